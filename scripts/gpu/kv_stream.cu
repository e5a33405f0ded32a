// The streaming ceiling of mha_bs8's K and V tiles: a kernel that only reads what the
// attention kernel of a mha_bs8 candidate reads (256 heads of K stored [64, 4096] and V
// [4096, 64], fp16; 4 key splits; tiles of 128 keys; 1,024 CTAs of 128 threads), with plain
// 16-byte loads, nothing computed. Each variant is printed with the CTAs per SM that its dynamic
// shared memory allows (0 B: as many as registers allow; 68,608 B: the 3 of mucc's g30 kernel)
// and the minimum and mean of 20 launches (stream launches, not CUDA-graph replays, no buffer
// rotation: compare its means with `mucc bench`'s medians with care). Modes: bit 0 interleaves
// the splits per iteration, bit 1 puts the split fastest in the block index, bit 2 stores K
// keys-major. docs/benchmarks.md ("Not adopted") has its figures.
//
//   nvcc -O3 -std=c++17 -arch=sm_90a -o kv_stream scripts/gpu/kv_stream.cu && ./kv_stream
#include <cstdio>
#include <cuda_fp16.h>
#define H 256
#define D 64
#define N 4096
#define S 4
#define T 128
#define IT (N / S / T)
__device__ unsigned sink;
static int g_smem = 0;
// mode bit0: interleave splits per iteration; bit1: y fastest in blockIdx; bit2: K keys-major
template <int MODE>
__global__ void __launch_bounds__(128, 3) pat(const uint4* __restrict__ k, const uint4* __restrict__ v) {
  int h, y;
  if (MODE & 2) { y = blockIdx.x % S; h = blockIdx.x / S; } else { h = blockIdx.x % H; y = blockIdx.x / H; }
  unsigned acc = 0;
  for (int it = 0; it < IT; ++it) {
    int key0 = (MODE & 1) ? (it * S + y) * T : y * (N / S) + it * T;
    uint4 r[16];
    // K tile: 64 rows x 128 keys (256 B per row) = 1024 uint4; 8 per thread. V tile: 128 keys x 64 = 1024 uint4.
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      int c = threadIdx.x + j * 128;
      size_t off;
      if (MODE & 4) off = ((size_t)h * N * D + (size_t)key0 * D) / 8 + c;  // keys-major contiguous
      else { int row = c / 16, col = c % 16; off = ((size_t)h * D * N + (size_t)row * N + key0) / 8 + col; }
      r[j] = k[off];
      r[8 + j] = v[((size_t)h * N * D + (size_t)key0 * D) / 8 + c];
    }
#pragma unroll
    for (int j = 0; j < 16; ++j) acc ^= r[j].x ^ r[j].y ^ r[j].z ^ r[j].w;
  }
  if (acc == 0x12345678) sink = acc;
}
template <int MODE> float run(const uint4* k, const uint4* v) {
  cudaFuncSetAttribute(pat<MODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, g_smem);
  int occ = 0; cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, pat<MODE>, 128, g_smem);
  printf("smem %d B: %d CTAs/SM; ", g_smem, occ);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  for (int w = 0; w < 3; ++w) pat<MODE><<<H * S, 128, g_smem>>>(k, v);
  float best = 1e9, sum = 0; int n = 20;
  for (int i = 0; i < n; ++i) {
    cudaEventRecord(a); pat<MODE><<<H * S, 128, g_smem>>>(k, v); cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b); sum += ms; if (ms < best) best = ms;
  }
  double bytes = 2.0 * H * D * N * 2;
  printf("mode %d: min %.2f us mean %.2f us  %.2f TB/s\n", MODE, best * 1e3, sum / n * 1e3, bytes / (best * 1e-3) / 1e12);
  return best;
}
int main() {
  size_t n = (size_t)H * D * N * 2;
  uint4 *k, *v; cudaMalloc(&k, n); cudaMalloc(&v, n); cudaMemset(k, 1, n); cudaMemset(v, 2, n);
  for (int sm : {0, 68608, 100000, 40000}) { g_smem = sm; run<0>(k, v); run<2>(k, v); }
  run<0>(k, v); run<3>(k, v); run<4>(k, v);
  // copy ceiling
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b); float best = 1e9;
  for (int i = 0; i < 10; ++i) { cudaEventRecord(a); cudaMemcpy(v, k, n, cudaMemcpyDeviceToDevice); cudaEventRecord(b); cudaEventSynchronize(b); float ms; cudaEventElapsedTime(&ms, a, b); if (ms < best) best = ms; }
  printf("copy %.2f us %.2f TB/s (read+write)\n", best * 1e3, 2.0 * n / (best * 1e-3) / 1e12);
  printf("err %s\n", cudaGetErrorString(cudaGetLastError()));
}
