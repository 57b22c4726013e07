// kv_canary.kv_canary_write, CUDA (OPS.md section 15), bit for bit with the torch reference:
// per request r, run = slot_hash(seed_slots[r]); for its entries in order with slot >= 0,
// canary[slot] = (token, position, run, kv_hash(slot)), then run = mix3(run, token, position).
// Every seed is read before any canary row is written:
//  - N <= 128 entries: one CTA of 256 threads, one launch: a thread per request walks its chain
//    into shared memory, a barrier, then 1, 2 or 4 threads per entry (one per source) hash its KV
//    bytes and the group's first thread writes the row.
//  - larger N: two launches: the chains (a thread per request) into a caller-provided int64
//    workspace [N], then the hashes and writes across the grid (PDL keeps them back to back).
// Entries are hashed in parallel; only the cheap chain (3 fmix per entry) is sequential. The KV
// bytes arrive staged (kv_canary_common.cuh: cooperative cp.async of whole lines into a per-warp
// shared-memory ring; the hash launch in CTAs of 128) when every source is 16-byte aligned, else by
// direct loads. Index values are preconditions: a slot outside the canary or a source's rows is not
// written, a seed outside the canary hashes as ANCHOR, a request whose pointers fall outside [0, N]
// or decrease is skipped; the kernel never reads or writes out of bounds (the torch reference
// raises).
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(4);

#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>

#include "kv_canary_common.cuh"

namespace kv_canary_write_detail {

constexpr int kThreads = 256, kStagedThreads = 128;
constexpr int kSmallEntries = 128;

struct Params {
  int64_t* canary;  // [S, 4] contiguous
  int64_t canary_rows;
  kv_canary_detail::Sources src;
  kv_canary_detail::IndexRef slots, tokens, positions, indptr, seeds;
  int64_t entries, requests;
  int64_t* prev;  // workspace [N] (the two-launch path)
  int group_log2;
};

// Request r's chain: prev[e] for each of its entries with slot >= 0.
__device__ __forceinline__ void walk_chain(const Params& p, int64_t r, int64_t* prev) {
  const int64_t lo = p.indptr[r], hi = p.indptr[r + 1];
  if (lo < 0 || hi < lo || hi > p.entries) return;
  uint64_t run = kv_canary_detail::slot_hash(p.canary, p.canary_rows, p.seeds[r]);
  for (int64_t e = lo; e < hi; ++e) {
    if (p.slots[e] < 0) continue;
    prev[e] = static_cast<int64_t>(run);
    run = kv_canary_detail::mix3(run, static_cast<uint64_t>(p.tokens[e]),
                                 static_cast<uint64_t>(p.positions[e]));
  }
}

// Thread t of the hash phase: entry t >> group_log2; hashes, then the group's first lane writes.
template <bool kStaged>
__device__ __forceinline__ void hash_and_write(const Params& p, int64_t t, const int64_t* prev,
                                               int64_t first, int64_t last,
                                               kv_canary_detail::staged::Ring* ring) {
  const int64_t e = t >> p.group_log2;
  int64_t slot = -1;
  if (e >= first && e < last) slot = p.slots[e];
  const bool valid =
      slot >= 0 && slot < p.canary_rows && kv_canary_detail::slot_in_sources(p.src, slot);
  const uint64_t acc =
      kv_canary_detail::group_kv_hash<kStaged>(p.src, slot, valid, p.group_log2, ring);
  if (valid && (t & ((1 << p.group_log2) - 1)) == 0) {
    int64_t* row = p.canary + slot * 4;
    row[0] = p.tokens[e];
    row[1] = p.positions[e];
    row[2] = prev[e];
    row[3] = static_cast<int64_t>(acc);
  }
}

// The entries every request covers: [indptr[0], indptr[R]) within [0, N].
__device__ __forceinline__ void covered(const Params& p, int64_t& first, int64_t& last) {
  first = p.indptr[0];
  last = p.indptr[p.requests];
  first = first < 0 ? 0 : first;
  last = last > p.entries ? p.entries : last;
}

template <bool kStaged>
__global__ void __launch_bounds__(kThreads) small_kernel(bool pdl, Params p) {
  __shared__ int64_t prev[kSmallEntries];
  extern __shared__ __align__(128) unsigned char smem[];
  kv_canary_detail::staged::Ring ring;
  if constexpr (kStaged) ring.init(smem);
  if (pdl) kernels::pdl_wait();
  for (int64_t r = threadIdx.x; r < p.requests; r += kThreads) walk_chain(p, r, prev);
  __syncthreads();  // every seed is read before any row is written
  int64_t first, last;
  covered(p, first, last);
  const int64_t total = p.entries << p.group_log2;
  for (int64_t base = 0; base < total; base += kThreads)
    hash_and_write<kStaged>(p, base + threadIdx.x, prev, first, last, &ring);
  if (pdl) kernels::pdl_launch_dependents();
}

__global__ void __launch_bounds__(kThreads) chain_kernel(bool pdl, Params p) {
  const int64_t r = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (pdl) kernels::pdl_wait();
  if (r < p.requests) walk_chain(p, r, p.prev);
  if (pdl) kernels::pdl_launch_dependents();
}

template <bool kStaged>
__global__ void __launch_bounds__(kThreads) hash_kernel(bool pdl, Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  kv_canary_detail::staged::Ring ring;
  if constexpr (kStaged) ring.init(smem);
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (pdl) kernels::pdl_wait();
  int64_t first, last;
  covered(p, first, last);
  hash_and_write<kStaged>(p, t, p.prev, first, last, &ring);
  if (pdl) kernels::pdl_launch_dependents();
}

}  // namespace kv_canary_write_detail

// canary [S, 4] int64 (contiguous, in place), workspace int64 [>= N] (used when N > 128; may be
// empty otherwise), slots / token_ids / positions [N] int32 or int64, req_indptr [R+1],
// seed_slots [R], then up to 4 sources, each an optional contiguous cache and its page_size,
// bytes_per_token, read_bytes.
inline void kv_canary_write(
    tvm::ffi::TensorView canary, tvm::ffi::TensorView workspace, tvm::ffi::TensorView slots,
    tvm::ffi::TensorView token_ids, tvm::ffi::TensorView positions,
    tvm::ffi::TensorView req_indptr, tvm::ffi::TensorView seed_slots,
    tvm::ffi::Optional<tvm::ffi::TensorView> cache0, int64_t page0, int64_t bpt0, int64_t read0,
    tvm::ffi::Optional<tvm::ffi::TensorView> cache1, int64_t page1, int64_t bpt1, int64_t read1,
    tvm::ffi::Optional<tvm::ffi::TensorView> cache2, int64_t page2, int64_t bpt2, int64_t read2,
    tvm::ffi::Optional<tvm::ffi::TensorView> cache3, int64_t page3, int64_t bpt3, int64_t read3) {
  namespace detail = kv_canary_write_detail;
  constexpr const char* kOp = "kv_canary.kv_canary_write";
  // 1. Validate.
  kernels::check_ndim(kOp, "canary", canary, 2);
  kernels::check_device(kOp, "canary", canary, kDLCUDA);
  kernels::check_contiguous(kOp, "canary", canary);
  TVM_FFI_CHECK(kernels::is_dtype(canary.dtype(), kDLInt, 64) && canary.size(1) == 4, ValueError)
      << kOp << ": canary must be [S, 4] int64";
  detail::Params p{};
  p.entries = slots.ndim() == 1 ? slots.size(0) : -1;
  p.slots = kv_canary_host::index_vector(kOp, "slots", slots, canary, -1);
  p.tokens = kv_canary_host::index_vector(kOp, "token_ids", token_ids, canary, p.entries);
  p.positions = kv_canary_host::index_vector(kOp, "positions", positions, canary, p.entries);
  p.indptr = kv_canary_host::index_vector(kOp, "req_indptr", req_indptr, canary, -1);
  TVM_FFI_CHECK(req_indptr.size(0) >= 1, ValueError)
      << kOp << ": req_indptr must have R+1 >= 1 entries";
  p.requests = req_indptr.size(0) - 1;
  p.seeds = kv_canary_host::index_vector(kOp, "seed_slots", seed_slots, canary, p.requests);
  kv_canary_host::add_source(kOp, p.src, cache0, page0, bpt0, read0, canary);
  kv_canary_host::add_source(kOp, p.src, cache1, page1, bpt1, read1, canary);
  kv_canary_host::add_source(kOp, p.src, cache2, page2, bpt2, read2, canary);
  kv_canary_host::add_source(kOp, p.src, cache3, page3, bpt3, read3, canary);
  const bool small = p.entries <= detail::kSmallEntries;
  if (!small) {
    kernels::check_ndim(kOp, "workspace", workspace, 1);
    kernels::check_contiguous(kOp, "workspace", workspace);
    kernels::check_same_device(kOp, "workspace", workspace, "canary", canary);
    TVM_FFI_CHECK(kernels::is_dtype(workspace.dtype(), kDLInt, 64) &&
                      workspace.size(0) >= p.entries,
                  ValueError)
        << kOp << ": workspace must be int64 with >= N = " << p.entries << " entries";
  }
  if (p.entries == 0 || p.requests == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(canary);
  const kernels::Launch ctx(kOp, canary);
  // 4. Launch.
  p.canary = kernels::data<int64_t>(canary);
  p.canary_rows = canary.size(0);
  p.group_log2 = p.src.count > 2 ? 2 : (p.src.count > 1 ? 1 : 0);
  namespace staged = kv_canary_detail::staged;
  const bool staged_reads = staged::eligible(p.src);
  if (small) {
    if (staged_reads)
      kernels::launch_with_smem<detail::small_kernel<true>>(
          ctx, 1, detail::kThreads, staged::block_bytes(detail::kThreads), p);
    else
      kernels::launch(ctx, detail::small_kernel<false>, 1, detail::kThreads, p);
    return;
  }
  p.prev = kernels::data<int64_t>(workspace);
  kernels::launch(ctx, detail::chain_kernel, kernels::ceil_div(p.requests, detail::kThreads),
                  detail::kThreads, p);
  const int64_t threads = p.entries << p.group_log2;
  if (staged_reads) {
    constexpr int kBlock = detail::kStagedThreads;
    kernels::launch_with_smem<detail::hash_kernel<true>>(
        ctx, kernels::ceil_div(threads, kBlock), kBlock, staged::block_bytes(kBlock), p);
  } else {
    kernels::launch(ctx, detail::hash_kernel<false>,
                    kernels::ceil_div(threads, detail::kThreads), detail::kThreads, p);
  }
}
