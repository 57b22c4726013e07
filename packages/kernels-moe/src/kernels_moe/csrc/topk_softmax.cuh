// moe.topk_softmax, CUDA: per token l = gating (fp32), l = c * tanh(l / c) when c != 0, l += bias,
// p = softmax(l); the k largest p (ties to the lower expert id) and their p, divided by their sum
// when renormalising.
//
// One warp per token, 4 tokens per block of 128 threads (no shared memory, no block barrier):
// lane `l` holds experts l, l + 32, ... in registers (kPer = ceil(E / 32) slots rounded up to a
// power of two, E <= 1024; the gating and bias rows' loads are all issued at once, coalesced),
// a warp max (one redux.sync) and a shuffle sum give the softmax, then up to 16 slots
// moe_common::warp_topk_narrow sorts each lane's 32-bit (probability, ~slot) keys (NarrowKey:
// exact for p >= 2^-64 at 8 slots) and takes k rounds of one warp max over the lanes' heads and a
// ballot of its holders, the lowest lane winning (k <= 32; ties to the lower expert). A NaN row,
// or a row whose k-th winner is below the exact range, computes its probabilities again and
// takes moe_common::warp_topk's 64-bit (probability, ~expert) keys (two reductions a round).
// Lane j writes column j. NaN logits make the row's probabilities NaN (no repair), as the
// reference.
//
// H200, E 256, k 8 (2026-12-04): sorted heads cut a round from a 32-instruction lane-local scan
// of 64-bit keys plus two reductions to the two reductions plus a few selects: 2.93 -> 2.14 us
// at T = 1, 15.17 -> 10.66 at T = 8192 (issue-bound there). float4 loads of fp32 rows (lane l
// holding experts 128 q + 4 l + j) measured no gain (2.10 / 10.88 us) and were taken out.
// The probabilities then still cost 8 IEEE divisions, each behind its own range-check branch
// (its MUFU.RCP and Markstein step serialised slot after slot), and a branch per slot for
// slots past E; now one reciprocal, the same fast path without the checks (bit-identical in
// the range every row but a 66-logit-wide one stays in) and masked keys: 34 -> 31 registers,
// 16 blocks per SM, so T = 8192's 2048 blocks fit one wave (12 per SM before).
// The rounds' shift as selects (it was a branch with 16 moves and register renaming) and the
// weights' sum as one warp sum after the rounds. Together (2026-12-04, A/B): T = 1 2.14 -> 1.73
// us, T = 8192 10.67 -> 11.09 (slower; without the 16-block bound 11.22).
// The 64-bit keys cost 8 instructions a compare-exchange (19 for 8 slots) and ~28 a round; the
// 32-bit keys 2 and ~20: about 190 of ~770 instructions per token fewer at E 256. Measured
// (A/B, 2026-12-04, E 256 k 8): T = 1 / 128 / 8192 1.73 / 1.82 / 11.10 -> 1.57 / 1.66 / 7.94
// us; E 8 k 2 unchanged. 32 registers at 8 slots, no spill without a bias (the bias row spills
// 4 words; the token is reread from %ctaid/%tid).
//
// Few experts (E <= 16: Mixtral's 8) take one thread per token instead (topk_softmax_thread_kernel,
// 64 threads a block): the row in registers through 16-byte loads where the rows are aligned,
// the max, the sum and the top-k as trees in the thread, no shuffle. The warp kernel there idles
// 24 of 32 lanes at E 8 and pays a warp max, a 5-step shuffle sum and k rounds of a reduction and
// a ballot per token: at T = 8192 its 2048 blocks issue ~300 warp instructions per token (2.93 us,
// issue-bound; sglang 1.76). A thread per token issues ~250 instructions per 32 tokens, and T =
// 8192 is 128 blocks of 2 warps (one wave), so the time is the T = 1 latency chain. The results
// are bit-identical to the warp kernel's (at E <= 32 that kernel holds one slot a lane): the
// same expf, the same division, and the trees sum in the order of the warp's xor butterfly
// (lanes past E, and past k for the weights' sum, add zeros).
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/checks.h>
#include <kernels/cuda_dtype.cuh>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>
#include <kernels/reduce.cuh>
#include <kernels/tensor.h>
#include <kernels/vec.cuh>

#include "moe_common.cuh"

namespace topk_softmax_detail {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxExperts = 1024;
constexpr int kMaxK = 32;

// A probability p in [0, 1] (bits < 2^30) and its slot as one 32-bit key whose unsigned order
// is p's, then the lower slot: p's bits from kFloor up (value part >= 1) above the kSlotBits of
// ~slot. kPer <= 4 keeps every p exactly; with 8 slots (E 129..256) p < 2^-64, with 16 p <
// 2^-32, share value part 0: a winner there sends the row to the 64-bit keys (exact for any p).
template <int kPer>
struct NarrowKey {
  static constexpr int kSlotBits = kPer >= 16 ? 4 : kPer >= 8 ? 3 : kPer >= 4 ? 2 : kPer - 1;
  static constexpr uint64_t kTop = 0x3f800002ull;  // bits of 1.0f, plus 2
  static constexpr uint32_t kFloor = static_cast<uint32_t>(
      kTop > (uint64_t{1} << (32 - kSlotBits)) ? kTop - (uint64_t{1} << (32 - kSlotBits)) : 0);

  static __device__ __forceinline__ uint32_t make(float prob, int slot) {
    const uint32_t bits = __float_as_uint(prob);
    const uint32_t value = bits >= kFloor ? bits - kFloor + 1 : 0u;
    return (value << kSlotBits) | static_cast<uint32_t>(kPer - 1 - slot);
  }
  // Whether the key's probability is exact (every key of a row with E >= k of them is nonzero
  // here only if its value part is).
  static __device__ __forceinline__ bool exact(uint32_t key) { return key >> kSlotBits != 0; }
  static __device__ __forceinline__ int slot(uint32_t key) {
    return kPer - 1 - static_cast<int>(key & (kPer - 1));
  }
  static __device__ __forceinline__ float prob(uint32_t key) {
    return __uint_as_float((key >> kSlotBits) + kFloor - 1);
  }
};

struct Params {
  const void* gating;
  const void* bias;  // [E] or null
  float* weights;
  int32_t* ids;
  int64_t g_s0, w_s0, w_s1, i_s0, i_s1;
  int64_t tokens;
  int experts, k, bias_code;
  float softcap;
  bool renormalize;
};

// v[i] /= total for the softmax's exponentials v in [0, 1] and their sum total in [1, E] (the
// peak's term is 1): one reciprocal and moe_common::div_rn_fast without a division's range-check
// branch per slot, exact unless some v is in (0, 2^-96) (a logit over 66 below the row's peak):
// such a row divides plainly.
template <int kN>
__device__ __forceinline__ void divide_by_total(float (&v)[kN], float total) {
  bool tiny = false;
#pragma unroll
  for (int i = 0; i < kN; ++i) tiny |= v[i] > 0.0f && v[i] < 0x1p-96f;
  if (!tiny) {
    const float r = moe_common::div_rcp(total);
#pragma unroll
    for (int i = 0; i < kN; ++i) v[i] = moe_common::div_rn_fast(v[i], total, r);
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) v[i] = v[i] / total;
  }
}

// The token's probabilities p[e] in lane e % 32, slot e / 32 (0 past E), from the gating row
// (and the bias row); true when the row is NaN (a NaN or +inf logit: every p NaN). `trigger`:
// let the next kernel start once the rows are requested (PDL).
template <typename T, int kPer>
__device__ __forceinline__ bool row_probabilities(const Params& p, int64_t token, int lane,
                                                  bool trigger, float (&v)[kPer]) {
  const T* row = static_cast<const T*>(p.gating) + token * p.g_s0;
  float bias[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = i * 32 + lane;
    v[i] = e < p.experts ? kernels::to_float(row[e]) : -INFINITY;
  }
  // The bias row's loads go out with the gating row's (one memory latency for both, not one
  // per slot behind each branch).
  if (p.bias) moe_common::load_row_slots<kPer>(bias, p.bias, p.bias_code, lane, p.experts);
  if (trigger) kernels::pdl_launch_dependents();
  // Uniform branches outside the slot loops; slots past E stay -inf (their bias reads 0), so
  // the max and exp loops need no per-slot test.
  if (p.softcap != 0.0f) {
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (i * 32 + lane < p.experts) v[i] = p.softcap * tanhf(v[i] / p.softcap);
  }
  if (p.bias) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) v[i] += bias[i];
  }
  float peak = -INFINITY;
#pragma unroll
  for (int i = 0; i < kPer; ++i) peak = fmaxf(peak, v[i]);
  peak = moe_common::warp_max_float(peak);
  float total = 0.0f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    v[i] = expf(v[i] - peak);  // 0 past E (NaN only when peak is -inf: a NaN row anyway)
    total += v[i];
  }
  total = kernels::warp_sum(total);
  divide_by_total(v, total);  // a lane with a tiny v divides plainly
  // A NaN or +inf logit makes every probability NaN (exp(NaN) or inf - inf in the sum), so the
  // row's weights are all NaN and its keys all rank as +inf (torch's descending sort puts NaN
  // first): ids 0, 1, ... as the reference.
  return isnan(total);
}

// Up to 8 slots, 32 registers (16 blocks per SM: T = 8192's 2048 blocks in one wave on 132 SMs;
// no spill on sm_90a); more slots keep the compiler's choice.
template <typename T, int kPer>
__global__ void __launch_bounds__(kThreads, kPer <= 8 ? 16 : 1)
    topk_softmax_kernel(bool pdl, Params p) {
  const int lane = threadIdx.x & 31;
  const int64_t token = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (pdl) kernels::pdl_wait();
  if (token >= p.tokens) return;  // the whole warp leaves together
  float v[kPer];
  const bool nan_row = row_probabilities<T, kPer>(p, token, lane, pdl, v);
  // Lane j's winner and its probability (0 in lanes >= k, out of the sum), from 32-bit keys
  // (one reduction and a ballot a round) when the row's probabilities allow, else (a NaN row,
  // a winner below NarrowKey's exact range: rare) from 64-bit keys, the probabilities computed
  // again (keeping them live through the rounds spilled 5 registers).
  int expert = 0;
  float weight = 0.0f;
  bool chosen = false;
  if constexpr (kPer <= 16) {
    using Narrow = NarrowKey<kPer>;
    if (!nan_row) {
      uint32_t key[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i)
        key[i] = Narrow::make(v[i], i) & (0u - static_cast<uint32_t>(i * 32 + lane < p.experts));
      uint32_t mine, mine_lane;
      const uint32_t last = moe_common::warp_topk_narrow<kPer>(key, p.k, lane, mine, mine_lane);
      if (Narrow::exact(last)) {  // the same in every lane
        chosen = true;
        expert = Narrow::slot(mine) * 32 + __ffs(mine_lane) - 1;
        weight = lane < p.k ? Narrow::prob(mine) : 0.0f;
      }
    }
  }
  if (!chosen) {
    if constexpr (kPer <= 16) row_probabilities<T, kPer>(p, token, lane, false, v);
    unsigned long long key[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      // A mask, not a select: nvcc turns the select into a branch per slot.
      key[i] = moe_common::score_key(nan_row ? INFINITY : v[i], i * 32 + lane) &
               (0ull - static_cast<unsigned long long>(i * 32 + lane < p.experts));
    }
    const unsigned long long mine = moe_common::warp_topk<kPer>(key, p.k, lane);
    expert = moe_common::key_expert(mine);
    weight = lane < p.k ? moe_common::from_ordered_bits(static_cast<uint32_t>(mine >> 32)) : 0.0f;
  }
  const float sum = kernels::warp_sum(weight);
  if (lane < p.k) {
    // The token again from the special registers: nvcc otherwise keeps it through the rounds
    // in local memory (a 64-bit spill and reload per token).
    uint32_t cta, tid;
    asm volatile("mov.u32 %0, %%ctaid.x;" : "=r"(cta));
    asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
    const int64_t token = static_cast<int64_t>(cta) * kWarps + (tid >> 5);
    if (nan_row) weight = NAN;
    if (p.renormalize) weight = weight / sum;
    p.weights[token * p.w_s0 + lane * p.w_s1] = weight;
    p.ids[token * p.i_s0 + lane * p.i_s1] = expert;
  }
}

// --- Few experts: one thread per token -------------------------------------------------------

// E at most this takes the thread kernel. Up to 16 the rounds' trees (4 levels, 15 nodes and 16
// masks a round) stay shorter than the warp's rounds at T = 1 for small k; at 32 a round's 31
// nodes and 32 masks would cost the one thread of a T = 1 launch more than the warp's reduction.
constexpr int kThreadMaxExperts = 16;
// Tokens (threads) per block: T = 8192 is 128 blocks, one per SM of the 132.
constexpr int kTokenThreads = 64;

// The token's logits in slots 0..E-1 (-inf past E): 16-byte loads over the whole 16-byte chunks
// of the row when `vector` (the rows 16-byte aligned), the rest element by element.
template <typename T, int kMax>
__device__ __forceinline__ void load_thread_row(const Params& p, int64_t token, bool vector,
                                                float (&v)[kMax]) {
  const T* row = static_cast<const T*>(p.gating) + token * p.g_s0;
  constexpr int kPerVec = kernels::kVectorBytes / static_cast<int>(sizeof(T));
  constexpr int kVecs = kMax / kPerVec;
  const int whole = vector ? p.experts / kPerVec * kPerVec : 0;  // elements in whole chunks
#pragma unroll
  for (int c = 0; c < kVecs; ++c) {
    if (c * kPerVec < whole) {
      kernels::Pack<T, kPerVec> pack;
      pack.load(row + c * kPerVec);
      float f[kPerVec];
      pack.unpack(f);
#pragma unroll
      for (int i = 0; i < kPerVec; ++i) v[c * kPerVec + i] = f[i];
    }
  }
#pragma unroll
  for (int e = 0; e < kMax; ++e) {
    if (e >= whole) v[e] = e < p.experts ? kernels::to_float(row[e]) : -INFINITY;
  }
}

// The trees below recurse on the level (kN: the values left, in x[0..kN)), so each level's loop
// has a constant bound: as nested loops, nvcc left the inner ones rolled at 16 slots and put the
// row on the stack (192 bytes).

// x[0] = the sum of x[0..kN) in the order of a warp's xor butterfly over lanes holding them
// (lanes past kN hold 0): x[i] + x[i + o] for o = kN / 2, ..., 1, so the result is
// kernels::warp_sum's. Overwrites x.
template <int kN, int kMax>
__device__ __forceinline__ void butterfly_sum(float (&x)[kMax]) {
  if constexpr (kN > 1) {
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) x[i] = x[i] + x[i + kN / 2];
    butterfly_sum<kN / 2>(x);
  }
}

// x[0] = the largest of x[0..kN) (fmaxf). Overwrites x.
template <int kN, int kMax>
__device__ __forceinline__ void tree_max(float (&x)[kMax]) {
  if constexpr (kN > 1) {
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) x[i] = fmaxf(x[i], x[i + kN / 2]);
    tree_max<kN / 2>(x);
  }
}

// b[0], at[0] = the largest of b[0..kN) and its index at[], the lower index on ties: a tree over
// adjacent pairs (a node's left half holds the lower indices; the right wins only when greater).
// Overwrites b and at.
template <int kN, int kMax>
__device__ __forceinline__ void tree_argmax(float (&b)[kMax], int (&at)[kMax]) {
  if constexpr (kN > 1) {
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) {
      const bool right = b[2 * i + 1] > b[2 * i];
      b[i] = right ? b[2 * i + 1] : b[2 * i];
      at[i] = right ? at[2 * i + 1] : at[2 * i];
    }
    tree_argmax<kN / 2>(b, at);
  }
}

// Rounds kJ..k-1 of the selection: the j-th largest of v and its index into weight[j] and
// expert[j], its slot then dropped to -1. Compile-time rounds (a recursion, not a loop with a
// runtime exit), so weight[] and expert[] are indexed by constants and stay in registers.
template <int kMax, int kJ = 0>
__device__ __forceinline__ void select_rounds(float (&v)[kMax], int k, float (&weight)[kMax],
                                              int (&expert)[kMax]) {
  if constexpr (kJ < kMax) {
    if (kJ < k) {
      float b[kMax];
      int at[kMax];
#pragma unroll
      for (int e = 0; e < kMax; ++e) {
        b[e] = v[e];
        at[e] = e;
      }
      tree_argmax<kMax>(b, at);
      weight[kJ] = b[0];
      expert[kJ] = at[0];
#pragma unroll
      for (int e = 0; e < kMax; ++e) v[e] = e == expert[kJ] ? -1.0f : v[e];
      select_rounds<kMax, kJ + 1>(v, k, weight, expert);
    }
  }
}

// One token per thread for E <= kMax (a power of two, <= kThreadMaxExperts): the warp kernel's
// arithmetic step by step (see row_probabilities), its reductions as trees in registers.
template <typename T, int kMax>
__global__ void __launch_bounds__(kTokenThreads)
    topk_softmax_thread_kernel(bool pdl, bool vector, Params p) {
  const int64_t token = static_cast<int64_t>(blockIdx.x) * kTokenThreads + threadIdx.x;
  if (pdl) kernels::pdl_wait();
  if (token >= p.tokens) return;
  float v[kMax];
  load_thread_row<T, kMax>(p, token, vector, v);
  float bias[kMax];
  if (p.bias) moe_common::load_floats<kMax>(bias, p.bias, p.bias_code, 1, p.experts);
  if (pdl) kernels::pdl_launch_dependents();
  if (p.softcap != 0.0f) {
#pragma unroll
    for (int e = 0; e < kMax; ++e)
      if (e < p.experts) v[e] = p.softcap * tanhf(v[e] / p.softcap);
  }
  if (p.bias) {
#pragma unroll
    for (int e = 0; e < kMax; ++e) v[e] += bias[e];  // 0 past E
  }
  // fmaxf where the warp kernel maxes ordered bits: the same peak but for a NaN in the row
  // (every probability NaN either way) or a zero of either sign (x - 0 is x, and expf(-0 - 0)
  // and expf(-0 + 0) are both 1).
  float m[kMax];
#pragma unroll
  for (int e = 0; e < kMax; ++e) m[e] = v[e];
  tree_max<kMax>(m);
  const float peak = m[0];
#pragma unroll
  for (int e = 0; e < kMax; ++e) v[e] = expf(v[e] - peak);  // 0 past E
#pragma unroll
  for (int e = 0; e < kMax; ++e) m[e] = v[e];
  butterfly_sum<kMax>(m);
  const float total = m[0];
  divide_by_total(v, total);
  const bool nan_row = isnan(total);
  // k rounds of a tree argmax; the winner's slot drops to -1, below every probability (slots
  // past E hold 0 and lose ties to every expert, so k <= E never takes one). A NaN row takes
  // experts 0, 1, ... as the reference.
  float weight[kMax];
  int expert[kMax];
#pragma unroll
  for (int j = 0; j < kMax; ++j) {
    weight[j] = 0.0f;
    expert[j] = j;
  }
  if (!nan_row) select_rounds<kMax>(v, p.k, weight, expert);
#pragma unroll
  for (int j = 0; j < kMax; ++j) m[j] = weight[j];
  butterfly_sum<kMax>(m);
  const float sum = m[0];
  float* weights = p.weights + token * p.w_s0;
  int32_t* ids = p.ids + token * p.i_s0;
#pragma unroll
  for (int j = 0; j < kMax; ++j) {
    if (j < p.k) {
      float w = nan_row ? NAN : weight[j];
      if (p.renormalize) w = w / sum;
      weights[j * p.w_s1] = w;
      ids[j * p.i_s1] = expert[j];
    }
  }
}

template <typename T, int kMax>
void launch_thread(const kernels::Launch& ctx, const Params& p) {
  // Whole 16-byte chunks: the row base and every row start 16-byte aligned.
  const bool vector = kernels::is_aligned(p.gating) &&
                      (p.g_s0 * static_cast<int64_t>(sizeof(T))) % kernels::kVectorBytes == 0;
  kernels::launch(ctx, topk_softmax_thread_kernel<T, kMax>,
                  kernels::ceil_div(p.tokens, kTokenThreads), kTokenThreads, vector, p);
}

template <typename T>
void launch(const kernels::Launch& ctx, const Params& p) {
  if (p.experts <= 4) return launch_thread<T, 4>(ctx, p);
  if (p.experts <= 8) return launch_thread<T, 8>(ctx, p);
  if (p.experts <= kThreadMaxExperts) return launch_thread<T, kThreadMaxExperts>(ctx, p);
  const unsigned grid = kernels::ceil_div(p.tokens, kWarps);
  const int per = (p.experts + 31) / 32;  // slots per lane, rounded up to a power of two
  if (per <= 1)
    kernels::launch(ctx, topk_softmax_kernel<T, 1>, grid, kThreads, p);
  else if (per <= 2)
    kernels::launch(ctx, topk_softmax_kernel<T, 2>, grid, kThreads, p);
  else if (per <= 4)
    kernels::launch(ctx, topk_softmax_kernel<T, 4>, grid, kThreads, p);
  else if (per <= 8)
    kernels::launch(ctx, topk_softmax_kernel<T, 8>, grid, kThreads, p);
  else if (per <= 16)
    kernels::launch(ctx, topk_softmax_kernel<T, 16>, grid, kThreads, p);
  else
    kernels::launch(ctx, topk_softmax_kernel<T, 32>, grid, kThreads, p);
}

}  // namespace topk_softmax_detail

// topk_weights [T, k] float32, topk_ids [T, k] int32 (any strides), gating [T, E] float
// (last dim contiguous), correction_bias [E] float or None; E <= 1024, k <= 32.
inline void topk_softmax(tvm::ffi::TensorView topk_weights, tvm::ffi::TensorView topk_ids,
                         tvm::ffi::TensorView gating, bool renormalize, double moe_softcapping,
                         tvm::ffi::Optional<tvm::ffi::TensorView> correction_bias) {
  namespace detail = topk_softmax_detail;
  constexpr const char* kOp = "moe.topk_softmax";
  // 1. Validate.
  kernels::check_ndim(kOp, "gating", gating, 2);
  kernels::check_ndim(kOp, "topk_weights", topk_weights, 2);
  kernels::check_ndim(kOp, "topk_ids", topk_ids, 2);
  kernels::check_same_shape(kOp, "topk_weights", topk_weights, "topk_ids", topk_ids);
  const int64_t tokens = gating.size(0), experts = gating.size(1), k = topk_weights.size(1);
  TVM_FFI_CHECK(topk_weights.size(0) == tokens, ValueError)
      << kOp << ": topk_weights must have T = " << tokens << " rows like gating, got shape "
      << kernels::shape_string(topk_weights);
  TVM_FFI_CHECK(k <= experts, ValueError)
      << kOp << ": k = " << k << " must be <= the number of experts E = " << experts;
  TVM_FFI_CHECK(experts <= detail::kMaxExperts && k <= detail::kMaxK, ValueError)
      << kOp << ": the CUDA kernel takes E <= " << detail::kMaxExperts << " and k <= "
      << detail::kMaxK << ", got E = " << experts << ", k = " << k;
  TVM_FFI_CHECK(kernels::is_dtype(topk_weights.dtype(), kDLFloat, 32), TypeError)
      << kOp << ": topk_weights must be float32";
  TVM_FFI_CHECK(kernels::is_dtype(topk_ids.dtype(), kDLInt, 32), TypeError)
      << kOp << ": topk_ids must be int32";
  kernels::check_device(kOp, "gating", gating, kDLCUDA);
  kernels::check_same_device(kOp, "topk_weights", topk_weights, "gating", gating);
  kernels::check_same_device(kOp, "topk_ids", topk_ids, "gating", gating);
  kernels::check_last_dim_contiguous(kOp, "gating", gating);
  detail::Params p{};
  if (correction_bias.has_value()) {
    const tvm::ffi::TensorView b = correction_bias.value();
    kernels::check_ndim(kOp, "correction_bias", b, 1);
    TVM_FFI_CHECK(b.size(0) == experts, ValueError)
        << kOp << ": correction_bias must have shape [" << experts << "] (E), got "
        << kernels::shape_string(b);
    kernels::check_contiguous(kOp, "correction_bias", b);
    kernels::check_same_device(kOp, "correction_bias", b, "gating", gating);
    p.bias_code = moe_common::float_code(kOp, "correction_bias", b.dtype());
    p.bias = kernels::data<const void>(b);
  }
  if (tokens == 0 || k == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(gating);
  const kernels::Launch ctx(kOp, gating);
  // 4. Dispatch on dtype and launch.
  p.gating = kernels::data<const void>(gating);
  p.weights = kernels::data<float>(topk_weights);
  p.ids = kernels::data<int32_t>(topk_ids);
  p.g_s0 = gating.stride(0);
  p.w_s0 = topk_weights.stride(0);
  p.w_s1 = topk_weights.stride(1);
  p.i_s0 = topk_ids.stride(0);
  p.i_s1 = topk_ids.stride(1);
  p.tokens = tokens;
  p.experts = static_cast<int>(experts);
  p.k = static_cast<int>(k);
  p.softcap = static_cast<float>(moe_softcapping);
  p.renormalize = renormalize;
  KERNELS_DISPATCH_FLOAT(gating.dtype(), kOp, T, [&] { detail::launch<T>(ctx, p); });
}
