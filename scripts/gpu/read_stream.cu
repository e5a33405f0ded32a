// Read-only streaming bound: how long reading B bytes once takes, as mucc bench times
// (executions over rotated buffers captured in one CUDA graph, median per execution).
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1);} } while (0)

template <int U>
__global__ void rd(const uint4* __restrict__ p, size_t n, float* out) {
  // grid-stride over 16-byte vectors, U loads in flight per thread
  size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  unsigned acc = 0;
  for (; i + (U - 1) * stride < n; i += U * stride) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(p + i + u * stride));
    }
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) { uint4 v = p[i]; acc ^= v.x ^ v.y ^ v.z ^ v.w; }
  if (acc == 0x12345678u) out[blockIdx.x] = 1.f;
}
// Blocked: each block reads one contiguous chunk (as a split weight), U vectors per thread in flight
template <int U>
__global__ void rdb(const uint4* __restrict__ p, size_t n, float* out) {
  size_t per = (n + gridDim.x - 1) / gridDim.x;
  size_t b0 = blockIdx.x * per, b1 = min(n, b0 + per);
  unsigned acc = 0;
  size_t i = b0 + threadIdx.x;
  for (; i + (U - 1) * blockDim.x < b1; i += U * blockDim.x) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(p + i + u * blockDim.x));
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < b1; i += blockDim.x) { uint4 v = p[i]; acc ^= v.x ^ v.y ^ v.z ^ v.w; }
  if (acc == 0x12345678u) out[blockIdx.x] = 1.f;
}

typedef void (*K)(const uint4*, size_t, float*);
int main() {
  int sms; CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp pr; CK(cudaGetDeviceProperties(&pr, 0));
  size_t l2 = pr.l2CacheSize;
  float* out; CK(cudaMalloc(&out, 1 << 20));
  cudaStream_t s; CK(cudaStreamCreate(&s));
  // copy bandwidth as mucc bench measures it: D2D copy of 1 GiB, read + write bytes
  { size_t B = 1ull << 30; void *a, *b; CK(cudaMalloc(&a, B)); CK(cudaMalloc(&b, B));
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    for (int w = 0; w < 3; ++w) CK(cudaMemcpyAsync(b, a, B, cudaMemcpyDeviceToDevice, s));
    std::vector<float> t;
    for (int r = 0; r < 10; ++r) { cudaEventRecord(e0, s); cudaMemcpyAsync(b, a, B, cudaMemcpyDeviceToDevice, s); cudaEventRecord(e1, s); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); t.push_back(ms); }
    std::sort(t.begin(), t.end()); printf("copy bandwidth %.3f TB/s\n", 2.0 * B / (t[5] * 1e-3) / 1e12);
    cudaFree(a); cudaFree(b); }
  size_t sizes[] = {33030144ull /*3584x4608x2*/, 45088768ull /*11008x2048x2*/, 90177536ull /*2048x22016x2*/, 135790592ull /*18944x3584x2*/};
  struct KV { const char* name; K k; int threads; int per_sm; bool blocked; } ks[] = {
    {"gs U4 256t x4/SM", rd<4>, 256, 4, false}, {"gs U8 256t x4/SM", rd<8>, 256, 4, false},
    {"gs U8 512t x2/SM", rd<8>, 512, 2, false}, {"gs U16 256t x2/SM", rd<16>, 256, 2, false},
    {"gs U8 128t x8/SM", rd<8>, 128, 8, false},
    {"blk U8 256t x4/SM", rdb<8>, 256, 4, true}, {"blk U8 128t x3/SM", rdb<8>, 128, 3, true},
    {"blk U16 128t x2/SM", rdb<16>, 128, 2, true}};
  for (size_t B : sizes) {
    int sets = (int)std::min<size_t>(64, (2 * l2 + B - 1) / B + 1);
    std::vector<uint4*> bufs(sets);
    for (auto& b : bufs) { CK(cudaMalloc(&b, B)); CK(cudaMemset(b, 1, B)); }
    for (auto& kv : ks) {
      int grid = sms * kv.per_sm;
      int execs = std::max(10, sets); execs = (execs + sets - 1) / sets * sets;
      cudaGraph_t g; cudaGraphExec_t ge;
      CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
      for (int e = 0; e < execs; ++e) kv.k<<<grid, kv.threads, 0, s>>>(bufs[e % sets], B / 16, out);
      CK(cudaStreamEndCapture(s, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
      cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
      for (int w = 0; w < 3; ++w) CK(cudaGraphLaunch(ge, s));
      std::vector<float> t;
      for (int r = 0; r < 30; ++r) { cudaEventRecord(e0, s); cudaGraphLaunch(ge, s); cudaEventRecord(e1, s); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); t.push_back(ms * 1000 / execs); }
      std::sort(t.begin(), t.end());
      printf("%10zu B  %-20s grid %4d  median %7.2f us  min %7.2f  (%.3f TB/s read)\n", B, kv.name, grid, t[15], t[0], B / (t[15] * 1e-6) / 1e12);
      cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
    }
    for (auto& b : bufs) cudaFree(b);
  }
  CK(cudaDeviceSynchronize());
}
