// Shared by the memory group's CUDA sources: int32/int64 index vectors read as int64 (the dtype is
// a runtime flag, so one compiled kernel serves every dtype mix and every batch size), torch's
// floor modulo, the block-wide sums the multi-CTA kernels use for their prefix offsets, and the
// host check every entry makes of an index vector.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/checks.h>
#include <kernels/dtype.h>
#include <kernels/tensor.h>

#include <cstdint>

namespace memory_detail {

// A 1-D int32/int64 vector: base pointer, element stride, width.
struct IndexRef {
  const void* ptr = nullptr;
  int64_t stride = 1;
  bool i64 = true;
  __device__ __forceinline__ int64_t operator[](int64_t i) const {
    return i64 ? static_cast<const int64_t*>(ptr)[i * stride]
               : static_cast<int64_t>(static_cast<const int32_t*>(ptr)[i * stride]);
  }
};

// torch's % on integers (the sign of the divisor), for d > 0.
__device__ __forceinline__ int64_t floor_mod(int64_t a, int64_t d) {
  const int64_t r = a % d;
  return r < 0 ? r + d : r;
}

// ceil(a / d) with floor semantics for negative a (torch's (a + d - 1) // d), for d > 0.
__device__ __forceinline__ int64_t ceil_div_floor(int64_t a, int64_t d) {
  const int64_t n = a + d - 1;
  return n >= 0 ? n / d : -((-n + d - 1) / d);
}

// Sum over the block of each thread's `v` (blockDim.x a multiple of 32, <= 1024); every thread
// gets the total. `scratch`: 32 entries of shared memory.
__device__ __forceinline__ int64_t block_sum(int64_t v, int64_t* scratch) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
  __syncthreads();  // scratch may still be read from an earlier call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < warps ? scratch[lane] : 0;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace memory_detail

namespace memory_host {

// A CUDA int32/int64 1-D vector on `like`'s device, of `length` entries when >= 0.
inline memory_detail::IndexRef index_vector(const char* op, const char* arg,
                                            const tvm::ffi::TensorView& t,
                                            const tvm::ffi::TensorView& like, int64_t length) {
  kernels::check_ndim(op, arg, t, 1);
  const bool i64 = kernels::is_dtype(t.dtype(), kDLInt, 64);
  TVM_FFI_CHECK(i64 || kernels::is_dtype(t.dtype(), kDLInt, 32), TypeError)
      << op << ": " << arg << " must be int32 or int64";
  kernels::check_device(op, arg, t, kDLCUDA);
  kernels::check_same_device(op, arg, t, "the first tensor", like);
  TVM_FFI_CHECK(length < 0 || t.size(0) == length, ValueError)
      << op << ": " << arg << " must have " << length << " entries, got " << t.size(0);
  memory_detail::IndexRef r;
  r.ptr = kernels::data<const void>(t);
  r.stride = t.size(0) > 1 ? t.stride(0) : 1;
  r.i64 = i64;
  return r;
}

}  // namespace memory_host
