// speculative.verify_tree_greedy, CUDA: one warp per request (4 per block of 128 threads). For
// N <= 64 the warp stages the request's tree in shared memory with coalesced loads (candidates,
// flat index, first child, next sibling, and the target's token after each node, gathered in
// parallel), so the walk that follows is shared-memory only; larger trees are walked from global
// memory. Lane 0 walks: S-1 steps, each visiting at most N siblings (cyclic or malformed trees
// terminate). Index values are preconditions: a child or sibling outside [-1, N) ends the walk
// there, a node whose flat index is outside [0, B*N) never matches, and a root outside it leaves
// the request's outputs untouched except accept_token_num = 0 (the torch reference raises). No
// host synchronisation; entries not visited are left as the caller prefilled them.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>

#include <tuple>

#include "speculative_common.cuh"

namespace verify_tree_greedy_detail {

constexpr int kWarps = 4;
constexpr int kThreads = kWarps * 32;
constexpr int kStagedNodes = 64;

struct Params {
  int32_t* predicts;                // [B*N], contiguous
  int32_t* accept_index;            // [B, S]
  int64_t ai_s0, ai_s1;
  int32_t* accept_token_num;        // [B]
  int64_t atn_s;
  speculative_detail::IndexRef cand, index, child, sibling, target;  // [B,N] x4, [B*N]
  int64_t batch, nodes, steps, flat;
};

// A request's tree staged in shared memory.
struct Staged {
  int64_t cand[kStagedNodes];
  int64_t index[kStagedNodes];  // -1 when out of [0, flat)
  int64_t target[kStagedNodes];  // target_predict[index] (unused when index is -1)
  int32_t child[kStagedNodes];   // -1 when out of [0, N)
  int32_t sibling[kStagedNodes];
};

// The tree read straight from global memory (N > kStagedNodes), with the same sanitising.
struct Global {
  const Params* p;
  int64_t b;
  __device__ __forceinline__ int64_t cand(int64_t i) const { return p->cand.at(b, i); }
  __device__ __forceinline__ int64_t index(int64_t i) const {
    const int64_t f = p->index.at(b, i);
    return f >= 0 && f < p->flat ? f : -1;
  }
  __device__ __forceinline__ int64_t target(int64_t i) const { return p->target[index(i)]; }
  __device__ __forceinline__ int64_t child(int64_t i) const {
    const int64_t c = p->child.at(b, i);
    return c >= 0 && c < p->nodes ? c : -1;
  }
  __device__ __forceinline__ int64_t sibling(int64_t i) const {
    const int64_t c = p->sibling.at(b, i);
    return c >= 0 && c < p->nodes ? c : -1;
  }
};

struct Shared {
  const Staged* s;
  __device__ __forceinline__ int64_t cand(int64_t i) const { return s->cand[i]; }
  __device__ __forceinline__ int64_t index(int64_t i) const { return s->index[i]; }
  __device__ __forceinline__ int64_t target(int64_t i) const { return s->target[i]; }
  __device__ __forceinline__ int64_t child(int64_t i) const { return s->child[i]; }
  __device__ __forceinline__ int64_t sibling(int64_t i) const { return s->sibling[i]; }
};

template <typename Tree>
__device__ __forceinline__ void walk(const Params& p, int64_t b, const Tree& tree) {
  int32_t* accept = p.accept_index + b * p.ai_s0;
  int64_t last = tree.index(0);
  if (last < 0) {
    p.accept_token_num[b * p.atn_s] = 0;
    return;
  }
  accept[0] = static_cast<int32_t>(last);
  int64_t want = tree.target(0);
  int64_t cur = 0;
  int32_t accepted = 0;
  for (int64_t step = 1; step < p.steps; ++step) {
    cur = tree.child(cur);
    bool found = false;
    for (int64_t k = 0; k < p.nodes && cur >= 0; ++k) {
      if (tree.index(cur) >= 0 && tree.cand(cur) == want) {
        found = true;
        break;
      }
      cur = tree.sibling(cur);
    }
    if (!found) break;
    p.predicts[last] = static_cast<int32_t>(tree.cand(cur));
    ++accepted;
    last = tree.index(cur);
    accept[accepted * p.ai_s1] = static_cast<int32_t>(last);
    want = tree.target(cur);
  }
  p.predicts[last] = static_cast<int32_t>(want);
  p.accept_token_num[b * p.atn_s] = accepted;
}

template <bool kStage>
__global__ void __launch_bounds__(kThreads) verify_kernel(bool pdl, Params p) {
  __shared__ Staged staged[kStage ? kWarps : 1];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t b = static_cast<int64_t>(blockIdx.x) * kWarps + warp;
  if (pdl) kernels::pdl_wait();
  if (b < p.batch) {
    if constexpr (kStage) {
      Staged& s = staged[warp];
      for (int64_t i = lane; i < p.nodes; i += 32) {
        const int64_t f = p.index.at(b, i);
        const int64_t c = p.child.at(b, i), n = p.sibling.at(b, i);
        s.cand[i] = p.cand.at(b, i);
        s.index[i] = f >= 0 && f < p.flat ? f : -1;
        s.child[i] = c >= 0 && c < p.nodes ? static_cast<int32_t>(c) : -1;
        s.sibling[i] = n >= 0 && n < p.nodes ? static_cast<int32_t>(n) : -1;
        s.target[i] = f >= 0 && f < p.flat ? p.target[f] : 0;
      }
      __syncwarp();
      if (lane == 0) walk(p, b, Shared{&s});
    } else {
      if (lane == 0) walk(p, b, Global{&p, b});
    }
  }
  if (pdl) kernels::pdl_launch_dependents();
}

}  // namespace verify_tree_greedy_detail

// predicts [B*N] int32 (contiguous), accept_index [B, S] int32, accept_token_num [B] int32,
// candidates / retrive_index / retrive_next_token / retrive_next_sibling [B, N] int32 or int64,
// target_predict [B*N] int32 or int64 (any strides).
inline void verify_tree_greedy(tvm::ffi::TensorView predicts, tvm::ffi::TensorView accept_index,
                               tvm::ffi::TensorView accept_token_num,
                               tvm::ffi::TensorView candidates, tvm::ffi::TensorView retrive_index,
                               tvm::ffi::TensorView retrive_next_token,
                               tvm::ffi::TensorView retrive_next_sibling,
                               tvm::ffi::TensorView target_predict) {
  namespace detail = verify_tree_greedy_detail;
  constexpr const char* kOp = "speculative.verify_tree_greedy";
  // 1. Validate.
  detail::Params p{};
  p.cand = speculative_host::index_tensor(kOp, "candidates", candidates, candidates, 2);
  p.index = speculative_host::index_tensor(kOp, "retrive_index", retrive_index, candidates, 2);
  p.child =
      speculative_host::index_tensor(kOp, "retrive_next_token", retrive_next_token, candidates, 2);
  p.sibling = speculative_host::index_tensor(kOp, "retrive_next_sibling", retrive_next_sibling,
                                             candidates, 2);
  p.target = speculative_host::index_tensor(kOp, "target_predict", target_predict, candidates, 1);
  kernels::check_same_shape(kOp, "retrive_index", retrive_index, "candidates", candidates);
  kernels::check_same_shape(kOp, "retrive_next_token", retrive_next_token, "candidates",
                            candidates);
  kernels::check_same_shape(kOp, "retrive_next_sibling", retrive_next_sibling, "candidates",
                            candidates);
  p.batch = candidates.size(0);
  p.nodes = candidates.size(1);
  p.flat = p.batch * p.nodes;
  for (const auto& [name, t, ndim] :
       {std::tuple<const char*, const tvm::ffi::TensorView*, int>{"predicts", &predicts, 1},
        {"accept_index", &accept_index, 2},
        {"accept_token_num", &accept_token_num, 1}}) {
    kernels::check_ndim(kOp, name, *t, ndim);
    kernels::check_same_device(kOp, name, *t, "candidates", candidates);
    TVM_FFI_CHECK(kernels::is_dtype(t->dtype(), kDLInt, 32), TypeError)
        << kOp << ": " << name << " must be int32";
  }
  kernels::check_contiguous(kOp, "predicts", predicts);
  TVM_FFI_CHECK(predicts.size(0) == p.flat && target_predict.size(0) == p.flat, ValueError)
      << kOp << ": predicts and target_predict must have B*N = " << p.flat << " entries";
  TVM_FFI_CHECK(accept_index.size(0) == p.batch && accept_token_num.size(0) == p.batch,
                ValueError)
      << kOp << ": accept_index [B, S] and accept_token_num [B] need B = " << p.batch;
  p.steps = accept_index.size(1);
  if (p.batch == 0) return;
  TVM_FFI_CHECK(p.steps >= 1 && p.steps <= p.nodes, ValueError)
      << kOp << ": accept_index must have 1 <= S <= N = " << p.nodes << " columns, got "
      << p.steps;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(candidates);
  const kernels::Launch ctx(kOp, candidates);
  // 4. Launch.
  p.predicts = kernels::data<int32_t>(predicts);
  p.accept_index = kernels::data<int32_t>(accept_index);
  p.ai_s0 = accept_index.stride(0);
  p.ai_s1 = accept_index.stride(1);
  p.accept_token_num = kernels::data<int32_t>(accept_token_num);
  p.atn_s = accept_token_num.stride(0);
  const unsigned grid = kernels::ceil_div(p.batch, detail::kWarps);
  if (p.nodes <= detail::kStagedNodes)
    kernels::launch(ctx, detail::verify_kernel<true>, grid, detail::kThreads, p);
  else
    kernels::launch(ctx, detail::verify_kernel<false>, grid, detail::kThreads, p);
}
