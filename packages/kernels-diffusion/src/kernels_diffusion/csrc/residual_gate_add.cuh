// diffusion.residual_gate_add, CUDA: out = r + gate * x over [B, L, H], in fp32, rounded once.
// gate is [B, H] / [B, 1, H] (per sample: its L stride is 0) or [B, L, H] (per token), r's dtype
// or float32. r, x and out share a dtype; every tensor has a contiguous last dim and arbitrary
// B and L strides; out may alias r (in place).
//
// One flat work index per 16-byte pack of out, split into (row, pack) and row into (b, l) by two
// FastDivmods, so any B x L fills the GPU; one pack per thread (kernels::launch_pointwise, PDL
// for small grids). Packs need H, the strides and the pointers in whole packs of r's dtype;
// otherwise a scalar kernel with the same indexing runs. Bytes: read r, x (and gate), write out.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/checks.h>
#include <kernels/cuda_dtype.cuh>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>
#include <kernels/pointwise.cuh>

namespace residual_gate_add_detail {

using kernels::FastDivmod;
using kernels::kPointwiseThreads;

// Element strides of one [B, L, H] operand (the last dim contiguous).
struct Strides {
  int64_t b;
  int64_t l;
};

struct Problem {
  FastDivmod per_row;  // work items per row: H / pack or H
  FastDivmod length;   // L
  uint32_t row0;       // first row of this launch
  uint32_t total;
  Strides out, r, x, gate;
};

template <typename T, typename G, bool kPacked>
__global__ void __launch_bounds__(kPointwiseThreads)
    residual_gate_add_kernel(bool pdl, T* out, const T* r, const T* __restrict__ x,
                             const G* __restrict__ gate, Problem p) {
  constexpr int W = kernels::pack_width<T, kPacked>;
  const uint32_t i = blockIdx.x * kPointwiseThreads + threadIdx.x;
  if (pdl) kernels::pdl_wait();
  if (i >= p.total) return;
  uint32_t row, c, b, l;
  p.per_row.divmod(i, row, c);
  p.length.divmod(row + p.row0, b, l);
  const int64_t e = static_cast<int64_t>(c) * W;
  kernels::Pack<T, W> rr, xr;
  kernels::Pack<G, W> gr;
  rr.load_stream(r + b * p.r.b + l * p.r.l + e);
  xr.load_stream(x + b * p.x.b + l * p.x.l + e);
  const G* gp = gate + b * p.gate.b + l * p.gate.l + e;
  if (p.gate.l == 0) {
    gr.load_cached(gp);  // per sample: every token of the sample reads it
  } else {
    gr.load_stream(gp);
  }
  if (pdl) kernels::pdl_launch_dependents();
  float a[W], v[W], g[W];
  rr.unpack(a);
  xr.unpack(v);
  gr.unpack(g);
#pragma unroll
  for (int k = 0; k < W; ++k) a[k] = fmaf(g[k], v[k], a[k]);
  rr.pack(a);
  rr.store_stream(out + b * p.out.b + l * p.out.l + e);
}

// [B, L, H] strides of an operand; a gate [B, H] or [B, 1, H] gets L stride 0. A size-1 dim may
// carry any stride in torch; it is never stepped over, so it counts as 0 (and cannot block packs).
inline Strides strides_of(const tvm::ffi::TensorView& t) {
  if (t.ndim() == 2) return {t.size(0) == 1 ? 0 : t.stride(0), 0};
  return {t.size(0) == 1 ? 0 : t.stride(0), t.size(1) == 1 ? 0 : t.stride(1)};
}

template <typename T, typename G>
void run(T* out, const T* r, const T* x, const G* gate, int64_t batch, int64_t length,
         int64_t hidden, Strides so, Strides sr, Strides sx, Strides sg,
         const kernels::Launch& ctx) {
  constexpr int P = kernels::Pack<T>::size;
  auto fits = [&](const void* ptr, Strides s) {
    return kernels::is_aligned(ptr) && s.b % P == 0 && s.l % P == 0;
  };
  const bool packed =
      hidden % P == 0 && fits(out, so) && fits(r, sr) && fits(x, sx) && fits(gate, sg);
  const int64_t per_row = packed ? hidden / P : hidden;
  const FastDivmod per_row_div(static_cast<uint32_t>(per_row));
  const FastDivmod length_div(static_cast<uint32_t>(length));
  kernels::for_row_chunks(batch * length, per_row, [&](int64_t r0, int64_t n) {
    Problem p;
    p.per_row = per_row_div;
    p.length = length_div;
    p.row0 = static_cast<uint32_t>(r0);
    p.total = static_cast<uint32_t>(n * per_row);
    p.out = so;
    p.r = sr;
    p.x = sx;
    p.gate = sg;
    auto kernel = packed ? residual_gate_add_kernel<T, G, true>
                         : residual_gate_add_kernel<T, G, false>;
    kernels::launch_pointwise(ctx, kernel, p.total, out, r, x, gate, p);
  });
}

}  // namespace residual_gate_add_detail

// out, r, x: [B, L, H], one dtype (out may be r). gate: [B, H], [B, 1, H] or [B, L, H], r's
// dtype or float32. Last dims contiguous.
inline void residual_gate_add(tvm::ffi::TensorView out, tvm::ffi::TensorView r,
                              tvm::ffi::TensorView x, tvm::ffi::TensorView gate) {
  namespace detail = residual_gate_add_detail;
  constexpr const char* kOp = "diffusion.residual_gate_add";
  // 1. Validate.
  kernels::check_ndim(kOp, "r", r, 3);
  kernels::check_same_shape(kOp, "x", x, "r", r);
  kernels::check_same_shape(kOp, "out", out, "r", r);
  kernels::check_same_dtype(kOp, "x", x, "r", r);
  kernels::check_same_dtype(kOp, "out", out, "r", r);
  const int64_t batch = r.size(0), length = r.size(1), hidden = r.size(2);
  const bool gate_ok = (gate.ndim() == 2 && gate.size(0) == batch && gate.size(1) == hidden) ||
                       (gate.ndim() == 3 && gate.size(0) == batch &&
                        (gate.size(1) == 1 || gate.size(1) == length) && gate.size(2) == hidden);
  TVM_FFI_CHECK(gate_ok, ValueError)
      << kOp << ": gate must have shape [B, H], [B, 1, H] or [B, L, H] for r "
      << kernels::shape_string(r) << ", got " << kernels::shape_string(gate);
  const bool fp32_gate = kernels::is_dtype(gate.dtype(), kDLFloat, 32);
  TVM_FFI_CHECK(gate.dtype() == r.dtype() || fp32_gate, TypeError)
      << kOp << ": gate must have r's dtype or float32";
  kernels::check_last_dim_contiguous(kOp, "r", r);
  kernels::check_last_dim_contiguous(kOp, "x", x);
  kernels::check_last_dim_contiguous(kOp, "out", out);
  kernels::check_last_dim_contiguous(kOp, "gate", gate);
  TVM_FFI_CHECK(batch * length < (int64_t{1} << 31) && hidden < (int64_t{1} << 31), ValueError)
      << kOp << ": r " << kernels::shape_string(r) << " has too many rows (at most 2^31)";
  kernels::check_device(kOp, "r", r, kDLCUDA);
  kernels::check_same_device(kOp, "x", x, "r", r);
  kernels::check_same_device(kOp, "out", out, "r", r);
  kernels::check_same_device(kOp, "gate", gate, "r", r);
  if (r.numel() == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(r);
  const kernels::Launch ctx(kOp, r);
  // 4. Dispatch on dtype and launch (checked).
  const detail::Strides so = detail::strides_of(out), sr = detail::strides_of(r),
                        sx = detail::strides_of(x), sg = detail::strides_of(gate);
  KERNELS_DISPATCH_FLOAT(r.dtype(), kOp, T, [&] {
    if (fp32_gate && !std::is_same_v<T, float>) {
      detail::run<T, float>(kernels::data<T>(out), kernels::data<const T>(r),
                            kernels::data<const T>(x), kernels::data<const float>(gate), batch,
                            length, hidden, so, sr, sx, sg, ctx);
    } else {
      detail::run<T, T>(kernels::data<T>(out), kernels::data<const T>(r),
                        kernels::data<const T>(x), kernels::data<const T>(gate), batch, length,
                        hidden, so, sr, sx, sg, ctx);
    }
  });
}
