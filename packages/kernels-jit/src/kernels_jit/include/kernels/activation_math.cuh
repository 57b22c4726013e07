// Activation functions in fp32 for bandwidth-bound kernels: accurate to fp32 level, built without
// --use_fast_math, and cheap enough in issue slots that a bf16 kernel stays memory-bound.
//
// Budget: at the H200's 4.27 TB/s an SM must retire ~3 outputs per cycle of a gated bf16 op
// (6 bytes each), ~40 instructions per output at full issue. The IEEE division of
// x / (1 + e^-x) costs ~20 (FCHK, a branch and a slow-path call per element) and libdevice erff
// ~28, so these use the approximate MUFU reciprocal and exp2 (1 and 2 ulp) directly.
//
// Accuracy against torch's fp32 functions (the references compute in fp32 and round once): a few
// fp32 ulp for sigmoid, silu and gelu_tanh (the error of the exp argument, |x| * 2^-24, dominates);
// within 4e-7 absolute of the exact GELU for gelu_erf, as close as torch's own erff-based fp32
// GELU (4.5e-7). After rounding to bf16/fp16 they agree with the reference except for rare
// one-ulp ties.
#pragma once

namespace kernels {
namespace math {

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kSqrtHalf = 0.70710678118654752440f;  // 1 / sqrt(2)
constexpr float kSqrt2OverPi = 0.79788456080286535588f;
constexpr float kGeluTanhCubic = 0.044715f;

// 2^x within 2 ulp; results below 2^-126 flush to 0, which here only meets a "1 +" or scales a
// term already below fp32's normal range.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// 1 / x within 1 ulp; 1 / inf = 0.
__device__ __forceinline__ float rcp_approx(float x) {
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 1 / (1 + e^-x): 0 for x < -88 (e^-x = inf), 1 for large x, NaN for NaN.
__device__ __forceinline__ float sigmoid(float x) {
  return rcp_approx(1.0f + exp2_approx(-kLog2e * x));
}

// x * sigmoid(x). silu(-inf) is NaN, as in torch.
__device__ __forceinline__ float silu(float x) { return x * sigmoid(x); }

// GELU with the exact erf, 0.5 x (1 + erf(x / sqrt 2)). With h = erfc(|x| / sqrt 2) / 2 it is
// x (1 - h) for x >= 0 and x h for x < 0: no cancellation for negative x, inf stays inf. h is
// t P(t) e^(-x^2 / 2), t = 1 / (1 + 0.39 |x| / sqrt 2), P of degree 5 (its coefficients halved)
// fitted for this library: minimax absolute error 8e-9 for erfc in float64; in fp32 the rounding
// of the exp argument dominates. 16 instructions, against ~28 for libdevice's erff.
__device__ __forceinline__ float gelu_erf(float x) {
  const float ax = fabsf(x);
  const float t = rcp_approx(fmaf(0.39f * kSqrtHalf, ax, 1.0f));
  float p = -0.11376848780309005f;
  p = fmaf(p, t, 0.44333188016872770f);
  p = fmaf(p, t, -0.31769964519552940f);
  p = fmaf(p, t, 0.32477930102464355f);
  p = fmaf(p, t, 0.045694366822230325f);
  p = fmaf(p, t, 0.11766258413649794f);
  const float h = p * t * exp2_approx(-0.5f * kLog2e * ax * ax);
  return x * (x >= 0.0f ? 1.0f - h : h);
}

// GELU, tanh approximation: 0.5 x (1 + tanh(u)), u = sqrt(2/pi) (x + 0.044715 x^3), computed as
// x * sigmoid(2u) (the same function, without the cancellation of 1 + tanh(u) for u < 0).
__device__ __forceinline__ float gelu_tanh(float x) {
  const float u = kSqrt2OverPi * x * fmaf(kGeluTanhCubic * x, x, 1.0f);
  return x * rcp_approx(1.0f + exp2_approx(-2.0f * kLog2e * u));
}

// relu(x)^2; NaN stays NaN like torch.relu.
__device__ __forceinline__ float relu2(float x) {
  const float r = x < 0.0f ? 0.0f : x;
  return r * r;
}

// Functors, so kernels take the activation as a template argument.
struct Silu {
  __device__ __forceinline__ float operator()(float x) const { return silu(x); }
};
struct GeluErf {
  __device__ __forceinline__ float operator()(float x) const { return gelu_erf(x); }
};
struct GeluTanh {
  __device__ __forceinline__ float operator()(float x) const { return gelu_tanh(x); }
};
struct Relu2 {
  __device__ __forceinline__ float operator()(float x) const { return relu2(x); }
};
// cap * tanh(x / cap), with 1 / cap precomputed on the host. tanhf is the precise libdevice
// function (~16 instructions, 2 ulp): fp16 and fp32 outputs match torch.tanh to fp32 level.
struct Softcap {
  float cap;
  float inv_cap;
  __device__ __forceinline__ float operator()(float x) const { return cap * tanhf(x * inv_cap); }
};
// The same for bf16 outputs, where a bf16 kernel reading and writing 4 bytes per element has
// ~28 instructions per element at full bandwidth: tanh(t) = 1 - 2 / (1 + e^(2t)) in 6
// instructions, absolute error ~2e-7 in tanh. That is far below a bf16 ulp of the result except
// for small |t|, where 1 - 2 / (1 + e^(2t)) cancels (4.3 bf16 ulps off near |x| = 1e-4 with cap
// 30): below |t| = 1/16 the odd series t (1 - t^2/3 + 2 t^4/15) (truncation error 0.054 t^7,
// relative 3e-9 there) is used instead, 4 more instructions and a select.
// inv_cap = 1 / cap, scale = 2 log2(e) / cap.
struct SoftcapExp {
  float cap;
  float inv_cap;
  float scale;
  __device__ __forceinline__ float operator()(float x) const {
    const float t = x * inv_cap;
    const float t2 = t * t;
    const float series = t * fmaf(t2, fmaf(t2, 2.0f / 15.0f, -1.0f / 3.0f), 1.0f);
    const float wide = fmaf(-2.0f, rcp_approx(1.0f + exp2_approx(x * scale)), 1.0f);
    return cap * (fabsf(t) < 0.0625f ? series : wide);
  }
};

}  // namespace math
}  // namespace kernels
