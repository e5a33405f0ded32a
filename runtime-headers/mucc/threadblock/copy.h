// mucc runtime, threadblock level: copies between a device tensor and a shared-memory tile.
// DL and SL are the layouts of the destination and the source over the tile's N elements, in
// the walk order the plan chose (consecutive threads take consecutive elements of its last dim).
#pragma once

#include "../arch/sm80.h"
#include "loops.h"

namespace mucc {
namespace tb {

template <class A, class B> struct Same {
  static constexpr bool value = false;
};
template <class A> struct Same<A, A> {
  static constexpr bool value = true;
};

// f(dst + DL(i), src + SL(i)) for the first element i of every chunk of CHUNK elements, chunks
// spread over the threads as for_each does. When a thread's step (NT chunks) moves both
// layouts' offsets uniformly (`Step`), its first offsets are computed once and the others are
// additions of constants.
template <int NT, i64 N, int CHUNK, class DL, class SL, class TD, class TS, class F>
__device__ __forceinline__ void for_each_chunk(int tid, TD* dst, TS* src, F f) {
  using SD = Step<DL, static_cast<i64>(NT) * CHUNK>;
  using SS = Step<SL, static_cast<i64>(NT) * CHUNK>;
  if constexpr (SD::uniform && SS::uniform && N / CHUNK > NT) {
    TD* d = dst + DL::offset(tid * CHUNK);
    TS* s = src + SL::offset(tid * CHUNK);
    for_each<NT, N / CHUNK>(tid, [&](int, int r) { f(d + r * SD::delta, s + r * SS::delta); });
  } else {
    for_each<NT, N / CHUNK>(tid, [&](int c, int) {
      const int i = c * CHUNK;
      f(dst + DL::offset(i), src + SL::offset(i));
    });
  }
}

// dst[DL(i)] = src[SL(i)] in chunks of CHUNK elements, one vector load and store per chunk.
// Preconditions: CHUNK·sizeof(T) is 16, 8 or 4 bytes; N a multiple of CHUNK; both layouts keep
// each chunk contiguous and aligned to its size (the plan's chunked copies guarantee it).
template <int NT, i64 N, int CHUNK, class DL, class SL, class T>
__device__ __forceinline__ void copy_chunks(int tid, T* dst, const T* src) {
  for_each_chunk<NT, N, CHUNK, DL, SL>(tid, dst, src, [](T* d, const T* s) {
    *reinterpret_cast<Vec<T, CHUNK>*>(d) = *reinterpret_cast<const Vec<T, CHUNK>*>(s);
  });
}

// dst[DL(i)] = src[SL(i)] in chunks of CHUNK elements between types: one vector load of CHUNK
// source elements (a wider type: an fp32 accumulator tile), each converted through the compute
// type (rounding once, as copy_elems does), one vector store of CHUNK destination elements.
// Preconditions: as copy_chunks, each side's chunk contiguous and aligned to its own size
// (the plan keeps CHUNK·sizeof(TS) at 16 bytes or less: one vector load).
template <int NT, i64 N, int CHUNK, class DL, class SL, class TD, class TS>
__device__ __forceinline__ void copy_chunks_cvt(int tid, TD* dst, const TS* src) {
  for_each_chunk<NT, N, CHUNK, DL, SL>(tid, dst, src, [](TD* d, const TS* s) {
    const Vec<TS, CHUNK> x = *reinterpret_cast<const Vec<TS, CHUNK>*>(s);
    Vec<TD, CHUNK> y;
#pragma unroll
    for (int c = 0; c < CHUNK; ++c) y.v[c] = from_compute<TD>(to_compute(x.v[c]));
    *reinterpret_cast<Vec<TD, CHUNK>*>(d) = y;
  });
}

// As copy_chunks, global → shared with cp.async (chunks of 16, 8 or 4 bytes): the copies are
// queued in this thread's current cp.async group. Preconditions: as copy_chunks; dst in shared
// memory.
template <int NT, i64 N, int CHUNK, class DL, class SL, class T>
__device__ __forceinline__ void cp_async_chunks(int tid, T* dst, const T* src) {
  for_each_chunk<NT, N, CHUNK, DL, SL>(tid, dst, src, [](T* d, const T* s) {
    sm80::cp_async<CHUNK * static_cast<int>(sizeof(T))>(d, s);
  });
}

// dst[DL(e)] = src[SL(e)] element by element; between different types through the compute
// type, rounding once (fp32 accumulator tiles stored as the graph's type).
template <int NT, i64 N, class DL, class SL, class TD, class TS>
__device__ __forceinline__ void copy_elems(int tid, TD* dst, const TS* src) {
  for_each<NT, N>(tid, [&](int e, int) {
    if constexpr (Same<TD, TS>::value) {
      dst[DL::offset(e)] = src[SL::offset(e)];
    } else {
      dst[DL::offset(e)] = from_compute<TD>(to_compute(src[SL::offset(e)]));
    }
  });
}

}  // namespace tb
}  // namespace mucc
