// mucc runtime: scalar operators, in the compute type (fp32 or fp64).
#pragma once

#include "types.h"

namespace mucc {
namespace op {

__device__ __forceinline__ float exp(float x) { return expf(x); }
__device__ __forceinline__ double exp(double x) { return ::exp(x); }
// exp through ex2.approx (__expf: within 2 + 1.16·|x| fp32 ulps, i.e. a relative error under
// 1.3e-5 wherever the result is finite and normal), for values the plan rounds to a 16-bit
// type right after (a 16-bit ulp is 2^-11 relative or more): the rounded result is the exact
// one's, or one 16-bit ulp away where exp(x) lies that close to a rounding boundary.
// fp64 computes exactly.
__device__ __forceinline__ float exp_approx(float x) { return __expf(x); }
__device__ __forceinline__ double exp_approx(double x) { return ::exp(x); }
// The same with results under 2^-126 flushed to zero (ex2.approx.ftz: one multiply and one
// MUFU.EX2, where the form above adds a range test, a halving and a squaring per value), for
// values rounded to fp16 right after, whose least subnormal (2^-24) makes every flushed value
// round to zero anyway.
__device__ __forceinline__ float exp_approx_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x * 1.44269504088896341f));
  return y;
}
__device__ __forceinline__ double exp_approx_ftz(double x) { return ::exp(x); }
__device__ __forceinline__ float log(float x) { return logf(x); }
__device__ __forceinline__ double log(double x) { return ::log(x); }
__device__ __forceinline__ float sqrt(float x) { return sqrtf(x); }
__device__ __forceinline__ double sqrt(double x) { return ::sqrt(x); }
template <class C> __device__ __forceinline__ C square(C x) { return x * x; }
// silu and sigmoid in fp32 divide by 1 + e^-x with the approximate division (within 2 ulps: a
// reciprocal and a multiply instead of the IEEE division's checked sequence with its slow
// path). The denominator is at least 1; when it is infinite (x < -88.7) the quotient is ±0 as
// the exact one is, and below 2^126 ≤ denominator (x < -87.3) it is 0 where the exact value
// is under 1e-36. fp64 divides exactly.
__device__ __forceinline__ float silu(float x) { return __fdividef(x, 1.0f + expf(-x)); }
__device__ __forceinline__ double silu(double x) { return x / (1.0 + ::exp(-x)); }
__device__ __forceinline__ float sigmoid(float x) { return __fdividef(1.0f, 1.0f + expf(-x)); }
__device__ __forceinline__ double sigmoid(double x) { return 1.0 / (1.0 + ::exp(-x)); }
// silu and sigmoid for a value that reaches a 16-bit store through products only (the plan's
// ChainPlan::approx_logistic): e^-x by exp_approx_ftz, the reciprocal of 1 + e^-x
// (at least 1, so never subnormal) by rcp.approx.ftz; relative error about 1e-5 for |x| < 88,
// far below the 16-bit rounding. e^-x overflows to +inf below x ≈ -88.7, where the reciprocal
// is 0 and silu gives ±0 as the exact one nearly does. fp64 computes them exactly.
__device__ __forceinline__ float rcp_approx_ftz(float x) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
__device__ __forceinline__ float sigmoid_approx(float x) { return rcp_approx_ftz(1.0f + exp_approx_ftz(-x)); }
__device__ __forceinline__ double sigmoid_approx(double x) { return sigmoid(x); }
__device__ __forceinline__ float silu_approx(float x) { return x * sigmoid_approx(x); }
__device__ __forceinline__ double silu_approx(double x) { return silu(x); }
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
