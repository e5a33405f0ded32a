// mucc runtime, threadblock level: an all-reduce (sum over the GPUs of a multi-GPU plan) fused
// into the kernel that produces its input, through peer-mapped exchange buffers.
//
// Every GPU (rank) owns one exchange buffer that every rank can address (`x[r]` is rank r's,
// `x[rank]` this GPU's own). An all-reduce has a region at byte `R` of every buffer:
//   R + 0          u64 ticket: blocks of this kernel done on this rank, over all executions
//   R + HEADER + (p·N + r)·SLOT   rank r's values for an execution with parity p, one 8-byte
//                  word per element: the value's bits in the low half, the execution's flag in
//                  the high half (written by rank r's blocks with single 8-byte stores)
// Protocol of execution E (E = ticket / BLOCKS read at the kernel's start: no block of this
// execution has counted itself yet; p = E & 1, flag = E + 1):
//   1. every block writes its tile of the all-reduce's input as usual, and each element also
//      as a (value, flag) word into slot (p, rank) of every rank, its own included (`copy_ll`);
//   2. after a block barrier the block's thread 0 counts itself on the ticket; the last HELPERS
//      blocks to do so each sum a share of the elements in rank order, re-reading every word
//      until it carries this execution's flag.
// A word is data and flag at once (single-copy atomic), so no fence or handshake is needed,
// within a GPU or across GPUs. Summing blocks wait only for stores of blocks that never wait,
// and at most HELPERS blocks wait at once, so the protocol cannot deadlock while HELPERS is
// below the blocks a GPU holds. Two parities keep a rank that runs ahead from overwriting words
// another rank still reads: it cannot run two executions ahead, because it reads this rank's
// words of the next one. Every element must be written in every execution (the plan fuses only
// dense layouts). A wait longer than MUCC_EXCHANGE_TIMEOUT_NS (a rank that never arrives)
// traps instead of hanging.
#pragma once

#include "../types.h"
#include "loops.h"

#ifndef MUCC_EXCHANGE_TIMEOUT_NS
#define MUCC_EXCHANGE_TIMEOUT_NS 10000000000ull
#endif

namespace mucc {
namespace xchg {

// Bytes of a region before its first slot.
constexpr int HEADER = 256;

__device__ __forceinline__ u64 globaltimer() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void st_volatile(u64* p, u64 w) {
  asm volatile("st.volatile.global.u64 [%0], %1;" ::"l"(p), "l"(w) : "memory");
}

__device__ __forceinline__ u64 ld_volatile(const u64* p) {
  u64 w;
  asm volatile("ld.volatile.global.u64 %0, [%1];" : "=l"(w) : "l"(p) : "memory");
  return w;
}

// The execution this block belongs to (read once, at the kernel's start).
template <int BLOCKS>
__device__ __forceinline__ u64 epoch(unsigned char* const* x, int rank, long long R) {
  return ld_volatile(reinterpret_cast<const u64*>(x[rank] + R)) / BLOCKS;
}

// Rank r's slot of parity `parity` in region R of buffer `base`: one word per element.
template <int N, long long SLOT>
__device__ __forceinline__ u64* slot(unsigned char* base, long long R, u64 parity, int r) {
  return reinterpret_cast<u64*>(base + R + HEADER + (static_cast<long long>(parity) * N + r) * SLOT);
}

// A value's bits, and back.
__device__ __forceinline__ unsigned bits(f16 v) { return __half_as_ushort(v); }
__device__ __forceinline__ unsigned bits(bf16 v) { return __bfloat16_as_ushort(v); }
__device__ __forceinline__ unsigned bits(float v) { return __float_as_uint(v); }
template <class T> __device__ __forceinline__ T from_bits(unsigned b);
template <> __device__ __forceinline__ f16 from_bits<f16>(unsigned b) {
  return __ushort_as_half(static_cast<unsigned short>(b));
}
template <> __device__ __forceinline__ bf16 from_bits<bf16>(unsigned b) {
  return __ushort_as_bfloat16(static_cast<unsigned short>(b));
}
template <> __device__ __forceinline__ float from_bits<float>(unsigned b) { return __uint_as_float(b); }

// The word carrying value v with `flag`, and its value.
template <class T> __device__ __forceinline__ u64 word(T v, unsigned flag) {
  return (static_cast<u64>(flag) << 32) | bits(v);
}
template <class T> __device__ __forceinline__ T value(u64 w) {
  return from_bits<T>(static_cast<unsigned>(w));
}

// dst[DL(e)] = (src[SL(e)] stored as T, flag) for the N elements of a tile: the copy_elems of
// an output tile, into another rank's slot.
template <int NT, i64 N, class DL, class SL, class T, class TS>
__device__ __forceinline__ void copy_ll(int tid, u64* dst, const TS* src, unsigned flag) {
  tb::for_each<NT, N>(tid, [&](int e, int) {
    st_volatile(dst + DL::offset(e), word<T>(from_compute<T>(to_compute(src[SL::offset(e)])), flag));
  });
}

// Step 2, called by all NT threads of every block after its stores. `recv` is the all-reduce's
// output (COUNT elements of T); every element of the input has been written as words into
// every rank's slot, this rank's own included.
template <class T, int N, int NT, int BLOCKS, int HELPERS, long long COUNT, long long SLOT>
__device__ __forceinline__ void arrive_and_sum(int tid, unsigned char* const* x, int rank, long long R,
                                               u64 e, T* recv) {
  static_assert(HELPERS >= 1 && HELPERS <= BLOCKS && HELPERS < 32, "helpers among the blocks");
  unsigned char* own = x[rank];
  int helper = -1;
  __syncthreads();  // every thread's stores are issued
  if (tid == 0) {
    // No fence: the words carry their own validity.
    const u64 pos = atomicAdd(reinterpret_cast<unsigned long long*>(own + R), 1ull) - e * BLOCKS;
    if (pos >= static_cast<u64>(BLOCKS - HELPERS)) helper = static_cast<int>(pos - (BLOCKS - HELPERS));
  }
  // Thread 0's helper index, to every thread of the block (no shared memory: one barrier per
  // bit of helper + 1, which is below 32).
  int code = 0;
#pragma unroll
  for (int b = 0; b < 5; ++b)
    if (__syncthreads_or(tid == 0 && (((helper + 1) >> b) & 1))) code |= 1 << b;
  const int hi = code - 1;
  if (hi < 0) return;
  const unsigned flag = static_cast<unsigned>(e + 1);
  const u64 parity = e & 1;
  const u64* words[N];
#pragma unroll
  for (int r = 0; r < N; ++r) words[r] = slot<N, SLOT>(own, R, parity, r);
  // This helper's share, U elements per thread in flight: every load of a batch is issued
  // before any is waited for.
  constexpr long long SHARE = (COUNT + HELPERS - 1) / HELPERS;
  const long long lo = static_cast<long long>(hi) * SHARE;
  const long long end = lo + SHARE < COUNT ? lo + SHARE : COUNT;
  constexpr int U = 8;
  const u64 start = globaltimer();
  for (long long i0 = lo + tid; i0 < end; i0 += static_cast<long long>(NT) * U) {
    u64 w[N][U];
#pragma unroll
    for (int r = 0; r < N; ++r)
#pragma unroll
      for (int u = 0; u < U; ++u) {
        const long long i = i0 + static_cast<long long>(u) * NT;
        w[r][u] = i < end ? ld_volatile(words[r] + i) : static_cast<u64>(flag) << 32;
      }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const long long i = i0 + static_cast<long long>(u) * NT;
      float acc = 0.f;
#pragma unroll
      for (int r = 0; r < N; ++r) {
        while (static_cast<unsigned>(w[r][u] >> 32) != flag) {
          if (globaltimer() - start > MUCC_EXCHANGE_TIMEOUT_NS) __trap();  // a rank never came
          w[r][u] = ld_volatile(words[r] + i);
        }
        acc += to_compute(value<T>(w[r][u]));
      }
      if (i < end) recv[i] = from_compute<T>(acc);
    }
  }
}

}  // namespace xchg
}  // namespace mucc
