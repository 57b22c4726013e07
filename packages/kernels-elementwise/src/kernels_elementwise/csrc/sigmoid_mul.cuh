// elementwise.sigmoid_mul, CUDA: out = x * sigmoid(gate) over [T, H, D], in fp32, rounded once.
// gate is [T, H, D] (an output gate, often a strided view into a fused q/gate projection) or
// [T, H, 1] (one gate per head). x and out are [T, H, D] or [T, H * D]; every tensor has a
// contiguous last dim and arbitrary token and head strides.
//
// One flat work index per 16-byte pack of out, split into (token, head, pack) by two FastDivmods,
// so any T fills the GPU; one pack per thread, PDL for small grids (kernels::launch_pointwise).
// Packs need D, the strides and the pointers in whole 16-byte units (a per-head gate is read as a
// scalar and has no such need); otherwise a scalar kernel with the same indexing runs.
// Bytes: read x and gate, write out.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/activation_math.cuh>
#include <kernels/checks.h>
#include <kernels/cuda_dtype.cuh>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>
#include <kernels/pointwise.cuh>

namespace sigmoid_mul_detail {

using kernels::FastDivmod;
using kernels::kPointwiseThreads;

// Element strides of one [T, H, D] operand.
struct Strides {
  int64_t token;
  int64_t head;
};

struct Problem {
  FastDivmod per_head;  // work items per head: D / pack or D
  FastDivmod heads;     // H
  uint32_t total;
  Strides out, x, gate;
};

template <typename T, bool kPacked, bool kPerHead>
__global__ void __launch_bounds__(kPointwiseThreads)
    sigmoid_mul_kernel(bool pdl, T* __restrict__ out, const T* __restrict__ x,
                       const T* __restrict__ gate, Problem p) {
  constexpr int W = kernels::pack_width<T, kPacked>;
  using A = kernels::Pack<T, W>;
  const uint32_t i = blockIdx.x * kPointwiseThreads + threadIdx.x;
  if (pdl) kernels::pdl_wait();
  if (i >= p.total) return;
  uint32_t th, c, t, h;
  p.per_head.divmod(i, th, c);
  p.heads.divmod(th, t, h);
  A xr;
  xr.load_stream(x + t * p.x.token + h * p.x.head + c * W);
  float v[W], g[W];
  if constexpr (kPerHead) {
    const T gh = gate[t * p.gate.token + h * p.gate.head];
    if (pdl) kernels::pdl_launch_dependents();
    const float s = kernels::math::sigmoid(kernels::to_float(gh));
#pragma unroll
    for (int k = 0; k < W; ++k) g[k] = s;
  } else {
    A gr;
    gr.load_stream(gate + t * p.gate.token + h * p.gate.head + c * W);
    if (pdl) kernels::pdl_launch_dependents();
    gr.unpack(g);
#pragma unroll
    for (int k = 0; k < W; ++k) g[k] = kernels::math::sigmoid(g[k]);
  }
  xr.unpack(v);
#pragma unroll
  for (int k = 0; k < W; ++k) v[k] *= g[k];
  xr.pack(v);
  xr.store_stream(out + t * p.out.token + h * p.out.head + c * W);
}

// The [T, H, D] strides of an operand that is [T, H, D] or [T, H * D]. A size-1 dim may carry
// any stride in torch; it is never stepped over, so it counts as 0 (and cannot block packs).
inline Strides strides_of(const tvm::ffi::TensorView& t, int64_t d) {
  Strides s{t.size(0) == 1 ? 0 : t.stride(0), t.ndim() == 3 ? t.stride(1) : d};
  if (t.ndim() == 3 && t.size(1) == 1) s.head = 0;
  return s;
}

template <typename T>
void run(T* out, const T* x, const T* gate, int64_t tokens, int64_t heads, int64_t d,
         Strides so, Strides sx, Strides sg, bool per_head, const kernels::Launch& ctx) {
  constexpr int P = kernels::Pack<T>::size;
  auto fits = [&](const void* ptr, Strides s) {
    return kernels::is_aligned(ptr) && s.token % P == 0 && s.head % P == 0;
  };
  const bool packed = d % P == 0 && fits(out, so) && fits(x, sx) && (per_head || fits(gate, sg));
  const int64_t per_head_items = packed ? d / P : d;
  const int64_t per_token = heads * per_head_items;
  kernels::for_row_chunks(tokens, per_token, [&](int64_t t0, int64_t n) {
    Problem p;
    p.per_head = FastDivmod(static_cast<uint32_t>(per_head_items));
    p.heads = FastDivmod(static_cast<uint32_t>(heads));
    p.total = static_cast<uint32_t>(n * per_token);
    p.out = so;
    p.x = sx;
    p.gate = sg;
    T* o = out + t0 * so.token;
    const T* xi = x + t0 * sx.token;
    const T* gi = gate + t0 * sg.token;
    auto kernel = packed ? (per_head ? sigmoid_mul_kernel<T, true, true>
                                     : sigmoid_mul_kernel<T, true, false>)
                         : (per_head ? sigmoid_mul_kernel<T, false, true>
                                     : sigmoid_mul_kernel<T, false, false>);
    kernels::launch_pointwise(ctx, kernel, p.total, o, xi, gi, p);
  });
}

}  // namespace sigmoid_mul_detail

// out: x's shape and dtype (may alias x). x: [T, H, D] or [T, H * D]. gate: [T, H, D] or
// [T, H, 1], x's dtype. Last dims contiguous.
inline void sigmoid_mul(tvm::ffi::TensorView out, tvm::ffi::TensorView x,
                        tvm::ffi::TensorView gate) {
  constexpr const char* kOp = "elementwise.sigmoid_mul";
  // 1. Validate.
  kernels::check_same_shape(kOp, "out", out, "x", x);
  kernels::check_same_dtype(kOp, "out", out, "x", x);
  kernels::check_same_dtype(kOp, "gate", gate, "x", x);
  kernels::check_device(kOp, "x", x, kDLCUDA);
  kernels::check_same_device(kOp, "out", out, "x", x);
  kernels::check_same_device(kOp, "gate", gate, "x", x);
  kernels::check_ndim(kOp, "gate", gate, 3);
  TVM_FFI_CHECK(x.ndim() == 2 || x.ndim() == 3, ValueError)
      << kOp << ": x must be [T, H, D] or [T, H * D], got " << kernels::shape_string(x);
  const int64_t tokens = gate.size(0), heads = gate.size(1);
  const bool per_head = gate.size(2) == 1;
  const int64_t d = x.ndim() == 3 ? x.size(2) : (heads ? x.size(1) / heads : 0);
  const bool shape_ok =
      x.size(0) == tokens &&
      (x.ndim() == 3 ? x.size(1) == heads : x.size(1) == heads * d) &&
      (per_head || gate.size(2) == d);
  TVM_FFI_CHECK(shape_ok, ValueError)
      << kOp << ": gate " << kernels::shape_string(gate) << " does not fit x "
      << kernels::shape_string(x) << " (gate must be [T, H, D] or [T, H, 1])";
  kernels::check_last_dim_contiguous(kOp, "x", x);
  kernels::check_last_dim_contiguous(kOp, "out", out);
  kernels::check_last_dim_contiguous(kOp, "gate", gate);
  if (x.numel() == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  const kernels::Launch ctx(kOp, x);
  // 4. Dispatch on dtype and launch (checked).
  const sigmoid_mul_detail::Strides so = sigmoid_mul_detail::strides_of(out, d),
                                    sx = sigmoid_mul_detail::strides_of(x, d),
                                    sg = sigmoid_mul_detail::strides_of(gate, d);
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T, [&] {
    sigmoid_mul_detail::run<T>(kernels::data<T>(out), kernels::data<const T>(x),
                               kernels::data<const T>(gate), tokens, heads, d, so, sx, sg,
                               per_head, ctx);
  });
}
