// mucc runtime: scalar operators, in the compute type (fp32 or fp64).
#pragma once

#include "types.h"

namespace mucc {
namespace op {

__device__ __forceinline__ float exp(float x) { return expf(x); }
__device__ __forceinline__ double exp(double x) { return ::exp(x); }
__device__ __forceinline__ float log(float x) { return logf(x); }
__device__ __forceinline__ double log(double x) { return ::log(x); }
__device__ __forceinline__ float sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double sqrt(double x) { return ::sqrt(x); }
template <class C> __device__ __forceinline__ C square(C x) { return x * x; }
template <class C> __device__ __forceinline__ C silu(C x) { return x / (C(1) + exp(-x)); }
template <class C> __device__ __forceinline__ C sigmoid(C x) { return C(1) / (C(1) + exp(-x)); }
// Exact GELU: 0.5·x·(1 + erf(x/√2)).
__device__ __forceinline__ float gelu(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
__device__ __forceinline__ double gelu(double x) { return 0.5 * x * (1.0 + ::erf(x * 0.70710678118654752)); }
// NaN propagates through relu and clamp.
template <class C> __device__ __forceinline__ C relu(C x) { return x > C(0) || x != x ? x : C(0); }
template <class C> __device__ __forceinline__ C clamp(C x, C lo, C hi) { return x != x ? x : (x < lo ? lo : (x > hi ? hi : x)); }

template <class C> __device__ __forceinline__ C add(C a, C b) { return a + b; }
template <class C> __device__ __forceinline__ C sub(C a, C b) { return a - b; }
template <class C> __device__ __forceinline__ C mul(C a, C b) { return a * b; }
template <class C> __device__ __forceinline__ C div(C a, C b) { return a / b; }
__device__ __forceinline__ float pow(float a, float b) { return powf(a, b); }
__device__ __forceinline__ double pow(double a, double b) { return ::pow(a, b); }

}  // namespace op
}  // namespace mucc
