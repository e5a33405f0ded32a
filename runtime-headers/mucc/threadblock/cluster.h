// mucc runtime, threadblock level, sm_90a only: a for-loop split over the CTAs of a cluster.
// Each CTA accumulates its share of the iterations into its own shared-memory tiles; after the
// loop CTA 0 folds the other CTAs' tiles into its own through distributed shared memory.
//
// Protocol (the generated kernel follows it; every thread of every CTA takes part):
//   cluster_sync();                    // every CTA's partial tiles are complete and visible
//   if (rank == 0) cluster_fold<...>(…) for each accumulator tile;
//   cluster_sync();                    // CTA 0 has read them: the others may exit
//   if (rank != 0) return;
#pragma once

#include "../arch/sm90.h"
#include "../ops.h"
#include "accum.h"
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

// How partial accumulators combine.
struct FoldSum {
  template <class T> __device__ __forceinline__ static T apply(T a, T b) { return a + b; }
};
struct FoldMax {
  template <class T> __device__ __forceinline__ static T apply(T a, T b) { return max_of(a, b); }
};

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

}  // namespace tb
}  // namespace mucc
