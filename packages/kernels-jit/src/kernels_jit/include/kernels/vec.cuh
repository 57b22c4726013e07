// The one pack type of the headers: kN consecutive elements of T, moved with 16-byte accesses
// (LDG.E.128 / STG.E.128) when kN * sizeof(T) is a multiple of 16 (a "vector"; 16 bytes is one
// access, 32 bytes, e.g. 8 fp32 weights of a bf16 row, two), or as one element (kN == 1: the
// scalar path of every engine, so packed and scalar kernels share one body).
//
// Values convert to and from Value arrays (fp32; int32 for int32 data) in pairs where the type
// has a paired conversion (one F2FP.PACK_AB per two bf16/fp16, round to nearest even like torch).
// The vector form keeps raw 32-bit words: a register array of class types (__nv_bfloat16) that is
// also copied as a whole ends up in local memory (a 104-byte stack frame and 240 bytes of spills
// in the bf16 x 8 row kernel).
//
// Accesses:
//   load_stream / store_stream: data touched once (evict-first). load_stream is a coherent load,
//     not ld.global.nc: outputs may alias inputs (in-place ops).
//   load_cached: data every block reads (weights, bias): the read-only path, kept in L1/L2. Never
//     for data the kernel writes.
//   load / store: plain; load is coherent with the thread's own earlier stores (loop kernels
//     re-reading a row they wrote): pass a pointer that is not __restrict__.
//   load(p, cache): load_stream or load, for kernels whose launch plan picks the policy (the row
//     engine passes it to its op structs as a compile-time constant).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "cuda_dtype.cuh"

namespace kernels {

constexpr int kVectorBytes = 16;

// The cache policy of a load: evict-first (data touched once) or plain.
enum class Cache { kStream, kPlain };

__host__ __device__ __forceinline__ bool is_aligned(const void* ptr, size_t bytes = kVectorBytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

// What elements compute in: float, or int32 for int32 data.
template <typename T>
using ValueOf = std::conditional_t<std::is_integral_v<T>, T, float>;

// 32-bit words of packed storage <-> values.
template <typename T>
struct Words;

template <>
struct Words<float> {
  static constexpr int kPerWord = 1;
  static __device__ __forceinline__ void unpack(uint32_t w, float* f) { f[0] = __uint_as_float(w); }
  static __device__ __forceinline__ uint32_t pack(const float* f) { return __float_as_uint(f[0]); }
};

template <>
struct Words<int32_t> {
  static constexpr int kPerWord = 1;
  static __device__ __forceinline__ void unpack(uint32_t w, int32_t* v) {
    v[0] = static_cast<int32_t>(w);
  }
  static __device__ __forceinline__ uint32_t pack(const int32_t* v) {
    return static_cast<uint32_t>(v[0]);
  }
};

template <>
struct Words<__nv_bfloat16> {
  static constexpr int kPerWord = 2;
  static __device__ __forceinline__ void unpack(uint32_t w, float* f) {
    f[0] = __uint_as_float(w << 16);
    f[1] = __uint_as_float(w & 0xffff0000u);
  }
  static __device__ __forceinline__ uint32_t pack(const float* f) {
    const __nv_bfloat162 h = __floats2bfloat162_rn(f[0], f[1]);  // one F2FP.BF16.F32.PACK_AB
    uint32_t w;
    memcpy(&w, &h, sizeof(w));
    return w;
  }
};

template <>
struct Words<__half> {
  static constexpr int kPerWord = 2;
  static __device__ __forceinline__ void unpack(uint32_t w, float* f) {
    __half2 h;
    memcpy(&h, &w, sizeof(w));
    const float2 v = __half22float2(h);
    f[0] = v.x;
    f[1] = v.y;
  }
  static __device__ __forceinline__ uint32_t pack(const float* f) {
    const __half2 h = __floats2half2_rn(f[0], f[1]);
    uint32_t w;
    memcpy(&w, &h, sizeof(w));
    return w;
  }
};

template <typename T, int kN = kVectorBytes / static_cast<int>(sizeof(T)),
          bool kVector = (sizeof(T) * kN) % kVectorBytes == 0>
struct Pack;

// Vector form: kN * sizeof(T) / 16 accesses of 16 bytes.
template <typename T, int kN>
struct Pack<T, kN, true> {
  using Value = ValueOf<T>;
  static constexpr int size = kN;
  static constexpr int kAccesses = kN * static_cast<int>(sizeof(T)) / kVectorBytes;
  static constexpr int kWords = 4 * kAccesses;
  static constexpr int kPerWord = Words<T>::kPerWord;
  static_assert(kWords * kPerWord == kN, "whole 32-bit words");
  uint32_t w[kWords];

  __device__ __forceinline__ void set(int a, const uint4& r) {
    w[4 * a] = r.x;
    w[4 * a + 1] = r.y;
    w[4 * a + 2] = r.z;
    w[4 * a + 3] = r.w;
  }
  __device__ __forceinline__ uint4 get(int a) const {
    return make_uint4(w[4 * a], w[4 * a + 1], w[4 * a + 2], w[4 * a + 3]);
  }
  __device__ __forceinline__ void zero() {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = 0;
  }
  __device__ __forceinline__ void load_stream(const T* p) {
#pragma unroll
    for (int a = 0; a < kAccesses; ++a) set(a, __ldcs(reinterpret_cast<const uint4*>(p) + a));
  }
  __device__ __forceinline__ void load_cached(const T* p) {
#pragma unroll
    for (int a = 0; a < kAccesses; ++a) set(a, __ldg(reinterpret_cast<const uint4*>(p) + a));
  }
  __device__ __forceinline__ void load(const T* p) {
#pragma unroll
    for (int a = 0; a < kAccesses; ++a) set(a, reinterpret_cast<const uint4*>(p)[a]);
  }
  __device__ __forceinline__ void load(const T* p, Cache cache) {
    if (cache == Cache::kStream) {
      load_stream(p);
    } else {
      load(p);
    }
  }
  __device__ __forceinline__ void store(T* p) const {
#pragma unroll
    for (int a = 0; a < kAccesses; ++a) reinterpret_cast<uint4*>(p)[a] = get(a);
  }
  __device__ __forceinline__ void store_stream(T* p) const {
#pragma unroll
    for (int a = 0; a < kAccesses; ++a) __stcs(reinterpret_cast<uint4*>(p) + a, get(a));
  }
  __device__ __forceinline__ void unpack(Value (&f)[kN]) const {
#pragma unroll
    for (int i = 0; i < kWords; ++i) Words<T>::unpack(w[i], f + i * kPerWord);
  }
  __device__ __forceinline__ void pack(const Value (&f)[kN]) {
#pragma unroll
    for (int i = 0; i < kWords; ++i) w[i] = Words<T>::pack(f + i * kPerWord);
  }
};

// Scalar form: one element, kept as raw bits like the vector form (an array of these in a
// struct of class types went to local memory in the fused loop kernel).
template <typename T>
struct Pack<T, 1, false> {
  using Value = ValueOf<T>;
  using Bits = std::conditional_t<sizeof(T) == 2, unsigned short, unsigned int>;
  static_assert(sizeof(T) == sizeof(Bits), "16- or 32-bit elements");
  static constexpr int size = 1;
  Bits v;

  __device__ __forceinline__ void zero() { v = 0; }  // +0.0 in every float type
  __device__ __forceinline__ void load_stream(const T* p) { v = *reinterpret_cast<const Bits*>(p); }
  __device__ __forceinline__ void load_cached(const T* p) {
    v = __ldg(reinterpret_cast<const Bits*>(p));
  }
  __device__ __forceinline__ void load(const T* p) { v = *reinterpret_cast<const Bits*>(p); }
  __device__ __forceinline__ void load(const T* p, Cache) { load(p); }
  __device__ __forceinline__ void store(T* p) const { *reinterpret_cast<Bits*>(p) = v; }
  __device__ __forceinline__ void store_stream(T* p) const { *reinterpret_cast<Bits*>(p) = v; }
  __device__ __forceinline__ void unpack(Value (&f)[1]) const {
    T t;
    memcpy(&t, &v, sizeof(t));
    if constexpr (std::is_integral_v<T>) {
      f[0] = t;
    } else {
      f[0] = to_float(t);
    }
  }
  __device__ __forceinline__ void pack(const Value (&f)[1]) {
    T t;
    if constexpr (std::is_integral_v<T>) {
      t = f[0];
    } else {
      t = from_float<T>(f[0]);
    }
    memcpy(&v, &t, sizeof(t));
  }
};

// Elements per access: one 16-byte vector, or one element.
template <typename T, bool kVector>
constexpr int pack_width = kVector ? kVectorBytes / static_cast<int>(sizeof(T)) : 1;

}  // namespace kernels
