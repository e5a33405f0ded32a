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

#define MUCC_CHECK_LAUNCH() MUCC_CHECK(cudaGetLastError())

#define MUCC_CHECK_CUBLAS(expr)                                                   \
  do {                                                                            \
    cublasStatus_t mucc_st_ = (expr);                                             \
    if (mucc_st_ != CUBLAS_STATUS_SUCCESS) return MUCC_CUBLAS_ERROR_BASE + (int)mucc_st_; \
  } while (0)

namespace mucc {
namespace host {

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
