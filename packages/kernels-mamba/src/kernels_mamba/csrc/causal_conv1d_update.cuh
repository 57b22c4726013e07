// mamba.causal_conv1d_update, CUDA: one decode step (or L speculative steps) of the depthwise
// causal conv1d.
//
// Vector path (the decode shape: L = 1, Ls = W-1, x and the state rows 16-byte aligned with the
// channels (x) and the state row contiguous): a thread per (kR batch rows, pack of kC = 16 /
// sizeof(T) channels); kR = 1 while that grid fits in one wave (16 CTAs of 64 per SM, <= 64
// registers), else kVecRows. A row's state is kC x (W-1) contiguous values (W-1 16-byte packs,
// [S, D, W-1] layout) or W-1 packs of kC channels ([S, W-1, D] layout, the channel-last state),
// its x one pack; the thread's taps are W packs (when weight is T and contiguous, else scalar
// loads). The rows' indices, x, taps and bias are issued first, then every state pack (the only
// loads that wait on the indices); the window is shifted (or read circularly at cache_seqlens %
// Ls) in registers, fp32 products, and the state and x packs are written back (a shifted state as
// a permutation of the raw packs). 64-thread CTAs, a grid of (D / kC / 64, B / kR).
// Generic path (anything else: L > 1, longer circular states, odd strides): a thread per
// (batch row, channel), the W-1 window in registers, the state row shifted (or written circularly)
// from the original values, then the L outputs.
// Rows whose state index is pad_slot_id (or out of range) are untouched. x and state one dtype.
// Both launch with PDL (kernels::pdl_for_grid): the launch overlaps the previous kernel.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(3);

#include <kernels/checks.h>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>
#include <kernels/tensor.h>
#include <kernels/vec.cuh>

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
  bool weight_vec, bias_vec;  // vector path: taps / bias are T, contiguous and 16-byte aligned
};

constexpr int kVecThreads = 64;
constexpr int kVecRows = 4;  // batch rows per thread past one wave of single rows
// Resident CTAs per SM of the one-row vector kernel (its register cap: <= 64 registers, 1024
// threads, 32 warps per SM). The kVecRows kernel keeps its 168 registers (6 CTAs per SM; at
// 128 it spills 40-64 bytes).
constexpr int kVecCtasOne = 16;

// The raw bits of element e (a compile-time index once unrolled) of kH packs of kC elements:
// the element's 32-bit word and its half (16-bit data) or the word itself (fp32).
template <typename Pk, int kH>
__device__ __forceinline__ uint32_t raw_word(const Pk (&packs)[kH], int e) {
  constexpr int kPerWord = Pk::kPerWord;
  return packs[e / Pk::size].w[(e % Pk::size) / kPerWord];
}

// The shifted state in place, from raw bits: column k of channel i takes column k + 1, the last
// column takes x. kChLast: the packs are columns ([W-1, D] row); else the packs hold the
// [D, W-1] row's elements channel-major.
template <bool kChLast, typename Pk, int kH>
__device__ __forceinline__ void shift_raw(Pk (&sp)[kH], const Pk& xp) {
  constexpr int kC = Pk::size;
  constexpr int kPerWord = Pk::kPerWord;
  if constexpr (kChLast) {
#pragma unroll
    for (int a = 0; a + 1 < kH; ++a) sp[a] = sp[a + 1];
    sp[kH - 1] = xp;
  } else {
    Pk src[kH];  // the original packs (sp is overwritten)
#pragma unroll
    for (int a = 0; a < kH; ++a) src[a] = sp[a];
    const Pk xs[1] = {xp};
#pragma unroll
    for (int a = 0; a < kH; ++a) {
#pragma unroll
      for (int q = 0; q < Pk::kWords; ++q) {
        uint32_t part[kPerWord];
        int half[kPerWord];
#pragma unroll
        for (int h = 0; h < kPerWord; ++h) {
          const int e = a * kC + q * kPerWord + h;  // output element: channel e / kH, column e % kH
          const int ch = e / kH, k = e % kH;
          const int from = k + 1 < kH ? e + 1 : ch;  // in the state, or x's channel ch
          part[h] = k + 1 < kH ? raw_word(src, from) : raw_word(xs, from);
          half[h] = from % kPerWord;
        }
        if constexpr (kPerWord == 1) {
          sp[a].w[q] = part[0];
        } else {
          // Low half from part[0] (bytes 0-3), high half from part[1] (bytes 4-7).
          const unsigned sel = (half[0] ? 0x32u : 0x10u) | (half[1] ? 0x7600u : 0x5400u);
          sp[a].w[q] = __byte_perm(part[0], part[1], sel);
        }
      }
    }
  }
}

// One row of the vector path in registers: the state packs sp (kW-1 of them, updated to the new
// state) and the x pack xp (replaced by the outputs), taps w and bias of the thread's channels.
// kCirc: x goes to column head of a circular state (the window starts after it), else the state
// shifts. kChLast: the state row is [W-1, D] (stride (1, ...) over channels) rather than [D, W-1].
// The column selection is per row, not per channel: per channel only FSELs, FMAs and the
// activation (silu_for: the MUFU form for 16-bit data).
template <typename T, int kW, bool kChLast, bool kCirc, typename Pk>
__device__ __forceinline__ void update_vec_row(Pk (&sp)[kW - 1], Pk& xp,
                                               const float (&w)[Pk::size][kW],
                                               const float (&bias)[Pk::size], int head,
                                               bool silu) {
  constexpr int kC = Pk::size;
  constexpr int kH = kW - 1;
  // The state as s[channel][column] (original values), x as xf[channel].
  float s[kC][kH], xf[kC];
#pragma unroll
  for (int a = 0; a < kH; ++a) {
    float f[kC];
    sp[a].unpack(f);
#pragma unroll
    for (int i = 0; i < kC; ++i) {
      if constexpr (kChLast) {
        s[i][a] = f[i];
      } else {
        s[(a * kC + i) / kH][(a * kC + i) % kH] = f[i];
      }
    }
  }
  xp.unpack(xf);
  // Circular: window slot k is column (head + k) % kH (sel[k][j]), x replaces column head.
  bool sel[kH][kH];
#pragma unroll
  for (int k = 0; k < kH; ++k)
#pragma unroll
    for (int j = 0; j < kH; ++j) sel[k][j] = kCirc && (head + k) % kH == j;
  // The window (oldest first) and the new state.
  float y[kC], ns[kC][kH];
#pragma unroll
  for (int i = 0; i < kC; ++i) {
    float win[kH];
#pragma unroll
    for (int k = 0; k < kH; ++k) {
      if constexpr (kCirc) {
        float v = s[i][0];
#pragma unroll
        for (int j = 1; j < kH; ++j) v = sel[k][j] ? s[i][j] : v;
        win[k] = v;
        ns[i][k] = k == head ? xf[i] : s[i][k];
      } else {
        win[k] = s[i][k];
        ns[i][k] = k + 1 < kH ? s[i][k + 1] : xf[i];
      }
    }
    float acc = bias[i] + w[i][kW - 1] * xf[i];
#pragma unroll
    for (int k = 0; k < kH; ++k) acc += w[i][k] * win[k];
    y[i] = silu ? mamba_common::silu_for<T>(acc) : acc;
  }
  // The new state packs (exact: every value came from T), the outputs in the x pack. A shifted
  // state is a permutation of the raw state and x elements (pack moves for the [W-1, D] row, one
  // PRMT per word of 16-bit data for the [D, W-1] row) instead of a conversion back per value.
  if constexpr (!kCirc) {
    shift_raw<kChLast>(sp, xp);
  } else {
#pragma unroll
    for (int a = 0; a < kH; ++a) {
      float f[kC];
#pragma unroll
      for (int i = 0; i < kC; ++i) {
        if constexpr (kChLast) {
          f[i] = ns[i][a];
        } else {
          f[i] = ns[(a * kC + i) / kH][(a * kC + i) % kH];
        }
      }
      sp[a].pack(f);
    }
  }
  xp.pack(y);
}

// The vector path (see the header): kR batch rows per thread (rows blockIdx.y * kR + r).
template <typename T, int kW, bool kChLast, int kR>
__global__ void __launch_bounds__(kVecThreads, kR == 1 ? kVecCtasOne : 1)
    update_vec_kernel(bool pdl, const Params p) {
  constexpr int kC = kernels::kVectorBytes / static_cast<int>(sizeof(T));
  constexpr int kH = kW - 1;  // state columns (Ls == W-1 on this path)
  using Pk = kernels::Pack<T, kC>;
  const int64_t d0 = (static_cast<int64_t>(blockIdx.x) * kVecThreads + threadIdx.x) * kC;
  const int64_t b0 = static_cast<int64_t>(blockIdx.y) * kR;
  if (pdl) kernels::pdl_wait();
  if (d0 >= p.dim) return;
  // 1. Everything but the state, at once: the rows' state indices first (the state loads wait on
  // them), the circular positions, x, then the taps and bias (L1/L2 resident).
  int64_t row[kR], seq[kR];
  bool live[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    live[r] = b0 + r < p.batch;
    row[r] = b0 + r;
    seq[r] = 0;
    if (live[r] && p.indices != nullptr)
      row[r] = mamba_common::load_index(p.indices, b0 + r, p.indices64);
    if (live[r] && p.seqlens != nullptr)
      seq[r] = mamba_common::load_index(p.seqlens, b0 + r, p.seqlens64);
  }
  Pk xp[kR];
#pragma unroll
  for (int r = 0; r < kR; ++r)
    if (live[r]) xp[r].load_stream(static_cast<const T*>(p.x) + (b0 + r) * p.xs_b + d0);
  float w[kC][kW], bias[kC];
  if (p.weight_vec) {
    const T* wp = static_cast<const T*>(p.weight) + d0 * kW;
#pragma unroll
    for (int a = 0; a < kW; ++a) {
      Pk v;
      v.load_cached(wp + a * kC);
      float f[kC];
      v.unpack(f);
#pragma unroll
      for (int i = 0; i < kC; ++i) w[(a * kC + i) / kW][(a * kC + i) % kW] = f[i];
    }
  } else {
#pragma unroll
    for (int i = 0; i < kC; ++i)
#pragma unroll
      for (int j = 0; j < kW; ++j)
        w[i][j] = mamba_common::load_any(p.weight, (d0 + i) * p.ws_d + j * p.ws_w, p.wcode);
  }
  if (p.bias == nullptr) {
#pragma unroll
    for (int i = 0; i < kC; ++i) bias[i] = 0.0f;
  } else if (p.bias_vec) {
    Pk v;
    v.load_cached(static_cast<const T*>(p.bias) + d0);
    v.unpack(bias);
  } else {
#pragma unroll
    for (int i = 0; i < kC; ++i)
      bias[i] = mamba_common::load_any(p.bias, (d0 + i) * p.bs_d, p.bcode);
  }
  // 2. The state packs of the rows that have a state row (pad_slot_id or an index out of range:
  // the row is untouched, x included).
  Pk sp[kR][kH];
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    if (p.indices != nullptr)
      live[r] = live[r] && row[r] != p.pad_slot_id && row[r] >= 0 && row[r] < p.slots;
    const T* st = static_cast<const T*>(p.state) + row[r] * p.ss_s + (kChLast ? d0 : d0 * kH);
#pragma unroll
    for (int a = 0; a < kH; ++a)
      if (live[r]) sp[r][a].load_stream(kChLast ? st + a * p.ss_l : st + a * kC);
  }
  if (pdl) kernels::pdl_launch_dependents();
  // 3. Per row: the window shifted (or read circularly at cache_seqlens % Ls), fp32 products,
  // then the state packs and the outputs over x.
#pragma unroll
  for (int r = 0; r < kR; ++r) {
    if (!live[r]) continue;
    if (p.seqlens != nullptr) {
      const int head = static_cast<int>(((seq[r] % kH) + kH) % kH);
      update_vec_row<T, kW, kChLast, true>(sp[r], xp[r], w, bias, head, p.silu);
    } else {
      update_vec_row<T, kW, kChLast, false>(sp[r], xp[r], w, bias, 0, p.silu);
    }
    T* st = static_cast<T*>(p.state) + row[r] * p.ss_s + (kChLast ? d0 : d0 * kH);
#pragma unroll
    for (int a = 0; a < kH; ++a) sp[r][a].store_stream(kChLast ? st + a * p.ss_l : st + a * kC);
    xp[r].store_stream(static_cast<T*>(p.x) + (b0 + r) * p.xs_b + d0);
  }
}

template <typename T, int kW>
__global__ void __launch_bounds__(128) update_kernel(bool pdl, const Params p) {
  const int64_t d = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t b = blockIdx.y;
  if (pdl) kernels::pdl_wait();
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
  if (pdl) kernels::pdl_launch_dependents();
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
    x[t * p.xs_l] = kernels::from_float<T>(p.silu ? mamba_common::silu_for<T>(acc) : acc);
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
  // PDL (kernels::pdl_for_grid, on for these grids on sm_90): the launch and block scheduling
  // overlap the previous kernel (decode steps are a few microseconds); pdl_wait comes first.
  auto launch = [&](auto kernel, dim3 grid, unsigned block) {
    const bool pdl = kernels::pdl_for_grid(ctx.enable_pdl, ctx.device, grid.x * grid.y, block);
    kernels::check_launch(kOp, kernels::LaunchConfig(grid, dim3(block), 0, ctx.stream, pdl)
                                   .launch(kernel, pdl, p));
  };
  // 4. Dispatch on dtype, width and path; launch (checked).
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T, [&] {
    constexpr int kC = kernels::kVectorBytes / static_cast<int>(sizeof(T));
    const int64_t es = sizeof(T);
    const int64_t ls = p.state_len;
    const bool x_ok = length == 1 && (p.xs_d == 1 || dim == 1) && dim % kC == 0 &&
                      kernels::is_aligned(p.x) && (p.xs_b * es) % 16 == 0;
    const bool state_rows = (p.ss_s * es) % 16 == 0 && kernels::is_aligned(p.state);
    const bool st_cf = (p.ss_l == 1 || ls == 1) && p.ss_d == ls;  // [S, D, W-1] rows
    const bool st_cl = (p.ss_d == 1 || dim == 1) && (p.ss_l * es) % 16 == 0;  // [S, W-1, D]
    const bool vec = x_ok && ls == width - 1 && state_rows && (st_cf || st_cl);
    if (vec) {
      p.weight_vec = kernels::is_dtype(weight.dtype(), x.dtype().code, x.dtype().bits) &&
                     p.ws_w == 1 && p.ws_d == width && kernels::is_aligned(p.weight);
      p.bias_vec = bias.has_value() &&
                   kernels::is_dtype(bias.value().dtype(), x.dtype().code, x.dtype().bits) &&
                   (p.bs_d == 1 || dim == 1) && kernels::is_aligned(p.bias);
      // A row per thread while that grid fits in one wave (16 CTAs of 64 per SM: B = 256,
      // D = 4096 is 2048 CTAs of 2112 slots, 31 warps per SM, each thread's math a quarter of
      // kVecRows rows', so the math of the warps whose state arrived overlaps the others' loads);
      // past it kVecRows rows per thread (the taps read once for them; B = 256, D = 8192: 1024
      // CTAs, 1.3 waves of 6 per SM).
      const int64_t threads = batch * (dim / kC);
      const bool rows = threads > int64_t{detail::kVecCtasOne} * detail::kVecThreads *
                                      kernels::sm_count(ctx.device);
      const int64_t per = rows ? detail::kVecRows : 1;
      const dim3 grid(kernels::ceil_div(dim / kC, detail::kVecThreads),
                      kernels::ceil_div(batch, per));
      auto go = [&](auto kernel) { launch(kernel, grid, detail::kVecThreads); };
      auto by_rows = [&](auto one, auto many) { rows ? go(many) : go(one); };
      constexpr int kRows = detail::kVecRows;
      const bool cf = st_cf;  // else the [S, W-1, D] state
      switch (width) {
        case 2:
          cf ? by_rows(detail::update_vec_kernel<T, 2, false, 1>,
                       detail::update_vec_kernel<T, 2, false, kRows>)
             : by_rows(detail::update_vec_kernel<T, 2, true, 1>,
                       detail::update_vec_kernel<T, 2, true, kRows>);
          break;
        case 3:
          cf ? by_rows(detail::update_vec_kernel<T, 3, false, 1>,
                       detail::update_vec_kernel<T, 3, false, kRows>)
             : by_rows(detail::update_vec_kernel<T, 3, true, 1>,
                       detail::update_vec_kernel<T, 3, true, kRows>);
          break;
        default:
          cf ? by_rows(detail::update_vec_kernel<T, 4, false, 1>,
                       detail::update_vec_kernel<T, 4, false, kRows>)
             : by_rows(detail::update_vec_kernel<T, 4, true, 1>,
                       detail::update_vec_kernel<T, 4, true, kRows>);
          break;
      }
      return;
    }
    const dim3 grid(kernels::ceil_div(dim, 128), static_cast<unsigned>(batch));
    switch (width) {
      case 2: launch(detail::update_kernel<T, 2>, grid, 128); break;
      case 3: launch(detail::update_kernel<T, 3>, grid, 128); break;
      default: launch(detail::update_kernel<T, 4>, grid, 128); break;
    }
  });
}
