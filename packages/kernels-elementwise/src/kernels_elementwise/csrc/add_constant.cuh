// elementwise.add_constant, CUDA: out = x + constant, in fp32 (int32 wraps like torch), rounded
// once. The reference kernel of the library: an op functor on the pointwise engine
// (kernels/pointwise.cuh: 16-byte packs when x and out are aligned, an element per thread
// otherwise, PDL for small grids, a checked launch), and a host entry in four steps.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/checks.h>
#include <kernels/dtype.h>
#include <kernels/pointwise.cuh>

namespace add_constant_detail {

// The op: what one element becomes. Floating types compute in fp32 (packs convert in pairs).
struct AddFloat {
  float c;
  __device__ __forceinline__ float operator()(float x) const { return x + c; }
};
// int32 wraps on overflow like torch, without signed-overflow UB.
struct AddInt {
  int32_t c;
  __device__ __forceinline__ int32_t operator()(int32_t x) const {
    return static_cast<int32_t>(static_cast<uint32_t>(x) + static_cast<uint32_t>(c));
  }
};

}  // namespace add_constant_detail

// out, x: one shape and dtype (float32, float16, bfloat16 or int32), contiguous.
inline void add_constant(tvm::ffi::TensorView out, tvm::ffi::TensorView x, double constant) {
  namespace detail = add_constant_detail;
  constexpr const char* kOp = "elementwise.add_constant";
  // 1. Validate.
  kernels::check_same_shape(kOp, "out", out, "x", x);
  kernels::check_same_dtype(kOp, "out", out, "x", x);
  kernels::check_contiguous(kOp, "x", x);
  kernels::check_contiguous(kOp, "out", out);
  kernels::check_device(kOp, "x", x, kDLCUDA);
  kernels::check_same_device(kOp, "out", out, "x", x);
  if (x.numel() == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  const kernels::Launch ctx(kOp, x);
  // 4. Dispatch on dtype and launch (checked).
  if (kernels::is_dtype(x.dtype(), kDLInt, 32)) {
    kernels::unary_rows<int32_t, int32_t>(ctx, out, x,
                                          detail::AddInt{static_cast<int32_t>(constant)});
    return;
  }
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T, [&] {
    kernels::unary_rows<T, T>(ctx, out, x, detail::AddFloat{static_cast<float>(constant)});
  });
}
