// mucc runtime, kernel level: element-wise maps over a shared iteration space.
//
// Every tensor of one operator is described by a layout over the *same* iteration shape (the
// result's shape with its dims in iteration order; broadcast dims of an operand have stride 0),
// so one row-major index addresses all of them. Grid-stride loops: any grid size is correct.
#pragma once

#include "../layout.h"

namespace mucc {
namespace kn {

__device__ __forceinline__ i64 global_thread() { return (i64)blockIdx.x * blockDim.x + threadIdx.x; }
__device__ __forceinline__ i64 global_threads() { return (i64)gridDim.x * blockDim.x; }

// out = op(in), element by element.
// Preconditions: OutL::size == InL::size. With VEC > 1: VEC divides the extent of the last
// iteration dim, both layouts have stride 1 on it and strides that are multiples of VEC on every
// other dim, and both pointers are aligned to VEC elements (16 bytes for full vectors).
template <class T, int VEC, class OutL, class InL, class Op>
__device__ __forceinline__ void unary(T* __restrict__ out, const T* __restrict__ in, Op op) {
  static_assert(OutL::size == InL::size, "operands must cover the same iteration space");
  static_assert(OutL::size % VEC == 0, "VEC must divide the iteration space");
  constexpr i64 n = OutL::size / VEC;
  for (i64 v = global_thread(); v < n; v += global_threads()) {
    const i64 i = v * VEC;
    const Vec<T, VEC> x = *reinterpret_cast<const Vec<T, VEC>*>(in + InL::offset(i));
    Vec<T, VEC> y;
#pragma unroll
    for (int e = 0; e < VEC; ++e) y.v[e] = from_compute<T>(op(to_compute(x.v[e])));
    *reinterpret_cast<Vec<T, VEC>*>(out + OutL::offset(i)) = y;
  }
}

// One element of `p` in every lane of a vector (an operand broadcast along the last dim).
template <class T, int VEC>
__device__ __forceinline__ Vec<T, VEC> splat(const T* p) {
  Vec<T, VEC> x;
  const T e = *p;
#pragma unroll
  for (int k = 0; k < VEC; ++k) x.v[k] = e;
  return x;
}

// out = op(a, b), element by element, with broadcasting through stride-0 dims.
// Preconditions: as for `unary`, for all three layouts, except that an operand marked
// A_SPLAT / B_SPLAT (stride 0 along the last iteration dim) is read one element per vector,
// with no stride or alignment condition.
template <class T, int VEC, class OutL, class AL, class BL, class Op, bool A_SPLAT = false,
          bool B_SPLAT = false>
__device__ __forceinline__ void binary(T* __restrict__ out, const T* __restrict__ a, const T* __restrict__ b, Op op) {
  static_assert(OutL::size == AL::size && OutL::size == BL::size, "operands must cover the same iteration space");
  static_assert(OutL::size % VEC == 0, "VEC must divide the iteration space");
  constexpr i64 n = OutL::size / VEC;
  for (i64 v = global_thread(); v < n; v += global_threads()) {
    const i64 i = v * VEC;
    const Vec<T, VEC> x = A_SPLAT ? splat<T, VEC>(a + AL::offset(i))
                                  : *reinterpret_cast<const Vec<T, VEC>*>(a + AL::offset(i));
    const Vec<T, VEC> y = B_SPLAT ? splat<T, VEC>(b + BL::offset(i))
                                  : *reinterpret_cast<const Vec<T, VEC>*>(b + BL::offset(i));
    Vec<T, VEC> z;
#pragma unroll
    for (int e = 0; e < VEC; ++e) z.v[e] = from_compute<T>(op(to_compute(x.v[e]), to_compute(y.v[e])));
    *reinterpret_cast<Vec<T, VEC>*>(out + OutL::offset(i)) = z;
  }
}

// dst = src (concat, split, chunk, aliasing outputs). Preconditions: as for `unary`.
template <class T, int VEC, class DstL, class SrcL>
__device__ __forceinline__ void copy(T* __restrict__ dst, const T* __restrict__ src) {
  static_assert(DstL::size == SrcL::size, "operands must cover the same iteration space");
  static_assert(DstL::size % VEC == 0, "VEC must divide the iteration space");
  constexpr i64 n = DstL::size / VEC;
  for (i64 v = global_thread(); v < n; v += global_threads()) {
    const i64 i = v * VEC;
    *reinterpret_cast<Vec<T, VEC>*>(dst + DstL::offset(i)) = *reinterpret_cast<const Vec<T, VEC>*>(src + SrcL::offset(i));
  }
}

}  // namespace kn
}  // namespace mucc
