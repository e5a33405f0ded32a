// mucc runtime, host side: error checking, launches, tensor maps and cuBLAS. Not compiled under
// NVRTC (it has no host code); the Rust runner performs the same steps from the launch plan.
#pragma once

#ifndef __CUDACC_RTC__
#include <cuda.h>
#include <cuda_runtime.h>
#include <cublas_v2.h>

#include <atomic>

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

// A 64-bit value argument of a kernel whose other arguments are pointers (launch passes the
// address of each element of its array).
inline void* value_arg(unsigned long long v) { return reinterpret_cast<void*>(v); }

// Launches `kernel` with the argument addresses `args`; `programmatic`: with programmatic stream
// serialisation (sm_90a), so that it may start before the previous kernel on `stream` ends (it
// waits for it with griddepcontrol.wait).
inline cudaError_t launch_args(const void* kernel, dim3 grid, dim3 block, unsigned smem, cudaStream_t stream,
                               void** args, bool programmatic) {
  if (!programmatic) return cudaLaunchKernel(kernel, grid, block, args, smem, stream);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelExC(&cfg, kernel, args);
}

// Launches `kernel` (whose parameters are N pointers) with the addresses `ptrs` on `stream`.
template <int N>
inline cudaError_t launch(const void* kernel, dim3 grid, dim3 block, unsigned smem, cudaStream_t stream,
                          void* const (&ptrs)[N]) {
  void* args[N];
  for (int i = 0; i < N; ++i) args[i] = const_cast<void**>(&ptrs[i]);
  return launch_args(kernel, grid, block, smem, stream, args, false);
}

// As launch, programmatically.
template <int N>
inline cudaError_t launch_programmatic(const void* kernel, dim3 grid, dim3 block, unsigned smem,
                                       cudaStream_t stream, void* const (&ptrs)[N]) {
  void* args[N];
  for (int i = 0; i < N; ++i) args[i] = const_cast<void**>(&ptrs[i]);
  return launch_args(kernel, grid, block, smem, stream, args, true);
}

template <int N, int M>
inline cudaError_t launch_maps(const void* kernel, dim3 grid, dim3 block, unsigned smem, cudaStream_t stream,
                               void* const (&ptrs)[N], const CUtensorMap* const (&maps)[M], bool programmatic) {
  void* args[N + M];
  for (int i = 0; i < N; ++i) args[i] = const_cast<void**>(&ptrs[i]);
  for (int i = 0; i < M; ++i) args[N + i] = const_cast<CUtensorMap*>(maps[i]);
  return launch_args(kernel, grid, block, smem, stream, args, programmatic);
}

// Launches `kernel` whose parameters are N pointers, then M tensor maps passed by value.
template <int N, int M>
inline cudaError_t launch(const void* kernel, dim3 grid, dim3 block, unsigned smem, cudaStream_t stream,
                          void* const (&ptrs)[N], const CUtensorMap* const (&maps)[M]) {
  return launch_maps(kernel, grid, block, smem, stream, ptrs, maps, false);
}

// As launch with tensor maps, programmatically.
template <int N, int M>
inline cudaError_t launch_programmatic(const void* kernel, dim3 grid, dim3 block, unsigned smem,
                                       cudaStream_t stream, void* const (&ptrs)[N],
                                       const CUtensorMap* const (&maps)[M]) {
  return launch_maps(kernel, grid, block, smem, stream, ptrs, maps, true);
}

// A tensor map of one call site, encoded again only when the buffer address changes.
struct CachedTensorMap {
  const void* addr = nullptr;
  CUtensorMap map;
};

// The driver's cuTensorMapEncodeTiled, found through the runtime (no link against libcuda).
using EncodeTiled = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                 const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                                 CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

inline EncodeTiled encode_tiled() {
  static const EncodeTiled fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return static_cast<EncodeTiled>(nullptr);
    return reinterpret_cast<EncodeTiled>(p);
  }();
  return fn;
}

// Encodes `c` as a tiled map of the tensor at `addr` (RANK dims, innermost first; strides in
// bytes of dims 1..RANK-1; box in elements; zero-filled out-of-bounds elements), unless it
// already maps `addr`.
template <int RANK>
inline cudaError_t tensor_map(CachedTensorMap& c, CUtensorMapDataType dtype, const void* addr,
                              const cuuint64_t (&dims)[RANK], const cuuint64_t* strides,
                              const cuuint32_t (&box)[RANK], CUtensorMapSwizzle swizzle) {
  if (c.addr == addr) return cudaSuccess;
  const EncodeTiled encode = encode_tiled();
  if (encode == nullptr) return cudaErrorNotSupported;
  cuuint32_t ones[RANK];
  for (int i = 0; i < RANK; ++i) ones[i] = 1;
  const CUresult r = encode(&c.map, dtype, RANK, const_cast<void*>(addr), dims, strides, box, ones,
                            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    c.addr = nullptr;
    return cudaErrorInvalidValue;
  }
  c.addr = addr;
  return cudaSuccess;
}

// Devices the per-device caches below track (ordinals 0..MAX_DEVICES-1).
constexpr int MAX_DEVICES = 64;

// Raises `kernel`'s dynamic shared memory limit to `bytes` on the current device once per
// device: `done` (one per call site) holds a bit per device already set. Safe to call from
// several host threads at once (a race sets the attribute twice, which is harmless).
inline cudaError_t max_dynamic_smem(const void* kernel, int bytes, std::atomic<unsigned long long>& done) {
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  const unsigned long long bit = dev >= 0 && dev < MAX_DEVICES ? 1ull << dev : 0ull;
  if (bit != 0 && (done.load(std::memory_order_acquire) & bit) != 0) return cudaSuccess;
  e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess && bit != 0) done.fetch_or(bit, std::memory_order_release);
  return e;
}

// One cuBLAS handle per host thread and device (a handle belongs to the device current when it
// was created), created on first use and kept for the thread's life.
inline cublasStatus_t cublas_handle(cublasHandle_t* out) {
  thread_local cublasHandle_t handles[MAX_DEVICES] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= MAX_DEVICES) return CUBLAS_STATUS_NOT_INITIALIZED;
  cublasHandle_t& handle = handles[dev];
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
