// mucc runtime, threadblock level: how the threads of a block share work.
#pragma once

#include "../layout.h"
#include "../ops.h"

namespace mucc {
namespace tb {

// f(e, r) for every e = tid + r·NT < N: each thread takes a fixed share, the same in every
// call (so state kept per thread across loop iterations stays with its elements). Indices are
// 32-bit: N is the size of a tile (shared memory or registers).
template <int NT, i64 N, class F> __device__ __forceinline__ void for_each(int tid, F f) {
  constexpr int R = static_cast<int>((N + NT - 1) / NT);
#pragma unroll 4
  for (int r = 0; r < R; ++r) {
    const int e = tid + r * NT;
    if (e < N) f(e, r);
  }
}

// As for_each, fully unrolled: `r` is a compile-time index into per-thread register arrays.
template <int NT, i64 N, class F> __device__ __forceinline__ void for_each_unrolled(int tid, F f) {
  constexpr int R = static_cast<int>((N + NT - 1) / NT);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int e = tid + r * NT;
    if (e < N) f(e, r);
  }
}

// Sum over groups of TPR consecutive lanes (TPR a power of two ≤ 32). Precondition: every lane
// of the warp calls it.
template <int TPR, class C> __device__ __forceinline__ C group_sum(C x) {
#pragma unroll
  for (int o = TPR / 2; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
  return x;
}

// Row reductions: groups of TPR threads take rows; for each row, s = Σ_j elem(row, j) over
// j < LEN, then sink(row, s) on the group's first thread.
// Preconditions: TPR is a power of two dividing 32, and NT a multiple of 32 when TPR > 1.
template <int NT, int TPR, i64 ROWS, i64 LEN, class C, class E, class S>
__device__ __forceinline__ void for_each_row(int tid, E elem, S sink) {
  constexpr int G = NT / TPR;
  const int g = tid / TPR;
  const int lane = tid % TPR;
  for (int base = 0; base < ROWS; base += G) {
    const int row = base + g;
    C s = C(0);
    if (row < ROWS) {
      for (int j = lane; j < LEN; j += TPR) s += elem(row, j);
    }
    s = group_sum<TPR>(s);
    if (row < ROWS && lane == 0) sink(row, s);
  }
}

// RMS-normalised rows: scale = 1 / sqrt(mean_j x(row, j)²); then out(row, j, x(row, j)·scale)
// for every element, and, once per row on the group's first thread, done(row, Σ_j v) where v is
// what `out` returned. Preconditions: as for for_each_row.
template <int NT, int TPR, i64 ROWS, i64 LEN, class C, class X, class O, class D>
__device__ __forceinline__ void rms_rows(int tid, X x, O out, D done) {
  constexpr int G = NT / TPR;
  const int g = tid / TPR;
  const int lane = tid % TPR;
  for (int base = 0; base < ROWS; base += G) {
    const int row = base + g;
    C ss = C(0);
    if (row < ROWS) {
      for (int j = lane; j < LEN; j += TPR) {
        const C v = x(row, j);
        ss += v * v;
      }
    }
    ss = group_sum<TPR>(ss);
    C total = C(0);
    if (row < ROWS) {
      const C scale = C(1) / op::sqrt(ss / C(LEN));
      for (int j = lane; j < LEN; j += TPR) total += out(row, j, x(row, j) * scale);
    }
    total = group_sum<TPR>(total);
    if (row < ROWS && lane == 0) done(row, total);
  }
}

}  // namespace tb
}  // namespace mucc
