// mucc runtime, host side: error checking and cuBLAS. Not compiled under NVRTC (it has no host
// code); the Rust runner performs the same steps from the launch plan.
#pragma once

#ifndef __CUDACC_RTC__
#include <cuda_runtime.h>
#include <cublas_v2.h>

// mucc_execute returns 0, a cudaError_t, or MUCC_CUBLAS_ERROR_BASE + a cublasStatus_t.
#define MUCC_CUBLAS_ERROR_BASE 100000

#define MUCC_CHECK(expr)                                   \
  do {                                                     \
    cudaError_t mucc_err_ = (expr);                        \
    if (mucc_err_ != cudaSuccess) return (int)mucc_err_;   \
  } while (0)

#define MUCC_CHECK_CUBLAS(expr)                                                   \
  do {                                                                            \
    cublasStatus_t mucc_st_ = (expr);                                             \
    if (mucc_st_ != CUBLAS_STATUS_SUCCESS) return MUCC_CUBLAS_ERROR_BASE + (int)mucc_st_; \
  } while (0)

namespace mucc {
namespace host {

// The caller's buffers of mucc_execute; in/out/ws give the address `bytes` bytes into one.
struct Buffers {
  const void* const* inputs;
  void* const* outputs;
  void* workspace;
  void* in(int i, unsigned long long bytes) const {
    return const_cast<char*>(static_cast<const char*>(inputs[i])) + bytes;
  }
  void* out(int j, unsigned long long bytes) const { return static_cast<char*>(outputs[j]) + bytes; }
  void* ws(unsigned long long bytes) const { return static_cast<char*>(workspace) + bytes; }
};

// Launches `kernel` (whose parameters are N pointers) with the addresses `ptrs` on `stream`.
template <int N>
inline cudaError_t launch(const void* kernel, dim3 grid, dim3 block, unsigned smem, cudaStream_t stream,
                          void* const (&ptrs)[N]) {
  void* args[N];
  for (int i = 0; i < N; ++i) args[i] = const_cast<void**>(&ptrs[i]);
  return cudaLaunchKernel(kernel, grid, block, args, smem, stream);
}

// One cuBLAS handle per host thread, created on first use.
inline cublasStatus_t cublas_handle(cublasHandle_t* out) {
  thread_local cublasHandle_t handle = nullptr;
  if (handle == nullptr) {
    cublasStatus_t st = cublasCreate(&handle);
    if (st != CUBLAS_STATUS_SUCCESS) {
      handle = nullptr;
      return st;
    }
  }
  *out = handle;
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace host
}  // namespace mucc
#endif
