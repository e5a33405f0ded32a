// GPU self-test of the warpgroup paths of mucc::tb::Mma (sm_90a). `run`: S = Q·K by wgmma with
// A by ldmatrix against mma.sync and a CPU reference. `run_from`: P = Q·Kᵀ by
// mma.sync into fragments, packed to T, then O = P·V twice — by wgmma (B = V through a
// 128-byte-swizzle shared-memory descriptor) and by mma.sync with ldmatrix.trans — against a
// CPU reference of round_T(Q·Kᵀ)·V. Build and run on a Hopper GPU:
//   nvcc -std=c++17 -gencode=arch=compute_90a,code=sm_90a -I runtime-headers \
//     scripts/gpu/wgmma_selftest.cu -o /tmp/wg && /tmp/wg
// (no compute_90 pass: wgmma needs the sm_90a feature set).
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <type_traits>
#include <vector>
#include "mucc/runtime.h"

using namespace mucc;

template <int M, int N, int S0, int S1> using L = Layout<Shape<M, N>, Stride<S0, S1>>;

// Q: ROWS × 16 (K contiguous), Kt: 16 × KEYS (keys contiguous), V: KEYS × 64, rows of 128
// bytes with the 128-byte swizzle pattern; 4·WG warps along M (ROWS = 64·WG·PM rows).
template <class T, int ROWS, int KEYS, int WM>
__global__ void kern(const T* gq, const T* gk, const T* gv, float* o_wgmma, float* o_mma) {
  extern __shared__ __align__(1024) unsigned char smem[];
  using LQ = L<ROWS, 16, 16, 1>;
  using LK = L<16, KEYS, KEYS, 1>;
  using LV = SwizzledLayout<L<KEYS, 64, 64, 1>, Swizzle<3, 3, 3>>;
  using P = tb::MmaAuto<T, LQ, LK, ROWS, KEYS, 16, WM, 1, tb::Load::Ldmatrix, tb::Load::LdmatrixTrans>;
  using W = tb::MmaAuto<T, LQ, LV, ROWS, 64, KEYS, WM, 1, tb::Load::Fragment, tb::Load::Wgmma>;
  using S = tb::MmaAuto<T, LQ, LV, ROWS, 64, KEYS, WM, 1, tb::Load::Fragment, tb::Load::LdmatrixTrans>;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid < 4) reinterpret_cast<unsigned*>(smem)[tid] = 0u;  // zero page
  T* v = reinterpret_cast<T*>(smem + 1024);                    // 1024-byte aligned
  T* q = v + KEYS * 64;
  T* k = q + ROWS * 16;
  for (int e = tid; e < ROWS * 16; e += blockDim.x) q[LQ::offset(e)] = gq[e];
  for (int e = tid; e < 16 * KEYS; e += blockDim.x) k[LK::offset(e)] = gk[e];
  for (int e = tid; e < KEYS * 64; e += blockDim.x) v[LV::offset(e)] = gv[e];
  __syncthreads();
  // The descriptor path reads shared memory through the async proxy: order the generic writes.
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  typename P::Frag pf;
  P::zero(pf);
  P::run(pf, q, k, smem, warp, lane);
  typename P::Packed pk;
  P::pack(pk, pf, warp, lane, [](int, int, float x) { return x; });
  typename W::Frag wf;
  W::zero(wf);
  W::template run_from<P>(wf, pk, v, smem, warp, lane);
  typename S::Frag sf;
  S::zero(sf);
  S::template run_from<P>(sf, pk, v, smem, warp, lane);
  W::each(wf, warp, lane, [&](int r, int c, float x, int, int, int) { o_wgmma[r * 64 + c] = x; });
  S::each(sf, warp, lane, [&](int r, int c, float x, int, int, int) { o_mma[r * 64 + c] = x; });
}

// S = Q·Kt with A = Q by ldmatrix (DK contiguous, the 128-byte swizzle when DK is 64 as in
// attention) and B = Kt (DK × KEYS, keys contiguous, 128-byte swizzle; KEYS above 64 in atom
// columns of 64 keys, DK·64 elements apart), by wgmma (`run`'s warpgroup path) and by mma.sync
// with ldmatrix.trans (for 64 keys; the atom columns are wgmma's only).
template <class T, int ROWS, int DK, int KEYS, int WM>
__global__ void kern_qk(const T* gq, const T* gk, float* o_wgmma, float* o_mma) {
  extern __shared__ __align__(1024) unsigned char smem[];
  using LQ = typename std::conditional<DK == 64, SwizzledLayout<L<ROWS, DK, DK, 1>, Swizzle<3, 3, 3>>,
                                       L<ROWS, DK, DK, 1>>::type;
  using LK = typename std::conditional<
      KEYS == 64, SwizzledLayout<L<DK, 64, 64, 1>, Swizzle<3, 3, 3>>,
      SwizzledLayout<Layout<Shape<DK, KEYS / 64, 64>, Stride<64, DK * 64, 1>>, Swizzle<3, 3, 3>>>::type;
  using LKS = SwizzledLayout<L<DK, KEYS, KEYS, 1>, Swizzle<3, 3, 3>>;  // mma.sync's copy: rows of KEYS
  using W = tb::MmaAuto<T, LQ, LK, ROWS, KEYS, DK, WM, 1, tb::Load::Ldmatrix, tb::Load::Wgmma>;
  using S = tb::MmaAuto<T, LQ, LKS, ROWS, KEYS, DK, WM, 1, tb::Load::Ldmatrix, tb::Load::LdmatrixTrans>;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  if (tid < 4) reinterpret_cast<unsigned*>(smem)[tid] = 0u;
  T* k = reinterpret_cast<T*>(smem + 1024);
  T* ks = k + DK * KEYS;
  T* q = ks + DK * KEYS;
  for (int e = tid; e < ROWS * DK; e += blockDim.x) q[LQ::offset(e)] = gq[e];
  for (int e = tid; e < DK * KEYS; e += blockDim.x) k[LK::offset(e)] = gk[e];
  for (int e = tid; e < DK * KEYS; e += blockDim.x) ks[LKS::offset(e)] = gk[e];
  __syncthreads();
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  __syncthreads();
  typename W::Frag wf;
  W::zero(wf);
  W::run(wf, q, k, smem, warp, lane);
  typename S::Frag sf;
  S::zero(sf);
  S::run(sf, q, ks, smem, warp, lane);
  W::each(wf, warp, lane, [&](int r, int c, float x, int, int, int) { o_wgmma[r * KEYS + c] = x; });
  S::each(sf, warp, lane, [&](int r, int c, float x, int, int, int) { o_mma[r * KEYS + c] = x; });
}

// Reads the wgmma and mma.sync results (device, `ref.size()` floats, rows of `cols`) and prints
// how many differ from `ref` by more than tol·(1 + |ref|), with the first wrong wgmma element;
// 1 when any does.
int report(const std::vector<double>& ref, const float* dw, const float* ds, int cols, double tol) {
  const size_t n = ref.size();
  std::vector<float> w(n), s(n);
  cudaMemcpy(w.data(), dw, n * 4, cudaMemcpyDeviceToHost);
  cudaMemcpy(s.data(), ds, n * 4, cudaMemcpyDeviceToHost);
  int bad_w = 0, bad_s = 0, first = -1;
  for (size_t i = 0; i < n; ++i) {
    const double t = tol * (1.0 + std::fabs(ref[i]));
    if (!(std::fabs(w[i] - ref[i]) <= t)) {
      ++bad_w;
      if (first < 0) first = static_cast<int>(i);
    }
    if (!(std::fabs(s[i] - ref[i]) <= t)) ++bad_s;
  }
  printf("wgmma %d wrong, mma.sync %d wrong of %zu", bad_w, bad_s, n);
  if (first >= 0)
    printf("; first at (%d, %d): ref %g wgmma %g mma.sync %g", first / cols, first % cols, ref[first], w[first],
           s[first]);
  printf("\n");
  return bad_w + bad_s > 0;
}

template <class T> float to_f(T x);
template <> float to_f<f16>(f16 x) { return __half2float(x); }
template <> float to_f<bf16>(bf16 x) { return __bfloat162float(x); }
template <class T> T from_f(float x);
template <> f16 from_f<f16>(float x) { return __float2half_rn(x); }
template <> bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }

template <class T, int ROWS, int KEYS, int WM> int check(const char* name) {
  std::vector<T> hq(ROWS * 16), hk(16 * KEYS), hv(KEYS * 64);
  std::vector<float> fq(hq.size()), fk(hk.size()), fv(hv.size());
  srand(7);
  auto fill = [](std::vector<T>& h, std::vector<float>& f) {
    for (size_t i = 0; i < h.size(); ++i) {
      h[i] = from_f<T>(float(rand() % 17 - 8) / 16);
      f[i] = to_f<T>(h[i]);
    }
  };
  fill(hq, fq), fill(hk, fk), fill(hv, fv);
  // Reference: P rounded to T as the pipe packs it, then P·V in double.
  std::vector<double> ref(ROWS * 64, 0.0);
  for (int r = 0; r < ROWS; ++r)
    for (int j = 0; j < KEYS; ++j) {
      float s = 0.f;
      for (int d = 0; d < 16; ++d) s += fq[r * 16 + d] * fk[d * KEYS + j];
      const double p = to_f<T>(from_f<T>(s));
      for (int c = 0; c < 64; ++c) ref[r * 64 + c] += p * fv[j * 64 + c];
    }
  T *dq, *dk, *dv;
  float *dw, *ds;
  cudaMalloc(&dq, hq.size() * 2), cudaMalloc(&dk, hk.size() * 2), cudaMalloc(&dv, hv.size() * 2);
  cudaMalloc(&dw, ROWS * 64 * 4), cudaMalloc(&ds, ROWS * 64 * 4);
  cudaMemcpy(dq, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dk, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dv, hv.data(), hv.size() * 2, cudaMemcpyHostToDevice);
  cudaMemset(dw, 0xff, ROWS * 64 * 4), cudaMemset(ds, 0xff, ROWS * 64 * 4);
  const int smem = 1024 + (KEYS * 64 + ROWS * 16 + 16 * KEYS) * 2;
  auto kf = kern<T, ROWS, KEYS, WM>;
  cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  kf<<<1, 32 * WM, smem>>>(dq, dk, dv, dw, ds);
  const cudaError_t e = cudaDeviceSynchronize();
  printf("%s: ", name);
  if (e != cudaSuccess) {
    printf("CUDA error %s\n", cudaGetErrorString(e));
    return 1;
  }
  const int bad = report(ref, dw, ds, 64, 1e-3);
  cudaFree(dq), cudaFree(dk), cudaFree(dv), cudaFree(dw), cudaFree(ds);
  return bad;
}

template <class T, int ROWS, int DK, int KEYS, int WM> int check_qk(const char* name) {
  std::vector<T> hq(ROWS * DK), hk(DK * KEYS);
  std::vector<float> fq(hq.size()), fk(hk.size());
  srand(11);
  for (size_t i = 0; i < hq.size(); ++i) fq[i] = to_f<T>(hq[i] = from_f<T>(float(rand() % 17 - 8) / 16));
  for (size_t i = 0; i < hk.size(); ++i) fk[i] = to_f<T>(hk[i] = from_f<T>(float(rand() % 17 - 8) / 16));
  std::vector<double> ref(ROWS * KEYS, 0.0);
  for (int r = 0; r < ROWS; ++r)
    for (int c = 0; c < KEYS; ++c)
      for (int d = 0; d < DK; ++d) ref[r * KEYS + c] += double(fq[r * DK + d]) * fk[d * KEYS + c];
  T *dq, *dk;
  float *dw, *ds;
  const size_t out = size_t(ROWS) * KEYS * 4;
  cudaMalloc(&dq, hq.size() * 2), cudaMalloc(&dk, hk.size() * 2);
  cudaMalloc(&dw, out), cudaMalloc(&ds, out);
  cudaMemcpy(dq, hq.data(), hq.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(dk, hk.data(), hk.size() * 2, cudaMemcpyHostToDevice);
  cudaMemset(dw, 0xff, out), cudaMemset(ds, 0xff, out);
  const int smem = 1024 + (2 * DK * KEYS + ROWS * DK) * 2;
  auto kf = kern_qk<T, ROWS, DK, KEYS, WM>;
  cudaFuncSetAttribute(kf, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  kf<<<1, 32 * WM, smem>>>(dq, dk, dw, ds);
  const cudaError_t e = cudaDeviceSynchronize();
  printf("%s: ", name);
  if (e != cudaSuccess) {
    printf("CUDA error %s\n", cudaGetErrorString(e));
    return 1;
  }
  const int bad = report(ref, dw, ds, KEYS, 1e-4);
  cudaFree(dq), cudaFree(dk), cudaFree(dw), cudaFree(ds);
  return bad;
}

int main() {
  int fails = 0;
  fails += check_qk<f16, 64, 64, 64, 4>("Q·K f16: 64 rows, head dim 64 (swizzled Q), 64 keys, one warpgroup");
  fails += check_qk<bf16, 64, 64, 64, 4>("Q·K bf16: 64 rows, head dim 64, 64 keys, one warpgroup");
  fails += check_qk<f16, 128, 16, 64, 4>("Q·K f16: 128 rows (two m-tiles per warp), head dim 16 (plain Q)");
  fails += check_qk<f16, 128, 64, 64, 8>("Q·K f16: 128 rows, two warpgroups");
  fails += check_qk<f16, 64, 64, 128, 4>("Q·K f16: 128 keys in two atom columns, one warpgroup");
  fails += check_qk<bf16, 64, 64, 256, 4>("Q·K bf16: 256 keys in four atom columns, one warpgroup");
  fails += check<f16, 64, 128, 4>("f16: 64 rows, 128 keys, one warpgroup");
  fails += check<bf16, 64, 128, 4>("bf16: 64 rows, 128 keys, one warpgroup");
  fails += check<f16, 128, 64, 4>("f16: 128 rows (two m-tiles per warp), 64 keys");
  fails += check<f16, 128, 128, 8>("f16: 128 rows, two warpgroups");
  printf("%s\n", fails ? "FAILED" : "all ok");
  return fails != 0;
}
