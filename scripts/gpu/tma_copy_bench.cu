// Probe for the Hopper memory path (issue 13): how close to DRAM bandwidth does a device-to-
// device copy get with (a) plain 16-byte loads and stores, (b) cp.async-free TMA: a ring of
// 2-D TMA loads into shared memory and TMA stores out of it, issued by one thread per CTA?
//
//   nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I runtime-headers \
//        scripts/gpu/tma_copy_bench.cu -lcuda -o /tmp/tmacopy && /tmp/tmacopy
//
// Prints GB/s (bytes read + bytes written per second, best of 20) per variant, and checks the
// copy after each variant.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "mucc/arch/sm90.h"

using mucc::u64;
namespace sm90 = mucc::sm90;

#define CK(x)                                                                    \
  do {                                                                           \
    cudaError_t e_ = (x);                                                        \
    if (e_ != cudaSuccess) {                                                     \
      printf("%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      exit(1);                                                                   \
    }                                                                            \
  } while (0)

constexpr int COLS = 256;  // f32 per row: one box row is 1 KiB

__global__ void vec_copy(const float4* __restrict__ in, float4* __restrict__ out, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    out[i] = in[i];
}

// One thread per CTA: a ring of STAGES boxes of BOX_R rows; tile t of this CTA is rows
// (blockIdx.x + t * gridDim.x) * BOX_R ...
template <int STAGES, int BOX_R>
__global__ void __launch_bounds__(32) tma_copy(const __grid_constant__ sm90::TensorMap src,
                                               const __grid_constant__ sm90::TensorMap dst, int tiles) {
  extern __shared__ unsigned char raw[];
  unsigned char* base = reinterpret_cast<unsigned char*>((reinterpret_cast<unsigned long long>(raw) + 127) / 128 * 128);
  constexpr int BYTES = BOX_R * COLS * 4;
  u64* full = reinterpret_cast<u64*>(base + STAGES * BYTES);
  if (threadIdx.x != 0) return;
  for (int s = 0; s < STAGES; ++s) sm90::mbar_init(&full[s], 1);
  sm90::fence_mbarrier_init();
  int mine = (tiles - (int)blockIdx.x + (int)gridDim.x - 1) / (int)gridDim.x;
  auto row = [&](int t) { return ((int)blockIdx.x + t * (int)gridDim.x) * BOX_R; };
  for (int t = 0; t < STAGES - 1 && t < mine; ++t) {
    sm90::mbar_arrive_expect_tx(&full[t], BYTES);
    sm90::tma_load(base + t * BYTES, &src, &full[t], 0, row(t));
  }
  sm90::RingState<STAGES> at;
  for (int t = 0; t < mine; ++t, at.advance()) {
    sm90::mbar_wait(&full[at.stage], at.parity);
    sm90::tma_store(&dst, base + at.stage * BYTES, 0, row(t));
    sm90::bulk_commit();
    int next = t + STAGES - 1;
    if (next < mine) {
      int s = next % STAGES;  // the stage stored at t - 1
      sm90::bulk_wait_read<1>();
      sm90::mbar_arrive_expect_tx(&full[s], BYTES);
      sm90::tma_load(base + s * BYTES, &src, &full[s], 0, row(next));
    }
  }
  sm90::bulk_wait<0>();
}

static sm90::TensorMap encode(void* base, unsigned long long rows, unsigned box_r) {
  cuuint64_t gdim[2] = {COLS, rows}, gstride[1] = {COLS * 4};
  cuuint32_t bdim[2] = {COLS, box_r}, estride[2] = {1, 1};
  CUtensorMap m;
  CUresult r = cuTensorMapEncodeTiled(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, base, gdim, gstride, bdim, estride,
                                      CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                                      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    printf("cuTensorMapEncodeTiled failed (%d)\n", (int)r);
    exit(1);
  }
  sm90::TensorMap out;
  memcpy(&out, &m, sizeof out);
  return out;
}

template <class F> static float best_ms(F launch) {
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  launch();
  CK(cudaDeviceSynchronize());
  float best = 1e30f;
  for (int i = 0; i < 20; ++i) {
    CK(cudaEventRecord(a));
    launch();
    CK(cudaEventRecord(b));
    CK(cudaEventSynchronize(b));
    float ms;
    CK(cudaEventElapsedTime(&ms, a, b));
    if (ms < best) best = ms;
  }
  return best;
}

static bool same(const float* d_out, const std::vector<float>& want) {
  std::vector<float> got(want.size());
  CK(cudaMemcpy(got.data(), d_out, want.size() * 4, cudaMemcpyDeviceToHost));
  return memcmp(got.data(), want.data(), want.size() * 4) == 0;
}

template <int STAGES, int BOX_R>
static void run_tma(const char* name, float* in, float* out, size_t rows, const std::vector<float>& want, int sms,
                    int per_sm, double bytes) {
  sm90::TensorMap s = encode(in, rows, BOX_R), d = encode(out, rows, BOX_R);
  int smem = STAGES * BOX_R * COLS * 4 + STAGES * 8 + 128;
  CK(cudaFuncSetAttribute(tma_copy<STAGES, BOX_R>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  int tiles = (int)(rows / BOX_R);
  CK(cudaMemset(out, 0, rows * COLS * 4));
  float ms = best_ms([&] { tma_copy<STAGES, BOX_R><<<sms * per_sm, 32, smem>>>(s, d, tiles); });
  CK(cudaGetLastError());
  printf("%-34s %4d CTAs %6.0f GB/s  %s\n", name, sms * per_sm, bytes / ms / 1e6, same(out, want) ? "ok" : "WRONG");
}

int main() {
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  int sms = p.multiProcessorCount;
  size_t rows = (size_t)1 << 20;  // 1 GiB of f32
  size_t n = rows * COLS;
  std::vector<float> h(n);
  for (size_t i = 0; i < n; ++i) h[i] = (float)(i % 100003);
  float *in, *out;
  CK(cudaMalloc(&in, n * 4));
  CK(cudaMalloc(&out, n * 4));
  CK(cudaMemcpy(in, h.data(), n * 4, cudaMemcpyHostToDevice));
  double bytes = 2.0 * n * 4;
  printf("%s, %d SMs, copy of %.0f MiB\n", p.name, sms, n * 4 / 1048576.0);
  float ms = best_ms([&] { CK(cudaMemcpyAsync(out, in, n * 4, cudaMemcpyDeviceToDevice)); });
  printf("%-34s %4s      %6.0f GB/s\n", "cudaMemcpy D2D", "", bytes / ms / 1e6);
  for (int per_sm : {4, 8, 16}) {
    CK(cudaMemset(out, 0, n * 4));
    ms = best_ms([&] { vec_copy<<<sms * per_sm, 256>>>((const float4*)in, (float4*)out, n / 4); });
    printf("%-34s %4d CTAs %6.0f GB/s  %s\n", "float4 grid-stride (256 thr)", sms * per_sm, bytes / ms / 1e6,
           same(out, h) ? "ok" : "WRONG");
  }
  run_tma<4, 32>("tma ring 4 x 32 KiB", in, out, rows, h, sms, 1, bytes);
  run_tma<6, 32>("tma ring 6 x 32 KiB", in, out, rows, h, sms, 1, bytes);
  run_tma<4, 16>("tma ring 4 x 16 KiB, 2/SM", in, out, rows, h, sms, 2, bytes);
  run_tma<8, 8>("tma ring 8 x 8 KiB, 2/SM", in, out, rows, h, sms, 2, bytes);
  run_tma<4, 8>("tma ring 4 x 8 KiB, 4/SM", in, out, rows, h, sms, 4, bytes);
  run_tma<3, 16>("tma ring 3 x 16 KiB, 4/SM", in, out, rows, h, sms, 4, bytes);
  return 0;
}
