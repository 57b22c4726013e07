// moe.moe_align_block_size, CUDA: the n = T*k slots grouped by bucket (bucket 0 = id -1, bucket
// e + 1 = expert e), each bucket padded with n to a multiple of block_size; expert_ids per block
// (-1 past the used blocks) and the padded total. Ids outside [-1, E) are skipped. The order of
// the slots inside a bucket is unspecified (shared-memory atomics).
//
// Small n (no workspace), P = sorted_token_ids' length <= kOneBlockMaxEntries: one block of 1024
// threads does it all: fill sorted_token_ids with n, count the buckets with shared-memory
// atomics, scan the padded sizes (a block scan), write expert_ids (a binary search over the
// bucket starts per block) and scatter each slot at its bucket's cursor (shared atomics).
// Small n, larger P: one launch of G = ceil(P / 1024) (9..32, <= E + 1) blocks of 1024 threads,
// each counting every slot and scanning, then writing only the buckets b = block (mod G): their
// padding, their expert_ids and their slots (shared cursors), and its share of the entries and
// blocks past the total. Large n (workspace [E+1, G] int32, G blocks of slots):
//   1. count: G blocks fill their share of sorted_token_ids with n and count their slots into a
//      shared histogram, written to workspace[b, g] (every entry written: nothing to zero);
//   2. scan: one block sums each bucket over the G blocks (a warp per bucket), scans the padded
//      sizes, writes the total and expert_ids, and turns workspace[b, g] into the position of
//      block g's first slot of bucket b;
//   3. scatter: G blocks rank their slots with shared atomics from those positions.
// Launches are PDL-chained on the caller's stream; no host synchronisation.
//
// Why two small paths (H200, E 256, k 8, bs 64, CUDA graphs, 2026-12-04): the one block's time
// grows with P, the entries one SM stores (2.79 / 3.30 / 4.40 / 4.87 us at T = 1 / 16 / 64 / 128,
// P = 512 / 8192 / 16703 / 17215); the G blocks measured 3.40 / 3.16 / 3.28 us at T = 16 / 64 /
// 128 (G = 8 / 17 / 17), about flat, but 5.33 at T = 1 (G = 1). The crossover lies near P = 8K
// entries (one block 3.30 against 3.40 at T = 16), hence kOneBlockMaxEntries: T <= 16 stays one
// block, T >= 17 takes G >= 9 blocks (each warp then owns at most one of 257 buckets). Measured
// with both paths (A/B against the one block alone, 2026-12-04): T = 1 / 16 / 64 / 128 2.78 /
// 3.29 / 3.16 / 3.28 us (was 2.79 / 3.29 / 4.40 / 4.87), T = 8192 18.17 (unchanged).
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/checks.h>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>
#include <kernels/tensor.h>

#include <algorithm>
#include <cstdint>
#include <utility>

namespace moe_align_block_size_detail {

constexpr int kMaxBuckets = 1025;  // E <= 1024
constexpr int kSmallThreads = 1024;
// Small n: one block up to this many entries of sorted_token_ids (P), else about
// kEntriesPerSmallCta entries per block, at most kMaxSmallCtas blocks.
constexpr int64_t kOneBlockMaxEntries = 8192;
constexpr int64_t kEntriesPerSmallCta = 1024;
constexpr int64_t kMaxSmallCtas = 32;
constexpr int kCountThreads = 256;
constexpr int kScanThreads = 1024;

struct Params {
  const void* ids;
  int32_t* sorted;
  int32_t* expert_ids;
  int32_t* post;
  int32_t* work;  // [buckets, ctas] or null
  int64_t n, padded_len, blocks, chunk;
  int buckets, block_size, ctas;
};

template <typename ID>
__device__ __forceinline__ int bucket_of(const ID* ids, int64_t i, int buckets) {
  const long long b = static_cast<long long>(ids[i]) + 1;
  return (b >= 0 && b < buckets) ? static_cast<int>(b) : -1;
}

__device__ __forceinline__ int padded(int count, int bs) { return (count + bs - 1) / bs * bs; }

// Exclusive scan of padded(count[b]) over b < buckets into start[b] (start[buckets] = total).
// Every thread of the block calls it; `warp_totals` holds 33 ints. Ends with a barrier.
__device__ void scan_starts(const int* count, int* start, int buckets, int bs, int* warp_totals) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int per = (buckets + blockDim.x - 1) / blockDim.x;
  const int b0 = min(tid * per, buckets), b1 = min(b0 + per, buckets);
  int local = 0;
  for (int b = b0; b < b1; ++b) local += padded(count[b], bs);
  int inclusive = local;
#pragma unroll
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int v = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += v;
  }
  if (lane == 31) warp_totals[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const int warps = blockDim.x >> 5;
    int t = lane < warps ? warp_totals[lane] : 0;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1) {
      const int v = __shfl_up_sync(0xffffffffu, t, offset);
      if (lane >= offset) t += v;
    }
    if (lane < warps) warp_totals[lane] = t;  // inclusive prefix of the warp totals
  }
  __syncthreads();
  int running = (warp ? warp_totals[warp - 1] : 0) + inclusive - local;
  for (int b = b0; b < b1; ++b) {
    start[b] = running;
    running += padded(count[b], bs);
  }
  if (tid == blockDim.x - 1) start[buckets] = running;
  __syncthreads();
}

// expert_ids[blk] = the bucket holding entry blk * bs, minus 1 (-1 past the total).
__device__ void write_expert_ids(const Params& p, const int* start) {
  const int total = start[p.buckets];
  for (int64_t blk = threadIdx.x; blk < p.blocks; blk += blockDim.x) {
    const int64_t pos = blk * p.block_size;
    int value = -1;
    if (pos < total) {
      int lo = 0, hi = p.buckets - 1;  // the last bucket starting at or before pos
      while (lo < hi) {
        const int mid = (lo + hi + 1) >> 1;
        if (start[mid] <= pos)
          lo = mid;
        else
          hi = mid - 1;
      }
      value = lo - 1;
    }
    p.expert_ids[blk] = value;
  }
}

template <typename ID>
__global__ void __launch_bounds__(kSmallThreads) align_small_kernel(bool pdl, Params p) {
  __shared__ int cursor[kMaxBuckets];
  __shared__ int start[kMaxBuckets + 1];
  __shared__ int warp_totals[33];
  const ID* ids = static_cast<const ID*>(p.ids);
  const int tid = threadIdx.x;
  if (pdl) kernels::pdl_wait();
  for (int b = tid; b < p.buckets; b += blockDim.x) cursor[b] = 0;
  const int32_t fill = static_cast<int32_t>(p.n);
  for (int64_t i = tid; i < p.padded_len; i += blockDim.x) p.sorted[i] = fill;
  __syncthreads();
  for (int64_t i = tid; i < p.n; i += blockDim.x) {
    const int b = bucket_of(ids, i, p.buckets);
    if (b >= 0) atomicAdd(&cursor[b], 1);
  }
  __syncthreads();
  scan_starts(cursor, start, p.buckets, p.block_size, warp_totals);
  if (tid == 0) *p.post = start[p.buckets];
  for (int b = tid; b < p.buckets; b += blockDim.x) cursor[b] = start[b];
  write_expert_ids(p, start);
  __syncthreads();
  if (pdl) kernels::pdl_launch_dependents();
  for (int64_t i = tid; i < p.n; i += blockDim.x) {
    const int b = bucket_of(ids, i, p.buckets);
    if (b >= 0) p.sorted[atomicAdd(&cursor[b], 1)] = static_cast<int32_t>(i);
  }
}

// Each of the grid's blocks counts every slot and scans the buckets (n is small: the same few
// KB of ids from L2), then writes only the buckets b = block (mod grid): their slots (shared
// cursors), their padding and their expert_ids, plus its share of the entries and blocks past
// the total. Different blocks write disjoint entries, so nothing orders them: no second launch
// and no grid barrier, and the P entries spread over the blocks' SMs instead of one SM's stores.
template <typename ID>
__global__ void __launch_bounds__(kSmallThreads) align_small_spread_kernel(bool pdl, Params p) {
  __shared__ int count[kMaxBuckets];
  __shared__ int start[kMaxBuckets + 1];
  __shared__ int cursor[kMaxBuckets];
  __shared__ int warp_totals[33];
  const ID* ids = static_cast<const ID*>(p.ids);
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
  const int cta = blockIdx.x, ctas = gridDim.x;
  if (pdl) kernels::pdl_wait();
  for (int b = tid; b < p.buckets; b += blockDim.x) count[b] = 0;
  __syncthreads();
  for (int64_t i = tid; i < p.n; i += blockDim.x) {
    const int b = bucket_of(ids, i, p.buckets);
    if (b >= 0) atomicAdd(&count[b], 1);
  }
  __syncthreads();
  scan_starts(count, start, p.buckets, p.block_size, warp_totals);
  const int total = start[p.buckets];
  if (cta == 0 && tid == 0) *p.post = total;
  for (int b = cta + ctas * tid; b < p.buckets; b += ctas * blockDim.x) cursor[b] = start[b];
  // A warp per owned bucket: padding after its slots, then its blocks' expert id.
  const int32_t fill = static_cast<int32_t>(p.n);
  for (int b = cta + ctas * warp; b < p.buckets; b += ctas * warps) {
    const int first = start[b], end = start[b + 1];
    for (int pos = first + count[b] + lane; pos < end; pos += 32) p.sorted[pos] = fill;
    for (int blk = first / p.block_size + lane; blk < end / p.block_size; blk += 32)
      p.expert_ids[blk] = b - 1;
  }
  const int64_t stride = static_cast<int64_t>(ctas) * blockDim.x;
  const int64_t offset = static_cast<int64_t>(cta) * blockDim.x + tid;
  for (int64_t i = total + offset; i < p.padded_len; i += stride) p.sorted[i] = fill;
  for (int64_t blk = total / p.block_size + offset; blk < p.blocks; blk += stride)
    p.expert_ids[blk] = -1;
  __syncthreads();
  if (pdl) kernels::pdl_launch_dependents();
  for (int64_t i = tid; i < p.n; i += blockDim.x) {
    const int b = bucket_of(ids, i, p.buckets);
    if (b >= 0 && b % ctas == cta) p.sorted[atomicAdd(&cursor[b], 1)] = static_cast<int32_t>(i);
  }
}

template <typename ID>
__global__ void __launch_bounds__(kCountThreads) align_count_kernel(bool pdl, Params p) {
  __shared__ int hist[kMaxBuckets];
  const ID* ids = static_cast<const ID*>(p.ids);
  const int tid = threadIdx.x, cta = blockIdx.x;
  if (pdl) kernels::pdl_wait();
  for (int b = tid; b < p.buckets; b += blockDim.x) hist[b] = 0;
  const int32_t fill = static_cast<int32_t>(p.n);
  for (int64_t i = static_cast<int64_t>(cta) * blockDim.x + tid; i < p.padded_len;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    p.sorted[i] = fill;
  __syncthreads();
  const int64_t first = cta * p.chunk, last = min(first + p.chunk, p.n);
  for (int64_t i = first + tid; i < last; i += blockDim.x) {
    const int b = bucket_of(ids, i, p.buckets);
    if (b >= 0) atomicAdd(&hist[b], 1);
  }
  __syncthreads();
  if (pdl) kernels::pdl_launch_dependents();
  for (int b = tid; b < p.buckets; b += blockDim.x) p.work[b * p.ctas + cta] = hist[b];
}

__global__ void __launch_bounds__(kScanThreads) align_scan_kernel(bool pdl, Params p) {
  __shared__ int count[kMaxBuckets];
  __shared__ int start[kMaxBuckets + 1];
  __shared__ int warp_totals[33];
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, warps = blockDim.x >> 5;
  if (pdl) kernels::pdl_wait();
  for (int b = warp; b < p.buckets; b += warps) {
    int sum = 0;
    for (int c = lane; c < p.ctas; c += 32) sum += p.work[b * p.ctas + c];
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
      sum += __shfl_xor_sync(0xffffffffu, sum, offset);
    if (lane == 0) count[b] = sum;
  }
  __syncthreads();
  scan_starts(count, start, p.buckets, p.block_size, warp_totals);
  if (tid == 0) *p.post = start[p.buckets];
  write_expert_ids(p, start);
  for (int b = warp; b < p.buckets; b += warps) {
    int running = start[b];
    for (int c0 = 0; c0 < p.ctas; c0 += 32) {
      const int c = c0 + lane;
      const int v = c < p.ctas ? p.work[b * p.ctas + c] : 0;
      int inclusive = v;
#pragma unroll
      for (int offset = 1; offset < 32; offset <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, inclusive, offset);
        if (lane >= offset) inclusive += u;
      }
      if (c < p.ctas) p.work[b * p.ctas + c] = running + inclusive - v;
      running += __shfl_sync(0xffffffffu, inclusive, 31);
    }
  }
  if (pdl) kernels::pdl_launch_dependents();
}

template <typename ID>
__global__ void __launch_bounds__(kCountThreads) align_scatter_kernel(bool pdl, Params p) {
  __shared__ int cursor[kMaxBuckets];
  const ID* ids = static_cast<const ID*>(p.ids);
  const int tid = threadIdx.x, cta = blockIdx.x;
  if (pdl) kernels::pdl_wait();
  for (int b = tid; b < p.buckets; b += blockDim.x) cursor[b] = p.work[b * p.ctas + cta];
  __syncthreads();
  const int64_t first = cta * p.chunk, last = min(first + p.chunk, p.n);
  for (int64_t i = first + tid; i < last; i += blockDim.x) {
    const int b = bucket_of(ids, i, p.buckets);
    if (b >= 0) p.sorted[atomicAdd(&cursor[b], 1)] = static_cast<int32_t>(i);
  }
}

template <typename ID>
void launch(const kernels::Launch& ctx, const Params& p) {
  if (p.ctas == 0) {
    if (p.padded_len <= kOneBlockMaxEntries) {
      kernels::launch(ctx, align_small_kernel<ID>, 1, kSmallThreads, p);
    } else {  // >= 9 blocks (P > 8192)
      const int64_t wanted = (p.padded_len + kEntriesPerSmallCta - 1) / kEntriesPerSmallCta;
      const int64_t ctas =
          std::clamp<int64_t>(wanted, 1, std::min<int64_t>(kMaxSmallCtas, p.buckets));
      kernels::launch(ctx, align_small_spread_kernel<ID>, static_cast<unsigned>(ctas),
                      kSmallThreads, p);
    }
    return;
  }
  kernels::launch(ctx, align_count_kernel<ID>, p.ctas, kCountThreads, p);
  kernels::launch(ctx, align_scan_kernel, 1, kScanThreads, p);
  kernels::launch(ctx, align_scatter_kernel<ID>, p.ctas, kCountThreads, p);
}

}  // namespace moe_align_block_size_detail

// sorted_token_ids int32 [P], expert_ids int32 [ceil(P / bs)], num_tokens_post_padded int32
// [1], topk_ids [T, k] int32 or int64 (contiguous), E <= 1024; workspace int32: empty (one
// block) or [(E + 1) * G] for G >= 1 blocks of slots.
inline void moe_align_block_size(tvm::ffi::TensorView sorted_token_ids,
                                 tvm::ffi::TensorView expert_ids,
                                 tvm::ffi::TensorView num_tokens_post_padded,
                                 tvm::ffi::TensorView topk_ids, int64_t num_experts,
                                 int64_t block_size, bool pad_sorted_token_ids,
                                 tvm::ffi::TensorView workspace) {
  namespace detail = moe_align_block_size_detail;
  constexpr const char* kOp = "moe.moe_align_block_size";
  // 1. Validate.
  kernels::check_ndim(kOp, "topk_ids", topk_ids, 2);
  kernels::check_contiguous(kOp, "topk_ids", topk_ids);
  TVM_FFI_CHECK(kernels::is_dtype(topk_ids.dtype(), kDLInt, 32) ||
                    kernels::is_dtype(topk_ids.dtype(), kDLInt, 64),
                TypeError)
      << kOp << ": topk_ids must be int32 or int64";
  TVM_FFI_CHECK(num_experts >= 1 && num_experts < detail::kMaxBuckets, ValueError)
      << kOp << ": the CUDA kernel takes 1 <= num_experts <= " << detail::kMaxBuckets - 1
      << ", got " << num_experts;
  TVM_FFI_CHECK(block_size >= 1 && block_size < (int64_t{1} << 30), ValueError)
      << kOp << ": block_size must be >= 1, got " << block_size;
  const int64_t n = topk_ids.numel();
  TVM_FFI_CHECK(n < (int64_t{1} << 31), ValueError) << kOp << ": more than 2^31 - 1 slots";
  const int64_t padded_len =
      std::min(n + (num_experts + 1) * (block_size - 1), n * block_size);
  const int64_t blocks = (padded_len + block_size - 1) / block_size;
  const std::pair<const char*, const tvm::ffi::TensorView*> outputs[] = {
      {"sorted_token_ids", &sorted_token_ids},
      {"expert_ids", &expert_ids},
      {"num_tokens_post_padded", &num_tokens_post_padded},
      {"workspace", &workspace}};
  for (const auto& [name, t] : outputs) {
    kernels::check_ndim(kOp, name, *t, 1);
    kernels::check_contiguous(kOp, name, *t);
    TVM_FFI_CHECK(kernels::is_dtype(t->dtype(), kDLInt, 32), TypeError)
        << kOp << ": " << name << " must be int32";
  }
  TVM_FFI_CHECK(sorted_token_ids.size(0) == padded_len && expert_ids.size(0) == blocks &&
                    num_tokens_post_padded.size(0) == 1,
                ValueError)
      << kOp << ": sorted_token_ids, expert_ids and num_tokens_post_padded must have shapes ["
      << padded_len << "], [" << blocks << "] and [1], got "
      << kernels::shape_string(sorted_token_ids) << ", " << kernels::shape_string(expert_ids)
      << " and " << kernels::shape_string(num_tokens_post_padded);
  const int64_t buckets = num_experts + 1;
  TVM_FFI_CHECK(workspace.size(0) % buckets == 0, ValueError)
      << kOp << ": workspace must hold (E + 1) * G int32, got " << workspace.size(0);
  kernels::check_device(kOp, "topk_ids", topk_ids, kDLCUDA);
  for (const auto& [name, t] : outputs)
    if (t->numel()) kernels::check_same_device(kOp, name, *t, "topk_ids", topk_ids);
  (void)pad_sorted_token_ids;  // the padding is always written (it also fills the buckets)
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(topk_ids);
  const kernels::Launch ctx(kOp, topk_ids);
  // 4. Dispatch on the id dtype and launch.
  detail::Params p{};
  p.ids = kernels::data<const void>(topk_ids);
  p.sorted = kernels::data<int32_t>(sorted_token_ids);
  p.expert_ids = kernels::data<int32_t>(expert_ids);
  p.post = kernels::data<int32_t>(num_tokens_post_padded);
  p.n = n;
  p.padded_len = padded_len;
  p.blocks = blocks;
  p.buckets = static_cast<int>(buckets);
  p.block_size = static_cast<int>(block_size);
  p.ctas = static_cast<int>(
      std::min<int64_t>(workspace.size(0) / buckets, std::max<int64_t>(n, 1)));
  p.work = p.ctas ? kernels::data<int32_t>(workspace) : nullptr;
  p.chunk = p.ctas ? (n + p.ctas - 1) / p.ctas : n;
  if (kernels::is_dtype(topk_ids.dtype(), kDLInt, 32))
    detail::launch<int32_t>(ctx, p);
  else
    detail::launch<int64_t>(ctx, p);
}
