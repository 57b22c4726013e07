// moe.gate_topk_renorm, CUDA: DeepSeek-V3 "noaux_tc" routing. Per token: s = sigmoid(logits),
// sb = s + bias (NaN -> -1e30) selects; with n_group > 1 only the topk_group groups of largest
// top-2 sum of sb compete (ties to the lower group); the k largest sb (ties to the lower expert)
// get weight s, divided by the sum when renormalising (not when it is 0), times the scaling
// factor when applied on output.
//
// One warp per token, 4 tokens per block of 128 threads (no shared memory, no block barrier):
// lane `l` holds experts l, l + 32, ... (kPer = ceil(E / 32) slots rounded up to a power of
// two, in registers, E <= 1024; the logits and bias rows' loads are all issued at once,
// coalesced). Group scores: per group, a lane-local top-2 over its experts in the group, then
// a warp max (redux.sync) and, beside a ballot counting its holders, the max of the rest give
// the group's top two. Groups of exactly 32 experts (DeepSeek-V3's 256 / 8) skip the
// lane-local pass (group g is register slot g), run the groups' reductions without branches
// between them (they overlap), and lane g ranks group g against the scores every lane already
// holds (no shuffles); otherwise lane g keeps group g's score (n_group <= 32) and counts the
// groups that beat it (n_group shuffles). A ballot of "fewer than topk_group" is the kept set.
// Then moe_common::warp_topk (each lane's keys sorted once, k rounds of a warp max over the
// heads, keys only) picks the experts (k <= 32); lane j fetches its winner's sigmoid (kPer
// shuffles) and writes column j.
//
// H200, DeepSeek-V3 routing (2026-12-04): 5.96 us at T = 1 and 23.26 at T = 8192 when the bias
// was loaded one dependent slot at a time and the selection scanned every key per round; 4.07 /
// 19.41 with the bias beside the logits and sorted-head rounds; 2.84 / 16.74 with the groups
// scored without branches between them and ranked in registers (before: 8 serial groups of
// redux -> ballot -> find-first -> redux plus an 8-step shuffle loop). What is left at T = 1 is
// mostly the 8 sigmoid divisions (exact, as torch) and the 8 selection rounds. The divisions
// then ran one after another (a range-check branch each, waiting on its MUFU); now they are
// nvcc's fast path without the checks, bit-identical for logits > -87.3, one check per lane
// (a lane holding a lower logit or NaN divides plainly).
// Only the keys through the sort and the rounds (the sigmoids were carried beside them: 2
// selects per compare-exchange, a shuffle and 8 moves per round, 53 registers), the winners'
// sigmoids fetched once: 39 registers, 12 blocks per SM instead of 9. Both: 2.45 / 15.63 us
// at T = 1 / 8192 (2026-12-04, 2.85 / 16.75 before in the same A/B run).
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

#include "moe_common.cuh"

namespace gate_topk_renorm_detail {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kMaxExperts = 1024;
constexpr int kMaxK = 32;
constexpr int kMaxGroups = 32;
constexpr float kNanScore = -1e30f;

struct Params {
  const void* logits;
  const void* bias;  // [E] or null
  float* weights;
  int32_t* ids;
  int64_t l_s0, w_s0, w_s1, i_s0, i_s1;
  int64_t tokens;
  int experts, k, bias_code, n_group, topk_group, group_size;
  float scale;  // 1 unless applied on output
  bool renormalize;
};

// The sum of a group's two largest selection scores (duplicates count, as topk(2).sum()) from
// each lane's largest (`first`) and second largest (`second`, -inf if none) of the group: the
// warp max of the firsts, and as second term that max again when two lanes hold it, else the
// warp max of what remains once its holder offers its second. The ballot and the second
// reduction both wait only on the first, so the chain is two redux.sync, not redux -> ballot ->
// find-first -> redux.
__device__ __forceinline__ float warp_top2_sum(float first, float second) {
  const uint32_t mine = moe_common::ordered_bits(first);
  const uint32_t top = moe_common::warp_max_u32(mine);
  const bool holder = mine == top;
  const bool shared_top = __popc(__ballot_sync(0xffffffffu, holder)) >= 2;
  const uint32_t rest = moe_common::warp_max_u32(holder ? moe_common::ordered_bits(second) : mine);
  return moe_common::from_ordered_bits(top) +
         moe_common::from_ordered_bits(shared_top ? top : rest);
}

// Up to 8 slots, 32 registers (16 blocks per SM: T = 8192's 2048 blocks in one wave on 132 SMs;
// sm_90a spills one word, 2 stores and 3 loads in L1); more slots keep the compiler's choice.
template <typename T, int kPer, bool kGroup32>
__global__ void __launch_bounds__(kThreads, kPer <= 8 ? 16 : 1) gate_topk_renorm_kernel(bool pdl, Params p) {
  const int lane = threadIdx.x & 31;
  const int64_t token = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (pdl) kernels::pdl_wait();
  if (token >= p.tokens) return;  // the whole warp leaves together
  const T* row = static_cast<const T*>(p.logits) + token * p.l_s0;
  float s[kPer], sb[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = i * 32 + lane;
    s[i] = e < p.experts ? kernels::to_float(row[e]) : 0.0f;
  }
  // The bias row's loads go out with the logits' (one memory latency for both, not one per
  // slot behind each branch); sb holds the bias until the sum.
  if (p.bias) moe_common::load_row_slots<kPer>(sb, p.bias, p.bias_code, lane, p.experts);
  if (pdl) kernels::pdl_launch_dependents();
  // s = 1 / (1 + exp(-l)) without the division's range-check branch per slot (each would wait
  // on its MUFU before the next slot issues): the fast path is exact for 1 + exp(-l) < 2^126,
  // i.e. every l > -87.3; a lane holding a lower one (or NaN) divides plainly.
  bool huge = false;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    s[i] = 1.0f + expf(-s[i]);
    huge |= !(s[i] < 0x1p126f);
  }
  if (!huge) {
#pragma unroll
    for (int i = 0; i < kPer; ++i) s[i] = moe_common::rcp_rn_fast(s[i]);
  } else {
#pragma unroll
    for (int i = 0; i < kPer; ++i) s[i] = 1.0f / s[i];
  }
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const float b = p.bias ? s[i] + sb[i] : s[i];
    sb[i] = isnan(b) ? kNanScore : b;
  }
  if (p.n_group > 1) {
    int group[kPer];
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int e = i * 32 + lane;
      group[i] = e >= p.experts ? -1 : kGroup32 ? i : e / p.group_size;
    }
    unsigned kept;
    if constexpr (kGroup32) {
      // Group g is slot g of every lane, and its score comes out of the reductions in every
      // lane: the kPer groups' reductions are independent (no branch between them, so they
      // overlap), and lane g ranks group g against the others' scores in its own registers
      // (kPer compares, no shuffles). Slots past n_group are computed and ignored.
      uint32_t score[kPer];
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const float g = warp_top2_sum(sb[i], -INFINITY);
        score[i] = moe_common::ordered_bits(isnan(g) ? kNanScore : g);
      }
      uint32_t mine = 0;
#pragma unroll
      for (int i = 0; i < kPer; ++i) mine = lane == i ? score[i] : mine;
      int beaten_by = 0;
#pragma unroll
      for (int i = 0; i < kPer; ++i)
        beaten_by += i < p.n_group && (score[i] > mine || (score[i] == mine && i < lane));
      kept = __ballot_sync(0xffffffffu, lane < p.n_group && beaten_by < p.topk_group);
    } else {
      float my_score = -INFINITY;
      for (int g = 0; g < p.n_group; ++g) {
        // Lane-local top two of the group, then the warp's (duplicates count).
        float first = -INFINITY, second = -INFINITY;
#pragma unroll
        for (int i = 0; i < kPer; ++i) {
          if (group[i] == g) {
            if (sb[i] > first) {
              second = first;
              first = sb[i];
            } else if (sb[i] > second) {
              second = sb[i];
            }
          }
        }
        const float score = warp_top2_sum(first, second);
        if (lane == g) my_score = score;
      }
      // Group g (lane g) is kept when fewer than topk_group groups beat it (a larger score, or
      // an equal one and a lower index): n_group independent shuffles and compares, not
      // topk_group rounds of dependent warp reductions.
      const uint32_t mine = moe_common::ordered_bits(isnan(my_score) ? kNanScore : my_score);
      int beaten_by = 0;
      for (int h = 0; h < p.n_group; ++h) {
        const uint32_t other = __shfl_sync(0xffffffffu, mine, h);
        beaten_by += other > mine || (other == mine && h < lane);
      }
      kept = __ballot_sync(0xffffffffu, lane < p.n_group && beaten_by < p.topk_group);
    }
#pragma unroll
    for (int i = 0; i < kPer; ++i)
      if (group[i] >= 0 && !((kept >> group[i]) & 1u)) sb[i] = -INFINITY;
  }
  unsigned long long key[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const int e = i * 32 + lane;
    key[i] = e < p.experts ? moe_common::score_key(sb[i], e) : 0ull;
  }
  // Lane j's winner and its sigmoid, shuffled from the winner's lane and picked by slot
  // (lanes >= k get key 0, expert -1: no slot, weight 0, out of the sum).
  const int expert = moe_common::key_expert(moe_common::warp_topk<kPer>(key, p.k, lane));
  float weight = 0.0f;
#pragma unroll
  for (int i = 0; i < kPer; ++i) {
    const float v = __shfl_sync(0xffffffffu, s[i], expert & 31);
    weight = expert >> 5 == i ? v : weight;
  }
  const float sum = kernels::warp_sum(weight);
  if (lane < p.k) {
    if (p.renormalize && sum != 0.0f) weight = weight / sum;
    weight *= p.scale;
    p.weights[token * p.w_s0 + lane * p.w_s1] = weight;
    p.ids[token * p.i_s0 + lane * p.i_s1] = expert;
  }
}

template <typename T, bool kGroup32>
void launch_groups(const kernels::Launch& ctx, const Params& p) {
  const unsigned grid = kernels::ceil_div(p.tokens, kWarps);
  const int per = (p.experts + 31) / 32;
  if (per <= 1)
    kernels::launch(ctx, gate_topk_renorm_kernel<T, 1, kGroup32>, grid, kThreads, p);
  else if (per <= 2)
    kernels::launch(ctx, gate_topk_renorm_kernel<T, 2, kGroup32>, grid, kThreads, p);
  else if (per <= 4)
    kernels::launch(ctx, gate_topk_renorm_kernel<T, 4, kGroup32>, grid, kThreads, p);
  else if (per <= 8)
    kernels::launch(ctx, gate_topk_renorm_kernel<T, 8, kGroup32>, grid, kThreads, p);
  else if (per <= 16)
    kernels::launch(ctx, gate_topk_renorm_kernel<T, 16, kGroup32>, grid, kThreads, p);
  else
    kernels::launch(ctx, gate_topk_renorm_kernel<T, 32, kGroup32>, grid, kThreads, p);
}

template <typename T>
void launch(const kernels::Launch& ctx, const Params& p) {
  if (p.n_group > 1 && p.group_size == 32)
    launch_groups<T, true>(ctx, p);
  else
    launch_groups<T, false>(ctx, p);
}

}  // namespace gate_topk_renorm_detail

// weights [T, k] float32, ids [T, k] int32 (any strides), logits [T, E] float (last dim
// contiguous), bias [E] float or None; E <= 1024, k <= 32, n_group <= 32.
inline void gate_topk_renorm(tvm::ffi::TensorView weights, tvm::ffi::TensorView ids,
                             tvm::ffi::TensorView logits,
                             tvm::ffi::Optional<tvm::ffi::TensorView> bias, int64_t n_group,
                             int64_t topk_group, bool renormalize, double routed_scaling_factor,
                             bool apply_routed_scaling_factor_on_output) {
  namespace detail = gate_topk_renorm_detail;
  constexpr const char* kOp = "moe.gate_topk_renorm";
  // 1. Validate.
  kernels::check_ndim(kOp, "logits", logits, 2);
  kernels::check_ndim(kOp, "weights", weights, 2);
  kernels::check_ndim(kOp, "ids", ids, 2);
  kernels::check_same_shape(kOp, "weights", weights, "ids", ids);
  const int64_t tokens = logits.size(0), experts = logits.size(1), k = weights.size(1);
  TVM_FFI_CHECK(weights.size(0) == tokens, ValueError)
      << kOp << ": weights must have T = " << tokens << " rows like logits, got shape "
      << kernels::shape_string(weights);
  TVM_FFI_CHECK(n_group >= 1 && experts % n_group == 0 && experts / n_group >= 2, ValueError)
      << kOp << ": E = " << experts << " must be a multiple of n_group = " << n_group
      << " with >= 2 experts per group";
  TVM_FFI_CHECK(topk_group >= 1 && topk_group <= n_group, ValueError)
      << kOp << ": topk_group = " << topk_group << " must be in [1, n_group = " << n_group << "]";
  TVM_FFI_CHECK(k >= 1 && k <= topk_group * (experts / n_group), ValueError)
      << kOp << ": topk = " << k << " must be in [1, topk_group * E / n_group = "
      << topk_group * (experts / n_group) << "]";
  TVM_FFI_CHECK(experts <= detail::kMaxExperts && k <= detail::kMaxK &&
                    n_group <= detail::kMaxGroups,
                ValueError)
      << kOp << ": the CUDA kernel takes E <= " << detail::kMaxExperts << ", k <= "
      << detail::kMaxK << " and n_group <= " << detail::kMaxGroups << ", got E = " << experts
      << ", k = " << k << ", n_group = " << n_group;
  TVM_FFI_CHECK(kernels::is_dtype(weights.dtype(), kDLFloat, 32), TypeError)
      << kOp << ": weights must be float32";
  TVM_FFI_CHECK(kernels::is_dtype(ids.dtype(), kDLInt, 32), TypeError)
      << kOp << ": ids must be int32";
  kernels::check_device(kOp, "logits", logits, kDLCUDA);
  kernels::check_same_device(kOp, "weights", weights, "logits", logits);
  kernels::check_same_device(kOp, "ids", ids, "logits", logits);
  kernels::check_last_dim_contiguous(kOp, "logits", logits);
  detail::Params p{};
  if (bias.has_value()) {
    const tvm::ffi::TensorView b = bias.value();
    kernels::check_ndim(kOp, "bias", b, 1);
    TVM_FFI_CHECK(b.size(0) == experts, ValueError)
        << kOp << ": bias must have shape [" << experts << "] (E), got "
        << kernels::shape_string(b);
    kernels::check_contiguous(kOp, "bias", b);
    kernels::check_same_device(kOp, "bias", b, "logits", logits);
    p.bias_code = moe_common::float_code(kOp, "bias", b.dtype());
    p.bias = kernels::data<const void>(b);
  }
  if (tokens == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(logits);
  const kernels::Launch ctx(kOp, logits);
  // 4. Dispatch on dtype and launch.
  p.logits = kernels::data<const void>(logits);
  p.weights = kernels::data<float>(weights);
  p.ids = kernels::data<int32_t>(ids);
  p.l_s0 = logits.stride(0);
  p.w_s0 = weights.stride(0);
  p.w_s1 = weights.stride(1);
  p.i_s0 = ids.stride(0);
  p.i_s1 = ids.stride(1);
  p.tokens = tokens;
  p.experts = static_cast<int>(experts);
  p.k = static_cast<int>(k);
  p.n_group = static_cast<int>(n_group);
  p.topk_group = static_cast<int>(topk_group);
  p.group_size = static_cast<int>(experts / n_group);
  p.scale = apply_routed_scaling_factor_on_output ? static_cast<float>(routed_scaling_factor)
                                                  : 1.0f;
  p.renormalize = renormalize;
  KERNELS_DISPATCH_FLOAT(logits.dtype(), kOp, T, [&] { detail::launch<T>(ctx, p); });
}
