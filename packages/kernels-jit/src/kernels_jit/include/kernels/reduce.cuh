// Warp and block reductions over float.
#pragma once

namespace kernels {

constexpr int kWarpSize = 32;

template <int Width = kWarpSize>
__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
  for (int offset = Width / 2; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
  return x;
}

template <int Width = kWarpSize>
__device__ __forceinline__ float warp_max(float x) {
#pragma unroll
  for (int offset = Width / 2; offset > 0; offset >>= 1)
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
}

// Sum over the block; every thread gets the result. `shared` holds >= 32 floats. blockDim.x must
// be a multiple of 32. Safe to call back to back: the trailing barrier guards `shared` reuse.
__device__ __forceinline__ float block_sum(float x, float* shared) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  x = warp_sum(x);
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  x = lane < warps ? shared[lane] : 0.0f;
  x = warp_sum(x);
  __syncthreads();
  return x;
}

__device__ __forceinline__ float block_max(float x, float* shared) {
  const int lane = threadIdx.x % kWarpSize, warp = threadIdx.x / kWarpSize;
  const int warps = blockDim.x / kWarpSize;
  x = warp_max(x);
  if (lane == 0) shared[warp] = x;
  __syncthreads();
  x = lane < warps ? shared[lane] : -INFINITY;
  x = warp_max(x);
  __syncthreads();
  return x;
}

}  // namespace kernels
