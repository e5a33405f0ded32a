// mucc runtime, threadblock level: work done by the last block of a group to finish. The blocks
// of a group (the key splits of one block of query rows) each store their partial results to
// device memory and arrive on the group's counter; the one that arrives last combines the
// group's partials. No block waits for another.
//
//   if (arrive_last<S>(tid, counter)) combine_splits<...>(…);
//
// The counter is a u32 in the workspace: zero before the first launch; the last block of the
// group sets it back to zero, so every launch finds it so.
//
// A grid split (the for-loop of one block shared by S CTAs that need not run at once) uses the
// same counter, one per block: every CTA stores its partial accumulator tiles into its slots
// in the workspace, then
//
//   if (!arrive_last<S>(tid, counter)) return;
//   fold_partials<...>(…) for each accumulator tile;   // slot 0, 1, …, S − 1 in this order
//
// so the folded value does not depend on which CTA arrives last.
#pragma once

#include "accum.h"
#include "loops.h"

namespace mucc {
namespace tb {

// How partial accumulators combine.
struct FoldSum {
  template <class T> __device__ __forceinline__ static T apply(T a, T b) { return a + b; }
};
struct FoldMax {
  template <class T> __device__ __forceinline__ static T apply(T a, T b) { return max_of(a, b); }
};

// Called by all threads of the block after their stores of its partials. Thread 0 releases
// them (the fence orders every thread's stores, which the barrier ordered before it, before
// the increment) and takes the count; the block that brings it to S acquires the other blocks'
// partials (the fence after its increment), resets the counter and returns true in every
// thread; the others return false.
template <int S>
__device__ __forceinline__ bool arrive_last(int tid, unsigned* counter) {
  __syncthreads();
  int last = 0;
  if (tid == 0) {
    __threadfence();
    last = atomicAdd(counter, 1u) == static_cast<unsigned>(S - 1);
    if (last) {
      __threadfence();
      atomicExch(counter, 0u);
    }
  }
  return __syncthreads_or(last) != 0;
}

// A grid split's CTA stores its partial tile t (N elements of shared memory at L) into its slot
// of the workspace, in row-major order, past the L1 cache (the CTA that folds it may run on
// another SM). Called by the CTA's NT threads before arrive_last.
template <int NT, i64 N, class L, class T>
__device__ __forceinline__ void store_partial(int tid, const T* t, T* slot) {
  for_each<NT, N>(tid, [&](int e, int) { __stcg(slot + e, t[L::offset(e)]); });
}

// The last CTA of a grid split's block (after arrive_last): t[L(e)] = F(slot_0[e], slot_1[e],
// …, slot_{S-1}[e]) for the N elements of its tile, slot r at `slots` + r·N, read past the L1
// cache, always in this order (the same rounding whichever CTA folds).
template <int NT, i64 N, int S, class F, class L, class T>
__device__ __forceinline__ void fold_partials(int tid, T* t, const T* slots) {
  for_each<NT, N>(tid, [&](int e, int) {
    T v = __ldcg(slots + e);
#pragma unroll
    for (int r = 1; r < S; ++r) v = F::apply(v, __ldcg(slots + r * N + e));
    t[L::offset(e)] = v;
  });
}

// The combination of S key splits' partials stored by the blocks of a group: split s's O (ROWS
// rows of D, layout LO) at o + s·OS, its row sums at l + s·LS and row maxima at m + s·MS (one
// element per row, layouts LL and LM). Per row, M the largest m and w_s = exp(m_s − M):
// y = Σ_s w_s·O_s / Σ_s w_s·l_s (layout LY), in the compute type: the arithmetic of
// kn::softmax_combine. The NT threads take VEC consecutive elements of a row at a time, and
// issue every load of a step before using any.
// Preconditions: VEC divides D; with VEC > 1 both O and y are contiguous along the row, and
// every row of them starts VEC-aligned.
template <int NT, i64 ROWS, i64 D, int S, int VEC, class LO, class LL, class LM, class LY, class T>
__device__ __forceinline__ void combine_splits(int tid, const T* o, i64 os, const T* l, i64 ls, const T* m, i64 ms,
                                               T* __restrict__ y) {
  using C = Compute<T>;
  static_assert(D % VEC == 0, "VEC must divide D");
  static_assert(LO::size == ROWS * D && LY::size == ROWS * D, "O and y: ROWS rows of D");
  static_assert(LL::size == ROWS && LM::size == ROWS, "l and m: one element per row");
  constexpr i64 PER_ROW = D / VEC;
  for (i64 e = tid; e < ROWS * PER_ROW; e += NT) {
    const i64 row = e / PER_ROW, j = (e % PER_ROW) * VEC;
    C mr[S], lr[S];
    Vec<T, VEC> ov[S];
#pragma unroll
    for (int s = 0; s < S; ++s) {
      mr[s] = to_compute(m[s * ms + LM::offset(row)]);
      lr[s] = to_compute(l[s * ls + LL::offset(row)]);
      ov[s] = *reinterpret_cast<const Vec<T, VEC>*>(o + s * os + LO::offset(row * D + j));
    }
    C top = mr[0];
#pragma unroll
    for (int s = 1; s < S; ++s) top = mr[s] > top ? mr[s] : top;
    C den = C(0);
    C acc[VEC];
#pragma unroll
    for (int v = 0; v < VEC; ++v) acc[v] = C(0);
#pragma unroll
    for (int s = 0; s < S; ++s) {
      const C w = op::exp(mr[s] - top);
      den += w * lr[s];
#pragma unroll
      for (int v = 0; v < VEC; ++v) acc[v] += w * to_compute(ov[s].v[v]);
    }
    Vec<T, VEC> out;
#pragma unroll
    for (int v = 0; v < VEC; ++v) out.v[v] = from_compute<T>(acc[v] / den);
    *reinterpret_cast<Vec<T, VEC>*>(y + LY::offset(row * D + j)) = out;
  }
}

}  // namespace tb
}  // namespace mucc
