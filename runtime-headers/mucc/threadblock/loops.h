// mucc runtime, threadblock level: how the threads of a block share work.
#pragma once

#include "../layout.h"
#include "../ops.h"

namespace mucc {
namespace tb {

// f(e, r) for every e = tid + r·NT < N: each thread takes a fixed share, the same in every
// call (so state kept per thread across loop iterations stays with its elements). Indices are
// 32-bit: N is the size of a tile (shared memory or registers). Precondition: 0 ≤ tid < NT.
// When NT divides N the bound holds for every r, so it is not tested: the body is straight-line
// code whose loads the compiler can issue together (a test per element hides that from it).
template <int NT, i64 N, class F> __device__ __forceinline__ void for_each(int tid, F f) {
  constexpr int R = static_cast<int>((N + NT - 1) / NT);
#pragma unroll 4
  for (int r = 0; r < R; ++r) {
    const int e = tid + r * NT;
    if (N % NT == 0 || e < N) f(e, r);
  }
}

// f(e) for every step e = V·(tid + r·NT) < N of V consecutive elements: a thread takes V
// neighbours at a time (one vector access per tile, `load_run` / `store_run`), consecutive
// threads consecutive steps. Precondition: V divides N (and the caller's rows), 0 ≤ tid < NT.
template <int NT, i64 N, int V, class F> __device__ __forceinline__ void for_each_step(int tid, F f) {
  static_assert(N % V == 0, "a step never crosses the end");
  constexpr i64 S = N / V;
  constexpr int R = static_cast<int>((S + NT - 1) / NT);
#pragma unroll 2
  for (int r = 0; r < R; ++r) {
    const int s = tid + r * NT;
    if (S % NT == 0 || s < S) f(s * V);
  }
}

// V consecutive elements of a tile, aligned to V·sizeof(T) (≤ 16 bytes): one vector load.
template <class T, int V> struct alignas(V * sizeof(T)) Run {
  T v[V];
};

// The V elements at `p` (aligned to V·sizeof(T)) in compute type C, by one vector load.
template <int V, class C> struct Loaded {
  C v[V];
  __device__ __forceinline__ C operator[](int j) const { return v[j]; }
};
template <int V, class C, class T> __device__ __forceinline__ Loaded<V, C> load_run(const T* p) {
  static_assert(V * sizeof(T) <= 16, "one vector access");
  const Run<T, V> r = *reinterpret_cast<const Run<T, V>*>(p);
  Loaded<V, C> out;
#pragma unroll
  for (int j = 0; j < V; ++j) out.v[j] = static_cast<C>(to_compute(r.v[j]));
  return out;
}

// Stores V compute values at `p` (aligned to V·sizeof(T)) in T, by one vector store.
template <int V, class T, class C> __device__ __forceinline__ void store_run(T* p, const C (&x)[V]) {
  static_assert(V * sizeof(T) <= 16, "one vector access");
  Run<T, V> r;
#pragma unroll
  for (int j = 0; j < V; ++j) r.v[j] = from_compute<T>(x[j]);
  *reinterpret_cast<Run<T, V>*>(p) = r;
}

// As for_each, fully unrolled: `r` is a compile-time index into per-thread register arrays.
template <int NT, i64 N, class F> __device__ __forceinline__ void for_each_unrolled(int tid, F f) {
  constexpr int R = static_cast<int>((N + NT - 1) / NT);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int e = tid + r * NT;
    if (N % NT == 0 || e < N) f(e, r);
  }
}

// How a row reduction combines its elements: `Add` sums from 0; `Max` keeps the largest from
// −∞, a NaN winning (as the f64 interpreter's max).
struct Add {
  template <class C> static __device__ __forceinline__ C start() { return C(0); }
  template <class C> static __device__ __forceinline__ C join(C a, C b) { return a + b; }
};
struct Max {
  template <class C> static __device__ __forceinline__ C start() { return neg_inf<C>(); }
  template <class C> static __device__ __forceinline__ C join(C a, C b) { return b > a || b != b ? b : a; }
};

// Reduction by OP (Add, Max) over groups of TPR consecutive lanes (TPR a power of two ≤ 32).
// Precondition: every lane of the warp calls it.
template <int TPR, class OP = Add, class C> __device__ __forceinline__ C group_sum(C x) {
#pragma unroll
  for (int o = TPR / 2; o > 0; o >>= 1) x = OP::join(x, __shfl_xor_sync(0xffffffffu, x, o));
  return x;
}

// Reduction by OP over groups of TPR consecutive threads of a block of NT threads. TPR ≤ 32:
// warp shuffles (every lane of the warp must call it). TPR > 32: warp shuffles, then the
// warps' partials meet in a small static shared array between two barriers, so every thread
// of the block must call it, in uniform control flow. Preconditions: TPR a power of two; NT a
// multiple of 32 when TPR > 1.
template <int NT, int TPR, class C, class OP = Add> __device__ __forceinline__ C block_group_sum(C x, int tid) {
  if constexpr (TPR <= 32) {
    (void)tid;
    return group_sum<TPR, OP>(x);
  } else {
    constexpr int NW = NT / 32, W = TPR / 32;
    __shared__ C partial[NW];
    x = group_sum<32, OP>(x);
    const int warp = tid / 32;
    if (tid % 32 == 0) partial[warp] = x;
    __syncthreads();
    const int first = (warp / W) * W;
    C s = OP::template start<C>();
#pragma unroll
    for (int w = 0; w < W; ++w) s = first + w < NW ? OP::join(s, partial[first + w]) : s;
    __syncthreads();  // the array is free for the next call
    return s;
  }
}

// Sums each of R values over a whole block of NT threads (NT a multiple of 32): warp shuffles,
// then the warps' partials meet in `scratch` (R · NT/32 values, used by this call only) after
// one barrier; every thread gets the R sums, all in the same order. Every thread of the block
// calls it in uniform control flow.
template <int NT, int R, class C>
__device__ __forceinline__ void block_sums(C (&x)[R], C* scratch, int tid) {
  constexpr int NW = NT / 32;
  static_assert(NT % 32 == 0, "whole warps");
#pragma unroll
  for (int r = 0; r < R; ++r) x[r] = group_sum<32>(x[r]);
  if (tid % 32 == 0) {
#pragma unroll
    for (int r = 0; r < R; ++r) scratch[r * NW + tid / 32] = x[r];
  }
  __syncthreads();
#pragma unroll
  for (int r = 0; r < R; ++r) {
    C s = C(0);
#pragma unroll
    for (int w = 0; w < NW; ++w) s += scratch[r * NW + w];
    x[r] = s;
  }
}

// Row reductions: groups of TPR threads take rows; for each row, s = OP over j < LEN of
// elem(row, j) (OP = Add: the sum; Max: the max), then sink(row, s) on the group's first
// thread. With V > 1, elem(row, j) gives OP over the V elements j, …, j + V − 1 (j a multiple
// of V: one vector load per tile), and consecutive threads of a group take consecutive runs.
// Preconditions: TPR is a power of two; NT a multiple of 32 when TPR > 1; with TPR > 32 every
// thread of the block calls it (see block_group_sum); LEN a multiple of V.
template <int NT, int TPR, i64 ROWS, i64 LEN, class C, int V = 1, class OP = Add, class E, class S>
__device__ __forceinline__ void for_each_row(int tid, E elem, S sink) {
  static_assert(LEN % V == 0, "whole runs of V elements");
  constexpr int G = NT / TPR;
  const int g = tid / TPR;
  const int lane = tid % TPR;
  for (int base = 0; base < ROWS; base += G) {
    const int row = base + g;
    C s = OP::template start<C>();
    if (row < ROWS) {
#pragma unroll 4
      for (int j = lane * V; j < LEN; j += TPR * V) s = OP::join(s, elem(row, j));
    }
    s = block_group_sum<NT, TPR, C, OP>(s, tid);
    if (row < ROWS && lane == 0) sink(row, s);
  }
}

// RMS-normalised rows: scale = 1 / sqrt(mean_j x(row, j)²); then out(row, j, x(row, j)·scale)
// for every element, and, when TOTAL, once per row on the group's first thread, done(row, Σ_j v)
// where v is what `out` returned. Preconditions: as for for_each_row.
template <int NT, int TPR, i64 ROWS, i64 LEN, bool TOTAL, class C, class X, class O, class D>
__device__ __forceinline__ void rms_rows(int tid, X x, O out, D done) {
  constexpr int G = NT / TPR;
  const int g = tid / TPR;
  const int lane = tid % TPR;
  for (int base = 0; base < ROWS; base += G) {
    const int row = base + g;
    C ss = C(0);
    if (row < ROWS) {
#pragma unroll 4
      for (int j = lane; j < LEN; j += TPR) {
        const C v = x(row, j);
        ss += v * v;
      }
    }
    ss = block_group_sum<NT, TPR>(ss, tid);
    C total = C(0);
    if (row < ROWS) {
      const C scale = C(1) / op::sqrt(ss / C(LEN));
#pragma unroll 4
      for (int j = lane; j < LEN; j += TPR) total += out(row, j, x(row, j) * scale);
    }
    if constexpr (TOTAL) {
      total = block_group_sum<NT, TPR>(total, tid);
      if (row < ROWS && lane == 0) done(row, total);
    } else {
      (void)total;
      (void)done;
    }
  }
}

}  // namespace tb
}  // namespace mucc
