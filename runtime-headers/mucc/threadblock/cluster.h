// mucc runtime, threadblock level, sm_90a only: a for-loop split over the CTAs of a cluster.
// Each CTA accumulates its share of the iterations into its own shared-memory tiles; after the
// loop CTA 0 folds the other CTAs' tiles into its own through distributed shared memory.
//
// Protocol (the generated kernel follows it; every thread of every CTA takes part):
//   cluster_sync();                    // every CTA's partial tiles are complete and visible
//   if (rank == 0) cluster_fold<...>(…) for each accumulator tile;
//   cluster_sync();                    // CTA 0 has read them: the others may exit
//   if (rank != 0) return;
//
// With pushes (the plan's slots in CTA 0's shared memory and its push mbarrier `push`):
//   before the loop: thread 0 initialises `push` (one arrival), fence_mbarrier_init; then
//   cluster_arrive_relaxed();          // every CTA: CTA 0's `push` is initialised
//   after the loop:
//   cluster_wait();                    // the pushes may start
//   __syncthreads();                   // this CTA's partial tiles are complete
//   if (rank != 0) { cluster_push<...>(…) for each accumulator tile; return; }
//   thread 0: mbar_arrive_expect_tx(push, bytes of every push); mbar_wait(push, 0);
//   cluster_fold_pushed<...>(…) for each accumulator tile;
//
// Split attention combined in its clusters (the CTAs of a cluster are the key splits of one
// block, each with its split's partials after the loop):
//   cluster_sync();                    // every CTA's (O, l, m) tiles are complete and visible
//   cluster_softmax_combine<...>(…);   // CTA r stores its share of the block's output rows
//   cluster_sync();                    // every CTA has read the others' tiles: all may exit
#pragma once

#include "../arch/sm90.h"
#include "../ops.h"
#include "accum.h"
#include "arrival.h"
#include "loops.h"

namespace mucc {
namespace sm90 {

// A value of this CTA's shared memory at `p`, read from CTA `rank` of the cluster.
__device__ __forceinline__ float ld_peer(const float* p, unsigned rank) {
  return ld_cluster_f32(map_rank(p, rank));
}
__device__ __forceinline__ double ld_peer(const double* p, unsigned rank) {
  double v;
  asm volatile("ld.shared::cluster.f64 %0, [%1];\n" : "=d"(v) : "r"(map_rank(p, rank)) : "memory");
  return v;
}

}  // namespace sm90

namespace tb {

// t[L(e)] = F(t[L(e)], peer_1[L(e)], …, peer_{CTAS-1}[L(e)]) for the N elements of a tile
// (T is float or double: partials are kept in the compute type), called by CTA 0's NT threads.
template <int NT, i64 N, int CTAS, class F, class L, class T> __device__ __forceinline__ void cluster_fold(int tid, T* t) {
  for_each<NT, N>(tid, [&](int e, int) {
    const auto o = L::offset(e);
    T v = t[o];
#pragma unroll
    for (int r = 1; r < CTAS; ++r) v = F::apply(v, sm90::ld_peer(t + o, r));
    t[o] = v;
  });
}

// CTA `rank` (≥ 1) of the cluster stores its tile t (N elements at L) into its slot of CTA 0's
// shared memory: the slot of rank r at `slots` + (r − 1)·STRIDE bytes, laid out as t, where
// `slots` and `push` (the push mbarrier) are addresses of this CTA's shared memory that stand for
// the same offsets in CTA 0. Each store completes its bytes on CTA 0's `push`; called by the
// CTA's NT threads, which may then leave.
template <int NT, i64 N, i64 STRIDE, class L, class T>
__device__ __forceinline__ void cluster_push(int tid, const T* t, const void* slots, u64* push, unsigned rank) {
  const unsigned base = sm90::map_rank(slots, 0) + (rank - 1) * static_cast<unsigned>(STRIDE);
  const unsigned bar = sm90::map_rank(push, 0);
  for_each<NT, N>(tid, [&](int e, int) {
    const auto o = L::offset(e);
    sm90::st_async(base + static_cast<unsigned>(o * sizeof(T)), t[o], bar);
  });
}

// In CTA 0, once the pushes are complete: t[L(e)] = F(t[L(e)], slot_1[L(e)], …,
// slot_{CTAS-1}[L(e)]) for the N elements of its tile, slot r at `slots` + (r − 1)·STRIDE bytes
// (the same order, and so the same rounding, as cluster_fold).
template <int NT, i64 N, int CTAS, i64 STRIDE, class F, class L, class T>
__device__ __forceinline__ void cluster_fold_pushed(int tid, T* t, const void* slots) {
  const unsigned char* s = static_cast<const unsigned char*>(slots);
  for_each<NT, N>(tid, [&](int e, int) {
    const auto o = L::offset(e);
    T v = t[o];
#pragma unroll
    for (int r = 1; r < CTAS; ++r) v = F::apply(v, reinterpret_cast<const T*>(s + (r - 1) * STRIDE)[o]);
    t[o] = v;
  });
}

// An online-softmax partial (rows of N elements, a rescaled row sum or output): every CTA's
// rows times exp(m_r − M), m_r that CTA's running max of the row (tile `m`, layout LM, one
// element per row) and M the largest of them, summed into CTA 0's tile. It reads CTA 0's `m`:
// the max tile itself is folded after every such partial (and a barrier).
template <int NT, i64 E, i64 N, int CTAS, class L, class LM, class T>
__device__ __forceinline__ void cluster_fold_rescaled(int tid, T* t, const T* m) {
  const T ninf = -T(__int_as_float(0x7f800000));
  for_each<NT, E>(tid, [&](int e, int) {
    const auto om = LM::offset(e / static_cast<int>(N));
    T mr[CTAS];
    mr[0] = m[om];
    T mx = mr[0];
#pragma unroll
    for (int r = 1; r < CTAS; ++r) {
      mr[r] = sm90::ld_peer(m + om, r);
      mx = max_of(mx, mr[r]);
    }
    const auto o = L::offset(e);
    T v = 0;
#pragma unroll
    for (int r = 0; r < CTAS; ++r) {
      const T x = r == 0 ? t[o] : sm90::ld_peer(t + o, r);
      v += mr[r] == ninf ? T(0) : x * T(op::exp_approx_ftz(mr[r] - mx));
    }
    t[o] = v;
  });
}

// The combining step of split attention by the CTAS CTAs of a cluster, one key split each: after
// its loop every CTA holds its split's O (tile `o`, ROWS × D, layout LO), row sums `l` and running
// row maxima `m` (layouts LL, LM: one element per row), all in the compute type T. CTA `rank`
// takes rows [rank·RPC, (rank + 1)·RPC) of the ROWS: per row, M the largest of the CTAs' m and
// w_r = exp(m_r − M), it stores Σ_r w_r·O_r / Σ_r w_r·l_r as Y at `y` (layout LY over ROWS × D).
// A thread takes one element per step (a warp's loads of O are then 32 consecutive elements of a
// row: several elements per thread made each load span several lines, measured slower) and issues
// every load of the step (each CTA's m, l and O) before it uses any. The same arithmetic as
// kn::softmax_combine, on the f32 partials instead of stored ones.
template <int NT, i64 ROWS, i64 D, int CTAS, i64 RPC, class LO, class LL, class LM, class LY, class T, class Y>
__device__ __forceinline__ void cluster_softmax_combine(int tid, const T* o, const T* l, const T* m, Y* __restrict__ y) {
  static_assert(RPC * CTAS >= ROWS, "the CTAs' rows cover the tile");
  const i64 first = static_cast<i64>(sm90::cluster_rank()) * RPC;
  for (i64 s = tid; s < RPC * D; s += NT) {
    const i64 row = first + s / D, j = s % D;
    if (row >= ROWS) break;
    T mr[CTAS], lr[CTAS], or_[CTAS];
#pragma unroll
    for (int r = 0; r < CTAS; ++r) {
      mr[r] = sm90::ld_peer(m + LM::offset(row), r);
      lr[r] = sm90::ld_peer(l + LL::offset(row), r);
      or_[r] = sm90::ld_peer(o + LO::offset(row * D + j), r);
    }
    T top = mr[0];
#pragma unroll
    for (int r = 1; r < CTAS; ++r) top = max_of(top, mr[r]);
    T num = 0, den = 0;
#pragma unroll
    for (int r = 0; r < CTAS; ++r) {
      const T w = op::exp(mr[r] - top);
      den += w * lr[r];
      num += w * or_[r];
    }
    y[LY::offset(row * D + j)] = from_compute<Y>(num / den);
  }
}

}  // namespace tb
}  // namespace mucc
