// GPU self-test of mucc::tb::Mma: C = A·B on shared-memory tiles for several layouts, through
// `run` (fragments) and `apply` (slices), against a CPU reference. Build and run on a GPU machine:
//   nvcc -std=c++17 -arch=sm_90a -I runtime-headers scripts/gpu/mma_selftest.cu -o /tmp/mma && /tmp/mma
// Operands load by ldmatrix (row-major A and column-major B plainly, the others with .trans);
// -DMUCC_SELFTEST_ELEMENTS loads both element by element.
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <string>
#include "mucc/runtime.h"

using namespace mucc;

// The load mode of an operand: ldmatrix along its contiguous dim, or element loads.
template <class L, bool IsA> __host__ __device__ constexpr int mode() {
#ifdef MUCC_SELFTEST_ELEMENTS
  return tb::Load::Elements;
#else
  constexpr bool row = LayoutTraits<L>::template stride<1> == 1;
  return (row == IsA) ? tb::Load::Ldmatrix : tb::Load::LdmatrixTrans;
#endif
}

template <class LA, class LB, int M, int N, int K, int WM, int WN>
__global__ void kern(const f16* ga, const f16* gb, float* c_run, float* c_apply) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid < 4) reinterpret_cast<unsigned*>(smem)[tid] = 0u;
  f16* a = reinterpret_cast<f16*>(smem + 16);
  f16* b = a + LA::size * 2;  // generous: layouts may pad
  for (int e = tid; e < M * K; e += blockDim.x) a[LA::offset(e)] = ga[e];
  for (int e = tid; e < K * N; e += blockDim.x) b[LB::offset(e)] = gb[e];
  __syncthreads();
  using MM = tb::MmaAuto<f16, LA, LB, M, N, K, WM, WN, mode<LA, true>(), mode<LB, false>()>;
  typename MM::Frag f;
  MM::zero(f);
  MM::run(f, a, b, smem, warp, lane);
  MM::each(f, warp, lane, [&](int r, int c, float v, int, int, int) { c_run[r * N + c] = v; });
  MM::apply(a, b, smem, warp, lane, [&](int r, int c, float v) { c_apply[r * N + c] = v; });
  if (tid == 0) printf("  load modes A %d B %d\n", mode<LA, true>(), mode<LB, false>());
}

template <class LA, class LB, int M, int N, int K, int WM, int WN>
int check(const char* name) {
  std::vector<f16> ha(M * K), hb(K * N);
  std::vector<float> fa(M * K), fb(K * N), ref(M * N, 0.f);
  srand(1);
  for (int i = 0; i < M * K; ++i) { fa[i] = float(rand() % 17 - 8) / 8; ha[i] = __float2half(fa[i]); }
  for (int i = 0; i < K * N; ++i) { fb[i] = float(rand() % 17 - 8) / 8; hb[i] = __float2half(fb[i]); }
  for (int m = 0; m < M; ++m) for (int n = 0; n < N; ++n) for (int k = 0; k < K; ++k) ref[m * N + n] += fa[m * K + k] * fb[k * N + n];
  f16 *da, *db; float *dr, *dp;
  cudaMalloc(&da, M * K * 2); cudaMalloc(&db, K * N * 2); cudaMalloc(&dr, M * N * 4); cudaMalloc(&dp, M * N * 4);
  cudaMemcpy(da, ha.data(), M * K * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(db, hb.data(), K * N * 2, cudaMemcpyHostToDevice);
  cudaMemset(dr, 0xff, M * N * 4); cudaMemset(dp, 0xff, M * N * 4);
  const int smem = 16 + (LA::size * 2 + LB::size * 2) * 2 + 1024;
  auto k = kern<LA, LB, M, N, K, WM, WN>;
  cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  printf("%s\n", name);
  k<<<1, 128, smem>>>(da, db, dr, dp);
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) { printf("  CUDA error %s\n", cudaGetErrorString(e)); return 1; }
  std::vector<float> r(M * N), p(M * N);
  cudaMemcpy(r.data(), dr, M * N * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(p.data(), dp, M * N * 4, cudaMemcpyDeviceToHost);
  int bad_r = 0, bad_p = 0, first = -1;
  for (int i = 0; i < M * N; ++i) {
    if (!(std::abs(r[i] - ref[i]) < 1e-3f)) { ++bad_r; if (first < 0) first = i; }
    if (!(std::abs(p[i] - ref[i]) < 1e-3f)) { ++bad_p; if (first < 0) first = i; }
  }
  printf("  run: %d wrong, apply: %d wrong of %d", bad_r, bad_p, M * N);
  if (const char* dump = getenv("MMA_DUMP"); dump && std::string(dump) == name) {  // raw matrices
    FILE* fp = fopen("/tmp/mma_dump.bin", "wb");
    fwrite(fa.data(), 4, fa.size(), fp); fwrite(fb.data(), 4, fb.size(), fp); fwrite(r.data(), 4, r.size(), fp);
    fclose(fp);
  }
  if (first >= 0) printf("; first at (%d, %d): ref %g run %g apply %g", first / N, first % N, ref[first], r[first], p[first]);
  printf("\n");
  if (bad_r) {  // wrong elements of `run` per row, n-tile by n-tile
    for (int m = 0; m < M; ++m) {
      printf("   row %2d:", m);
      for (int n8 = 0; n8 < (N + 7) / 8; ++n8) {
        int w = 0;
        for (int n = n8 * 8; n < n8 * 8 + 8 && n < N; ++n) w += !(std::abs(r[m * N + n] - ref[m * N + n]) < 1e-3f);
        printf(" %d", w);
      }
      printf("\n");
      if (m == 3) break;
    }
  }
  cudaFree(da); cudaFree(db); cudaFree(dr); cudaFree(dp);
  return bad_r + bad_p > 0;
}

template <int M, int N, int S0, int S1> using L = Layout<Shape<M, N>, Stride<S0, S1>>;
template <class X, int B, int Mb, int S> using SW = SwizzledLayout<X, Swizzle<B, Mb, S>>;

int main() {
  int fails = 0;
  fails += check<SW<L<8, 64, 64, 1>, 3, 3, 3>, SW<L<64, 32, 32, 1>, 2, 3, 3>, 8, 32, 64, 1, 4>("gated: A 8x64 row xor, B 64x32 row xor");
  fails += check<SW<L<16, 256, 256, 1>, 3, 3, 5>, SW<L<256, 64, 64, 1>, 3, 3, 3>, 16, 64, 256, 1, 4>("lora op4: A 16x256, B 256x64");
  fails += check<SW<L<16, 256, 256, 1>, 3, 3, 5>, SW<L<256, 16, 16, 1>, 1, 3, 3>, 16, 16, 256, 1, 2>("lora op5: A 16x256, B 256x16");
  fails += check<SW<L<16, 16, 16, 1>, 1, 3, 3>, SW<L<16, 64, 64, 1>, 3, 3, 3>, 16, 64, 16, 1, 4>("lora op6: A 16x16, B 16x64");
  fails += check<L<16, 16, 16, 1>, L<16, 64, 64, 1>, 16, 64, 16, 1, 4>("plain A 16x16, B 16x64");
  fails += check<L<16, 64, 64, 1>, L<64, 64, 64, 1>, 16, 64, 64, 1, 4>("plain A 16x64, B 64x64");
  fails += check<L<16, 64, 1, 16>, L<64, 64, 1, 64>, 16, 64, 64, 1, 4>("col-major A (trans), col-major B (plain)");
  fails += check<L<32, 64, 64, 1>, L<64, 64, 64, 1>, 32, 64, 64, 2, 2>("plain 32x64x64, 2x2 warps");
  fails += check<L<16, 64, 64, 1>, L<64, 64, 64, 1>, 16, 64, 64, 1, 2>("plain 16x64x64, 1x2 warps (PN 4)");
  fails += check<L<16, 32, 32, 1>, L<32, 64, 64, 1>, 16, 64, 32, 1, 4>("plain 16x64x32 (K 32)");
  fails += check<L<16, 64, 1, 16>, L<64, 64, 64, 1>, 16, 64, 64, 1, 4>("A col (trans), B row (trans)");
  fails += check<L<16, 64, 64, 1>, L<64, 64, 1, 64>, 16, 64, 64, 1, 4>("A row (plain), B col (plain)");
  fails += check<L<16, 64, 64, 1>, L<64, 16, 16, 1>, 16, 16, 64, 1, 2>("plain 16x16x64, 1x2 warps (PN 1)");
  fails += check<L<16, 64, 64, 1>, L<64, 64, 64, 1>, 16, 64, 64, 1, 1>("plain 16x64x64, 1 warp (PN 8)");
  fails += check<SW<L<8, 64, 64, 1>, 3, 3, 3>, L<64, 8, 8, 1>, 8, 8, 64, 1, 1>("gated_mlp g23: A 8x64 xor, B 64x8, 1x1 warps of 4");
  fails += check<L<24, 40, 40, 1>, L<40, 24, 24, 1>, 24, 24, 40, 2, 2>("odd 24x24x40: partial m-tile and k-step, 2x2 warps");
  fails += check<L<24, 40, 1, 24>, L<40, 24, 1, 40>, 24, 24, 40, 2, 2>("odd 24x24x40 col-major A and B");
  printf("%s\n", fails ? "FAILED" : "all ok");
  return fails != 0;
}
