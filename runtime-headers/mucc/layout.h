// mucc runtime: CuTe-style compile-time layouts.
//
//   Layout<Shape<3, 50, 783>, Stride<39200, 784, 1>>::offset(i)
//
// maps the row-major linear index i of a logical coordinate (dims outermost first, as in
// Mirage) to an element offset. Every extent and stride is a compile-time constant, so offsets
// compile to multiplications and shifts. A stride of 0 broadcasts a dim.
#pragma once

#include "types.h"

namespace mucc {

template <i64... Ds> struct Shape {
  static constexpr int rank = sizeof...(Ds);
  static constexpr i64 size = (Ds * ... * 1LL);
};

template <i64... Ss> struct Stride {
  static constexpr int rank = sizeof...(Ss);
};

namespace detail {
template <class Sh, class St> struct Offset;
template <> struct Offset<Shape<>, Stride<>> {
  __host__ __device__ static constexpr i64 at(i64) { return 0; }
};
template <i64 D0, i64... Ds, i64 S0, i64... Ss> struct Offset<Shape<D0, Ds...>, Stride<S0, Ss...>> {
  static constexpr i64 inner = (Ds * ... * 1LL);
  __host__ __device__ static constexpr i64 at(i64 i) {
    return (i / inner) * S0 + Offset<Shape<Ds...>, Stride<Ss...>>::at(i % inner);
  }
};
}  // namespace detail

// Precondition: Shape and Stride have the same rank; 0 <= i < size.
template <class Sh, class St> struct Layout {
  static_assert(Sh::rank == St::rank, "a layout needs one stride per dim");
  using shape = Sh;
  using stride = St;
  static constexpr int rank = Sh::rank;
  static constexpr i64 size = Sh::size;
  __host__ __device__ static constexpr i64 offset(i64 i) { return detail::Offset<Sh, St>::at(i); }
};

// XOR swizzle on element offsets: bits [M+S, M+S+B) are XORed into bits [M, M+B), permuting
// 2^M-element chunks within rows so that rows walked together hit different banks.
template <int B, int M, int S> struct Swizzle {
  static constexpr i64 mask = (1LL << B) - 1;
  __host__ __device__ static constexpr i64 apply(i64 o) { return o ^ (((o >> (M + S)) & mask) << M); }
};

// A layout followed by a swizzle of its offsets.
template <class L, class Sw> struct SwizzledLayout {
  using layout = L;
  static constexpr int rank = L::rank;
  static constexpr i64 size = L::size;
  __host__ __device__ static constexpr i64 offset(i64 i) { return Sw::apply(L::offset(i)); }
};

// Compile-time checks of the algebra (evaluated by every compiler that includes this file).
static_assert(Layout<Shape<3, 4>, Stride<4, 1>>::offset(5) == 5, "row-major");
static_assert(Layout<Shape<3, 4>, Stride<1, 3>>::offset(5) == 4, "column-major");
static_assert(Layout<Shape<2, 3, 4>, Stride<0, 4, 1>>::offset(13) == 1, "broadcast dim");
static_assert(Swizzle<3, 3, 3>::apply(64) == 72, "xor swizzle moves row 1 by one chunk");

}  // namespace mucc
