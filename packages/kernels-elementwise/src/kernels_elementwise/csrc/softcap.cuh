// elementwise.softcap, CUDA: out = cap * tanh(x / cap), in fp32, rounded once to out's dtype
// (x's dtype, or float32 for logits that the sampler reads in fp32). tanh is libdevice's tanhf,
// except for bf16 outputs (see kernels::math::SoftcapExp: the bandwidth budget).
//
// Runs on the unary row engine of <kernels/pointwise.cuh>: a contiguous tensor streams as one row
// of 16-byte packs plus a tail; a row-strided 2-D view (logits rows inside a wider buffer) keeps
// packs when its row stride allows, else a scalar kernel runs. In place when out is x.
// Bytes: read x, write out.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/activation_math.cuh>
#include <kernels/checks.h>
#include <kernels/cuda_dtype.cuh>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pointwise.cuh>

#include <cmath>
#include <type_traits>

// out: x's shape; dtype x's or float32; may alias x. x: float32/float16/bfloat16, a contiguous last
// dim and leading dims with one row stride. cap: finite and non-zero.
inline void softcap(tvm::ffi::TensorView out, tvm::ffi::TensorView x, double cap) {
  constexpr const char* kOp = "elementwise.softcap";
  // 1. Validate.
  kernels::check_same_shape(kOp, "out", out, "x", x);
  kernels::check_device(kOp, "x", x, kDLCUDA);
  kernels::check_same_device(kOp, "out", out, "x", x);
  const bool out_fp32 = kernels::is_dtype(out.dtype(), kDLFloat, 32);
  TVM_FFI_CHECK(out.dtype() == x.dtype() || out_fp32, TypeError)
      << kOp << ": out must have x's dtype or float32";
  TVM_FFI_CHECK(std::isfinite(cap) && cap != 0.0, ValueError)
      << kOp << ": cap must be finite and non-zero, got " << cap;
  const kernels::RowView xv = kernels::row_view(x), ov = kernels::row_view(out);
  TVM_FFI_CHECK(xv.ok && ov.ok, ValueError)
      << kOp << ": x and out need a contiguous last dim and leading dims with one row stride";
  if (x.numel() == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  const kernels::Launch ctx(kOp, x);
  // 4. Dispatch on dtype and launch (checked).
  const float c = static_cast<float>(cap);
  const kernels::math::Softcap precise{c, static_cast<float>(1.0 / cap)};
  const kernels::math::SoftcapExp fast{c, static_cast<float>(1.0 / cap),
                                       static_cast<float>(2.0 * 1.4426950408889634 / cap)};
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T, [&] {
    if (out_fp32) {
      kernels::unary_rows<T, float>(ctx, out, x, precise);
    } else if constexpr (std::is_same_v<T, kernels::bf16_t>) {
      kernels::unary_rows<T, T>(ctx, out, x, fast);
    } else {
      kernels::unary_rows<T, T>(ctx, out, x, precise);
    }
  });
}
