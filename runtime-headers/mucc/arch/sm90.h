// mucc runtime, Hopper (sm_90a) instructions: mbarriers with transaction counts, the bulk
// tensor copy engine (TMA: loads, multicast loads, stores), clusters and distributed shared
// memory, register reallocation between warpgroups, programmatic dependent launch, and the
// proxy fences that order them. Device code only; no CUDA header needed (NVRTC compiles it).
// `scripts/gpu/sm90_selftest.cu` checks every wrapper on a GPU.
//
// Preconditions common to all: shared-memory pointers point into this CTA's shared memory;
// mbarriers are 8-byte aligned; TMA destinations are 128-byte aligned (1024 bytes for the
// 128-byte swizzle); tensor maps are `const __grid_constant__` kernel parameters (or live in
// global or constant memory) encoded on the host with cuTensorMapEncodeTiled.
#pragma once

#include "../types.h"

namespace mucc {
namespace sm90 {

// A CUtensorMap as a kernel sees it: 128 opaque bytes, 64-byte aligned. The host encodes it
// with cuTensorMapEncodeTiled and passes it by value.
struct alignas(64) TensorMap {
  unsigned long long opaque[16];
};
static_assert(sizeof(TensorMap) == 128, "a tensor map is 128 bytes");

__device__ __forceinline__ unsigned smem_u32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ unsigned long long map_u64(const TensorMap* m) {
  return reinterpret_cast<unsigned long long>(m);
}

// ---- mbarriers ---------------------------------------------------------------------------
// An mbarrier completes a phase when `count` arrivals have happened and every byte announced
// with expect_tx has landed; phases alternate parity 0, 1, 0, … Waiting on parity P returns
// once the phase of parity P has completed (a fresh barrier counts its "previous" phase, parity
// 1, as complete: producers wait on their empty barriers with parity 1 first).

// Initialises `bar` for `count` arrivals per phase (one thread, before any use; then
// fence_mbarrier_init and a barrier, so that other threads and the copy engine see it).
__device__ __forceinline__ void mbar_init(u64* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
}

// Makes initialised mbarriers visible to the cluster's threads and to the copy engine.
__device__ __forceinline__ void fence_mbarrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival.
__device__ __forceinline__ void mbar_arrive(u64* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}

// One arrival that also announces `bytes` more bytes for this phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(u64* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

// Announces `bytes` more bytes for this phase without arriving.
__device__ __forceinline__ void mbar_expect_tx(u64* bar, unsigned bytes) {
  asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}

// Whether the phase of parity `parity` has completed (returns after a bounded wait).
__device__ __forceinline__ bool mbar_try_wait(u64* bar, unsigned parity) {
  unsigned ok;
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n"
      "}\n"
      : "=r"(ok)
      : "r"(smem_u32(bar)), "r"(parity)
      : "memory");
  return ok != 0;
}

// Waits until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(u64* bar, unsigned parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}

// The position in a ring of STAGES buffers: the stage and the parity of its current phase.
template <int STAGES> struct RingState {
  int stage = 0;
  unsigned parity = 0;
  __device__ __forceinline__ void advance() {
    if (++stage == STAGES) {
      stage = 0;
      parity ^= 1u;
    }
  }
};

// ---- the bulk tensor copy engine ---------------------------------------------------------
// Loads complete on an mbarrier of the destination CTA (announce the bytes with
// mbar_arrive_expect_tx first); coordinates are element indices, innermost dim first, and may
// reach past the tensor's end (those elements are filled with zeros). One thread issues.

__device__ __forceinline__ void tma_load(void* dst, const TensorMap* map, u64* bar, int c0) {
  asm volatile("cp.async.bulk.tensor.1d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2}], [%3];\n"
               ::"r"(smem_u32(dst)), "l"(map_u64(map)), "r"(c0), "r"(smem_u32(bar))
               : "memory");
}
__device__ __forceinline__ void tma_load(void* dst, const TensorMap* map, u64* bar, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n"
               ::"r"(smem_u32(dst)), "l"(map_u64(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar))
               : "memory");
}
__device__ __forceinline__ void tma_load(void* dst, const TensorMap* map, u64* bar, int c0, int c1, int c2) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], [%5];\n"
      ::"r"(smem_u32(dst)), "l"(map_u64(map)), "r"(c0), "r"(c1), "r"(c2), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void tma_load(void* dst, const TensorMap* map, u64* bar, int c0, int c1, int c2,
                                         int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n"
      ::"r"(smem_u32(dst)), "l"(map_u64(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void tma_load(void* dst, const TensorMap* map, u64* bar, int c0, int c1, int c2,
                                         int c3, int c4) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5, "
      "%6}], [%7];\n"
      ::"r"(smem_u32(dst)), "l"(map_u64(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(smem_u32(bar))
      : "memory");
}

// The box a load at these coordinates would copy, brought into L2 only (no shared memory, no
// mbarrier): a hint, which may run before griddepcontrol.wait since it reads nothing into the CTA.
__device__ __forceinline__ void tma_prefetch_l2(const TensorMap* map, int c0) {
  asm volatile("cp.async.bulk.prefetch.tensor.1d.L2.global.tile [%0, {%1}];\n" ::"l"(map_u64(map)), "r"(c0)
               : "memory");
}
__device__ __forceinline__ void tma_prefetch_l2(const TensorMap* map, int c0, int c1) {
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];\n" ::"l"(map_u64(map)), "r"(c0),
               "r"(c1)
               : "memory");
}
__device__ __forceinline__ void tma_prefetch_l2(const TensorMap* map, int c0, int c1, int c2) {
  asm volatile("cp.async.bulk.prefetch.tensor.3d.L2.global.tile [%0, {%1, %2, %3}];\n" ::"l"(map_u64(map)),
               "r"(c0), "r"(c1), "r"(c2)
               : "memory");
}
__device__ __forceinline__ void tma_prefetch_l2(const TensorMap* map, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.prefetch.tensor.4d.L2.global.tile [%0, {%1, %2, %3, %4}];\n" ::"l"(map_u64(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3)
               : "memory");
}
__device__ __forceinline__ void tma_prefetch_l2(const TensorMap* map, int c0, int c1, int c2, int c3, int c4) {
  asm volatile("cp.async.bulk.prefetch.tensor.5d.L2.global.tile [%0, {%1, %2, %3, %4, %5}];\n"
               ::"l"(map_u64(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
               : "memory");
}

// A 2-D load written to the same shared-memory offset (and completing on the same mbarrier
// offset) in every CTA of the cluster whose bit is set in `ctas`. Every destination CTA
// announces the bytes on its own mbarrier.
__device__ __forceinline__ void tma_load_multicast(void* dst, const TensorMap* map, u64* bar, unsigned short ctas,
                                                   int c0, int c1) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster [%0], [%1, "
      "{%2, %3}], [%4], %5;\n"
      ::"r"(smem_u32(dst)), "l"(map_u64(map)), "r"(c0), "r"(c1), "r"(smem_u32(bar)), "h"(ctas)
      : "memory");
}

// A 2-D store of a shared-memory box (written by ordinary stores: fence_proxy_async in each
// writing thread and a barrier first); commit, then wait before reusing the buffer.
__device__ __forceinline__ void tma_store(const TensorMap* map, const void* src, int c0, int c1) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%2, %3}], [%1];\n"
               ::"l"(map_u64(map)), "r"(smem_u32(src)), "r"(c0), "r"(c1)
               : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until at most N committed store groups still read shared memory.
template <int N> __device__ __forceinline__ void bulk_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read %0;\n" ::"n"(N) : "memory");
}
// Waits until at most N committed store groups are incomplete (their writes visible).
template <int N> __device__ __forceinline__ void bulk_wait() {
  asm volatile("cp.async.bulk.wait_group %0;\n" ::"n"(N) : "memory");
}

// Brings a tensor map into the cache ahead of its first use.
__device__ __forceinline__ void prefetch_tensormap(const TensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(map_u64(map)) : "memory");
}

// Orders this thread's ordinary shared-memory accesses before later accesses of the async
// proxy (the copy engine, wgmma).
__device__ __forceinline__ void fence_proxy_async() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// ---- clusters and distributed shared memory ----------------------------------------------

__device__ __forceinline__ unsigned cluster_rank() {
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
  return r;
}
__device__ __forceinline__ unsigned cluster_size() {
  unsigned n;
  asm volatile("mov.u32 %0, %%cluster_nctarank;\n" : "=r"(n));
  return n;
}
// Arrive at, then wait for, the cluster barrier: every thread of every CTA of the cluster.
// Orders shared-memory accesses across the cluster (release, acquire).
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void cluster_sync() {
  cluster_arrive();
  cluster_wait();
}
// An arrival that orders no memory access of its own: after fence_mbarrier_init, it publishes
// initialised mbarriers to the cluster's threads that wait on the barrier.
__device__ __forceinline__ void cluster_arrive_relaxed() {
  asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");
}
// The shared::cluster address of `p` (this CTA's shared memory) in CTA `rank` of the cluster.
__device__ __forceinline__ unsigned map_rank(const void* p, unsigned rank) {
  unsigned out;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(out) : "r"(smem_u32(p)), "r"(rank));
  return out;
}
__device__ __forceinline__ float ld_cluster_f32(unsigned addr) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ unsigned ld_cluster_u32(unsigned addr) {
  unsigned v;
  asm volatile("ld.shared::cluster.u32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void st_cluster_f32(unsigned addr, float v) {
  asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(addr), "f"(v) : "memory");
}
// Stores `v` at the shared::cluster address `addr` (another CTA's shared memory) and completes
// its bytes on the mbarrier at shared::cluster address `bar` (in the same CTA as `addr`).
__device__ __forceinline__ void st_async(unsigned addr, float v, unsigned bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];\n" ::"r"(addr),
               "r"(__float_as_uint(v)), "r"(bar)
               : "memory");
}
__device__ __forceinline__ void st_async(unsigned addr, double v, unsigned bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b64 [%0], %1, [%2];\n" ::"r"(addr),
               "l"(__double_as_longlong(v)), "r"(bar)
               : "memory");
}

// ---- warpgroup register reallocation (every thread of the warpgroup executes it; the kernel
// needs __launch_bounds__(threads, 1)) -----------------------------------------------------
template <int N> __device__ __forceinline__ void regs_grow() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
}
template <int N> __device__ __forceinline__ void regs_shrink() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
}

// ---- programmatic dependent launch --------------------------------------------------------
// Waits until the grids this one depends on have completed (or triggered) and their memory is
// visible; a no-op when the kernel was launched without the programmatic attribute.
__device__ __forceinline__ void grid_dependency_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
// Lets the dependent grid start launching (its griddepcontrol.wait still waits for this grid).
__device__ __forceinline__ void launch_dependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

}  // namespace sm90
}  // namespace mucc
