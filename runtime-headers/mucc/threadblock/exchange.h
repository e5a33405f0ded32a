// mucc runtime, threadblock level: an all-reduce (sum over the GPUs of a multi-GPU plan) fused
// into the kernel that produces its input, through peer-mapped exchange buffers.
//
// Every GPU (rank) owns one exchange buffer that every rank can address (`x[r]` is rank r's,
// `x[rank]` this GPU's own). An all-reduce has a region at byte `R` of every buffer:
//   R + 0          u64 epoch: executions of this kernel completed on this rank
//   R + 8          u32 ticket: blocks of the current execution done on this rank
//   R + 64 + 8·r   u64 arrivals from rank r: blocks of rank r that have sent their tile here,
//                  over all executions so far
//   R + 256 + (p·N + r)·SLOT   rank r's tiles of an execution with parity p (written by rank r)
// Protocol of one execution (E = the epoch read at the kernel's start, p = E & 1):
//   1. every block writes its tile of the all-reduce's input as usual and also into slot
//      (p, rank) of every other rank's region (remote stores);
//   2. after a block barrier, the block's thread 0 adds 1 to its arrivals on every other rank
//      (a remote reduction with release semantics at system scope, which orders the whole
//      block's stores before it) and takes a ticket here (after a device-scope fence);
//   3. the block taking the last ticket waits until every other rank's arrivals here reach
//      (E + 1)·BLOCKS (acquire), then sums the ranks' values in rank order (its own from the
//      input tensor, the others' from the slots) into the all-reduce's output, and counts the
//      execution (epoch).
// Only the last block waits, and it waits for blocks of *other* GPUs that wait for nothing, so
// the protocol cannot deadlock whatever the number of resident blocks. Two parities keep a rank
// that runs ahead into its next execution from overwriting slots another rank still reads: it
// cannot run two executions ahead, because each execution waits for every rank's blocks. A wait
// longer than MUCC_EXCHANGE_TIMEOUT_NS (a rank that never arrives) traps instead of hanging.
#pragma once

#include "../types.h"

#ifndef MUCC_EXCHANGE_TIMEOUT_NS
#define MUCC_EXCHANGE_TIMEOUT_NS 10000000000ull
#endif

namespace mucc {
namespace xchg {

// Bytes before the first slot of a region.
constexpr int HEADER = 256;

__device__ __forceinline__ u64 globaltimer() {
  u64 t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ __forceinline__ void red_release_sys(u64* p, u64 v) {
  asm volatile("red.release.sys.global.add.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ u64 ld_acquire_sys(const u64* p) {
  u64 v;
  asm volatile("ld.acquire.sys.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

// The epoch of region `R` of this rank's buffer (read once per block, before its ticket).
__device__ __forceinline__ u64 epoch(unsigned char* const* x, int rank, long long R) {
  return *reinterpret_cast<volatile u64*>(x[rank] + R);
}

// An unsigned type of B bytes (the unit a sum step moves).
template <int B> struct Bits;
template <> struct Bits<2> { using type = unsigned short; };
template <> struct Bits<4> { using type = unsigned; };
template <> struct Bits<8> { using type = uint2; };
template <> struct Bits<16> { using type = uint4; };

// Rank r's slot of parity `parity` in region R of buffer `base`: where rank r's tiles land.
template <class T, int N, long long SLOT>
__device__ __forceinline__ T* slot(unsigned char* base, long long R, u64 parity, int r) {
  return reinterpret_cast<T*>(base + R + HEADER + (static_cast<long long>(parity) * N + r) * SLOT);
}

// Steps 2 and 3, called by all NT threads of a block after their stores.
// `send` and `recv` are the all-reduce's input and output (COUNT elements of T, the same layout,
// possibly one buffer); VEC elements move per access (the plan aligned them).
template <class T, int N, int NT, int BLOCKS, long long COUNT, int VEC, long long SLOT>
__device__ __forceinline__ void arrive_and_sum(int tid, unsigned char* const* x, int rank, long long R,
                                               u64 e, const T* send, T* recv) {
  unsigned char* own = x[rank];
  int last_here = 0;
  __syncthreads();  // every thread's stores are issued
  if (tid == 0) {
#pragma unroll 1
    for (int r = 0; r < N; ++r)
      if (r != rank) red_release_sys(reinterpret_cast<u64*>(x[r] + R + 64 + 8 * rank), 1);
    __threadfence();  // this block's stores of the input before its ticket
    const unsigned t = atomicAdd(reinterpret_cast<unsigned*>(own + R + 8), 1u);
    if (t == BLOCKS - 1) {
      last_here = 1;
      __threadfence();  // every block's stores of the input (their fences precede their tickets)
      *reinterpret_cast<volatile unsigned*>(own + R + 8) = 0u;
      const u64 want = (e + 1) * static_cast<u64>(BLOCKS);
      const u64 start = globaltimer();
#pragma unroll 1
      for (int r = 0; r < N; ++r) {
        if (r == rank) continue;
        const u64* f = reinterpret_cast<const u64*>(own + R + 64 + 8 * r);
        while (ld_acquire_sys(f) < want)
          if (globaltimer() - start > MUCC_EXCHANGE_TIMEOUT_NS) __trap();  // a rank never came
      }
    }
  }
  if (!__syncthreads_or(last_here)) return;
  const u64 parity = e & 1;
  static_assert(COUNT % VEC == 0, "whole vectors");
  using V = typename Bits<VEC * static_cast<int>(sizeof(T))>::type;
  const V* src[N];
#pragma unroll
  for (int r = 0; r < N; ++r)
    src[r] = r == rank ? reinterpret_cast<const V*>(send)
                       : reinterpret_cast<const V*>(slot<T, N, SLOT>(own, R, parity, r));
  // UNROLL vectors per thread in flight: the loads are independent, their latency overlaps.
  constexpr int UNROLL = 4;
  constexpr long long VECS = COUNT / VEC;
  for (long long i0 = tid; i0 < VECS; i0 += static_cast<long long>(NT) * UNROLL) {
    V v[UNROLL][N];
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const long long i = i0 + static_cast<long long>(u) * NT;
#pragma unroll
      for (int r = 0; r < N; ++r)
        if (i < VECS) v[u][r] = __ldcg(src[r] + i);  // through L2, not this SM's L1
    }
#pragma unroll
    for (int u = 0; u < UNROLL; ++u) {
      const long long i = i0 + static_cast<long long>(u) * NT;
      if (i >= VECS) break;
      float acc[VEC];
#pragma unroll
      for (int j = 0; j < VEC; ++j) acc[j] = 0.f;
#pragma unroll
      for (int r = 0; r < N; ++r) {
        const T* s = reinterpret_cast<const T*>(&v[u][r]);
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[j] += to_compute(s[j]);
      }
      V out;
      T* o = reinterpret_cast<T*>(&out);
#pragma unroll
      for (int j = 0; j < VEC; ++j) o[j] = from_compute<T>(acc[j]);
      reinterpret_cast<V*>(recv)[i] = out;
    }
  }
  __syncthreads();
  if (tid == 0) *reinterpret_cast<volatile u64*>(own + R) = e + 1;  // the next execution's parity
}

}  // namespace xchg
}  // namespace mucc
