// activation.{silu_and_mul, gelu_and_mul, gelu_tanh_and_mul, relu2}, CUDA.
//
// Gated: x [..., 2d] -> out [..., d], out = act(x[..., :d]) * x[..., d:], computed in fp32 and
// rounded once. Unary: relu2(x) = relu(x)^2, same shape.
//
// Both run on the pointwise launch of <kernels/pointwise.cuh>: one flat work index per 16-byte
// pack of the output (8 bf16/fp16 or 4 fp32 values) per thread, divided into (row, column) with
// FastDivmod, so any token count fills the 132 SMs of an H200 and rows may sit at any stride
// (slices of a wider buffer); PDL for small grids (see launch_pointwise; enable_pdl overrides it: -1 auto, 0 off, 1 on). Packs need d, the row
// strides and the base pointers to be whole 16-byte multiples; otherwise a scalar kernel with the
// same indexing runs. Bytes for the gated ops: read 2d, write d per row.
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

namespace activation_detail {

using kernels::FastDivmod;
using kernels::kPointwiseThreads;

// One kernel for both paths: kN = a 16-byte pack (d, row strides and pointers in whole packs,
// which keeps the up half at x + d aligned like the gate half) or 1.
template <typename T, int kN, typename Act>
__global__ void __launch_bounds__(kPointwiseThreads)
    gated_kernel(bool pdl, T* __restrict__ out, int64_t out_stride, const T* __restrict__ x,
                 int64_t x_stride, int64_t d, FastDivmod per_row, uint32_t total) {
  const uint32_t i = blockIdx.x * kPointwiseThreads + threadIdx.x;
  if (pdl) kernels::pdl_wait();
  if (i >= total) return;
  uint32_t r, c;
  per_row.divmod(i, r, c);
  const T* src = x + r * x_stride + c * kN;
  kernels::Pack<T, kN> gate, up;
  gate.load_stream(src);
  up.load_stream(src + d);
  if (pdl) kernels::pdl_launch_dependents();
  float g[kN], v[kN];
  gate.unpack(g);
  up.unpack(v);
  const Act act;
#pragma unroll
  for (int k = 0; k < kN; ++k) g[k] = act(g[k]) * v[k];
  gate.pack(g);
  gate.store_stream(out + r * out_stride + c * kN);
}

template <typename T, typename Act>
void gated_rows(const kernels::Launch& ctx, T* out, int64_t out_stride, const T* x,
                int64_t x_stride, int64_t rows, int64_t d) {
  constexpr int P = kernels::Pack<T>::size;
  const bool packed = kernels::packs_fit(x, d, x_stride, sizeof(T)) &&
                      kernels::packs_fit(out, d, out_stride, sizeof(T));
  const int64_t per_row = packed ? d / P : d;
  const FastDivmod divmod(static_cast<uint32_t>(per_row));
  kernels::for_row_chunks(rows, per_row, [&](int64_t r0, int64_t n) {
    const int64_t work = n * per_row;
    auto kernel = packed ? gated_kernel<T, P, Act> : gated_kernel<T, 1, Act>;
    kernels::launch_pointwise(ctx, kernel, work, out + r0 * out_stride, out_stride,
                              x + r0 * x_stride, x_stride, d, divmod, static_cast<uint32_t>(work));
  });
}

// out: [..., d]; x: [..., 2d], same leading shape and dtype; last dims contiguous; the leading
// dims of each must collapse to one row stride (the Python op routes other layouts to torch).
// enable_pdl: -1 auto (kernels::pdl_for_grid), 0 off, 1 on.
template <typename Act>
void gated(const char* op, tvm::ffi::TensorView out, tvm::ffi::TensorView x, int64_t enable_pdl) {
  // 1. Validate.
  kernels::check_same_dtype(op, "out", out, "x", x);
  kernels::check_device(op, "x", x, kDLCUDA);
  kernels::check_same_device(op, "out", out, "x", x);
  TVM_FFI_CHECK(x.ndim() >= 1 && out.ndim() == x.ndim(), ValueError)
      << op << ": x " << kernels::shape_string(x) << " and out " << kernels::shape_string(out)
      << " must have the same number of dims (at least 1)";
  const int nd = x.ndim();
  bool shape_ok = x.size(nd - 1) == 2 * out.size(nd - 1);
  for (int i = 0; i + 1 < nd; ++i) shape_ok = shape_ok && x.size(i) == out.size(i);
  TVM_FFI_CHECK(shape_ok, ValueError)
      << op << ": out " << kernels::shape_string(out) << " must be x "
      << kernels::shape_string(x) << " with the last dim halved";
  const kernels::RowView xv = kernels::row_view(x), ov = kernels::row_view(out);
  TVM_FFI_CHECK(xv.ok && ov.ok, ValueError)
      << op << ": x and out need a contiguous last dim and leading dims with one row stride";
  const int64_t d = ov.cols;
  if (xv.rows == 0 || d == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  const kernels::Launch ctx(op, x, enable_pdl);
  // 4. Dispatch on dtype and launch (checked).
  KERNELS_DISPATCH_FLOAT(x.dtype(), op, T, [&] {
    gated_rows<T, Act>(ctx, kernels::data<T>(out), ov.stride, kernels::data<const T>(x),
                       xv.stride, xv.rows, d);
  });
}

}  // namespace activation_detail

inline void silu_and_mul(tvm::ffi::TensorView out, tvm::ffi::TensorView x, int64_t enable_pdl) {
  activation_detail::gated<kernels::math::Silu>("activation.silu_and_mul", out, x, enable_pdl);
}

inline void gelu_and_mul(tvm::ffi::TensorView out, tvm::ffi::TensorView x, int64_t enable_pdl) {
  activation_detail::gated<kernels::math::GeluErf>("activation.gelu_and_mul", out, x, enable_pdl);
}

inline void gelu_tanh_and_mul(tvm::ffi::TensorView out, tvm::ffi::TensorView x, int64_t enable_pdl) {
  activation_detail::gated<kernels::math::GeluTanh>("activation.gelu_tanh_and_mul", out, x, enable_pdl);
}

// out: same shape and dtype as x; may alias x (in place). enable_pdl: -1 auto, 0 off, 1 on.
inline void relu2(tvm::ffi::TensorView out, tvm::ffi::TensorView x, int64_t enable_pdl) {
  constexpr const char* kOp = "activation.relu2";
  // 1. Validate.
  kernels::check_same_shape(kOp, "out", out, "x", x);
  kernels::check_same_dtype(kOp, "out", out, "x", x);
  kernels::check_device(kOp, "x", x, kDLCUDA);
  kernels::check_same_device(kOp, "out", out, "x", x);
  const kernels::RowView xv = kernels::row_view(x), ov = kernels::row_view(out);
  TVM_FFI_CHECK(xv.ok && ov.ok, ValueError)
      << kOp << ": x and out need a contiguous last dim and leading dims with one row stride";
  if (x.numel() == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  const kernels::Launch ctx(kOp, x, enable_pdl);
  // 4. Dispatch on dtype and launch (checked).
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T,
                         [&] { kernels::unary_rows<T, T>(ctx, out, x, kernels::math::Relu2{}); });
}
