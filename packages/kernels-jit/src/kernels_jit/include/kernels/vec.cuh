// 16-byte vectors: one LDG.E.128 / STG.E.128 per access when the address is 16-byte aligned.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kernels {

constexpr int kVectorBytes = 16;

template <typename T, int N = kVectorBytes / sizeof(T)>
struct alignas(sizeof(T) * N) Vec {
  static constexpr int size = N;
  T data[N];

  __device__ __forceinline__ T& operator[](int i) { return data[i]; }
  __device__ __forceinline__ const T& operator[](int i) const { return data[i]; }

  __device__ __forceinline__ void load(const T* ptr) { *this = *reinterpret_cast<const Vec*>(ptr); }
  __device__ __forceinline__ void store(T* ptr) const { *reinterpret_cast<Vec*>(ptr) = *this; }
  // Streaming variants: data read or written once should not evict reused lines from L2.
  __device__ __forceinline__ void load_stream(const T* ptr) {
    const int4 raw = __ldcs(reinterpret_cast<const int4*>(ptr));
    *this = *reinterpret_cast<const Vec*>(&raw);
  }
  __device__ __forceinline__ void store_stream(T* ptr) const {
    __stcs(reinterpret_cast<int4*>(ptr), *reinterpret_cast<const int4*>(this));
  }
};

__host__ __device__ __forceinline__ bool is_aligned(const void* ptr, size_t bytes = kVectorBytes) {
  return reinterpret_cast<uintptr_t>(ptr) % bytes == 0;
}

}  // namespace kernels
