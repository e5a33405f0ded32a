// Read-only streaming of a row-major weight [R, C] (bf16) in column strips of TW bytes, each CTA
// one strip over a range of rows, as decode GEMV kernels read W: does the strip width matter?
// Timed as mucc bench times (executions over rotated buffers in one CUDA graph, median).
#include <cuda_runtime.h>
#include <cstdio>
#include <cstdlib>
#include <vector>
#include <algorithm>
#define CK(x) do { cudaError_t e = (x); if (e != cudaSuccess) { printf("%s: %s\n", #x, cudaGetErrorString(e)); exit(1);} } while (0)

// grid (strips, parts); block 128 threads; strip of tw bytes; rows [part*rr, part*rr+rr)
template <int U>
__global__ void strip(const char* __restrict__ w, int row_bytes, int tw, int rr, float* out) {
  int lanes = tw / 16;                 // threads per row
  int rows_per_pass = blockDim.x / lanes;
  int lane = threadIdx.x % lanes, r0 = threadIdx.x / lanes;
  const char* base = w + (size_t)blockIdx.y * rr * row_bytes + (size_t)blockIdx.x * tw + lane * 16;
  unsigned acc = 0;
  int r = r0;
  for (; r + (U - 1) * rows_per_pass < rr; r += U * rows_per_pass) {
    uint4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u)
      asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                   : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
                   : "l"(base + (size_t)(r + u * rows_per_pass) * row_bytes));
#pragma unroll
    for (int u = 0; u < U; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; r < rr; r += rows_per_pass) { uint4 v = *(const uint4*)(base + (size_t)r * row_bytes); acc ^= v.x ^ v.y ^ v.z ^ v.w; }
  if (acc == 0x12345678u) out[blockIdx.x] = 1.f;
}

int main() {
  cudaDeviceProp pr; CK(cudaGetDeviceProperties(&pr, 0));
  float* out; CK(cudaMalloc(&out, 1 << 20));
  cudaStream_t s; CK(cudaStreamCreate(&s));
  struct W { int rows, cols; } ws[] = {{11008, 2048}, {3584, 4608}, {2048, 22016}};
  for (auto wd : ws) {
    size_t row_bytes = (size_t)wd.cols * 2, B = row_bytes * wd.rows;
    int sets = (int)std::min<size_t>(64, (2 * (size_t)pr.l2CacheSize + B - 1) / B + 1);
    std::vector<char*> bufs(sets);
    for (auto& b : bufs) { CK(cudaMalloc(&b, B)); CK(cudaMemset(b, 1, B)); }
    int tws[] = {128, 256, 512, 1024, 2048};
    int ctas_want[] = {256, 528, 1056};
    for (int tw : tws) {
      if (row_bytes % tw) continue;
      int strips = row_bytes / tw;
      for (int want : ctas_want) {
        int parts = std::max(1, want / strips);
        int rr = (wd.rows + parts - 1) / parts; parts = (wd.rows + rr - 1) / rr;
        if (parts * rr != wd.rows) { rr = wd.rows / parts; if (rr * parts != wd.rows) continue; }
        int execs = std::max(10, sets); execs = (execs + sets - 1) / sets * sets;
        cudaGraph_t g; cudaGraphExec_t ge;
        CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
        for (int e = 0; e < execs; ++e) strip<4><<<dim3(strips, parts), 128, 0, s>>>(bufs[e % sets], (int)row_bytes, tw, rr, out);
        CK(cudaStreamEndCapture(s, &g)); CK(cudaGraphInstantiate(&ge, g, 0));
        cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
        for (int w = 0; w < 3; ++w) CK(cudaGraphLaunch(ge, s));
        std::vector<float> t;
        for (int r = 0; r < 20; ++r) { cudaEventRecord(e0, s); cudaGraphLaunch(ge, s); cudaEventRecord(e1, s); cudaEventSynchronize(e1); float ms; cudaEventElapsedTime(&ms, e0, e1); t.push_back(ms * 1000 / execs); }
        std::sort(t.begin(), t.end());
        printf("W %5dx%-5d strip %4d B  grid %3dx%-3d (%4d CTAs, %4d rows each)  median %7.2f us  (%.3f TB/s)\n", wd.rows, wd.cols, tw, strips, parts, strips * parts, rr, t[10], B / (t[10] * 1e-6) / 1e12);
        cudaGraphExecDestroy(ge); cudaGraphDestroy(g);
      }
    }
    for (auto& b : bufs) cudaFree(b);
  }
  CK(cudaDeviceSynchronize());
}
