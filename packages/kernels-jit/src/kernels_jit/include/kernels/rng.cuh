// The project RNG on the device, bit for bit kernels_jit.rng (OPS.md section 0): a counter-based
// generator, so a draw depends only on (seed, offset, row, j), never on the launch shape or on
// which thread makes it; every rank and every backend gets the same numbers.
#pragma once

#include <cstdint>

namespace kernels {
namespace rng {

// The full splitmix64 step: fmix(x + golden) (kernels_jit.rng.mix).
__device__ __forceinline__ uint64_t mix(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// U(seed, offset, row, j) = (mix(mix(mix(mix(seed) ^ offset) ^ row) ^ j) >> 40) * 2^-24, in
// [0, 1) with 24 random bits (kernels_jit.rng.uniform).
__device__ __forceinline__ float uniform(int64_t seed, int64_t offset, int64_t row, int64_t j) {
  const uint64_t h = mix(mix(mix(mix(static_cast<uint64_t>(seed)) ^ static_cast<uint64_t>(offset)) ^
                             static_cast<uint64_t>(row)) ^
                         static_cast<uint64_t>(j));
  return static_cast<float>(static_cast<uint32_t>(h >> 40)) * 5.9604644775390625e-08f;
}

}  // namespace rng
}  // namespace kernels
