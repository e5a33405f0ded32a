// GPU self-test of runtime-headers/mucc/arch/sm90.h (Hopper only):
//
//   nvcc -std=c++17 -arch=sm_90a -I runtime-headers scripts/gpu/sm90_selftest.cu -lcuda -o /tmp/sm90
//   timeout 120 /tmp/sm90        # prints one line per test and "sm90 self-test: N failed"
//
// 1. tma 2d swizzle: a 2-D TMA load (f16, 128-byte swizzle) whose box reaches past both ends of
//    the tensor; the tile is read back through the swizzle and the out-of-range part must be 0.
//    Also prefetch_tensormap, mbar_init/fence_mbarrier_init/arrive_expect_tx/wait.
// 2. tma 3d: a 3-D load (f32, no swizzle) partly out of range.
// 3. ring: a 4-stage ring of 1-D TMA loads with full and empty mbarriers (parities wrap), a
//    producer warpgroup that gives registers away (regs_shrink) and two consumer warpgroups that
//    take them (regs_grow).
// 4. cluster: a cluster of 2 CTAs; CTA 0 multicasts one 2-D load to both (each announces the
//    bytes on its own barrier, CTA 1 with mbar_expect_tx + mbar_arrive), then distributed shared
//    memory: each CTA reads and writes the other's shared memory (map_rank, ld/st_cluster).
// 5. tma store: ordinary shared-memory stores, fence_proxy_async, a 2-D TMA store clipped at the
//    tensor's end (what lies outside must stay untouched), bulk_commit, bulk_wait.
// 6. pdl: a dependent kernel launched with programmatic stream serialization reads what the
//    primary kernel (which calls launch_dependents first) wrote, after grid_dependency_wait.
#include <cuda.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "mucc/arch/sm90.h"

using mucc::u64;
namespace sm90 = mucc::sm90;

#define CK(x)                                                                         \
  do {                                                                                \
    cudaError_t e_ = (x);                                                             \
    if (e_ != cudaSuccess) {                                                          \
      printf("%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_));      \
      return 1;                                                                       \
    }                                                                                 \
  } while (0)

static int failures = 0;
static void report(const char* name, int wrong, int total) {
  printf("%-18s %s (%d of %d values wrong)\n", name, wrong ? "FAILED" : "ok", wrong, total);
  if (wrong) ++failures;
}

// Encodes a tensor map over a row-major tensor; dims and box innermost first.
static sm90::TensorMap encode(void* base, CUtensorMapDataType type, int elem, int rank, const unsigned long long* dims,
                              const unsigned* box, CUtensorMapSwizzle swizzle) {
  cuuint64_t gdim[5], gstride[4];
  cuuint32_t bdim[5], estride[5];
  unsigned long long stride = elem;
  for (int i = 0; i < rank; ++i) {
    gdim[i] = dims[i];
    bdim[i] = box[i];
    estride[i] = 1;
    if (i > 0) gstride[i - 1] = stride;
    stride *= dims[i];
  }
  CUtensorMap m;
  CUresult r = cuTensorMapEncodeTiled(&m, type, rank, base, gdim, gstride, bdim, estride, CU_TENSOR_MAP_INTERLEAVE_NONE,
                                      swizzle, CU_TENSOR_MAP_L2_PROMOTION_NONE, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    printf("cuTensorMapEncodeTiled failed (%d)\n", (int)r);
    ++failures;
  }
  sm90::TensorMap out;
  static_assert(sizeof(CUtensorMap) == sizeof(sm90::TensorMap), "tensor map size");
  memcpy(&out, &m, sizeof out);
  return out;
}

__device__ unsigned char* align_up(unsigned char* p, unsigned a) {
  unsigned long long v = reinterpret_cast<unsigned long long>(p);
  return reinterpret_cast<unsigned char*>((v + a - 1) / a * a);
}

// ---- 1 ---------------------------------------------------------------------------------------
constexpr int T1_ROWS = 100, T1_COLS = 72, T1_BOX_C = 64, T1_BOX_R = 32, T1_C0 = 32, T1_R0 = 80;

__global__ void tma_2d_swizzle(const __grid_constant__ sm90::TensorMap map, float* out) {
  extern __shared__ unsigned char raw[];
  unsigned char* tile = align_up(raw, 1024);
  u64* bar = reinterpret_cast<u64*>(tile + T1_BOX_C * T1_BOX_R * 2);
  if (threadIdx.x == 0) {
    sm90::prefetch_tensormap(&map);
    sm90::mbar_init(bar, 1);
    sm90::fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    sm90::mbar_arrive_expect_tx(bar, T1_BOX_C * T1_BOX_R * 2);
    sm90::tma_load(tile, &map, bar, T1_C0, T1_R0);
  }
  sm90::mbar_wait(bar, 0);
  for (int i = threadIdx.x; i < T1_BOX_C * T1_BOX_R; i += blockDim.x) {
    int r = i / T1_BOX_C, c = i % T1_BOX_C;
    // 128-byte swizzle: the 16-byte chunk of a 128-byte row is XORed with the row mod 8.
    int byte = r * 128 + ((((c * 2) / 16) ^ (r % 8)) * 16) + (c * 2) % 16;
    out[i] = __half2float(*reinterpret_cast<const __half*>(tile + byte));
  }
}

static int test_tma_2d_swizzle() {
  std::vector<__half> h(T1_ROWS * T1_COLS);
  auto val = [](int r, int c) { return (float)((r * T1_COLS + c) % 2039 + 1); };
  for (int r = 0; r < T1_ROWS; ++r)
    for (int c = 0; c < T1_COLS; ++c) h[r * T1_COLS + c] = __float2half(val(r, c));
  __half* d;
  float* o;
  CK(cudaMalloc(&d, h.size() * 2));
  CK(cudaMalloc(&o, T1_BOX_C * T1_BOX_R * 4));
  CK(cudaMemcpy(d, h.data(), h.size() * 2, cudaMemcpyHostToDevice));
  unsigned long long dims[2] = {T1_COLS, T1_ROWS};
  unsigned box[2] = {T1_BOX_C, T1_BOX_R};
  sm90::TensorMap map = encode(d, CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 2, 2, dims, box, CU_TENSOR_MAP_SWIZZLE_128B);
  int smem = 1024 + T1_BOX_C * T1_BOX_R * 2 + 16;
  CK(cudaFuncSetAttribute(tma_2d_swizzle, cudaFuncAttributeMaxDynamicSharedMemorySize, smem));
  tma_2d_swizzle<<<1, 128, smem>>>(map, o);
  CK(cudaDeviceSynchronize());
  std::vector<float> got(T1_BOX_C * T1_BOX_R);
  CK(cudaMemcpy(got.data(), o, got.size() * 4, cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int r = 0; r < T1_BOX_R; ++r)
    for (int c = 0; c < T1_BOX_C; ++c) {
      int gr = T1_R0 + r, gc = T1_C0 + c;
      float want = (gr < T1_ROWS && gc < T1_COLS) ? val(gr, gc) : 0.0f;
      if (got[r * T1_BOX_C + c] != want) ++wrong;
    }
  report("tma 2d swizzle", wrong, (int)got.size());
  cudaFree(d);
  cudaFree(o);
  return 0;
}

// ---- 2 ---------------------------------------------------------------------------------------
__global__ void tma_3d(const __grid_constant__ sm90::TensorMap map, float* out) {
  __shared__ alignas(128) float tile[2][4][8];
  __shared__ alignas(8) u64 bar;
  if (threadIdx.x == 0) {
    sm90::mbar_init(&bar, 1);
    sm90::fence_mbarrier_init();
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    sm90::mbar_arrive_expect_tx(&bar, sizeof tile);
    sm90::tma_load(&tile[0][0][0], &map, &bar, 0, 3, 3);
  }
  sm90::mbar_wait(&bar, 0);
  out[threadIdx.x] = (&tile[0][0][0])[threadIdx.x];
}

static int test_tma_3d() {
  std::vector<float> h(4 * 6 * 8);
  for (size_t i = 0; i < h.size(); ++i) h[i] = (float)(i + 1);
  float *d, *o;
  CK(cudaMalloc(&d, h.size() * 4));
  CK(cudaMalloc(&o, 64 * 4));
  CK(cudaMemcpy(d, h.data(), h.size() * 4, cudaMemcpyHostToDevice));
  unsigned long long dims[3] = {8, 6, 4};
  unsigned box[3] = {8, 4, 2};
  sm90::TensorMap map = encode(d, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, 3, dims, box, CU_TENSOR_MAP_SWIZZLE_NONE);
  tma_3d<<<1, 64>>>(map, o);
  CK(cudaDeviceSynchronize());
  std::vector<float> got(64);
  CK(cudaMemcpy(got.data(), o, 64 * 4, cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int z = 0; z < 2; ++z)
    for (int y = 0; y < 4; ++y)
      for (int x = 0; x < 8; ++x) {
        int gz = 3 + z, gy = 3 + y;
        float want = (gz < 4 && gy < 6) ? h[(gz * 6 + gy) * 8 + x] : 0.0f;
        if (got[(z * 4 + y) * 8 + x] != want) ++wrong;
      }
  report("tma 3d", wrong, 64);
  cudaFree(d);
  cudaFree(o);
  return 0;
}

// ---- 3 ---------------------------------------------------------------------------------------
constexpr int T3_STAGES = 4, T3_BOX = 256, T3_TILES = 37;

__global__ void __launch_bounds__(384, 1) ring(const __grid_constant__ sm90::TensorMap map, float* out) {
  __shared__ alignas(128) float buf[T3_STAGES][T3_BOX];
  __shared__ alignas(8) u64 full[T3_STAGES], empty[T3_STAGES];
  int warpgroup = threadIdx.x / 128;
  if (threadIdx.x == 0) {
    for (int s = 0; s < T3_STAGES; ++s) {
      sm90::mbar_init(&full[s], 1);
      sm90::mbar_init(&empty[s], 256);
    }
    sm90::fence_mbarrier_init();
  }
  __syncthreads();
  sm90::RingState<T3_STAGES> at;
  if (warpgroup == 0) {
    sm90::regs_shrink<40>();
    if (threadIdx.x == 0) {
      for (int t = 0; t < T3_TILES; ++t, at.advance()) {
        sm90::mbar_wait(&empty[at.stage], at.parity ^ 1u);
        sm90::mbar_arrive_expect_tx(&full[at.stage], T3_BOX * 4);
        sm90::tma_load(&buf[at.stage][0], &map, &full[at.stage], t * T3_BOX);
      }
    }
  } else {
    sm90::regs_grow<232>();
    int i = threadIdx.x - 128;
    for (int t = 0; t < T3_TILES; ++t, at.advance()) {
      sm90::mbar_wait(&full[at.stage], at.parity);
      out[t * T3_BOX + i] = 2.0f * buf[at.stage][i];
      sm90::mbar_arrive(&empty[at.stage]);
    }
  }
}

static int test_ring() {
  int n = T3_TILES * T3_BOX;
  std::vector<float> h(n);
  for (int i = 0; i < n; ++i) h[i] = (float)(i % 977) - 300.0f;
  float *d, *o;
  CK(cudaMalloc(&d, n * 4));
  CK(cudaMalloc(&o, n * 4));
  CK(cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(o, 0, n * 4));
  unsigned long long dims[1] = {(unsigned long long)n};
  unsigned box[1] = {T3_BOX};
  sm90::TensorMap map = encode(d, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, 1, dims, box, CU_TENSOR_MAP_SWIZZLE_NONE);
  ring<<<1, 384>>>(map, o);
  CK(cudaDeviceSynchronize());
  std::vector<float> got(n);
  CK(cudaMemcpy(got.data(), o, n * 4, cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int i = 0; i < n; ++i)
    if (got[i] != 2.0f * h[i]) ++wrong;
  report("ring + setmaxnreg", wrong, n);
  cudaFree(d);
  cudaFree(o);
  return 0;
}

// ---- 4 ---------------------------------------------------------------------------------------
constexpr int T4_R = 16, T4_C = 32;

__global__ void __cluster_dims__(2, 1, 1) cluster(const __grid_constant__ sm90::TensorMap map, float* out) {
  __shared__ alignas(128) float tile[T4_R][T4_C];
  __shared__ alignas(8) u64 bar;
  __shared__ unsigned mine;
  __shared__ float written;
  unsigned rank = sm90::cluster_rank();
  if (threadIdx.x == 0) {
    sm90::mbar_init(&bar, 1);
    sm90::fence_mbarrier_init();
    mine = 1000 + rank;
  }
  sm90::cluster_sync();
  if (threadIdx.x == 0) {
    if (rank == 0) {
      sm90::mbar_arrive_expect_tx(&bar, sizeof tile);
      sm90::tma_load_multicast(&tile[0][0], &map, &bar, 0x3, 0, 0);
    } else {
      sm90::mbar_expect_tx(&bar, sizeof tile);
      sm90::mbar_arrive(&bar);
    }
  }
  sm90::mbar_wait(&bar, 0);
  float* o = out + rank * (T4_R * T4_C + 3);
  for (int i = threadIdx.x; i < T4_R * T4_C; i += blockDim.x) o[i] = (&tile[0][0])[i];
  if (threadIdx.x == 0) {
    unsigned other = rank ^ 1u;
    o[T4_R * T4_C] = (float)sm90::ld_cluster_u32(sm90::map_rank(&mine, other));
    sm90::st_cluster_f32(sm90::map_rank(&written, other), (float)rank + 0.5f);
  }
  sm90::cluster_sync();
  if (threadIdx.x == 0) {
    o[T4_R * T4_C + 1] = written;
    o[T4_R * T4_C + 2] = (float)sm90::cluster_size();
  }
}

static int test_cluster() {
  int n = T4_R * T4_C, per = n + 3;
  std::vector<float> h(n);
  for (int i = 0; i < n; ++i) h[i] = (float)(3 * i + 7);
  float *d, *o;
  CK(cudaMalloc(&d, n * 4));
  CK(cudaMalloc(&o, 2 * per * 4));
  CK(cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice));
  CK(cudaMemset(o, 0, 2 * per * 4));
  unsigned long long dims[2] = {T4_C, T4_R};
  unsigned box[2] = {T4_C, T4_R};
  sm90::TensorMap map = encode(d, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, 2, dims, box, CU_TENSOR_MAP_SWIZZLE_NONE);
  cluster<<<2, 128>>>(map, o);
  CK(cudaDeviceSynchronize());
  std::vector<float> got(2 * per);
  CK(cudaMemcpy(got.data(), o, got.size() * 4, cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int r = 0; r < 2; ++r) {
    const float* g = &got[r * per];
    for (int i = 0; i < n; ++i)
      if (g[i] != h[i]) ++wrong;
    if (g[n] != (float)(1000 + (r ^ 1))) ++wrong;
    if (g[n + 1] != (float)(r ^ 1) + 0.5f) ++wrong;
    if (g[n + 2] != 2.0f) ++wrong;
  }
  report("cluster multicast", wrong, 2 * per);
  cudaFree(d);
  cudaFree(o);
  return 0;
}

// ---- 5 ---------------------------------------------------------------------------------------
constexpr int T5_ROWS = 20, T5_COLS = 40, T5_BOX_C = 32, T5_BOX_R = 8, T5_C0 = 24, T5_R0 = 16;

__global__ void tma_store(const __grid_constant__ sm90::TensorMap map) {
  __shared__ alignas(128) float tile[T5_BOX_R][T5_BOX_C];
  for (int i = threadIdx.x; i < T5_BOX_R * T5_BOX_C; i += blockDim.x)
    (&tile[0][0])[i] = (float)(1000 * (i / T5_BOX_C) + i % T5_BOX_C);
  sm90::fence_proxy_async();
  __syncthreads();
  if (threadIdx.x == 0) {
    sm90::tma_store(&map, &tile[0][0], T5_C0, T5_R0);
    sm90::bulk_commit();
    sm90::bulk_wait_read<0>();
    sm90::bulk_wait<0>();
  }
}

static int test_tma_store() {
  int n = T5_ROWS * T5_COLS;
  std::vector<float> h(n, -1.0f);
  float* d;
  CK(cudaMalloc(&d, n * 4));
  CK(cudaMemcpy(d, h.data(), n * 4, cudaMemcpyHostToDevice));
  unsigned long long dims[2] = {T5_COLS, T5_ROWS};
  unsigned box[2] = {T5_BOX_C, T5_BOX_R};
  sm90::TensorMap map = encode(d, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, 2, dims, box, CU_TENSOR_MAP_SWIZZLE_NONE);
  tma_store<<<1, 128>>>(map);
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int r = 0; r < T5_ROWS; ++r)
    for (int c = 0; c < T5_COLS; ++c) {
      bool in = r >= T5_R0 && c >= T5_C0;
      float want = in ? (float)(1000 * (r - T5_R0) + (c - T5_C0)) : -1.0f;
      if (h[r * T5_COLS + c] != want) ++wrong;
    }
  report("tma store", wrong, n);
  cudaFree(d);
  return 0;
}

// ---- 6 ---------------------------------------------------------------------------------------
constexpr int T6_N = 1 << 22;

__global__ void primary(float* buf) {
  sm90::launch_dependents();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < T6_N; i += gridDim.x * blockDim.x) {
    float v = (float)(i % 1021);
    for (int k = 0; k < 64; ++k) v = v * 1.0f + 0.0f;  // keep the primary busy a little
    buf[i] = v;
  }
}

__global__ void dependent(const float* buf, float* out) {
  sm90::grid_dependency_wait();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < T6_N; i += gridDim.x * blockDim.x) out[i] = buf[i] + 1.0f;
}

static int test_pdl() {
  float *buf, *out;
  CK(cudaMalloc(&buf, T6_N * 4));
  CK(cudaMalloc(&out, T6_N * 4));
  CK(cudaMemset(buf, 0xff, T6_N * 4));
  primary<<<264, 256>>>(buf);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(264);
  cfg.blockDim = dim3(256);
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, dependent, (const float*)buf, out));
  CK(cudaDeviceSynchronize());
  std::vector<float> got(T6_N);
  CK(cudaMemcpy(got.data(), out, T6_N * 4, cudaMemcpyDeviceToHost));
  int wrong = 0;
  for (int i = 0; i < T6_N; ++i)
    if (got[i] != (float)(i % 1021) + 1.0f) ++wrong;
  report("pdl", wrong, T6_N);
  cudaFree(buf);
  cudaFree(out);
  return 0;
}

int main() {
  int (*tests[])() = {test_tma_2d_swizzle, test_tma_3d, test_ring, test_cluster, test_tma_store, test_pdl};
  for (auto t : tests)
    if (t()) {
      printf("sm90 self-test: stopped on a CUDA error\n");
      return 1;
    }
  printf("sm90 self-test: %d failed\n", failures);
  return failures ? 1 : 0;
}
