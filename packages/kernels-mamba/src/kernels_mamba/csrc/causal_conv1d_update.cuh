// mamba.causal_conv1d_update, CUDA: one decode step (or L speculative steps) of the depthwise
// causal conv1d. A thread per (batch row, channel): the W-1 window of the state in registers,
// the state row shifted (or written circularly at cache_seqlens % Ls) from the original values,
// then the L outputs, fp32 products and sums, one rounding. Rows whose state index is
// pad_slot_id (or out of range) are untouched. Any strides; x and state one dtype.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/checks.h>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/tensor.h>

#include "mamba_common.cuh"

namespace causal_conv1d_update_detail {

struct Params {
  void* x;
  void* state;
  const void* weight;
  const void* bias;
  const void* seqlens;
  const void* indices;
  int64_t batch, dim, length, slots, state_len;
  int64_t xs_b, xs_d, xs_l;           // x strides
  int64_t ss_s, ss_d, ss_l;           // state strides
  int64_t ws_d, ws_w, bs_d;           // weight, bias strides
  int64_t pad_slot_id;
  int wcode, bcode;
  bool seqlens64, indices64, silu;
};

template <typename T, int kW>
__global__ void __launch_bounds__(128) update_kernel(const Params p) {
  const int64_t d = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t b = blockIdx.y;
  if (d >= p.dim) return;
  int64_t row = b;
  if (p.indices != nullptr) {
    row = mamba_common::load_index(p.indices, b, p.indices64);
    if (row == p.pad_slot_id || row < 0 || row >= p.slots) return;
  }
  T* x = static_cast<T*>(p.x) + b * p.xs_b + d * p.xs_d;
  T* st = static_cast<T*>(p.state) + row * p.ss_s + d * p.ss_d;
  const int64_t ls = p.state_len, len = p.length;
  float w[kW];
#pragma unroll
  for (int j = 0; j < kW; ++j)
    w[j] = mamba_common::load_any(p.weight, d * p.ws_d + j * p.ws_w, p.wcode);
  const float bias = p.bias ? mamba_common::load_any(p.bias, d * p.bs_d, p.bcode) : 0.0f;
  // 1. The window: the W-1 state columns before the first new token (original values).
  float win[kW > 1 ? kW - 1 : 1];
  int64_t head = 0;  // circular: where the new tokens go
  if (p.seqlens != nullptr) {
    const int64_t s = mamba_common::load_index(p.seqlens, b, p.seqlens64);
    head = ((s % ls) + ls) % ls;
#pragma unroll
    for (int k = 0; k < kW - 1; ++k) {
      int64_t i = (head - (kW - 1) + k) % ls;
      i += i < 0 ? ls : 0;
      win[k] = kernels::to_float(st[i * p.ss_l]);
    }
  } else {
#pragma unroll
    for (int k = 0; k < kW - 1; ++k) win[k] = kernels::to_float(st[(ls - (kW - 1) + k) * p.ss_l]);
  }
  // 2. The state row, from the original state and x (reads run ahead of writes).
  if (p.seqlens != nullptr) {
    for (int64_t t = 0; t < len; ++t) {
      int64_t i = (head + t) % ls;
      st[i * p.ss_l] = x[t * p.xs_l];
    }
  } else {
    // new[j] = xx[j + L], xx = concat(state, x): the columns older than the window move in
    // memory (ascending, so every read precedes the write over it), the window's from
    // registers, then x. In the usual Ls == W-1 nothing waits on a load but the window's.
    for (int64_t j = 0; j + len < ls - (kW - 1); ++j) st[j * p.ss_l] = st[(j + len) * p.ss_l];
#pragma unroll
    for (int k = 0; k < kW - 1; ++k) {
      const int64_t j = ls - (kW - 1) + k - len;
      if (j >= 0) st[j * p.ss_l] = kernels::from_float<T>(win[k]);  // exact: win came from T
    }
    for (int64_t t = len > ls ? len - ls : 0; t < len; ++t) st[(ls - len + t) * p.ss_l] = x[t * p.xs_l];
  }
  // 3. The outputs, overwriting x.
  for (int64_t t = 0; t < len; ++t) {
    const float xv = kernels::to_float(x[t * p.xs_l]);
    float acc = bias + w[kW - 1] * xv;
#pragma unroll
    for (int k = 0; k < kW - 1; ++k) acc += w[k] * win[k];
#pragma unroll
    for (int k = 0; k + 1 < kW - 1; ++k) win[k] = win[k + 1];
    win[kW - 2] = xv;
    x[t * p.xs_l] = kernels::from_float<T>(p.silu ? mamba_common::silu(acc) : acc);
  }
}

}  // namespace causal_conv1d_update_detail

// x [B, D, L] (a [B, D] x is passed as [B, D, 1]) and conv_state [S, D, Ls] of one dtype, any
// strides; weight [D, W] (W in 2..4), bias [D] or None of any float dtype; cache_seqlens and
// conv_state_indices [B] int32/int64 or None.
inline void causal_conv1d_update(tvm::ffi::TensorView x, tvm::ffi::TensorView conv_state,
                                 tvm::ffi::TensorView weight,
                                 tvm::ffi::Optional<tvm::ffi::TensorView> bias, bool silu,
                                 tvm::ffi::Optional<tvm::ffi::TensorView> cache_seqlens,
                                 tvm::ffi::Optional<tvm::ffi::TensorView> conv_state_indices,
                                 int64_t pad_slot_id) {
  namespace detail = causal_conv1d_update_detail;
  constexpr const char* kOp = "mamba.causal_conv1d_update";
  // 1. Validate.
  kernels::check_ndim(kOp, "x", x, 3);
  kernels::check_ndim(kOp, "conv_state", conv_state, 3);
  kernels::check_ndim(kOp, "weight", weight, 2);
  kernels::check_device(kOp, "x", x, kDLCUDA);
  kernels::check_same_dtype(kOp, "conv_state", conv_state, "x", x);
  kernels::check_same_device(kOp, "conv_state", conv_state, "x", x);
  kernels::check_same_device(kOp, "weight", weight, "x", x);
  const int64_t batch = x.size(0), dim = x.size(1), length = x.size(2);
  const int64_t width = weight.size(1);
  TVM_FFI_CHECK(weight.size(0) == dim && width >= 2 && width <= 4, ValueError)
      << kOp << ": weight must be [D, W] = [" << dim << ", 2..4], got "
      << kernels::shape_string(weight);
  TVM_FFI_CHECK(conv_state.size(1) == dim && conv_state.size(2) >= width - 1, ValueError)
      << kOp << ": conv_state must be [S, " << dim << ", >= " << width - 1 << "], got "
      << kernels::shape_string(conv_state);
  detail::Params p{};
  p.wcode = mamba_common::float_code(kOp, "weight", weight);
  if (bias.has_value()) {
    const tvm::ffi::TensorView bv = bias.value();
    kernels::check_ndim(kOp, "bias", bv, 1);
    TVM_FFI_CHECK(bv.size(0) == dim, ValueError) << kOp << ": bias must have " << dim << " entries";
    kernels::check_same_device(kOp, "bias", bv, "x", x);
    p.bcode = mamba_common::float_code(kOp, "bias", bv);
    p.bias = kernels::data(bv);
    p.bs_d = bv.stride(0);
  }
  if (cache_seqlens.has_value()) {
    const tvm::ffi::TensorView v = cache_seqlens.value();
    kernels::check_ndim(kOp, "cache_seqlens", v, 1);
    TVM_FFI_CHECK(v.size(0) == batch && (v.stride(0) == 1 || batch <= 1), ValueError)
        << kOp << ": cache_seqlens must be a contiguous [" << batch << "] vector";
    kernels::check_same_device(kOp, "cache_seqlens", v, "x", x);
    p.seqlens64 = mamba_common::index_is64(kOp, "cache_seqlens", v);
    p.seqlens = kernels::data(v);
  }
  if (conv_state_indices.has_value()) {
    const tvm::ffi::TensorView v = conv_state_indices.value();
    kernels::check_ndim(kOp, "conv_state_indices", v, 1);
    TVM_FFI_CHECK(v.size(0) == batch && (v.stride(0) == 1 || batch <= 1), ValueError)
        << kOp << ": conv_state_indices must be a contiguous [" << batch << "] vector";
    kernels::check_same_device(kOp, "conv_state_indices", v, "x", x);
    p.indices64 = mamba_common::index_is64(kOp, "conv_state_indices", v);
    p.indices = kernels::data(v);
  } else {
    TVM_FFI_CHECK(conv_state.size(0) >= batch, ValueError)
        << kOp << ": without conv_state_indices conv_state needs >= B = " << batch << " rows";
  }
  TVM_FFI_CHECK(batch <= 65535, ValueError) << kOp << ": B must be <= 65535, got " << batch;
  if (x.numel() == 0) return;
  p.x = kernels::data(x);
  p.state = kernels::data(conv_state);
  p.weight = kernels::data(weight);
  p.batch = batch;
  p.dim = dim;
  p.length = length;
  p.slots = conv_state.size(0);
  p.state_len = conv_state.size(2);
  p.xs_b = x.stride(0);
  p.xs_d = x.stride(1);
  p.xs_l = x.stride(2);
  p.ss_s = conv_state.stride(0);
  p.ss_d = conv_state.stride(1);
  p.ss_l = conv_state.stride(2);
  p.ws_d = weight.stride(0);
  p.ws_w = weight.stride(1);
  p.pad_slot_id = pad_slot_id;
  p.silu = silu;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  const kernels::Launch ctx(kOp, x);
  // 4. Dispatch on dtype and width, launch (checked).
  const dim3 grid(kernels::ceil_div(dim, 128), static_cast<unsigned>(batch));
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T, [&] {
    switch (width) {
      case 2: detail::update_kernel<T, 2><<<grid, 128, 0, ctx.stream>>>(p); break;
      case 3: detail::update_kernel<T, 3><<<grid, 128, 0, ctx.stream>>>(p); break;
      default: detail::update_kernel<T, 4><<<grid, 128, 0, ctx.stream>>>(p); break;
    }
  });
  kernels::check_launch(kOp);
}
