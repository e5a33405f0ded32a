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
  static constexpr i64 max = 0;
  template <class I> __host__ __device__ static constexpr I at(I) { return 0; }
};
template <i64 D0, i64... Ds, i64 S0, i64... Ss> struct Offset<Shape<D0, Ds...>, Stride<S0, Ss...>> {
  static constexpr i64 inner = (Ds * ... * 1LL);
  // The largest offset of the layout (strides are non-negative).
  static constexpr i64 max = (D0 - 1) * S0 + Offset<Shape<Ds...>, Stride<Ss...>>::max;
  template <class I> __host__ __device__ static constexpr I at(I i) {
    return (i / static_cast<I>(inner)) * static_cast<I>(S0) + Offset<Shape<Ds...>, Stride<Ss...>>::at(i % static_cast<I>(inner));
  }
};
template <bool Small> struct IndexType {
  using type = i64;
};
template <> struct IndexType<true> {
  using type = int;
};
}  // namespace detail

// Precondition: Shape and Stride have the same rank; 0 <= i < size. Offsets are computed in
// 32-bit arithmetic when every offset of the layout fits (tiles, and most global views), in
// 64-bit otherwise.
template <class Sh, class St> struct Layout {
  static_assert(Sh::rank == St::rank, "a layout needs one stride per dim");
  using shape = Sh;
  using stride = St;
  static constexpr int rank = Sh::rank;
  static constexpr i64 size = Sh::size;
  static constexpr i64 max_offset = detail::Offset<Sh, St>::max;
  using index = typename detail::IndexType<(max_offset < 2147483647LL && size < 2147483647LL)>::type;
  template <class I> __host__ __device__ static constexpr index offset(I i) {
    return detail::Offset<Sh, St>::at(static_cast<index>(i));
  }
};

// XOR swizzle on element offsets: bits [M+S, M+S+B) are XORed into bits [M, M+B), permuting
// 2^M-element chunks within rows so that rows walked together hit different banks.
template <int B, int M, int S> struct Swizzle {
  template <class I> __host__ __device__ static constexpr I apply(I o) {
    return o ^ (((o >> (M + S)) & static_cast<I>((1LL << B) - 1)) << M);
  }
};

// A layout followed by a swizzle of its offsets.
template <class L, class Sw> struct SwizzledLayout {
  using layout = L;
  static constexpr int rank = L::rank;
  static constexpr i64 size = L::size;
  using index = typename L::index;
  template <class I> __host__ __device__ static constexpr index offset(I i) { return Sw::apply(L::offset(i)); }
};

namespace detail {
template <class St, int I> struct StrideAt;
template <i64 S0, i64... Ss> struct StrideAt<Stride<S0, Ss...>, 0> {
  static constexpr i64 value = S0;
};
template <i64 S0, i64... Ss, int I> struct StrideAt<Stride<S0, Ss...>, I> {
  static constexpr i64 value = StrideAt<Stride<Ss...>, I - 1>::value;
};
}  // namespace detail

// Facts about a (possibly swizzled) layout used to pick instructions: the stride of dim I, the
// log2 of the element chunks a swizzle keeps whole (62: no swizzle), and the log2 of the
// swizzle's period: moving an offset by a multiple of 2^period_log2 elements moves the swizzled
// offset by the same amount (the XOR reads only bits below it), so such steps stay additions.
template <class L> struct LayoutTraits {
  template <int I> static constexpr i64 stride = detail::StrideAt<typename L::stride, I>::value;
  static constexpr int kept_chunk_log2 = 62;
  static constexpr int period_log2 = 0;
};
template <class L, int B, int M, int S> struct LayoutTraits<SwizzledLayout<L, Swizzle<B, M, S>>> {
  template <int I> static constexpr i64 stride = detail::StrideAt<typename L::stride, I>::value;
  static constexpr int kept_chunk_log2 = M;
  static constexpr int period_log2 = B + M + S;
};

namespace detail {
// Whether moving the linear index of Layout<Shape<Ds...>, Stride<Ss...>> by STEP moves every
// offset by the same amount, and by how much. With j the outermost dim whose inner extent
// P_j (the product of the dims after it) divides STEP, STEP adds q = STEP / P_j to the index
// merged over dims 0..j and leaves the dims after j alone; the move is uniform when dims 0..j
// merge linearly (every dim k < j of extent above 1 has stride t_j times the extents of dims
// k+1..j), and then it is q·t_j.
template <class Sh, class St, i64 STEP> struct UniformStep;
template <i64... Ds, i64... Ss, i64 STEP> struct UniformStep<Shape<Ds...>, Stride<Ss...>, STEP> {
  static constexpr int rank = sizeof...(Ds);
  static constexpr i64 d[rank > 0 ? rank : 1] = {Ds...};
  static constexpr i64 s[rank > 0 ? rank : 1] = {Ss...};
  __host__ __device__ static constexpr int outer() {
    i64 p = 1;
    int j = rank - 1;
    for (int k = rank - 1; k >= 0; --k) {
      if (STEP % p != 0) break;
      j = k;
      p *= d[k];
    }
    return j;
  }
  __host__ __device__ static constexpr bool merges(int j) {
    for (int k = 0; k < j; ++k) {
      if (d[k] == 1) continue;
      i64 want = s[j];
      for (int l = k + 1; l <= j; ++l) want *= d[l];
      if (s[k] != want) return false;
    }
    return true;
  }
  __host__ __device__ static constexpr i64 inner(int j) {
    i64 p = 1;
    for (int k = j + 1; k < rank; ++k) p *= d[k];
    return p;
  }
  static constexpr int j = outer();
  static constexpr bool uniform = rank > 0 && STEP > 0 && STEP % inner(j) == 0 && merges(j);
  static constexpr i64 delta = uniform ? (STEP / inner(j)) * s[j] : 0;
};
}  // namespace detail

// offset(i + STEP) == offset(i) + delta for every i with 0 <= i, i + STEP < size, when
// `uniform`: a loop that visits i, i + STEP, … computes the first offset and then adds.
template <class L, i64 STEP> struct Step {
  using U = detail::UniformStep<typename L::shape, typename L::stride, STEP>;
  static constexpr bool uniform = U::uniform;
  static constexpr i64 delta = U::delta;
};
// A swizzle keeps the step uniform when the step is a multiple of its period.
template <class L, int B, int M, int S, i64 STEP> struct Step<SwizzledLayout<L, Swizzle<B, M, S>>, STEP> {
  static constexpr bool uniform = Step<L, STEP>::uniform && Step<L, STEP>::delta % (1LL << (B + M + S)) == 0;
  static constexpr i64 delta = Step<L, STEP>::delta;
};

// Compile-time checks of the algebra (evaluated by every compiler that includes this file).
static_assert(Layout<Shape<3, 4>, Stride<4, 1>>::offset(5) == 5, "row-major");
static_assert(Layout<Shape<3, 4>, Stride<1, 3>>::offset(5) == 4, "column-major");
static_assert(Layout<Shape<2, 3, 4>, Stride<0, 4, 1>>::offset(13) == 1, "broadcast dim");
static_assert(Swizzle<3, 3, 3>::apply(64) == 72, "xor swizzle moves row 1 by one chunk");
static_assert(LayoutTraits<Layout<Shape<2, 3, 4>, Stride<12, 1, 3>>>::stride<2> == 3, "stride of dim 2");
static_assert(Swizzle<3, 3, 3>::apply(77 + 512) == Swizzle<3, 3, 3>::apply(77) + 512,
              "a step of the swizzle's period is an addition");
static_assert(Step<Layout<Shape<1, 64, 128>, Stride<262144, 4096, 1>>, 1024>::uniform &&
                  Step<Layout<Shape<1, 64, 128>, Stride<262144, 4096, 1>>, 1024>::delta == 8 * 4096,
              "a step of whole rows moves by rows");
static_assert(!Step<Layout<Shape<4, 64>, Stride<100, 1>>, 32>::uniform, "half rows of padded rows do not");
static_assert(Step<Layout<Shape<4, 64>, Stride<100, 1>>, 64>::delta == 100, "whole padded rows do");
static_assert(!Step<Layout<Shape<2, 4, 64>, Stride<1000, 64, 1>>, 128>::uniform, "rows of two blocks do not");
static_assert(Step<Layout<Shape<2, 4, 64>, Stride<256, 64, 1>>, 128>::delta == 128, "rows of a compact block do");
static_assert(Step<SwizzledLayout<Layout<Shape<1, 64, 128>, Stride<8192, 128, 1>>, Swizzle<3, 3, 4>>, 1024>::uniform,
              "a step of the swizzle's period stays uniform");
static_assert(!Step<SwizzledLayout<Layout<Shape<64, 64>, Stride<64, 1>>, Swizzle<3, 3, 3>>, 256>::uniform,
              "a step within the swizzle's period does not");

}  // namespace mucc
