// DLPack dtype -> C++ type dispatch, shared by CUDA and CPU sources.
#pragma once

#include <dlpack/dlpack.h>
#include <tvm/ffi/error.h>

#include <cstdint>
#include <cstring>

#ifdef __CUDACC__
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace kernels {

#ifdef __CUDACC__
using half_t = __half;
using bf16_t = __nv_bfloat16;
#else
// Host-side storage types with round-to-nearest-even conversions; CPU kernels compute in float.
struct half_t {
  uint16_t bits;
};
struct bf16_t {
  uint16_t bits;
};
#endif

inline bool is_dtype(DLDataType t, uint8_t code, uint8_t bits) {
  return t.code == code && t.bits == bits && t.lanes == 1;
}

// KERNELS_DISPATCH_FLOAT(dtype, op_name, T, ...): runs the body with T bound to float, half_t or
// bf16_t; any other dtype is a TypeError naming the op.
#define KERNELS_DISPATCH_FLOAT(DTYPE, OP, T, ...)                                          \
  [&] {                                                                                     \
    if (::kernels::is_dtype(DTYPE, kDLFloat, 32)) {                                         \
      using T = float;                                                                      \
      return __VA_ARGS__();                                                                 \
    } else if (::kernels::is_dtype(DTYPE, kDLFloat, 16)) {                                  \
      using T = ::kernels::half_t;                                                          \
      return __VA_ARGS__();                                                                 \
    } else if (::kernels::is_dtype(DTYPE, kDLBfloat, 16)) {                                 \
      using T = ::kernels::bf16_t;                                                          \
      return __VA_ARGS__();                                                                 \
    }                                                                                       \
    TVM_FFI_THROW(TypeError) << OP << ": unsupported dtype (expected float32, float16 or "  \
                             << "bfloat16)";                                                \
  }()

#ifndef __CUDACC__
inline float to_float(float x) { return x; }
inline float to_float(int32_t x) { return static_cast<float>(x); }
inline float to_float(bf16_t x) {
  uint32_t bits = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline float to_float(half_t x) {
  uint32_t h = x.bits, sign = (h & 0x8000u) << 16, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
  if (exp == 0) {
    if (man == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while (!(man & 0x400)) {
        man <<= 1;
        --exp;
      }
      bits = sign | (exp << 23) | ((man & 0x3ff) << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (man << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (man << 13);
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

template <typename T>
T from_float(float f);
template <>
inline float from_float<float>(float f) { return f; }
template <>
inline bf16_t from_float<bf16_t>(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((bits >> 16) | 0x40)};
  bits += 0x7fffu + ((bits >> 16) & 1u);  // round to nearest even
  return bf16_t{static_cast<uint16_t>(bits >> 16)};
}
template <>
inline half_t from_float<half_t>(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  uint32_t sign = (x >> 16) & 0x8000u;
  uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return half_t{static_cast<uint16_t>(sign | 0x7e00u)};  // NaN
  if (abs >= 0x477ff000u) return half_t{static_cast<uint16_t>(sign | 0x7c00u)};  // overflow/inf
  if (abs < 0x38800000u) {  // subnormal or zero in half: round (abs as float) * 2^24
    float a;
    std::memcpy(&a, &abs, 4);
    float scaled = a * 16777216.0f;  // exact; nearbyint rounds half to even
    return half_t{static_cast<uint16_t>(sign | static_cast<uint32_t>(__builtin_nearbyintf(scaled)))};
  }
  uint32_t mant = abs + 0xfffu + ((abs >> 13) & 1u) - (static_cast<uint32_t>(112) << 23);
  return half_t{static_cast<uint16_t>(sign | (mant >> 13))};
}
#endif

}  // namespace kernels
