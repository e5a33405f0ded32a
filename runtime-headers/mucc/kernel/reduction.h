// mucc runtime, kernel level: sums over one dim, RMS normalisation and the online-softmax
// combination of split attention.
//
// Accumulation runs in the compute type (fp32 for 16-bit and 32-bit floats, fp64 otherwise).
#pragma once

#include "../ops.h"
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

template <class C>
__device__ __forceinline__ C warp_max(C x) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const C y = __shfl_xor_sync(0xffffffffu, x, o);
    x = (y > x || y != y) ? y : x;  // NaN wins, as in the reference
  }
  return x;
}

// Grouped sum over one dim r of extent TO·K down to TO, with Mirage's strided grouping:
// out[…, j, …] = Σ_{k<K} in[…, k·TO + j, …]  (TO = 1 is a plain sum); with MAX, the largest
// element of each group instead of the sum (NaN wins).
// OutL is over the output shape (dim r of extent TO); InL over the input shape. INNER is the
// product of the extents after dim r, RSTRIDE the input stride of dim r.
// Contiguous groups of the last dim (INNER = 1): TO = 1 with an output whose last dim has any
// extent G; output o combines input elements o·K … o·K + K − 1 (logical indices).
// WARP = true: one warp per output element (for long reductions), else one thread.
// Preconditions: blockDim.x is a multiple of 32 when WARP.
template <class T, class OutL, class InL, i64 TO, i64 K, i64 INNER, i64 RSTRIDE, bool WARP,
          bool MAX = false>
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
    C acc = MAX ? neg_inf<C>() : C(0);
    for (i64 k = lane; k < K; k += lanes) {
      const C x = to_compute(base[k * TO * RSTRIDE]);
      if (MAX) {
        acc = (x > acc || x != x) ? x : acc;
      } else {
        acc += x;
      }
    }
    if (WARP) acc = MAX ? warp_max(acc) : warp_sum(acc);
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

// The online-softmax combination of attention split over S key blocks: for each of ROWS rows
// r, with M = max_s m[r, s] and w_s = exp(m[r, s] - M),
//   out[r, j] = sum_s w_s * O[r, s*D + j] / sum_s w_s * l[r, s].
// OutL is over [ROWS, D] (logical index r*D + j), OL over [ROWS, S*D], LL and ML over
// [ROWS, S] (row-major logical indices over the tensors' shapes, any strides). A row takes
// G*P consecutive threads: thread p*G + g sums VEC consecutive outputs at a time (outputs
// (g + c*G)*VEC ...) over the splits p, p + P, ... in registers, in the compute type; the P
// partial sums of an output are then added by warp shuffles and thread p = 0 stores. No shared
// memory, no barrier.
// Preconditions: VEC divides D; with VEC > 1, OL and OutL have stride 1 along their last dim,
// strides and base pointers aligned to VEC elements; P divides S; with P > 1, G*P is a power of
// two of at most 32 and blockDim.x a multiple of 32. Any grid size is correct.
template <class T, class OutL, class OL, class LL, class ML, i64 ROWS, i64 S, i64 D, int VEC, int G, int P>
__device__ __forceinline__ void softmax_combine(T* __restrict__ out, const T* __restrict__ o,
                                                const T* __restrict__ l, const T* __restrict__ m) {
  using C = Compute<T>;
  static_assert(OutL::size == ROWS * D && OL::size == ROWS * S * D, "O and out shapes");
  static_assert(LL::size == ROWS * S && ML::size == ROWS * S, "l and m shapes");
  static_assert(D % VEC == 0 && G >= 1 && S >= 1, "VEC must divide D");
  static_assert(S % P == 0, "P must divide S");
  static_assert(P == 1 || (G * P <= 32 && ((G * P) & (G * P - 1)) == 0), "G*P: a power of two up to 32");
  constexpr i64 CH = (D / VEC + G - 1) / G;
  constexpr i64 W = (i64)G * P;
  const i64 step = global_threads() / W;
  const i64 first = global_thread() / W;
  const i64 g = global_thread() % G;
  const i64 p = (global_thread() / G) % P;
  // A partial row group at the end of the grid has nothing to do (and, with P > 1, whole
  // groups are whole warp segments, so the shuffles below see only active lanes).
  if (first >= step) return;
  // With P > 1 the lanes of a warp shuffle together: the loop runs while the warp's first row
  // group has a row, and a group past the last row repeats the last row without storing.
  constexpr i64 PER_WARP = P > 1 ? 32 / W : 1;
  const i64 lead = first - first % PER_WARP;
  for (i64 q = first; lead + (q - first) < ROWS; q += step) {
    const bool live = q < ROWS;
    const i64 r = live ? q : ROWS - 1;
    C top = to_compute(m[ML::offset(r * S)]);
    for (i64 s = 1; s < S; ++s) {
      const C x = to_compute(m[ML::offset(r * S + s)]);
      top = x > top ? x : top;
    }
    C den = C(0);
    C acc[CH][VEC];
#pragma unroll
    for (i64 c = 0; c < CH; ++c)
#pragma unroll
      for (int e = 0; e < VEC; ++e) acc[c][e] = C(0);
#pragma unroll 4
    for (i64 s = p; s < S; s += P) {
      const C w = op::exp(to_compute(m[ML::offset(r * S + s)]) - top);
      den += w * to_compute(l[LL::offset(r * S + s)]);
#pragma unroll
      for (i64 c = 0; c < CH; ++c) {
        const i64 j = (g + c * G) * VEC;
        if (j < D) {
          const Vec<T, VEC> x = *reinterpret_cast<const Vec<T, VEC>*>(o + OL::offset((r * S + s) * D + j));
#pragma unroll
          for (int e = 0; e < VEC; ++e) acc[c][e] += w * to_compute(x.v[e]);
        }
      }
    }
    if (P > 1) {
#pragma unroll
      for (int x = G; x < W; x <<= 1) {
        den += __shfl_xor_sync(0xffffffffu, den, x);
#pragma unroll
        for (i64 c = 0; c < CH; ++c)
#pragma unroll
          for (int e = 0; e < VEC; ++e) acc[c][e] += __shfl_xor_sync(0xffffffffu, acc[c][e], x);
      }
    }
    if (live && p == 0) {
#pragma unroll
      for (i64 c = 0; c < CH; ++c) {
        const i64 j = (g + c * G) * VEC;
        if (j < D) {
          Vec<T, VEC> y;
#pragma unroll
          for (int e = 0; e < VEC; ++e) y.v[e] = from_compute<T>(acc[c][e] / den);
          *reinterpret_cast<Vec<T, VEC>*>(out + OutL::offset(r * D + j)) = y;
        }
      }
    }
  }
}

}  // namespace kn
}  // namespace mucc
