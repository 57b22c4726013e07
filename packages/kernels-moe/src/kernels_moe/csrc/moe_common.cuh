// Helpers shared by the kernels-moe CUDA sources: a scalar read of a float tensor of any float
// dtype (weights and biases may differ in dtype from the main operand), the order-preserving
// (score, expert id) keys and the sorted-head warp top-k of the routing kernels, and small host
// checks.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <kernels/checks.h>
#include <kernels/dtype.h>

#include <cstdint>

namespace moe_common {

// A float tensor's dtype as a small code read on the device: 0 float32, 1 float16, 2 bfloat16.
enum FloatCode : int { kF32 = 0, kF16 = 1, kBF16 = 2 };

inline int float_code(const char* op, const char* arg, DLDataType t) {
  if (kernels::is_dtype(t, kDLFloat, 32)) return kF32;
  if (kernels::is_dtype(t, kDLFloat, 16)) return kF16;
  if (kernels::is_dtype(t, kDLBfloat, 16)) return kBF16;
  TVM_FFI_THROW(TypeError) << op << ": " << arg
                           << " must be float32, float16 or bfloat16";
  return kF32;
}

// Element i of a float array of dtype `code`, as fp32, through the read-only path.
__device__ __forceinline__ float load_float(const void* p, int code, int64_t i) {
  if (code == kF32) return __ldg(static_cast<const float*>(p) + i);
  const unsigned short bits = __ldg(static_cast<const unsigned short*>(p) + i);
  if (code == kF16) return __half2float(__ushort_as_half(bits));
  return __uint_as_float(static_cast<uint32_t>(bits) << 16);
}

// n (<= kN) elements i * stride of a float array of dtype `code` as fp32, the loads issued
// back to back (one dtype branch, not one per element).
template <int kN>
__device__ __forceinline__ void load_floats(float (&out)[kN], const void* p, int code,
                                            int64_t stride, int n) {
  if (code == kF32) {
    const float* f = static_cast<const float*>(p);
#pragma unroll
    for (int i = 0; i < kN; ++i) out[i] = i < n ? __ldg(f + i * stride) : 0.0f;
  } else {
    const unsigned short* h = static_cast<const unsigned short*>(p);
    unsigned short bits[kN];
#pragma unroll
    for (int i = 0; i < kN; ++i) bits[i] = i < n ? __ldg(h + i * stride) : 0;
#pragma unroll
    for (int i = 0; i < kN; ++i)
      out[i] = code == kF16 ? __half2float(__ushort_as_half(bits[i]))
                            : __uint_as_float(static_cast<uint32_t>(bits[i]) << 16);
  }
}

// (score, expert) as one 64-bit key whose unsigned maximum is the largest score, ties to the
// lower expert: the score's bits mapped to an order-preserving uint32 above ~expert. No valid
// element ever has key 0 (its low word is ~e != 0 for e < 2^32 - 1 and its high word > 0
// for every non-NaN score), so 0 is "nothing left". NaN scores must be mapped by the caller.
__device__ __forceinline__ unsigned long long score_key(float score, int expert) {
  uint32_t u = __float_as_uint(score);
  u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
  return (static_cast<unsigned long long>(u) << 32) | (0xffffffffu - static_cast<uint32_t>(expert));
}
__device__ __forceinline__ int key_expert(unsigned long long key) {
  return static_cast<int>(0xffffffffu - static_cast<uint32_t>(key));
}

// A float's bits as a uint32 of the same order (NaN excluded), and back.
__device__ __forceinline__ uint32_t ordered_bits(float x) {
  const uint32_t u = __float_as_uint(x);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float from_ordered_bits(uint32_t u) {
  return __uint_as_float((u & 0x80000000u) ? (u & 0x7fffffffu) : ~u);
}

__device__ __forceinline__ uint32_t warp_max_u32(uint32_t x) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __reduce_max_sync(0xffffffffu, x);
#else
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1)
    x = max(x, __shfl_xor_sync(0xffffffffu, x, offset));
  return x;
#endif
}

// The warp's largest key, in every lane: on sm_80+ two redux.sync (the score word, then the
// expert word among the lanes holding that score) instead of 5 steps of two 32-bit shuffles.
__device__ __forceinline__ unsigned long long warp_max_key(unsigned long long key) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  const uint32_t hi = static_cast<uint32_t>(key >> 32), lo = static_cast<uint32_t>(key);
  const uint32_t top = __reduce_max_sync(0xffffffffu, hi);
  const uint32_t low = __reduce_max_sync(0xffffffffu, hi == top ? lo : 0u);
  return (static_cast<unsigned long long>(top) << 32) | low;
#else
#pragma unroll
  for (int offset = 16; offset > 0; offset >>= 1) {
    const unsigned long long other = __shfl_xor_sync(0xffffffffu, key, offset);
    key = other > key ? other : key;
  }
  return key;
#endif
}

// A row's elements lane, lane + 32, ... (kPer slots, the warp's row of E elements) of a float
// array of dtype `code` as fp32, 0 past E; the loads are issued back to back.
template <int kPer>
__device__ __forceinline__ void load_row_slots(float (&out)[kPer], const void* p, int code,
                                               int lane, int experts) {
  const int bytes = code == kF32 ? 4 : 2;
  load_floats<kPer>(out, static_cast<const char*>(p) + lane * bytes, code, 32,
                    (experts - lane + 31) / 32);
}

// nvcc's IEEE division and reciprocal (x / d, 1.0f / d) are MUFU.RCP, a Newton step and, for
// x / d, a Markstein correction, each behind a range check that branches to a slow subroutine.
// Per element those branches serialise the chains (each waits on its MUFU before the next
// element issues). The helpers below are that fast path without the check, bit-identical to
// x / d and 1.0f / d where the caller guarantees the range named, so callers test the range
// once per lane and redo the rare lane with the plain division.
__device__ __forceinline__ float rcp_approx(float d) {
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(d));
  return r;
}
// 1.0f / d for d in [1, 2^126).
__device__ __forceinline__ float rcp_rn_fast(float d) {
  const float r = rcp_approx(d);
  return __fmaf_rn(r, -__fmaf_rn(d, r, -1.0f), r);
}
// The reciprocal that div_rn_fast refines per quotient, one per divisor.
__device__ __forceinline__ float div_rcp(float d) {
  const float r = rcp_approx(d);
  return __fmaf_rn(r, __fmaf_rn(-d, r, 1.0f), r);
}
// x / d, r = div_rcp(d), for d in [1, 2^11] and x = 0 or x in [2^-96, 2^64] (the quotient,
// the remainder and every intermediate stay normal, where the Markstein step rounds exactly).
__device__ __forceinline__ float div_rn_fast(float x, float d, float r) {
  const float q = __fmaf_rn(x, r, 0.0f);
  return __fmaf_rn(r, __fmaf_rn(-d, q, x), q);
}

// The warp's largest float, in every lane: one redux.sync over order-preserving bits (sm_80+).
// A positive-signed NaN wins (fmaxf would skip it); callers whose NaN input makes every result
// NaN anyway (softmax) do not mind.
__device__ __forceinline__ float warp_max_float(float x) {
  return from_ordered_bits(warp_max_u32(ordered_bits(x)));
}

// Compare-exchange `index` (of odd_even_merge_count(n)) of Batcher's odd-even merge sort of n (a
// power of two) elements, as first * n + second: a constexpr walk of the network's loops, so the
// sort below sees constant register indices (nvcc's unroller leaves the nested loops with
// data-dependent bounds rolled, and the arrays on the stack).
constexpr int odd_even_merge_pair(int n, int index) {
  int count = 0;
  for (int p = 1; p < n; p <<= 1)
    for (int k = p; k >= 1; k >>= 1)
      for (int j = k % p; j + k < n; j += 2 * k)
        for (int i = 0; i < k && i + j + k < n; ++i)
          if ((i + j) / (2 * p) == (i + j + k) / (2 * p)) {
            if (count == index) return (i + j) * n + i + j + k;
            ++count;
          }
  return count;  // index == count: the number of compare-exchanges
}
constexpr int odd_even_merge_count(int n) { return odd_even_merge_pair(n, -1); }

template <int kPer, int kIndex>
__device__ __forceinline__ void compare_exchange(unsigned long long (&key)[kPer]) {
  if constexpr (kIndex < odd_even_merge_count(kPer)) {
    constexpr int a = odd_even_merge_pair(kPer, kIndex) / kPer;
    constexpr int b = odd_even_merge_pair(kPer, kIndex) % kPer;
    const bool swap = key[b] > key[a];
    const unsigned long long ka = key[a], kb = key[b];
    key[a] = swap ? kb : ka;
    key[b] = swap ? ka : kb;
    compare_exchange<kPer, kIndex + 1>(key);
  }
}

// The same network on 32-bit keys: the larger to the first place, two integer min/max and no
// predicate per compare-exchange (the 64-bit form costs two compares and four selects).
template <int kPer, int kIndex>
__device__ __forceinline__ void compare_exchange(uint32_t (&key)[kPer]) {
  if constexpr (kIndex < odd_even_merge_count(kPer)) {
    constexpr int a = odd_even_merge_pair(kPer, kIndex) / kPer;
    constexpr int b = odd_even_merge_pair(kPer, kIndex) % kPer;
    const uint32_t ka = key[a], kb = key[b];
    key[a] = max(ka, kb);
    key[b] = min(ka, kb);
    compare_exchange<kPer, kIndex + 1>(key);
  }
}

// Sorts kPer keys (64- or 32-bit) descending in registers: Batcher's odd-even merge sort (kPer
// a power of two; 19 compare-exchanges for 8).
template <int kPer, typename Key>
__device__ __forceinline__ void sort_desc(Key (&key)[kPer]) {
  static_assert((kPer & (kPer - 1)) == 0, "sort_desc takes a power-of-two length");
  compare_exchange<kPer, 0>(key);
}

// The k <= 32 largest keys of a warp's row, descending: each lane holds kPer keys (kPer a power
// of two; key 0: not a candidate; keys are distinct; expert e lives in lane e % 32). Returns the
// j-th winner's key in lane j, 0 in lanes >= k.
//
// Each lane sorts its keys once, so a round is a warp key max over the lanes' heads (two
// redux.sync) and the winning lane's shift by one slot (selects, no branch): the round's
// dependent chain is the two reductions and a few selects, not a kPer-long lane-local scan.
// Only keys travel through the sort and the rounds; callers fetch the winners' values once
// (a value that is not the key's score costs kPer shuffles then, not 2 selects per
// compare-exchange and a shuffle and kPer selects per round).
template <int kPer>
__device__ __forceinline__ unsigned long long warp_topk(unsigned long long (&key)[kPer], int k,
                                                        int lane) {
  sort_desc<kPer>(key);
  unsigned long long mine = 0;
  for (int j = 0; j < k; ++j) {
    const unsigned long long best = warp_max_key(key[0]);
    mine = lane == j ? best : mine;
    const bool won = key[0] == best;  // this lane's head won: the next slot becomes its head
#pragma unroll
    for (int i = 0; i + 1 < kPer; ++i) key[i] = won ? key[i + 1] : key[i];
    key[kPer - 1] = won ? 0ull : key[kPer - 1];
  }
  return mine;
}

// warp_topk for 32-bit keys that are distinct within a lane but may repeat across lanes, where
// equal keys rank by lane, the lower first (callers put the value above the slot, so the lower
// lane is the lower expert). A round is one reduction over the heads and a ballot of the lanes
// holding the maximum, the lowest of them winning, instead of two reductions of 64-bit keys;
// the shift moves one register per slot, not two. Lane j gets the j-th winner's key in `mine`
// and its lane as a one-hot mask in `mine_lane` (both 0 in lanes >= k). Returns the last
// winner's key (the same in every lane).
template <int kPer>
__device__ __forceinline__ uint32_t warp_topk_narrow(uint32_t (&key)[kPer], int k, int lane,
                                                     uint32_t& mine, uint32_t& mine_lane) {
  sort_desc<kPer>(key);
  const uint32_t self = 1u << lane;
  uint32_t best = 0;
  mine = 0;
  mine_lane = 0;
  for (int j = 0; j < k; ++j) {
    best = warp_max_u32(key[0]);
    const uint32_t holders = __ballot_sync(0xffffffffu, key[0] == best);
    const uint32_t first = holders & (0u - holders);  // the lowest holder's bit
    mine = lane == j ? best : mine;
    mine_lane = lane == j ? first : mine_lane;
    const bool won = first == self;
#pragma unroll
    for (int i = 0; i + 1 < kPer; ++i) key[i] = won ? key[i + 1] : key[i];
    key[kPer - 1] = won ? 0u : key[kPer - 1];
  }
  return best;
}

}  // namespace moe_common
