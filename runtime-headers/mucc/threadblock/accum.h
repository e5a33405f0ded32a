// mucc runtime, threadblock level: accumulator updates and tile-wide fills. Updates of a tile
// element convert through the compute type C (a tile may hold the graph's 16-bit type when the
// loop runs once), so they compile for every element type and round once.
#pragma once

#include "loops.h"

namespace mucc {
namespace tb {

// The larger of a and v; a NaN v is kept, a NaN a is replaced (Mirage's running max).
template <class C> __device__ __forceinline__ C max_of(C a, C v) { return a > v ? a : v; }

// slot += v.
template <class T, class C> __device__ __forceinline__ void acc_add(T& slot, C v) {
  slot = from_compute<T>(to_compute(slot) + v);
}
// slot = max(slot, v).
template <class T, class C> __device__ __forceinline__ void acc_max(T& slot, C v) {
  slot = from_compute<T>(max_of(to_compute(slot), v));
}
// slot = slot·scale + v.
template <class T, class C> __device__ __forceinline__ void acc_rescale(T& slot, C scale, C v) {
  slot = from_compute<T>(to_compute(slot) * scale + v);
}

// t[L(e)] = v for every element of a tile of N elements.
template <int NT, i64 N, class L, class T, class C> __device__ __forceinline__ void fill(int tid, T* t, C v) {
  for_each<NT, N>(tid, [&](int e, int) { t[L::offset(e)] = from_compute<T>(v); });
}

// Running max over a for-loop, for OUTS outputs of K elements each (element k of output o at
// (o / INNER)·K·INNER + o % INNER + k·INNER of x): state = max(state, max_k x), and
// diff = old state − new state (0 when unchanged). A NaN in x or in the state wins.
template <int NT, i64 OUTS, i64 K, i64 INNER, class LX, class L0, class L1, class TX, class T0, class T1>
__device__ __forceinline__ void running_max(int tid, const TX* x, T0* state, T1* diff) {
  using C = Compute<TX>;
  for_each<NT, OUTS>(tid, [&](int o, int) {
    const int base = (o / INNER) * (K * INNER) + o % INNER;
    C m = neg_inf<C>();
    for (int k = 0; k < K; ++k) {
      const C v = to_compute(x[LX::offset(base + k * INNER)]);
      m = v > m || v != v ? v : m;
    }
    const C old = to_compute(state[L0::offset(o)]);
    const C now = m > old || m != m ? m : old;
    state[L0::offset(o)] = from_compute<T0>(now);
    diff[L1::offset(o)] = from_compute<T1>(old == now ? C(0) : old - now);
  });
}

}  // namespace tb
}  // namespace mucc
