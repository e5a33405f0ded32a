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

}  // namespace tb
}  // namespace mucc
