// Helpers shared by the mamba CUDA sources (group-local, not part of the kernels-jit API):
// a runtime-typed load of the small parameter tensors (weights, biases, A/dt/D, indices), so the
// kernels are templated only on the dtype of the tensors that carry the bytes.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/checks.h>
#include <kernels/cuda_dtype.cuh>
#include <kernels/dtype.h>

#include <cstdint>

namespace mamba_common {

// 0: float32, 1: float16, 2: bfloat16.
inline int float_code(const char* op, const char* arg, const tvm::ffi::TensorView& t) {
  if (kernels::is_dtype(t.dtype(), kDLFloat, 32)) return 0;
  if (kernels::is_dtype(t.dtype(), kDLFloat, 16)) return 1;
  if (kernels::is_dtype(t.dtype(), kDLBfloat, 16)) return 2;
  TVM_FFI_THROW(TypeError) << op << ": " << arg << " must be float32, float16 or bfloat16";
}

// An int32 or int64 index vector: true for int64.
inline bool index_is64(const char* op, const char* arg, const tvm::ffi::TensorView& t) {
  if (kernels::is_dtype(t.dtype(), kDLInt, 64)) return true;
  TVM_FFI_CHECK(kernels::is_dtype(t.dtype(), kDLInt, 32), TypeError)
      << op << ": " << arg << " must be int32 or int64";
  return false;
}

__device__ __forceinline__ float load_any(const void* p, int64_t i, int code) {
  if (code == 0) return static_cast<const float*>(p)[i];
  if (code == 1) return __half2float(static_cast<const __half*>(p)[i]);
  return __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]);
}

__device__ __forceinline__ void store_any(void* p, int64_t i, int code, float v) {
  if (code == 0) {
    static_cast<float*>(p)[i] = v;
  } else if (code == 1) {
    static_cast<__half*>(p)[i] = __float2half_rn(v);
  } else {
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  }
}

__device__ __forceinline__ int64_t load_index(const void* p, int64_t i, bool is64) {
  return is64 ? static_cast<const int64_t*>(p)[i] : static_cast<const int32_t*>(p)[i];
}

__device__ __forceinline__ float silu(float v) { return v / (1.0f + expf(-v)); }

// 2^x flushing denormal results to 0 (MUFU.EX2 without the denormal fix-up of __expf).
__device__ __forceinline__ float ex2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// silu with the fast intrinsics (MUFU.EX2 + MUFU.RCP, ~2 ulp): for 16-bit outputs, where the
// rounding to 7 or 10 mantissa bits dominates. -v past 88: exp -> inf and v / inf -> 0, the limit;
// v past 87: exp(-v) flushes to 0 and y = v.
__device__ __forceinline__ float silu_fast(float v) {
  return __fdividef(v, 1.0f + ex2_ftz(v * -1.4426950408889634f));
}

// The activation of data of type T: IEEE silu for fp32 data, the MUFU form for 16-bit data (its
// ~2 ulp in fp32 are far below the final rounding): ~2 MUFU + 3 FP32 instructions instead of ~25.
template <typename T>
__device__ __forceinline__ float silu_for(float v) {
  if constexpr (sizeof(T) == 2) {
    return silu_fast(v);
  } else {
    return silu(v);
  }
}

// A float of a runtime dtype, split in a load and a conversion: two 16-bit loads (the halves of
// an fp32, or one 16-bit value twice) with no branch between the load and its use, so a batch of
// these issues back to back (one memory round trip) instead of one round trip per load_any.
struct Raw {
  unsigned short lo, hi;
};

__device__ __forceinline__ Raw load_raw(const void* p, int64_t i, int code) {
  const unsigned short* q = static_cast<const unsigned short*>(p);
  const int64_t e = code == 0 ? 2 * i : i;
  return {q[e], q[e + (code == 0 ? 1 : 0)]};
}

__device__ __forceinline__ float raw_float(Raw r, int code) {
  const unsigned lo = r.lo, hi = r.hi;
  if (code == 0) return __uint_as_float(lo | (hi << 16));
  if (code == 1) return __half2float(__ushort_as_half(r.lo));
  return __uint_as_float(lo << 16);
}

}  // namespace mamba_common
