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
//
// Groups of 32 experts with E <= 256 (DeepSeek-V3), 16-byte-aligned rows and bias: a second
// kernel, gate_group32_kernel below (lane = 8 consecutive experts, 32-bit keys, one warp max a
// round, ~550 instructions a token on its main path against ~980 here: predicted ~10 us at
// T = 8192, not yet measured). Everything else, and unaligned views, takes the kernel above.
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

#include <cfloat>

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

// The sigmoids of a lane's slots in place, s = 1 / (1 + exp(-l)), without the division's
// range-check branch per slot (each would wait on its MUFU before the next slot issues): the fast
// path is exact for 1 + exp(-l) < 2^126, i.e. every l > -87.3; a lane holding a lower one (or
// NaN) divides plainly. Both kernels' scores.
template <int kN>
__device__ __forceinline__ void sigmoid_slots(float (&s)[kN]) {
  bool huge = false;
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    s[i] = 1.0f + expf(-s[i]);
    huge |= !(s[i] < 0x1p126f);
  }
  if (!huge) {
#pragma unroll
    for (int i = 0; i < kN; ++i) s[i] = moe_common::rcp_rn_fast(s[i]);
  } else {
#pragma unroll
    for (int i = 0; i < kN; ++i) s[i] = 1.0f / s[i];
  }
}

// Both kernels' output: lane j < k writes column j of the token, its winner `expert` and its
// `weight` (0 in lanes >= k, so the warp sum is the winners'), renormalised by that sum (unless
// it is 0) and scaled.
__device__ __forceinline__ void write_token(const Params& p, int64_t token, int lane, float weight,
                                            int expert) {
  const float sum = kernels::warp_sum(weight);
  if (lane < p.k) {
    if (p.renormalize && sum != 0.0f) weight = weight / sum;
    weight *= p.scale;
    p.weights[token * p.w_s0 + lane * p.w_s1] = weight;
    p.ids[token * p.i_s0 + lane * p.i_s1] = expert;
  }
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
  sigmoid_slots(s);
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
  write_token(p, token, lane, weight, expert);
}

// --- Groups of 32 experts, E = 32 * n_group <= 256 (DeepSeek-V3) ----------------------------------
//
// Lane l holds experts 8 pos .. 8 pos + 7 at position pos = l ^ 31 (16-byte row loads; the
// reversed order puts the lowest experts in the highest lane, which find-leading-one names in
// one instruction). Group g is positions 4g .. 4g + 3, an aligned block of 4 lanes: its top two
// are each lane's (a min/max tree) merged over two xor shuffles, not two warp reductions per group.
// The lane at position 4g + q compares groups 2q and 2q + 1 with its own (two shuffles) and the 4
// lanes' counts add up (two more): group g is kept when fewer than topk_group groups beat it.
//
// Selection runs on 32-bit keys: a score's order-preserving bits relative to the largest group
// top M (29 bits: every score within 2^29 - 2 codes below M, i.e. 64 binades of M's sign) above
// ~slot. A round is one warp max; the lanes whose head has the same score hold it, the lowest
// position (highest lane) wins: equal scores go to the lower expert (lower position, then lower
// slot within the lane's sorted keys). Its (position, ~slot) is shuffled to the round's lane.
// Only each lane's 4 best keys take part (a 4-register shift a round); the 5th stands guard.
// The row is routed again with 64-bit (score, ~expert) keys (exact for any scores) when the k-th
// winner has score part 0 (below the window or a dropped group's), or a lane that gave up its 4
// keys holds a 5th as good as it.
// Only the keys live through the rounds; lane j reloads its winner's logit (an L1 hit) for the
// weight.
constexpr int kSlots32 = 8;     // experts per lane
constexpr int kWindow32 = 4;    // keys per lane in the rounds
constexpr uint32_t kSpan32 = (1u << 29) - 2;  // codes below M kept exact (score part < 2^29)

// order-preserving bits in two instructions (moe_common::ordered_bits compiles to three).
__device__ __forceinline__ uint32_t ordered_bits2(float x) {
  const uint32_t u = __float_as_uint(x);
  return u ^ (static_cast<uint32_t>(static_cast<int32_t>(u) >> 31) | 0x80000000u);
}

// Eight consecutive elements (16-byte aligned) as fp32, in 16-byte loads.
template <typename T>
__device__ __forceinline__ void load8(const T* src, float (&out)[kSlots32]) {
  constexpr int kVec = 16 / sizeof(T);
#pragma unroll
  for (int c = 0; c < kSlots32 / kVec; ++c) {
    const uint4 v = *reinterpret_cast<const uint4*>(src + c * kVec);
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int j = 0; j < kVec; ++j) {
      if constexpr (sizeof(T) == 4) {
        out[c * kVec + j] = __uint_as_float(w[j]);
      } else {
        const uint16_t h = static_cast<uint16_t>(w[j / 2] >> (16 * (j % 2)));
        T t;
        memcpy(&t, &h, 2);
        out[c * kVec + j] = kernels::to_float(t);
      }
    }
  }
}

// The selection scores sb of the 8 experts at position `pos` (s = sigmoid(logit), sb = s + bias,
// NaN -> -1e30); 0.5 where !active (the caller masks them). `trigger`: let the next kernel start
// (PDL) once the rows are requested.
template <typename T>
__device__ __forceinline__ void group32_scores(const Params& p, int64_t token, int pos,
                                               bool active, bool trigger,
                                               float (&sb)[kSlots32]) {
  float b[kSlots32];
#pragma unroll
  for (int i = 0; i < kSlots32; ++i) sb[i] = b[i] = 0.0f;
  if (active) {
    load8(static_cast<const T*>(p.logits) + token * p.l_s0 + pos * kSlots32, sb);
    if (p.bias) {
      if (p.bias_code == moe_common::kF32)
        load8(static_cast<const float*>(p.bias) + pos * kSlots32, b);
      else if (p.bias_code == moe_common::kF16)
        load8(static_cast<const __half*>(p.bias) + pos * kSlots32, b);
      else
        load8(static_cast<const __nv_bfloat16*>(p.bias) + pos * kSlots32, b);
    }
  }
  if (trigger) kernels::pdl_launch_dependents();
  sigmoid_slots(sb);
  // As the reference's nan_to_num: NaN -> -1e30, +-inf -> +-FLT_MAX (an infinite bias), so a
  // kept expert always ranks above the dropped groups' -inf. One compare a slot; the rare lane
  // maps.
  bool special = false;
#pragma unroll
  for (int i = 0; i < kSlots32; ++i) {
    sb[i] += b[i];  // + 0 without a bias: s unchanged (s >= 0)
    special |= !(fabsf(sb[i]) <= FLT_MAX);
  }
  if (special) {
#pragma unroll
    for (int i = 0; i < kSlots32; ++i)
      sb[i] = isnan(sb[i]) ? kNanScore : fminf(fmaxf(sb[i], -FLT_MAX), FLT_MAX);
  }
}

// The top two of a set of scores (duplicates count): (a1 >= a2) merged with (b1 >= b2).
__device__ __forceinline__ void merge_top2(float& a1, float& a2, float b1, float b2) {
  const float second = fmaxf(fminf(a1, b1), fmaxf(a2, b2));
  a1 = fmaxf(a1, b1);
  a2 = second;
}

template <typename T>
__global__ void __launch_bounds__(kThreads, 16) gate_group32_kernel(bool pdl, Params p) {
  const int lane = threadIdx.x & 31;
  const int64_t token = static_cast<int64_t>(blockIdx.x) * kWarps + (threadIdx.x >> 5);
  if (pdl) kernels::pdl_wait();
  if (token >= p.tokens) return;  // the whole warp leaves together
  const int pos = lane ^ 31;
  const int group = pos >> 2;
  const bool active = group < p.n_group;
  float sb[kSlots32];
  group32_scores<T>(p, token, pos, active, pdl, sb);

  // 1. Group scores: the lane's top two (pairs, then a merge tree), then its group's 4 lanes'.
  float t1[4], t2[4];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    t1[i] = fmaxf(sb[2 * i], sb[2 * i + 1]);
    t2[i] = fminf(sb[2 * i], sb[2 * i + 1]);
  }
  merge_top2(t1[0], t2[0], t1[1], t2[1]);
  merge_top2(t1[2], t2[2], t1[3], t2[3]);
  merge_top2(t1[0], t2[0], t1[2], t2[2]);
  float top1 = t1[0], top2 = t2[0];
#pragma unroll
  for (int offset = 1; offset <= 2; offset <<= 1) {
    const float o1 = __shfl_xor_sync(0xffffffffu, top1, offset);
    const float o2 = __shfl_xor_sync(0xffffffffu, top2, offset);
    merge_top2(top1, top2, o1, o2);
  }
  // The keys' window: the largest group top M (beside the ranking, not after it). Codes >= low
  // get score parts 1 .. 2^29 - 1.
  const uint32_t peak = moe_common::warp_max_u32(ordered_bits2(active ? top1 : -INFINITY));
  const uint32_t low = peak > kSpan32 ? peak - kSpan32 : 1u;

  // 2. Kept groups: group g against groups 2q and 2q + 1 (q = pos & 3; group h's first lane is
  // position 4h), ties to the lower group.
  const float gscore = top1 + top2;
  const uint32_t mine = ordered_bits2(isnan(gscore) ? kNanScore : gscore);
  int beaten_by = 0;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int other_group = 2 * (pos & 3) + h;
    const uint32_t other = __shfl_sync(0xffffffffu, mine, (4 * other_group) ^ 31);
    beaten_by += other_group < p.n_group &&
                 (other > mine || (other == mine && other_group < group));
  }
  beaten_by += __shfl_xor_sync(0xffffffffu, beaten_by, 1);
  beaten_by += __shfl_xor_sync(0xffffffffu, beaten_by, 2);
  const bool kept = active && beaten_by < p.topk_group;

  // 3. Keys (code - low + 1) << 3 | ~slot for codes >= low in kept groups, else ~slot; sorted.
  const uint32_t floor = kept ? low - 1 : 0xffffffffu;
  uint32_t key[kSlots32];
#pragma unroll
  for (int i = 0; i < kSlots32; ++i)
    key[i] = ((max(ordered_bits2(sb[i]), floor) - floor) << 3) |
             static_cast<uint32_t>(kSlots32 - 1 - i);
  moe_common::sort_desc<kSlots32>(key);
  const uint32_t guard = key[kWindow32];

  // 4. k rounds over the heads: lane j gets its winner's (position << 3 | ~slot).
  const uint32_t tag = static_cast<uint32_t>(pos) << 3;
  uint32_t best = 0, mine_id = 0;
  for (int j = 0; j < p.k; ++j) {
    best = moe_common::warp_max_u32(key[0]);
    // Same score part as the best (its slot bits are <= 7; compared with best as it came).
    const uint32_t holders = __ballot_sync(0xffffffffu, (key[0] | 7u) >= best);
    const int src = 31 - __clz(holders);  // the lowest position holding the round's score
    const uint32_t id = __shfl_sync(0xffffffffu, tag | (key[0] & 7u), src);
    mine_id = lane == j ? id : mine_id;
    const bool won = src == lane;
#pragma unroll
    for (int i = 0; i + 1 < kWindow32; ++i) key[i] = won ? key[i + 1] : key[i];
    key[kWindow32 - 1] = won ? 0u : key[kWindow32 - 1];
  }
  int expert = static_cast<int>(mine_id ^ 7u);  // 8 pos + slot
  // A lane whose 4 keys all won has head 0 (a lane still holding a key 0 has guard 0 too).
  const bool short_window =
      __any_sync(0xffffffffu, key[0] == 0u && guard >= (best & ~7u));
  if ((best >> 3) == 0 || short_window) {
    group32_scores<T>(p, token, pos, active, false, sb);
    unsigned long long wide[kSlots32];
#pragma unroll
    for (int i = 0; i < kSlots32; ++i)
      wide[i] = active ? moe_common::score_key(kept ? sb[i] : -INFINITY, pos * kSlots32 + i)
                       : 0ull;
    expert = moe_common::key_expert(moe_common::warp_topk<kSlots32>(wide, p.k, lane));
  }

  // 5. Lane j's weight: its winner's sigmoid from the logit again (as in group32_scores), 0 in
  // lanes >= k.
  float weight = 0.0f;
  if (lane < p.k) {
    const float d =
        1.0f + expf(-kernels::to_float(static_cast<const T*>(p.logits)[token * p.l_s0 + expert]));
    weight = d < 0x1p126f ? moe_common::rcp_rn_fast(d) : 1.0f / d;
  }
  write_token(p, token, lane, weight, expert);
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
void launch(const kernels::Launch& ctx, const Params& p, bool rows_aligned) {
  if (p.n_group > 1 && p.group_size == 32 && p.n_group <= 8 && rows_aligned)
    kernels::launch(ctx, gate_group32_kernel<T>, kernels::ceil_div(p.tokens, kWarps), kThreads, p);
  else if (p.n_group > 1 && p.group_size == 32)
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
  // The 32-expert-group kernel reads rows and the bias in 16-byte loads.
  const int64_t elem = (logits.dtype().bits + 7) / 8;
  const bool rows_aligned =
      reinterpret_cast<uintptr_t>(p.logits) % 16 == 0 && (p.l_s0 * elem) % 16 == 0 &&
      (p.bias == nullptr || reinterpret_cast<uintptr_t>(p.bias) % 16 == 0);
  KERNELS_DISPATCH_FLOAT(logits.dtype(), kOp, T, [&] { detail::launch<T>(ctx, p, rows_aligned); });
}
