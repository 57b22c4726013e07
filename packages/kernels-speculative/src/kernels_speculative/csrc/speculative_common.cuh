// Shared by the speculative group's CUDA sources: int32/int64 index tensors read as int64 (the
// dtype is a runtime flag, so one compiled kernel serves every dtype mix), the project RNG
// (OPS.md section 0, bit for bit with kernels_jit.rng.uniform) and the host check of an index
// tensor.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/checks.h>
#include <kernels/dtype.h>
#include <kernels/tensor.h>
#include <kernels/rng.cuh>

#include <cstdint>

namespace speculative_detail {

// A strided int32/int64 tensor of up to 2 dims read as int64: element (i, j) at i*s0 + j*s1.
struct IndexRef {
  const void* ptr = nullptr;
  int64_t s0 = 1;
  int64_t s1 = 1;
  bool i64 = true;
  __device__ __forceinline__ int64_t operator[](int64_t i) const { return at(i, 0); }
  __device__ __forceinline__ int64_t at(int64_t i, int64_t j) const {
    const int64_t k = i * s0 + j * s1;
    return i64 ? static_cast<const int64_t*>(ptr)[k]
               : static_cast<int64_t>(static_cast<const int32_t*>(ptr)[k]);
  }
};

// The project RNG (kernels/rng.cuh).
using kernels::rng::uniform;

}  // namespace speculative_detail

namespace speculative_host {

// A CUDA int32/int64 tensor of `ndim` dims on `like`'s device, as an IndexRef.
inline speculative_detail::IndexRef index_tensor(const char* op, const char* arg,
                                                 const tvm::ffi::TensorView& t,
                                                 const tvm::ffi::TensorView& like, int ndim) {
  kernels::check_ndim(op, arg, t, ndim);
  kernels::check_device(op, arg, t, kDLCUDA);
  kernels::check_same_device(op, arg, t, "the first tensor", like);
  const bool i64 = kernels::is_dtype(t.dtype(), kDLInt, 64);
  TVM_FFI_CHECK(i64 || kernels::is_dtype(t.dtype(), kDLInt, 32), TypeError)
      << op << ": " << arg << " must be int32 or int64";
  speculative_detail::IndexRef r;
  r.ptr = kernels::data<const void>(t);
  r.i64 = i64;
  r.s0 = t.stride(0);
  r.s1 = ndim > 1 ? t.stride(1) : 0;
  return r;
}

}  // namespace speculative_host
