// elementwise.add_constant, CPU: out = x + constant, computed in fp32 (int32 wraps like torch).
#pragma once

#include <kernels/checks.h>
#include <kernels/dtype.h>


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
    auto* dst = static_cast<int32_t*>(out.data_ptr());
    const auto* src = static_cast<const int32_t*>(x.data_ptr());
    const uint32_t c = static_cast<uint32_t>(static_cast<int32_t>(constant));
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<int32_t>(static_cast<uint32_t>(src[i]) + c);
    return;
  }
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T, [&] {
    T* dst = static_cast<T*>(out.data_ptr());
    const T* src = static_cast<const T*>(x.data_ptr());
    const float c = static_cast<float>(constant);
    for (int64_t i = 0; i < n; ++i) dst[i] = kernels::from_float<T>(kernels::to_float(src[i]) + c);
  });
}
