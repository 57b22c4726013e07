// elementwise.add_constant, CUDA: out = x + constant. The reference kernel of the library: every
// CUDA entry point follows its four steps (validate, device guard, caller's stream, dispatch and
// checked launch).
#pragma once

#include <kernels/checks.h>
#include <kernels/cuda_dtype.cuh>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/vec.cuh>

namespace add_constant_detail {

// One 16-byte vector per thread, 256 threads, one CTA per 256 vectors. A sweep on the H200
// (2026-12-02, 1 GiB fp32 in and out, CUDA graphs) put this first at 4253 GB/s (505 us); 2, 4
// or 8 vectors per thread gave 4095-4136 GB/s, persistent grids (4 CTAs per SM) <= 4000 GB/s,
// 512 threads 4227 GB/s; streaming (.cs) loads and stores were within 0.5% of plain ones.
constexpr int kBlockSize = 256;
constexpr int kUnroll = 1;

template <typename T>
__device__ __forceinline__ T add(T x, float c) {
  return kernels::from_float<T>(kernels::to_float(x) + c);
}
__device__ __forceinline__ int32_t add(int32_t x, int32_t c) {
  // Wrap on overflow like torch does, without signed-overflow UB.
  return static_cast<int32_t>(static_cast<uint32_t>(x) + static_cast<uint32_t>(c));
}

// A whole vector at a time. Half types convert in pairs (one F2F.BF16X2 / F2F.F16X2 per two
// elements): per-element conversions held bf16 at 89% of copy bandwidth on the H200 while fp32,
// with no conversions, reached 101% (2026-12-02).
template <typename T, typename C>
__device__ __forceinline__ void add_vector(kernels::Vec<T>& v, C c) {
#pragma unroll
  for (int k = 0; k < kernels::Vec<T>::size; ++k) v[k] = add(v[k], c);
}
__device__ __forceinline__ void add_vector(kernels::Vec<__nv_bfloat16>& v, float c) {
  auto* pairs = reinterpret_cast<__nv_bfloat162*>(v.data);
#pragma unroll
  for (int k = 0; k < kernels::Vec<__nv_bfloat16>::size / 2; ++k) {
    float2 f = __bfloat1622float2(pairs[k]);
    pairs[k] = __float22bfloat162_rn(make_float2(f.x + c, f.y + c));
  }
}
__device__ __forceinline__ void add_vector(kernels::Vec<__half>& v, float c) {
  auto* pairs = reinterpret_cast<__half2*>(v.data);
#pragma unroll
  for (int k = 0; k < kernels::Vec<__half>::size / 2; ++k) {
    float2 f = __half22float2(pairs[k]);
    pairs[k] = __float22half2_rn(make_float2(f.x + c, f.y + c));
  }
}

template <typename T, typename C>
__global__ void add_constant_scalar(T* __restrict__ out, const T* __restrict__ x, C c, int64_t n) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += stride)
    out[i] = add(x[i], c);
}

// Requires x and out 16-byte aligned. Vectors first, then the tail (< one vector) by block 0.
template <typename T, typename C>
__global__ void add_constant_vector(T* __restrict__ out, const T* __restrict__ x, C c, int64_t n) {
  using V = kernels::Vec<T>;
  const int64_t num_vectors = n / V::size;
  const int64_t base = (blockIdx.x * static_cast<int64_t>(blockDim.x)) * kUnroll + threadIdx.x;
  V v[kUnroll];
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t i = base + u * blockDim.x;
    if (i < num_vectors) v[u].load_stream(x + i * V::size);
  }
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t i = base + u * blockDim.x;
    if (i < num_vectors) {
      add_vector(v[u], c);
      v[u].store_stream(out + i * V::size);
    }
  }
  if (blockIdx.x == 0) {
    for (int64_t i = num_vectors * V::size + threadIdx.x; i < n; i += blockDim.x)
      out[i] = add(x[i], c);
  }
}

template <typename T, typename C>
void launch(T* out, const T* x, C c, int64_t n, cudaStream_t stream) {
  using V = kernels::Vec<T>;
  if (kernels::is_aligned(out) && kernels::is_aligned(x) && n >= V::size) {
    const int64_t vectors = n / V::size;
    const unsigned grid = kernels::ceil_div(vectors, int64_t{kBlockSize} * kUnroll);
    add_constant_vector<<<grid, kBlockSize, 0, stream>>>(out, x, c, n);
  } else {
    const unsigned grid = kernels::ceil_div(n, kBlockSize) < 65536u ? kernels::ceil_div(n, kBlockSize)
                                                                    : 65536u;
    add_constant_scalar<<<grid, kBlockSize, 0, stream>>>(out, x, c, n);
  }
}

}  // namespace add_constant_detail

// out: any shape, contiguous; x: same shape and dtype as out, contiguous.
inline void add_constant(tvm::ffi::TensorView out, tvm::ffi::TensorView x, double constant) {
  constexpr const char* kOp = "elementwise.add_constant";
  // 1. Validate.
  kernels::check_same_shape(kOp, "out", out, "x", x);
  kernels::check_same_dtype(kOp, "out", out, "x", x);
  kernels::check_contiguous(kOp, "x", x);
  kernels::check_contiguous(kOp, "out", out);
  kernels::check_device(kOp, "x", x, kDLCUDA);
  kernels::check_same_device(kOp, "out", out, "x", x);
  const int64_t n = x.numel();
  if (n == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  cudaStream_t stream = kernels::current_stream(x);
  // 4. Dispatch on dtype and launch.
  if (kernels::is_dtype(x.dtype(), kDLInt, 32)) {
    add_constant_detail::launch(static_cast<int32_t*>(out.data_ptr()),
                                static_cast<const int32_t*>(x.data_ptr()),
                                static_cast<int32_t>(constant), n, stream);
  } else {
    KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T, [&] {
      add_constant_detail::launch(static_cast<T*>(out.data_ptr()),
                                  static_cast<const T*>(x.data_ptr()), static_cast<float>(constant),
                                  n, stream);
    });
  }
  kernels::check_launch(kOp);
}
