// elementwise.add_constant, CPU: out = x + constant, computed in fp32 (int32 wraps like torch).
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/checks.h>
#include <kernels/dtype.h>
#include <kernels/tensor.h>

inline void add_constant_cpu(tvm::ffi::TensorView out, tvm::ffi::TensorView x, double constant) {
  constexpr const char* kOp = "elementwise.add_constant";
  kernels::check_same_shape(kOp, "out", out, "x", x);
  kernels::check_same_dtype(kOp, "out", out, "x", x);
  kernels::check_contiguous(kOp, "x", x);
  kernels::check_contiguous(kOp, "out", out);
  kernels::check_device(kOp, "x", x, kDLCPU);
  kernels::check_device(kOp, "out", out, kDLCPU);
  const int64_t n = x.numel();
  if (kernels::is_dtype(x.dtype(), kDLInt, 32)) {
    auto* dst = kernels::data<int32_t>(out);
    const auto* src = kernels::data<const int32_t>(x);
    const uint32_t c = static_cast<uint32_t>(static_cast<int32_t>(constant));
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<int32_t>(static_cast<uint32_t>(src[i]) + c);
    return;
  }
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T, [&] {
    T* dst = kernels::data<T>(out);
    const T* src = kernels::data<const T>(x);
    const float c = static_cast<float>(constant);
    for (int64_t i = 0; i < n; ++i) dst[i] = kernels::from_float<T>(kernels::to_float(src[i]) + c);
  });
}
