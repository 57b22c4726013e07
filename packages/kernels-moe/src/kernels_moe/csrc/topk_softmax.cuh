// moe.topk_softmax, CUDA: per token l = gating (fp32), l = c * tanh(l / c) when c != 0, l += bias,
// p = softmax(l); the k largest p (ties to the lower expert id) and their p, divided by their sum
// when renormalising.
//
// One warp per token, 4 tokens per block of 128 threads: lane `l` holds experts l, l + 32, ...
// in registers (kPer = ceil(E / 32) slots, E <= 1024; the row's loads are all issued at once,
// coalesced), a warp max and sum give the softmax, then k rounds of a lane-local max plus a warp
// shuffle max over 64-bit (score, ~expert) keys select the experts (k <= 32). Lane j writes
// column j. NaN logits make the row's probabilities NaN (no repair), as the reference.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/checks.h>
#include <kernels/cuda_dtype.cuh>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>
#include <kernels/reduce.cuh>
#include <kernels/tensor.h>

#include "moe_common.cuh"

namespace topk_softmax_detail {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxExperts = 1024;
constexpr int kMaxK = 32;

struct Params {
  const void* gating;
  const void* bias;  // [E] or null
  float* weights;
  int32_t* ids;
  int64_t g_s0, w_s0, w_s1, i_s0, i_s1;
  int64_t tokens;
  int experts, k, bias_code;
  float softcap;
  bool renormalize;
};

template <typename T, int kPer>
__global__ void __launch_bounds__(kThreads) topk_softmax_kernel(bool pdl, Params p) {
  const int lane = threadIdx.x & 31;
  const int64_t token = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (pdl) kernels::pdl_wait();
  if (token >= p.tokens) return;  // the whole warp leaves together
  const T* row = static_cast<const T*>(p.gating) + token * p.g_s0;
  float v[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = i * 32 + lane;
    v[i] = e < p.experts ? kernels::to_float(row[e]) : -INFINITY;
  }
  if (pdl) kernels::pdl_launch_dependents();
  float peak = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = i * 32 + lane;
    if (e < p.experts) {
      if (p.softcap != 0.0f) v[i] = p.softcap * tanhf(v[i] / p.softcap);
      if (p.bias) v[i] += moe_common::load_float(p.bias, p.bias_code, e);
      peak = fmaxf(peak, v[i]);
    }
  }
  peak = kernels::warp_max(peak);
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = i * 32 + lane;
    v[i] = e < p.experts ? expf(v[i] - peak) : 0.0f;
    total += v[i];
  }
  total = kernels::warp_sum(total);
  unsigned long long key[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = i * 32 + lane;
    v[i] = v[i] / total;
    // NaN probabilities rank first (torch's descending sort); the weights are NaN anyway.
    key[i] = e < p.experts ? moe_common::score_key(isnan(v[i]) ? INFINITY : v[i], e) : 0ull;
  }
  int expert;
  float weight, sum;
  moe_common::warp_topk<kPer>(key, v, p.k, lane, expert, weight, sum);
  if (lane < p.k) {
    if (p.renormalize) weight = weight / sum;
    p.weights[token * p.w_s0 + lane * p.w_s1] = weight;
    p.ids[token * p.i_s0 + lane * p.i_s1] = expert;
  }
}

template <typename T>
void launch(const kernels::Launch& ctx, const Params& p) {
  const unsigned grid = kernels::ceil_div(p.tokens, kWarps);
  const int per = (p.experts + 31) / 32;
  if (per <= 1)
    kernels::launch(ctx, topk_softmax_kernel<T, 1>, grid, kThreads, p);
  else if (per <= 2)
    kernels::launch(ctx, topk_softmax_kernel<T, 2>, grid, kThreads, p);
  else if (per <= 4)
    kernels::launch(ctx, topk_softmax_kernel<T, 4>, grid, kThreads, p);
  else if (per <= 8)
    kernels::launch(ctx, topk_softmax_kernel<T, 8>, grid, kThreads, p);
  else if (per <= 12)
    kernels::launch(ctx, topk_softmax_kernel<T, 12>, grid, kThreads, p);
  else if (per <= 16)
    kernels::launch(ctx, topk_softmax_kernel<T, 16>, grid, kThreads, p);
  else
    kernels::launch(ctx, topk_softmax_kernel<T, 32>, grid, kThreads, p);
}

}  // namespace topk_softmax_detail

// topk_weights [T, k] float32, topk_ids [T, k] int32 (any strides), gating [T, E] float
// (last dim contiguous), correction_bias [E] float or None; E <= 1024, k <= 32.
inline void topk_softmax(tvm::ffi::TensorView topk_weights, tvm::ffi::TensorView topk_ids,
                         tvm::ffi::TensorView gating, bool renormalize, double moe_softcapping,
                         tvm::ffi::Optional<tvm::ffi::TensorView> correction_bias) {
  namespace detail = topk_softmax_detail;
  constexpr const char* kOp = "moe.topk_softmax";
  // 1. Validate.
  kernels::check_ndim(kOp, "gating", gating, 2);
  kernels::check_ndim(kOp, "topk_weights", topk_weights, 2);
  kernels::check_ndim(kOp, "topk_ids", topk_ids, 2);
  kernels::check_same_shape(kOp, "topk_weights", topk_weights, "topk_ids", topk_ids);
  const int64_t tokens = gating.size(0), experts = gating.size(1), k = topk_weights.size(1);
  TVM_FFI_CHECK(topk_weights.size(0) == tokens, ValueError)
      << kOp << ": topk_weights must have T = " << tokens << " rows like gating, got shape "
      << kernels::shape_string(topk_weights);
  TVM_FFI_CHECK(k <= experts, ValueError)
      << kOp << ": k = " << k << " must be <= the number of experts E = " << experts;
  TVM_FFI_CHECK(experts <= detail::kMaxExperts && k <= detail::kMaxK, ValueError)
      << kOp << ": the CUDA kernel takes E <= " << detail::kMaxExperts << " and k <= "
      << detail::kMaxK << ", got E = " << experts << ", k = " << k;
  TVM_FFI_CHECK(kernels::is_dtype(topk_weights.dtype(), kDLFloat, 32), TypeError)
      << kOp << ": topk_weights must be float32";
  TVM_FFI_CHECK(kernels::is_dtype(topk_ids.dtype(), kDLInt, 32), TypeError)
      << kOp << ": topk_ids must be int32";
  kernels::check_device(kOp, "gating", gating, kDLCUDA);
  kernels::check_same_device(kOp, "topk_weights", topk_weights, "gating", gating);
  kernels::check_same_device(kOp, "topk_ids", topk_ids, "gating", gating);
  kernels::check_last_dim_contiguous(kOp, "gating", gating);
  detail::Params p{};
  if (correction_bias.has_value()) {
    const tvm::ffi::TensorView b = correction_bias.value();
    kernels::check_ndim(kOp, "correction_bias", b, 1);
    TVM_FFI_CHECK(b.size(0) == experts, ValueError)
        << kOp << ": correction_bias must have shape [" << experts << "] (E), got "
        << kernels::shape_string(b);
    kernels::check_contiguous(kOp, "correction_bias", b);
    kernels::check_same_device(kOp, "correction_bias", b, "gating", gating);
    p.bias_code = moe_common::float_code(kOp, "correction_bias", b.dtype());
    p.bias = kernels::data<const void>(b);
  }
  if (tokens == 0 || k == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(gating);
  const kernels::Launch ctx(kOp, gating);
  // 4. Dispatch on dtype and launch.
  p.gating = kernels::data<const void>(gating);
  p.weights = kernels::data<float>(topk_weights);
  p.ids = kernels::data<int32_t>(topk_ids);
  p.g_s0 = gating.stride(0);
  p.w_s0 = topk_weights.stride(0);
  p.w_s1 = topk_weights.stride(1);
  p.i_s0 = topk_ids.stride(0);
  p.i_s1 = topk_ids.stride(1);
  p.tokens = tokens;
  p.experts = static_cast<int>(experts);
  p.k = static_cast<int>(k);
  p.softcap = static_cast<float>(moe_softcapping);
  p.renormalize = renormalize;
  KERNELS_DISPATCH_FLOAT(gating.dtype(), kOp, T, [&] { detail::launch<T>(ctx, p); });
}
