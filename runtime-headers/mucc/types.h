// mucc runtime: element types, conversions to the compute type, and vector storage.
//
// No C++ standard-library headers: the same code compiles under nvcc and NVRTC.
#pragma once

#include <cuda_fp16.h>
#include <cuda_bf16.h>

namespace mucc {

using i64 = long long;
using u64 = unsigned long long;
using i32 = int;
using u32 = unsigned int;
using i16 = short;
using u16 = unsigned short;
using i8 = signed char;
using u8 = unsigned char;
using f16 = __half;
using bf16 = __nv_bfloat16;

// The type arithmetic runs in: fp32 for 16-bit floats and fp32, fp64 for fp64 and integers
// (exact for every 32-bit integer).
template <class T> struct ComputeOf { using type = double; };
template <> struct ComputeOf<f16> { using type = float; };
template <> struct ComputeOf<bf16> { using type = float; };
template <> struct ComputeOf<float> { using type = float; };
template <class T> using Compute = typename ComputeOf<T>::type;

__device__ __forceinline__ float to_compute(f16 x) { return __half2float(x); }
__device__ __forceinline__ float to_compute(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_compute(float x) { return x; }
__device__ __forceinline__ double to_compute(double x) { return x; }
__device__ __forceinline__ double to_compute(i64 x) { return (double)x; }
__device__ __forceinline__ double to_compute(u64 x) { return (double)x; }
__device__ __forceinline__ double to_compute(i32 x) { return (double)x; }
__device__ __forceinline__ double to_compute(u32 x) { return (double)x; }
__device__ __forceinline__ double to_compute(i16 x) { return (double)x; }
__device__ __forceinline__ double to_compute(u16 x) { return (double)x; }
__device__ __forceinline__ double to_compute(i8 x) { return (double)x; }
__device__ __forceinline__ double to_compute(u8 x) { return (double)x; }

// Rounds once, to nearest (even for floats); integers saturate.
template <class T> __device__ __forceinline__ T from_compute(Compute<T> x);
template <> __device__ __forceinline__ f16 from_compute<f16>(float x) { return __float2half_rn(x); }
template <> __device__ __forceinline__ bf16 from_compute<bf16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ float from_compute<float>(float x) { return x; }
template <> __device__ __forceinline__ double from_compute<double>(double x) { return x; }

template <class T> __device__ __forceinline__ T saturate_int(double x, double lo, double hi) {
  x = rint(x);
  return (T)(x != x ? 0.0 : (x < lo ? lo : (x > hi ? hi : x)));
}
template <> __device__ __forceinline__ i64 from_compute<i64>(double x) { return saturate_int<i64>(x, -9223372036854775808.0, 9223372036854774784.0); }
template <> __device__ __forceinline__ u64 from_compute<u64>(double x) { return saturate_int<u64>(x, 0.0, 18446744073709549568.0); }
template <> __device__ __forceinline__ i32 from_compute<i32>(double x) { return saturate_int<i32>(x, -2147483648.0, 2147483647.0); }
template <> __device__ __forceinline__ u32 from_compute<u32>(double x) { return saturate_int<u32>(x, 0.0, 4294967295.0); }
template <> __device__ __forceinline__ i16 from_compute<i16>(double x) { return saturate_int<i16>(x, -32768.0, 32767.0); }
template <> __device__ __forceinline__ u16 from_compute<u16>(double x) { return saturate_int<u16>(x, 0.0, 65535.0); }
template <> __device__ __forceinline__ i8 from_compute<i8>(double x) { return saturate_int<i8>(x, -128.0, 127.0); }
template <> __device__ __forceinline__ u8 from_compute<u8>(double x) { return saturate_int<u8>(x, 0.0, 255.0); }

// −∞, +∞ and a quiet NaN in the compute type.
template <class C> __device__ __forceinline__ C neg_inf();
template <> __device__ __forceinline__ float neg_inf<float>() { return __int_as_float(0xff800000); }
template <> __device__ __forceinline__ double neg_inf<double>() { return __longlong_as_double(0xfff0000000000000ULL); }
template <class C> __device__ __forceinline__ C inf();
template <> __device__ __forceinline__ float inf<float>() { return __int_as_float(0x7f800000); }
template <> __device__ __forceinline__ double inf<double>() { return __longlong_as_double(0x7ff0000000000000ULL); }
template <class C> __device__ __forceinline__ C nan();
template <> __device__ __forceinline__ float nan<float>() { return __int_as_float(0x7fc00000); }
template <> __device__ __forceinline__ double nan<double>() { return __longlong_as_double(0x7ff8000000000000ULL); }

// x, hidden from the optimiser: what is computed from it is recomputed where it is used rather
// than hoisted out of a loop and kept live in registers across its iterations.
__device__ __forceinline__ int opaque(int x) {
  int y;
  asm volatile("mov.b32 %0, %1;" : "=r"(y) : "r"(x));
  return y;
}

// N consecutive elements, aligned to their size (16 bytes for a full vector): one load or store.
template <class T, int N> struct alignas(sizeof(T) * N) Vec {
  T v[N];
};

}  // namespace mucc
