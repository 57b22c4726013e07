// mamba.causal_conv1d_fwd, CUDA: the depthwise causal conv1d of prefill sequences, in place.
//
// A CTA per (sequence, channel block) walks the whole sequence in rounds. In a round each thread
// owns kCG-th of the block's channels (one 16-byte pack of kN channels, or one channel) and a run
// of R <= kR consecutive time steps: it loads its run plus the W-1 rows before it (all the
// round's reads happen before one barrier, all its writes after it, so every input is original),
// computes in fp32 with a sliding window, then stores. The W-1 original rows at the end of each
// round go to shared memory: they are the halo of the next round and, after the last round, the
// new conv state. The prefix (the stored state or zeros) seeds the first halo. Channel-last x
// (stride (1, row): the proj_out view) takes the 16-byte path; other layouts the scalar one.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/checks.h>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/tensor.h>
#include <kernels/vec.cuh>

#include "mamba_common.cuh"

namespace causal_conv1d_fwd_detail {

constexpr int kThreads = 256;
constexpr int kR = 8;  // time steps per thread per round, at most

struct Params {
  void* x;
  const void* weight;
  const void* bias;
  void* states;
  const void* qsl;
  const void* indices;
  const bool* init;
  int64_t dim, tokens, length;   // tokens: T of a varlen x; length: L of a batched x
  int64_t xs_b, xs_d, xs_t;      // x strides (xs_b = 0 for varlen)
  int64_t ws_d, ws_w, bs_d;
  int64_t ss_s, ss_d, ss_w, slots;
  int64_t pad_slot_id;
  int64_t init_stride;
  int wcode, bcode, scode;
  bool varlen, qsl64, indices64, silu;
};

template <typename T, int kN, int kCG, int kW>
__global__ void __launch_bounds__(kThreads, 2) fwd_kernel(const Params p) {
  using Pk = kernels::Pack<T, kN>;
  constexpr int kRuns = kThreads / kCG;
  constexpr int kHalo = kW - 1;
  constexpr int kBlockCh = kCG * kN;
  __shared__ float halo[2][kHalo][kBlockCh];
  __shared__ __align__(16) float wsm[kW + 1][kBlockCh];  // the taps, then the bias

  const int64_t b = blockIdx.y;
  const int cg = threadIdx.x % kCG, tr = threadIdx.x / kCG;
  const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * kCG + cg) * kN;
  const bool active = c0 < p.dim;

  // The sequence: its columns, its state row, whether it runs at all (uniform over the CTA).
  int64_t start = 0, len = p.length;
  if (p.varlen) {
    start = mamba_common::load_index(p.qsl, b, p.qsl64);
    const int64_t end = mamba_common::load_index(p.qsl, b + 1, p.qsl64);
    if (start < 0 || end > p.tokens || end < start) return;
    len = end - start;
  }
  int64_t row = b;
  if (p.indices != nullptr) {
    row = mamba_common::load_index(p.indices, b, p.indices64);
    if (row == p.pad_slot_id) return;
  }
  if (p.states != nullptr && (row < 0 || row >= p.slots)) return;
  const bool use_state = p.states != nullptr && p.init != nullptr && p.init[b * p.init_stride];

  T* x = static_cast<T*>(p.x) + b * p.xs_b + start * p.xs_t + c0 * p.xs_d;
  // The taps and bias of the block's channels, and the first halo (the prefix), in shared memory.
  if (tr == 0) {
#pragma unroll
    for (int i = 0; i < kN; ++i) {
      const int64_t c = active ? c0 + i : 0;
#pragma unroll
      for (int j = 0; j < kW; ++j)
        wsm[j][cg * kN + i] = mamba_common::load_any(p.weight, c * p.ws_d + j * p.ws_w, p.wcode);
      wsm[kW][cg * kN + i] = p.bias ? mamba_common::load_any(p.bias, c * p.bs_d, p.bcode) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kHalo; ++k)
#pragma unroll
      for (int i = 0; i < kN; ++i)
        halo[0][k][cg * kN + i] =
            use_state && active
                ? mamba_common::load_any(p.states, row * p.ss_s + (c0 + i) * p.ss_d + k * p.ss_w,
                                         p.scode)
                : 0.0f;
  }
  __syncthreads();

  const int64_t run = len < static_cast<int64_t>(kRuns) * kR ? (len + kRuns - 1) / kRuns : kR;
  const int64_t per_round = run * kRuns;
  int cur = 0;
  for (int64_t rs = 0; rs < len; rs += per_round) {
    const int64_t t0 = rs + tr * run;
    // Loads: positions t0 - kHalo + m, m < run + kHalo (global when inside this round's columns
    // or later, shared halo when before the round).
    Pk raw[kR + kHalo];
    if (active) {
#pragma unroll
      for (int m = 0; m < kR + kHalo; ++m) {
        const int64_t pos = t0 - kHalo + m;
        if (m < run + kHalo && pos >= rs && pos < len) raw[m].load(x + pos * p.xs_t);
      }
    }
    // The next halo: the original last kHalo columns of this round.
    const int64_t round_end = rs + per_round < len ? rs + per_round : len;
    if (tr == 0 && active) {
#pragma unroll
      for (int k = 0; k < kHalo; ++k) {
        const int64_t pos = round_end - kHalo + k;
        float f[kN];
        if (pos >= rs) {
          Pk v;
          v.load(x + pos * p.xs_t);
          v.unpack(f);
        } else {
#pragma unroll
          for (int i = 0; i < kN; ++i) f[i] = halo[cur][pos - rs + kHalo][cg * kN + i];
        }
#pragma unroll
        for (int i = 0; i < kN; ++i) halo[cur ^ 1][k][cg * kN + i] = f[i];
      }
    }
    // Compute: a sliding window of kHalo fp32 columns.
    if (active) {
      float win[kHalo][kN];
#pragma unroll
      for (int m = 0; m < kHalo; ++m) {
        const int64_t pos = t0 - kHalo + m;
        if (pos < rs) {
#pragma unroll
          for (int i = 0; i < kN; ++i) win[m][i] = halo[cur][pos - rs + kHalo][cg * kN + i];
        } else {
          raw[m].unpack(win[m]);
        }
      }
#pragma unroll
      for (int m = 0; m < kR; ++m) {
        if (m < run) {
          float f[kN], y[kN];
          raw[m + kHalo].unpack(f);
#pragma unroll
          for (int i = 0; i < kN; ++i) {
            const int ch = cg * kN + i;
            float acc = wsm[kW][ch];
#pragma unroll
            for (int j = 0; j < kHalo; ++j) acc += wsm[j][ch] * win[j][i];
            acc += wsm[kW - 1][ch] * f[i];
            y[i] = p.silu ? mamba_common::silu(acc) : acc;
          }
#pragma unroll
          for (int j = 0; j + 1 < kHalo; ++j)
#pragma unroll
            for (int i = 0; i < kN; ++i) win[j][i] = win[j + 1][i];
#pragma unroll
          for (int i = 0; i < kN; ++i) win[kHalo - 1][i] = f[i];
          raw[m + kHalo].pack(y);
        }
      }
    }
    __syncthreads();  // every read of the round (global and halo) before any write
    if (active) {
#pragma unroll
      for (int m = 0; m < kR; ++m)
        if (m < run && t0 + m < len) raw[m + kHalo].store(x + (t0 + m) * p.xs_t);
    }
    cur ^= 1;
  }
  // The new state: the last kHalo columns of concat(prefix, x_b), original values.
  if (p.states != nullptr && tr == 0 && active) {
#pragma unroll
    for (int k = 0; k < kHalo; ++k)
#pragma unroll
      for (int i = 0; i < kN; ++i)
        mamba_common::store_any(p.states, row * p.ss_s + (c0 + i) * p.ss_d + k * p.ss_w, p.scode,
                                halo[cur][k][cg * kN + i]);
  }
}

template <typename T, int kN, int kCG>
void launch(const kernels::Launch& ctx, const Params& p, int64_t width, int64_t seqs) {
  const dim3 grid(kernels::ceil_div(p.dim, kCG * kN), static_cast<unsigned>(seqs));
  switch (width) {
    case 2: fwd_kernel<T, kN, kCG, 2><<<grid, kThreads, 0, ctx.stream>>>(p); break;
    case 3: fwd_kernel<T, kN, kCG, 3><<<grid, kThreads, 0, ctx.stream>>>(p); break;
    default: fwd_kernel<T, kN, kCG, 4><<<grid, kThreads, 0, ctx.stream>>>(p); break;
  }
}

}  // namespace causal_conv1d_fwd_detail

// x: varlen [D, T] (with query_start_loc [B+1]) or batched [Bt, D, L], any strides, float32,
// float16 or bfloat16, overwritten; weight [D, W] (W in 2..4), bias [D] or None, conv_states
// [S, D, W-1] or None (any float dtype, any strides); cache_indices [B] int32/int64 or None;
// has_initial_state [B] bool or None.
inline void causal_conv1d_fwd(tvm::ffi::TensorView x, tvm::ffi::TensorView weight,
                              tvm::ffi::Optional<tvm::ffi::TensorView> bias,
                              tvm::ffi::Optional<tvm::ffi::TensorView> conv_states,
                              tvm::ffi::Optional<tvm::ffi::TensorView> query_start_loc,
                              tvm::ffi::Optional<tvm::ffi::TensorView> cache_indices,
                              tvm::ffi::Optional<tvm::ffi::TensorView> has_initial_state,
                              bool silu, int64_t pad_slot_id) {
  namespace detail = causal_conv1d_fwd_detail;
  constexpr const char* kOp = "mamba.causal_conv1d_fwd";
  // 1. Validate.
  TVM_FFI_CHECK(x.ndim() == 2 || x.ndim() == 3, ValueError)
      << kOp << ": x must be [D, T] or [Bt, D, L], got " << kernels::shape_string(x);
  kernels::check_device(kOp, "x", x, kDLCUDA);
  kernels::check_ndim(kOp, "weight", weight, 2);
  kernels::check_same_device(kOp, "weight", weight, "x", x);
  const bool varlen = x.ndim() == 2;
  const int64_t dim = varlen ? x.size(0) : x.size(1);
  const int64_t width = weight.size(1);
  TVM_FFI_CHECK(weight.size(0) == dim && width >= 2 && width <= 4, ValueError)
      << kOp << ": weight must be [D, W] = [" << dim << ", 2..4], got "
      << kernels::shape_string(weight);
  detail::Params p{};
  p.wcode = mamba_common::float_code(kOp, "weight", weight);
  int64_t seqs = varlen ? 0 : x.size(0);
  if (varlen) {
    TVM_FFI_CHECK(query_start_loc.has_value(), ValueError)
        << kOp << ": varlen x [D, T] needs query_start_loc";
    const tvm::ffi::TensorView q = query_start_loc.value();
    kernels::check_ndim(kOp, "query_start_loc", q, 1);
    TVM_FFI_CHECK(q.size(0) >= 1 && (q.stride(0) == 1 || q.size(0) <= 1), ValueError)
        << kOp << ": query_start_loc must be a contiguous [B+1] vector";
    kernels::check_same_device(kOp, "query_start_loc", q, "x", x);
    p.qsl64 = mamba_common::index_is64(kOp, "query_start_loc", q);
    p.qsl = kernels::data(q);
    seqs = q.size(0) - 1;
  } else {
    TVM_FFI_CHECK(!query_start_loc.has_value(), ValueError)
        << kOp << ": batched x takes no query_start_loc";
  }
  if (bias.has_value()) {
    const tvm::ffi::TensorView v = bias.value();
    kernels::check_ndim(kOp, "bias", v, 1);
    TVM_FFI_CHECK(v.size(0) == dim, ValueError) << kOp << ": bias must have " << dim << " entries";
    kernels::check_same_device(kOp, "bias", v, "x", x);
    p.bcode = mamba_common::float_code(kOp, "bias", v);
    p.bias = kernels::data(v);
    p.bs_d = v.stride(0);
  }
  if (conv_states.has_value()) {
    const tvm::ffi::TensorView v = conv_states.value();
    kernels::check_ndim(kOp, "conv_states", v, 3);
    TVM_FFI_CHECK(v.size(1) == dim && v.size(2) == width - 1, ValueError)
        << kOp << ": conv_states must be [S, " << dim << ", " << width - 1 << "], got "
        << kernels::shape_string(v);
    kernels::check_same_device(kOp, "conv_states", v, "x", x);
    p.scode = mamba_common::float_code(kOp, "conv_states", v);
    p.states = kernels::data(v);
    p.ss_s = v.stride(0);
    p.ss_d = v.stride(1);
    p.ss_w = v.stride(2);
    p.slots = v.size(0);
  }
  if (cache_indices.has_value()) {
    const tvm::ffi::TensorView v = cache_indices.value();
    kernels::check_ndim(kOp, "cache_indices", v, 1);
    TVM_FFI_CHECK(v.size(0) == seqs && (v.stride(0) == 1 || seqs <= 1), ValueError)
        << kOp << ": cache_indices must be a contiguous [" << seqs << "] vector";
    kernels::check_same_device(kOp, "cache_indices", v, "x", x);
    p.indices64 = mamba_common::index_is64(kOp, "cache_indices", v);
    p.indices = kernels::data(v);
  }
  if (has_initial_state.has_value()) {
    const tvm::ffi::TensorView v = has_initial_state.value();
    kernels::check_ndim(kOp, "has_initial_state", v, 1);
    TVM_FFI_CHECK(v.size(0) == seqs && kernels::is_dtype(v.dtype(), kDLBool, 8), ValueError)
        << kOp << ": has_initial_state must be a bool [" << seqs << "] vector";
    kernels::check_same_device(kOp, "has_initial_state", v, "x", x);
    p.init = kernels::data<const bool>(v);
    p.init_stride = v.stride(0);
  }
  TVM_FFI_CHECK(seqs <= 65535, ValueError) << kOp << ": at most 65535 sequences, got " << seqs;
  if (x.numel() == 0 || seqs == 0) return;
  p.x = kernels::data(x);
  p.weight = kernels::data(weight);
  p.ws_d = weight.stride(0);
  p.ws_w = weight.stride(1);
  p.dim = dim;
  p.varlen = varlen;
  if (varlen) {
    p.tokens = x.size(1);
    p.xs_b = 0;
    p.xs_d = x.stride(0);
    p.xs_t = x.stride(1);
  } else {
    p.length = x.size(2);
    p.xs_b = x.stride(0);
    p.xs_d = x.stride(1);
    p.xs_t = x.stride(2);
  }
  p.pad_slot_id = pad_slot_id;
  p.silu = silu;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  const kernels::Launch ctx(kOp, x);
  // 4. Dispatch: 16-byte packs along contiguous channels when everything lines up.
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T, [&] {
    constexpr int kN = kernels::kVectorBytes / static_cast<int>(sizeof(T));
    const int64_t esize = sizeof(T);
    const bool vec = (p.xs_d == 1 || dim == 1) && dim % kN == 0 &&
                     kernels::is_aligned(p.x) && (p.xs_t * esize) % 16 == 0 &&
                     (p.xs_b * esize) % 16 == 0;
    if (vec) {
      detail::launch<T, kN, 2>(ctx, p, width, seqs);
    } else {
      detail::launch<T, 1, 1>(ctx, p, width, seqs);
    }
  });
  kernels::check_launch(kOp);
}
