// mucc runtime, kernel level: sums over one dim and RMS normalisation.
//
// Accumulation runs in the compute type (fp32 for 16-bit and 32-bit floats, fp64 otherwise).
#pragma once

#include "elementwise.h"

namespace mucc {
namespace kn {

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}
__device__ __forceinline__ double warp_sum(double x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Grouped sum over one dim r of extent TO·K down to TO, with Mirage's strided grouping:
// out[…, j, …] = Σ_{k<K} in[…, k·TO + j, …]  (TO = 1 is a plain sum).
// OutL is over the output shape (dim r of extent TO); InL over the input shape. INNER is the
// product of the extents after dim r, RSTRIDE the input stride of dim r.
// WARP = true: one warp per output element (for long reductions), else one thread.
// Preconditions: blockDim.x is a multiple of 32 when WARP.
template <class T, class OutL, class InL, i64 TO, i64 K, i64 INNER, i64 RSTRIDE, bool WARP>
__device__ __forceinline__ void reduce(T* __restrict__ out, const T* __restrict__ in) {
  using C = Compute<T>;
  constexpr i64 n = OutL::size;
  const i64 lanes = WARP ? 32 : 1;
  const i64 lane = WARP ? (i64)(threadIdx.x & 31) : 0;
  const i64 first = global_thread() / lanes;
  const i64 step = global_threads() / lanes;
  for (i64 o = first; o < n; o += step) {
    const i64 in_index = (o / (TO * INNER)) * (TO * K * INNER) + o % (TO * INNER);
    const T* base = in + InL::offset(in_index);
    C acc = C(0);
    for (i64 k = lane; k < K; k += lanes) acc += to_compute(base[k * TO * RSTRIDE]);
    if (WARP) acc = warp_sum(acc);
    if (lane == 0) out[OutL::offset(o)] = from_compute<T>(acc);
  }
}

// RMS normalisation without ε or weight: each of ROWS groups of GROUP consecutive logical
// elements is divided by sqrt(mean(x²)). One warp per row.
// Preconditions: blockDim.x is a multiple of 32; OutL::size == InL::size == ROWS·GROUP.
template <class T, class OutL, class InL, i64 ROWS, i64 GROUP>
__device__ __forceinline__ void rms_norm(T* __restrict__ out, const T* __restrict__ in) {
  using C = Compute<T>;
  static_assert(OutL::size == ROWS * GROUP && InL::size == ROWS * GROUP, "shape mismatch");
  const i64 lane = threadIdx.x & 31;
  for (i64 r = global_thread() / 32; r < ROWS; r += global_threads() / 32) {
    C sum = C(0);
    for (i64 j = lane; j < GROUP; j += 32) {
      const C x = to_compute(in[InL::offset(r * GROUP + j)]);
      sum += x * x;
    }
    const C scale = C(1) / op::sqrt(warp_sum(sum) / C(GROUP));
    for (i64 j = lane; j < GROUP; j += 32) {
      out[OutL::offset(r * GROUP + j)] = from_compute<T>(to_compute(in[InL::offset(r * GROUP + j)]) * scale);
    }
  }
}

}  // namespace kn
}  // namespace mucc
