// Streaming ceiling of the bulk tensor copy engine for a decode-time weight (K × N, N
// contiguous), read once in boxes of BK rows × 64 columns (128 B, swizzle 128B) as mucc's
// decode kernels read it: how many stages, CTAs per SM and issuing schemes it takes to reach
// the copy bandwidth, with and without a per-iteration consumer delay that stands for the
// compute of an iteration. Sizes the rings of `sched::kernel` (docs/benchmarks.md).
//
//   nvcc -O3 -std=c++17 -gencode=arch=compute_90a,code=sm_90a -o tma_stream tma_stream.cu
//   ./tma_stream            # table on stdout
//
// Modes: `sync` is mucc's loop (all threads wait on the stage's mbarrier, a block barrier,
// thread 0 refills the stage freed one iteration ago, the consumers work, a block barrier);
// `ws` adds a producer warp that refills a stage as soon as the consumers release it (empty
// mbarriers). Each consumer thread reads 16 B of every stage, so the copies are really used.
// `MUCC_TMA_PDL=1`: mucc's decode configurations launched plainly and with programmatic stream
// serialisation (`pdl` 1: griddepcontrol.wait first, then launch_dependents; 2: the CTA's first
// `stages` iterations prefetched into L2 before the wait, which reads nothing stale since the
// writes of the kernel before land in L2; 3: its whole share prefetched; 4: as 2, but
// launch_dependents after the loop, where mucc's kernels trigger), so that a replay's ramp-up
// overlaps the tail of the one before.
#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e = (x);                                                               \
    if (e != cudaSuccess) {                                                            \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e));    \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

__device__ __forceinline__ unsigned su32(const void* p) {
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(unsigned long long* b, unsigned n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(su32(b)), "r"(n));
}
__device__ __forceinline__ void mbar_expect(unsigned long long* b, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(su32(b)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void mbar_arrive(unsigned long long* b) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(su32(b)) : "memory");
}
__device__ __forceinline__ void mbar_wait(unsigned long long* b, unsigned parity) {
  asm volatile(
      "{\n .reg .pred p;\n"
      "W%=: mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      " @!p bra W%=;\n}" ::"r"(su32(b)),
      "r"(parity)
      : "memory");
}
// L2 prefetch of one box (no shared memory, no mbarrier).
__device__ __forceinline__ void tma2d_prefetch_l2(const CUtensorMap* m, int x, int y) {
  asm volatile("cp.async.bulk.prefetch.tensor.2d.L2.global.tile [%0, {%1, %2}];" ::"l"(m), "r"(x), "r"(y)
               : "memory");
}
__device__ __forceinline__ void tma2d(void* dst, const CUtensorMap* m, unsigned long long* bar, int x,
                                      int y, bool evict_first) {
  if (evict_first) {
    unsigned long long pol;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(su32(dst)),
        "l"(m), "r"(su32(bar)), "r"(x), "r"(y), "l"(pol)
        : "memory");
  } else {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4}], [%2];" ::"r"(su32(dst)),
        "l"(m), "r"(su32(bar)), "r"(x), "r"(y)
        : "memory");
  }
}

struct Cfg {
  int bk;      // box rows
  int boxes;   // 64-column boxes per stage (a CTA covers boxes × 64 columns)
  int stages;
  int split;   // CTAs per column block (the K range is split among them)
  int ws;      // 1: producer warp
  int delay;   // consumer delay per iteration (ns)
  int ef;      // evict-first hint
  int fixed;   // > 0: exactly this many CTAs per column block (else one wave of `split` per SM)
  int cluster; // 1: the CTAs of a column block form a cluster (as mucc's cluster split), which
               // ends with a cluster barrier
  int l2;      // L2 promotion of the tensor map: 0 256B (mucc's), 1 none, 2 128B, 3 64B
  int pdl;     // programmatic launch: 0 off, 1 on, 2 on with the first stages prefetched into L2
               // before griddepcontrol.wait, 3 with the CTA's whole share prefetched, 4 as 2 with
               // the trigger after the loop instead of after the wait
};

__global__ void stream(const __grid_constant__ CUtensorMap map, int iters_total, Cfg c, float* sink) {
  extern __shared__ __align__(1024) unsigned char smem[];
  unsigned long long* full = reinterpret_cast<unsigned long long*>(smem);
  unsigned long long* empty = full + 16;
  unsigned char* ring = smem + 1024;
  const int box_bytes = c.bk * 128;
  const int stage_bytes = box_bytes * c.boxes;
  const int col_block = blockIdx.x / c.split, r = blockIdx.x % c.split;
  const int it0 = static_cast<int>((long long)iters_total * r / c.split);
  const int it1 = static_cast<int>((long long)iters_total * (r + 1) / c.split);
  const int n = it1 - it0;
  const int consumers = 128;
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < c.stages; ++s) {
      mbar_init(full + s, 1);
      mbar_init(empty + s, consumers / 32);
    }
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }
  if (c.pdl >= 2 && tid == 0) {
    const int m = c.pdl == 3 ? n : (c.stages < n ? c.stages : n);
    for (int i = 0; i < m; ++i)
      for (int b = 0; b < c.boxes; ++b) tma2d_prefetch_l2(&map, (col_block * c.boxes + b) * 64, (it0 + i) * c.bk);
  }
  if (c.pdl) asm volatile("griddepcontrol.wait;" ::: "memory");
  if (c.pdl && c.pdl != 4) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  __syncthreads();
  auto issue = [&](int i) {  // iteration i (0-based within the CTA) into stage i % stages
    const int s = i % c.stages;
    mbar_expect(full + s, stage_bytes);
    for (int b = 0; b < c.boxes; ++b)
      tma2d(ring + s * stage_bytes + b * box_bytes, &map, full + s, (col_block * c.boxes + b) * 64,
            (it0 + i) * c.bk, c.ef);
  };
  float acc = 0.f;
  auto consume = [&](int i) {
    const int s = i % c.stages;
    const uint4* p = reinterpret_cast<const uint4*>(ring + s * stage_bytes);
    for (int e = tid; e < stage_bytes / 16; e += consumers) {
      uint4 v = p[e];
      acc += __uint_as_float(v.x ^ v.w);
    }
    if (c.delay > 0) {
      long long t0 = clock64();
      while (clock64() - t0 < (long long)c.delay * 17 / 10) {
      }
    }
  };
  if (!c.ws) {
    if (tid == 0)
      for (int i = 0; i < c.stages - 1 && i < n; ++i) issue(i);
    for (int i = 0; i < n; ++i) {
      mbar_wait(full + i % c.stages, (i / c.stages) & 1);
      __syncthreads();
      if (tid == 0 && i + c.stages - 1 < n) issue(i + c.stages - 1);
      consume(i);
      __syncthreads();
    }
  } else if (tid >= consumers) {
    if (tid == consumers) {
      for (int i = 0; i < n; ++i) {
        if (i >= c.stages) mbar_wait(empty + i % c.stages, ((i / c.stages) - 1) & 1);
        issue(i);
      }
    }
  } else {
    for (int i = 0; i < n; ++i) {
      mbar_wait(full + i % c.stages, (i / c.stages) & 1);
      consume(i);
      __syncwarp();
      if (tid % 32 == 0) mbar_arrive(empty + i % c.stages);
    }
  }
  if (c.pdl == 4) asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (c.cluster) asm volatile("barrier.cluster.arrive.release;\nbarrier.cluster.wait.acquire;" ::: "memory");
  if (acc == 12345.678f) sink[0] = acc;
}

// One launch, with a cluster of `split` CTAs when c.cluster is set.
static void launch(dim3 grid, int threads, int smem, cudaStream_t st, const CUtensorMap& map, int iters,
                   Cfg c, float* sink) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = dim3(threads);
  cfg.dynamicSmemBytes = smem;
  cfg.stream = st;
  cudaLaunchAttribute attr[2];
  int n = 0;
  if (c.cluster) {
    attr[n].id = cudaLaunchAttributeClusterDimension;
    attr[n].val.clusterDim.x = c.split;
    attr[n].val.clusterDim.y = 1;
    attr[n].val.clusterDim.z = 1;
    ++n;
  }
  if (c.pdl) {
    attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attr;
  cfg.numAttrs = n;
  CK(cudaLaunchKernelEx(&cfg, stream, map, iters, c, sink));
}

typedef CUresult (*EncodeFn)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                             const cuuint64_t*, const cuuint32_t*, const cuuint32_t*, CUtensorMapInterleave,
                             CUtensorMapSwizzle, CUtensorMapL2promotion, CUtensorMapFloatOOBfill);

int main() {
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult q;
  CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q));
  EncodeFn encode = reinterpret_cast<EncodeFn>(fn);
  CK(cudaFuncSetAttribute(stream, cudaFuncAttributeMaxDynamicSharedMemorySize, 227 * 1024));
  float* sink;
  CK(cudaMalloc(&sink, 4));
  std::printf("%s, %d SMs\n", prop.name, sms);
  // Copy bandwidth (read + write bytes), as mucc bench's floor uses.
  {
    size_t bytes = size_t(1) << 30;
    void *a, *b;
    CK(cudaMalloc(&a, bytes));
    CK(cudaMalloc(&b, bytes));
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    CK(cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice));
    cudaEventRecord(e0);
    for (int i = 0; i < 10; ++i) CK(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice));
    cudaEventRecord(e1);
    CK(cudaEventSynchronize(e1));
    float ms;
    cudaEventElapsedTime(&ms, e0, e1);
    std::printf("copy bandwidth: %.0f GB/s\n", 2.0 * bytes * 10 / (ms * 1e-3) / 1e9);
    cudaFree(a);
    cudaFree(b);
  }
  struct Shape {
    int k, n;
  };
  // MUCC_TMA_QUICK=1: the four decode shapes, a few configurations without delay.
  const bool quick = std::getenv("MUCC_TMA_QUICK") != nullptr;
  // MUCC_TMA_SPLITS=1: the two small decode shapes with the K range split over 1-8x more CTAs
  // than a cluster of 8 allows (is it the number of CTAs streaming at once that bounds them?).
  const bool splits = std::getenv("MUCC_TMA_SPLITS") != nullptr;
  const bool pdl = std::getenv("MUCC_TMA_PDL") != nullptr;
  std::vector<Shape> shapes = {{11008, 2048}, {18944, 3584}};
  if (quick) shapes = {{3584, 4608}, {11008, 2048}, {2048, 22016}, {18944, 3584}};
  if (splits) shapes = {{11008, 2048}, {3584, 4608}};
  if (pdl) shapes = {{3584, 4608}, {11008, 2048}, {18944, 3584}};
  for (Shape sh : shapes) {
    const size_t bytes = size_t(sh.k) * sh.n * 2;
    const int copies = 4;  // rotated, past the L2
    std::vector<void*> w(copies);
    for (auto& p : w) {
      CK(cudaMalloc(&p, bytes));
      CK(cudaMemset(p, 1, bytes));
    }
    std::printf("\nW %d x %d bf16 (%.1f MB)\n", sh.k, sh.n, bytes / 1e6);
    std::printf("%5s %5s %6s %6s %4s %6s %3s %6s %8s %8s %3s %3s %3s\n", "bk", "boxes", "stages", "ctas", "ws",
                "delay", "ef", "smem", "us", "GB/s", "cl", "l2", "pdl");
    std::vector<Cfg> cfgs;
    if (pdl) {
      // mucc's decode plans (see `quick`), in clusters and as plain CTAs, then one wave of 2 per SM.
      const int bk = sh.k == 3584 ? 56 : sh.k == 11008 ? 172 : 148;
      const int split = sh.k == 3584 ? 4 : sh.k == 11008 ? 8 : 2;
      for (int cl : {1, 0})
        for (int p : {0, 1, 2, 3, 4}) cfgs.push_back({bk, 1, sh.k == 11008 ? 2 : 4, 0, 0, 0, 0, split, cl, 0, p});
      for (int p : {0, 1, 2, 3, 4}) cfgs.push_back({bk, 1, 4, 2, 0, 0, 0, 0, 0, 0, p});
    }
    if (splits) {
      const std::vector<int> fixed = sh.k == 11008 ? std::vector<int>{8, 16} : std::vector<int>{4, 8};
      const std::vector<int> bks = sh.k == 11008 ? std::vector<int>{172, 86} : std::vector<int>{56};
      for (int l2 : {0, 1, 2, 3})
        for (int f : fixed)
          for (int bk : bks)
            for (int stages : {2, 3})
              if ((sh.k + bk - 1) / bk >= 2 * f) cfgs.push_back({bk, 1, stages + (sh.k == 3584), 0, 0, 0, 0, f, 0, l2});
    }
    if (quick) {
      for (int ws : {0, 1})
        for (int bk : {56, 172})
          for (int stages : {3, 4})
            for (int per_sm : {1, 2, 3}) cfgs.push_back({bk, 1, stages, per_sm, ws, 0, 0, 0, 0});
      // mucc's decode plans (box rows, stages, CTAs per column block), with and without a
      // cluster: 3584 x 4608 in clusters of 4 (16 iterations of 56 rows, 4 stages), 11008 x
      // 2048 in clusters of 8 (8 iterations of 172 rows, 2 stages).
      const int bk = sh.k == 3584 ? 56 : 172, split = sh.k == 3584 ? 4 : 8;
      for (int cl : {0, 1})
        if (sh.k == 3584 || sh.k == 11008)
        for (int stages : {2, 3, 4}) cfgs.push_back({bk, 1, stages, 0, 0, 0, 0, split, cl});
    }
    for (int ws : {0, 1})
      if (!quick && !splits && !pdl)
      for (int delay : {0, 600})
        for (int bk : {172, 86, 256})
          for (int stages : {2, 3, 4, 6, 8})
            for (int per_sm : {1, 2, 3}) cfgs.push_back({bk, 1, stages, per_sm, ws, delay, 0, 0, 0});
    if (!quick && !splits && !pdl)
      for (int ef : {1}) cfgs.push_back({172, 1, 4, 2, 1, 0, ef, 0, 0});
    if (!quick && !splits && !pdl)
      for (int stages : {2, 4}) cfgs.push_back({172, 2, stages, 2, 1, 0, 0, 0, 0});
    for (Cfg c : cfgs) {
      const int col_blocks = sh.n / (64 * c.boxes);
      const int per_sm = c.split;  // reinterpret: CTAs per SM wanted
      const int want = per_sm * sms;
      c.split = want / col_blocks > 0 ? want / col_blocks : 1;  // one wave
      const int iters = (sh.k + c.bk - 1) / c.bk;
      if (c.split > iters) c.split = iters;
      if (c.fixed > 0) c.split = c.fixed;
      const int ctas = col_blocks * c.split;
      const int ring = c.stages * c.bk * 128 * c.boxes;
      int smem = 1024 + ring;
      const int slot = per_sm > 0 ? 228 * 1024 / per_sm - 1024 - 1024 : 0;
      if (smem < slot) smem = slot;  // force the residency
      if (1024 + ring > 227 * 1024) continue;
      if (smem > 227 * 1024) smem = 227 * 1024;
      std::vector<CUtensorMap> maps(copies);
      for (int i = 0; i < copies; ++i) {
        cuuint64_t dims[2] = {cuuint64_t(sh.n), cuuint64_t(sh.k)};
        cuuint64_t strides[1] = {cuuint64_t(sh.n) * 2};
        cuuint32_t box[2] = {64u, cuuint32_t(c.bk)};
        cuuint32_t es[2] = {1, 1};
        if (encode(&maps[i], CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, w[i], dims, strides, box, es,
                   CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
                   c.l2 == 1   ? CU_TENSOR_MAP_L2_PROMOTION_NONE
                   : c.l2 == 2 ? CU_TENSOR_MAP_L2_PROMOTION_L2_128B
                   : c.l2 == 3 ? CU_TENSOR_MAP_L2_PROMOTION_L2_64B
                               : CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                   CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
          std::printf("encode failed\n");
          return 1;
        }
      }
      const int threads = c.ws ? 160 : 128;
      for (int i = 0; i < 8; ++i)
        launch(dim3(ctas), threads, smem, 0, maps[i % copies], iters, c, sink);
      CK(cudaGetLastError());
      CK(cudaDeviceSynchronize());
      // Timed as CUDA-graph replays (as `mucc bench`): 40 launches per replay, 5 replays.
      const int reps = 40;
      cudaStream_t st;
      CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
      for (int i = 0; i < reps; ++i) launch(dim3(ctas), threads, smem, st, maps[i % copies], iters, c, sink);
      CK(cudaStreamEndCapture(st, &graph));
      CK(cudaGraphInstantiate(&exec, graph, 0));
      CK(cudaGraphLaunch(exec, st));
      CK(cudaStreamSynchronize(st));
      cudaEvent_t e0, e1;
      cudaEventCreate(&e0);
      cudaEventCreate(&e1);
      float ms = 1e30f;
      for (int k = 0; k < 5; ++k) {
        cudaEventRecord(e0, st);
        CK(cudaGraphLaunch(exec, st));
        cudaEventRecord(e1, st);
        CK(cudaEventSynchronize(e1));
        float t;
        cudaEventElapsedTime(&t, e0, e1);
        if (t < ms) ms = t;
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      cudaStreamDestroy(st);
      const double us = ms * 1e3 / reps;
      std::printf("%5d %5d %6d %6d %4d %6d %3d %6d %8.2f %8.0f %3d %3d %3d\n", c.bk, c.boxes, c.stages, ctas, c.ws,
                  c.delay, c.ef, smem, us, bytes / (us * 1e-6) / 1e9, c.cluster, c.l2, c.pdl);
    }
    for (auto p : w) cudaFree(p);
  }
  return 0;
}
