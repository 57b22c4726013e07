// sampling.sampling_from_probs, CUDA: one seeded inverse-CDF draw per output row.
//
// One CTA of 1024 threads per output row (the source row indices[i] or i), or for small batches a
// thread-block cluster of 1-16 CTAs per row, each over a slice cached in shared memory (the
// launch shape of filters.cuh's choose_shape; top_k_top_p_sampling_from_probs runs the filters'
// radix search first). Pass 1 reads the slice (16 elements per thread in flight) for its fp32
// total, the bad-row flag (NaN/inf/negative entry) and the last index with a positive weight;
// a cluster combines the slice totals in rank order into the row total and each slice's prefix.
// Pass 2 walks only the slice where u * total is crossed, in tiles of 16 consecutive elements
// per thread in vocabulary order: a block exclusive scan of the tile sums gives each thread its
// running prefix, the thread whose running sum first exceeds u * total (on a positive weight)
// names the sample, and the walk stops there.
// top_k_top_p on the cached shape with k <= kSurvivors draws over the top-k survivors alone after
// the top-k search (survivors_draw: one cluster barrier instead of the top-p search's 3 and the
// draw's 2; the full path when ties keep more than kSurvivors).
// u = U(seed, offset, i, 0) is the project RNG (kernels_jit.rng.uniform) bit for bit. The prefix
// sums are taken in a different order than torch.cumsum, so a sample may differ from the
// reference's only where u * total lies within rounding of a CDF boundary.
// Invalid rows (bad entry, total not in (0, inf), out-of-range index) give sample 0, valid false.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(7);

#include "filters.cuh"

#include <kernels/cluster.cuh>
#include <kernels/rng.cuh>

#include <climits>
#include <string>

namespace sampling_draw_detail {

namespace f = sampling_filters_detail;
constexpr int kThreads = 1024;
constexpr int kTile = 16;  // consecutive elements per thread in one pass-2 step

// The project RNG (kernels/rng.cuh).
using kernels::rng::uniform;

struct Params {
  const void* x;
  int64_t x_stride, rows, cols;
  const void* indices;  // int32/int64 [out_rows] or null
  bool indices64;
  void* samples;  // int32 or int64 [out_rows]
  bool samples64;
  bool* valid;
  const int64_t* seed;
  const int64_t* offset;
  bool seed_per_row, offset_per_row;
  int cluster;    // CTAs per output row (a thread-block cluster when > 1), each over one slice
  int64_t slice;  // elements per CTA slice (a multiple of the pack width)
};

// E consecutive elements starting at `start` (zeros past cols) as fp32.
template <typename T, bool kVec, int E>
__device__ __forceinline__ void load_tile(const T* row, int64_t start, int64_t cols, float* w) {
  if constexpr (kVec) {
    constexpr int N = kernels::pack_width<T, true>;
    static_assert(E % N == 0, "tile must hold whole packs");
    using P = kernels::Pack<T, N>;
    P p[E / N];
#pragma unroll
    for (int q = 0; q < E / N; ++q)
      if (start + q * N < cols) p[q].load_cached(row + start + q * N);
#pragma unroll
    for (int q = 0; q < E / N; ++q) {
      float v[N];
      if (start + q * N < cols) {
        p[q].unpack(v);
      } else {
#pragma unroll
        for (int j = 0; j < N; ++j) v[j] = 0.0f;
      }
#pragma unroll
      for (int j = 0; j < N; ++j) w[q * N + j] = v[j];
    }
  } else {
#pragma unroll
    for (int j = 0; j < E; ++j)
      w[j] = start + j < cols ? kernels::to_float(row[start + j]) : 0.0f;
  }
}

struct Shared {
  float red[32];
  float scan[32];
  int last_pos;
  int found;
  float step_total;
  // cluster > 1: rank r's slice sum, bad flag, last kept index and sample, pushed by rank r.
  float in_sum[f::kMaxCluster];
  int in_bad[f::kMaxCluster];
  int in_last[f::kMaxCluster];
  int in_found[f::kMaxCluster];
  // survivors_draw: this CTA's survivor count and bad-row flag (read by every rank), and the
  // row's offsets per rank, total and flag.
  int surv_n;
  int surv_bad;
  int surv_off[f::kMaxCluster];
  int surv_total;
  int surv_any_bad;
};

// Output row i: the source row, or -1 when indices[i] is out of range.
__device__ __forceinline__ int64_t source_row(const Params& p, int64_t i) {
  int64_t src = i;
  if (p.indices != nullptr)
    src = p.indices64 ? static_cast<const int64_t*>(p.indices)[i]
                      : static_cast<int64_t>(static_cast<const int32_t*>(p.indices)[i]);
  return (src < 0 || src >= p.rows) ? -1 : src;
}

// Thread 0 of rank 0 of the row's cluster writes the result.
__device__ __forceinline__ void write_result(const Params& p, int64_t i, int64_t index, bool ok) {
  if (threadIdx.x != 0 || blockIdx.x % p.cluster != 0) return;
  if (p.samples64)
    static_cast<int64_t*>(p.samples)[i] = index;
  else
    static_cast<int32_t*>(p.samples)[i] = static_cast<int32_t>(index);
  p.valid[i] = ok;
}

// E consecutive values of the CTA's slice from `start` (zeros past len) as fp32: from global
// memory (load_tile) or from the shared cache.
template <typename T, bool kVec, bool kCache, int E>
__device__ __forceinline__ void slice_tile(const f::Src<T, kVec, kCache>& src, int64_t start,
                                           float* w) {
  if constexpr (kCache) {
#pragma unroll
    for (int j = 0; j < E; ++j) w[j] = start + j < src.len ? src.c[start + j] : 0.0f;
  } else {
    load_tile<T, kVec, E>(src.g, start, src.len, w);
  }
}

// The draw over weights w = (v >= thr ? v : 0) of one row (thr = -inf: the whole row), this CTA
// over its slice [start, start + src.len) of a cluster of p.cluster CTAs. `invalid`
// (cluster-uniform) forces sample 0 / valid false; bad entries are judged over the whole row.
// The running sum of a slice starts at the sum of the slices before it (rank order); the sample
// is the first crossing of the lowest rank that has one. Cluster > 1: two exchanges of one barrier
// each (every CTA pushes its block-level values into every rank's in_* slots, then reads its own
// shared memory), so no remote access follows the last barrier.
template <typename T, bool kVec, bool kCache>
__device__ void draw_row(const Params& p, int64_t i, const f::Src<T, kVec, kCache>& src,
                         int64_t start_col, float thr, bool invalid, Shared& s) {
  namespace cg = cooperative_groups;
  const int64_t len = src.len;
  const int cluster = p.cluster;
  // Remote shared memory is written only once every CTA of the cluster runs (wait below).
  if (cluster > 1) kernels::cluster_arrive_relaxed();
  // Pass 1: kept total, bad flag, last kept positive index.
  if (threadIdx.x == 0) s.last_pos = -1;
  float part = 0.0f;
  bool bad = false;
  int last = -1;
  constexpr int E1 = 16;
  for (int64_t base = static_cast<int64_t>(threadIdx.x) * E1; base < len;
       base += static_cast<int64_t>(kThreads) * E1) {
    float w[E1];
    slice_tile<T, kVec, kCache, E1>(src, base, w);
#pragma unroll
    for (int j = 0; j < E1; ++j) {
      bad |= f::bad_prob(w[j]);  // padding is 0: never bad
      const float x = w[j] >= thr ? w[j] : 0.0f;
      part += x;
      if (x > 0.0f) last = static_cast<int>(start_col + base + j);
    }
  }
  __syncthreads();
  if (last >= 0) atomicMax(&s.last_pos, last);
  bad = __syncthreads_or(bad);
  const float mine = kernels::block_sum(part, s.red);
  float total = mine, carry = 0.0f;
  int last_pos = s.last_pos;
  if (cluster > 1) {
    // The slices' sums in rank order: the total and this slice's exclusive prefix.
    cg::cluster_group cl = cg::this_cluster();
    const int rank = static_cast<int>(cl.block_rank());
    kernels::cluster_wait();  // every CTA runs
    if (threadIdx.x < cluster) {
      Shared* dst = cl.map_shared_rank(&s, static_cast<int>(threadIdx.x));
      dst->in_sum[rank] = mine;
      dst->in_bad[rank] = bad;
      dst->in_last[rank] = last_pos;
    }
    cl.sync();
    total = 0.0f;
    int any = 0;
    for (int r = 0; r < cluster; ++r) {
      if (r == rank) carry = total;
      total += s.in_sum[r];
      any |= s.in_bad[r];
      last_pos = max(last_pos, s.in_last[r]);
    }
    bad = any != 0;
  }
  if (invalid || bad || !(total > 0.0f && total < INFINITY)) {
    write_result(p, i, 0, false);
    return;
  }
  const int64_t seed = p.seed[p.seed_per_row ? i : 0];
  const int64_t offset = p.offset[p.offset_per_row ? i : 0];
  const float target = uniform(seed, offset, i, 0) * total;

  // Pass 2: tiles in vocabulary order until the running sum exceeds target (a slice whose sums
  // stay at or below target, or that starts past it, finds nothing or a later index).
  if (threadIdx.x == 0) s.found = INT_MAX;
  __syncthreads();
  int found = INT_MAX;
  if (carry + mine > target || cluster == 1) {
    for (int64_t step = 0; step < len; step += static_cast<int64_t>(kThreads) * kTile) {
      const int64_t start = step + static_cast<int64_t>(threadIdx.x) * kTile;
      float w[kTile];
      slice_tile<T, kVec, kCache, kTile>(src, start, w);
      float local = 0.0f;
#pragma unroll
      for (int j = 0; j < kTile; ++j) {
        w[j] = w[j] >= thr ? w[j] : 0.0f;
        local += w[j];
      }
      // Ends with __syncthreads: s.found (set last step) is stable here.
      const float excl = f::block_exclusive_scan<float>(local, s.scan);
      float c = carry + excl;
      int hit = INT_MAX;
#pragma unroll
      for (int j = 0; j < kTile; ++j) {
        c += w[j];
        if (hit == INT_MAX && w[j] > 0.0f && c > target)
          hit = static_cast<int>(start_col + start + j);
      }
      if (hit != INT_MAX) atomicMin(&s.found, hit);
      if (threadIdx.x == kThreads - 1) s.step_total = excl + local;
      __syncthreads();
      found = s.found;
      carry += s.step_total;
      __syncthreads();  // s.step_total is rewritten next step
      if (found != INT_MAX) break;
    }
  }
  if (cluster > 1) {
    cg::cluster_group cl = cg::this_cluster();
    const int rank = static_cast<int>(cl.block_rank());
    if (threadIdx.x < cluster)
      cl.map_shared_rank(&s, static_cast<int>(threadIdx.x))->in_found[rank] = found;
    cl.sync();
    for (int r = 0; r < cluster; ++r) found = min(found, s.in_found[r]);
  }
  // u * total rounded up to (or past) every prefix: the last token with weight.
  write_result(p, i, found != INT_MAX ? found : last_pos, true);
}

// This CTA's part of output row i = blockIdx.x / p.cluster: the slice of its source row.
template <typename T, bool kVec, bool kCache>
__device__ __forceinline__ f::Src<T, kVec, kCache> draw_src(const Params& p, int64_t src_row) {
  const int64_t start = static_cast<int64_t>(blockIdx.x % p.cluster) * p.slice;
  const int64_t left = p.cols - start;
  const int64_t len = left < 0 ? 0 : (left < p.slice ? left : p.slice);
  f::Src<T, kVec, kCache> src{static_cast<const T*>(p.x) + src_row * p.x_stride + start,
                              reinterpret_cast<const float*>(f::filters_cache_), len};
  if constexpr (kCache)
    f::fill_cache<T, kVec>(src.g, reinterpret_cast<float*>(f::filters_cache_), len);
  return src;
}

template <typename T, bool kVec, bool kCache>
__global__ void __launch_bounds__(kThreads) draw_kernel(Params p) {
  __shared__ Shared s;
  const int64_t i = blockIdx.x / p.cluster;
  const int64_t src_row = source_row(p, i);
  if (src_row < 0) {  // cluster-uniform: never read outside probs
    write_result(p, i, 0, false);
    return;
  }
  const auto src = draw_src<T, kVec, kCache>(p, src_row);
  const int64_t start = static_cast<int64_t>(blockIdx.x % p.cluster) * p.slice;
  draw_row(p, i, src, start, -INFINITY, false, s);
}

// Survivors of top-k (values >= the k-th largest, ties included) that survivors_draw holds.
constexpr int kSurvivors = 256;

// top_k_top_p on the cached shape with top-k on: after the top-k search, the rest of the row's
// work runs over its survivors alone, held by every CTA, with no further cluster barrier (the
// full path takes a top-p search of 3 cluster barriers and a draw of 2). One sweep of each
// slice counts its survivors (v >= thr_k) and flags bad entries; a second stages them (index,
// value) in a fixed order (thread t's in slice order after those of threads < t) in fs.tot_*,
// which no rank writes before the next cluster barrier. After one cluster barrier every CTA
// copies every rank's survivors in rank order into fs.count / fs.mass (n <= kSurvivors: else it
// returns false, cluster-uniformly, and the full top-p search and draw follow), arrives at the
// exit barrier, and on the list alone:
//  - top-p: keep v iff S_gt(v) < target (tp, or tp * sum_k for top_k_first, as the full path),
//    S_gt summed in double over the list (ties share S_gt: kept together); tp <= 0 keeps the
//    maximum's ties;
//  - the draw: weights w = v >= max(thr_k, thr_p); every survivor's running sum in vocabulary
//    order (the weights of the survivors at or before its index, summed in list order) and the
//    total in the same order (so the last index's running sum has the total's bits); the sample
//    is the smallest index whose running sum exceeds u * total (the full path's rule), else the
//    last index with weight.
// The sums run in another order than the full path's (slices, then ranks), so a sample may
// differ from it only where u * total lies within rounding of a CDF boundary.
template <typename T, bool kVec>
__device__ bool survivors_draw(const Params& p, int64_t i, const f::Src<T, kVec, true>& src,
                               int64_t start_col, float thr_k, float sum_k, float tp, bool joint,
                               f::Shared& fs, Shared& s) {
  namespace cg = cooperative_groups;
  const int cluster = p.cluster;
  const int64_t len = src.len;
  const int t = static_cast<int>(threadIdx.x);
  // 1. This CTA's survivors, staged.
  int mine = 0;
  bool bad = false;
  for (int64_t j = t; j < len; j += kThreads) {
    const float v = src.c[j];
    bad |= f::bad_prob(v);
    mine += v >= thr_k ? 1 : 0;
  }
  int slot = f::block_exclusive_scan<int>(mine, fs.scan_i);  // ends with __syncthreads
  bad = __syncthreads_or(bad);
  if (t == kThreads - 1) {
    s.surv_n = slot + mine;
    s.surv_bad = bad ? 1 : 0;
  }
  if (mine > 0) {
    for (int64_t j = t; j < len; j += kThreads) {
      const float v = src.c[j];
      if (v >= thr_k) {
        if (slot < kSurvivors) {
          fs.tot_count[slot] = static_cast<int>(start_col + j);
          fs.tot_mass[slot] = v;
        }
        ++slot;
      }
    }
  }
  // 2. Every rank's count and flag (rank order): offsets, the row's count and flag.
  if (cluster > 1)
    cg::this_cluster().sync();
  else
    __syncthreads();
  if (t < 32) {
    int n = 0, b = 0;
    if (t < cluster) {
      const Shared* from = cluster > 1 ? cg::this_cluster().map_shared_rank(&s, t) : &s;
      n = from->surv_n;
      b = from->surv_bad;
    }
    int inc = n;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int y = __shfl_up_sync(0xFFFFFFFFu, inc, o);
      if (t >= o) inc += y;
    }
    if (t < cluster) s.surv_off[t] = inc - n;
    const int total = __shfl_sync(0xFFFFFFFFu, inc, 31);
    const bool any = __any_sync(0xFFFFFFFFu, b != 0);
    if (t == 0) {
      s.surv_total = total;
      s.surv_any_bad = any ? 1 : 0;
    }
  }
  __syncthreads();
  const int n = s.surv_total;
  if (n > kSurvivors) return false;  // the same on every rank
  // 3. The row's survivors, rank order, into this CTA's list.
  if (t < n) {
    int r = 0;
    while (r + 1 < cluster && s.surv_off[r + 1] <= t) ++r;
    const int j = t - s.surv_off[r];
    const f::Shared* from = cluster > 1 ? cg::this_cluster().map_shared_rank(&fs, r) : &fs;
    fs.count[t] = from->tot_count[j];
    fs.mass[t] = from->tot_mass[j];
  }
  __syncthreads();
  // No remote access follows: arrive at the exit barrier now (the reads above are done), wait
  // before exiting, so no rank leaves while another still reads its staged survivors.
  if (cluster > 1) kernels::cluster_arrive();
  const bool invalid = s.surv_any_bad != 0 || tp != tp;
  const float v = t < n ? fs.mass[t] : -INFINITY;
  // 4. Top-p over the survivors (block-uniform branches).
  float thr_p = -INFINITY;
  if (!invalid && tp < 1.0f) {
    if (tp <= 0.0f) {
      thr_p = kernels::block_max(v, s.red);  // the argmax set
    } else if (joint || (sum_k >= f::kMinSum && sum_k < INFINITY)) {
      // top_k_first with a kept sum < 1e-8: the renormalised row is zero, top-p keeps it all.
      const double target = joint ? tp : tp * sum_k;
      float keep_min = INFINITY;
      if (t < n) {
        double gt = 0.0;
        for (int q = 0; q < n; ++q) {
          const float x = fs.mass[q];
          if (x > v) gt += x;
        }
        // gt == 0: the maximum, kept whenever tp > 0 (as the reference), even where tp * sum_k
        // underflows to 0 in fp32.
        if (gt < target || gt == 0.0) keep_min = v;
      }
      thr_p = -kernels::block_max(-keep_min, s.red);
    }
  }
  // 5. The draw over w = v >= max(thr_k, thr_p).
  const float thr = fmaxf(thr_k, thr_p);
  const int idx = t < n ? fs.count[t] : INT_MAX;
  const float w = t < n && v >= thr ? v : 0.0f;
  float run = 0.0f, total = 0.0f;
  if (t < n) {
    for (int q = 0; q < n; ++q) {
      const float x = fs.mass[q] >= thr ? fs.mass[q] : 0.0f;
      total += x;
      if (fs.count[q] <= idx) run += x;
    }
  }
  if (t == 0) {
    s.step_total = total;
    s.found = INT_MAX;
    s.last_pos = -1;
  }
  __syncthreads();
  total = s.step_total;
  const bool ok = !invalid && total > 0.0f && total < INFINITY;
  if (ok && w > 0.0f) {
    const int64_t seed = p.seed[p.seed_per_row ? i : 0];
    const int64_t offset = p.offset[p.offset_per_row ? i : 0];
    const float target = uniform(seed, offset, i, 0) * total;
    atomicMax(&s.last_pos, idx);
    if (run > target) atomicMin(&s.found, idx);
  }
  __syncthreads();
  if (ok)
    write_result(p, i, s.found != INT_MAX ? s.found : s.last_pos, true);
  else
    write_result(p, i, 0, false);
  if (cluster > 1) kernels::cluster_wait();
  return true;
}

// Per-source-row filter parameters of top_k_top_p_sampling_from_probs.
struct FilterParams {
  const void* k_arr;  // int32/int64 [B] or null
  bool k64;
  int64_t k_val;
  const float* p_arr;  // float32 [B] or null
  float p_val;
  bool joint;  // "joint": both rules on the original row; else top-p on the top-k renormalised row
};

template <typename T, bool kVec, bool kCache>
__global__ void __launch_bounds__(kThreads) top_k_top_p_kernel(Params p, FilterParams fp) {
  __shared__ Shared s;
  __shared__ f::Shared fs;
  const int64_t i = blockIdx.x / p.cluster;
  const int64_t src_row = source_row(p, i);
  if (src_row < 0) {
    write_result(p, i, 0, false);
    return;
  }
  const auto src = draw_src<T, kVec, kCache>(p, src_row);
  const int64_t start = static_cast<int64_t>(blockIdx.x % p.cluster) * p.slice;
  const int64_t cols = p.cols;
  const int cluster = p.cluster;
  int64_t k = fp.k_val;
  if (fp.k_arr != nullptr)
    k = fp.k64 ? static_cast<const int64_t*>(fp.k_arr)[src_row]
               : static_cast<int64_t>(static_cast<const int32_t*>(fp.k_arr)[src_row]);
  const float tp = fp.p_arr != nullptr ? fp.p_arr[src_row] : fp.p_val;
  // Top-k: keep v >= thr_k (the k-th largest value), kept sum sum_k. Neither search flags bad
  // rows (kProbs = false): draw_row judges the whole row in its first pass anyway, and each flag
  // would cost a cluster reduction.
  float thr_k = -INFINITY, sum_k = 0.0f, mx = 0.0f;
  const bool k_on = k > 0 && k < cols;
  if (k_on) {
    const f::Threshold t =
        f::radix_threshold<false, false>(src, 0.0f, static_cast<int>(k), fs, cluster);
    thr_k = t.value;
    sum_k = t.kept_sum;
  }
  if constexpr (kCache) {  // the rest over the top-k survivors when they fit (cluster-uniform)
    if (k_on && k <= kSurvivors &&
        survivors_draw<T, kVec>(p, i, src, start, thr_k, sum_k, tp, fp.joint, fs, s))
      return;
  }
  // Top-p: keep v >= thr_p. On the original row (joint) the rule is S_gt(v) < tp; on the top-k
  // renormalised row (top_k_first) it is S_gt(v) / sum_k < tp, i.e. S_gt(v) < tp * sum_k over the
  // same values (every value strictly greater than a kept one is kept by top-k). Either way only
  // values >= thr_k matter (S_gt of such a value only sums values above it), so the top-p search
  // runs over the top-k survivors alone (floor key).
  float thr_p = -INFINITY;
  if (tp == tp && tp < 1.0f) {
    if (tp <= 0.0f || (!fp.joint && !k_on)) {
      float part = 0.0f, m = -INFINITY;
      src.each([&](float v) {
        if (v >= -INFINITY) part += v;
        m = fmaxf(m, v);
      });
      const float total = f::row_sum(part, fs, cluster);
      mx = f::row_max(m, fs, cluster);
      if (!k_on) sum_k = total;
    }
    if (tp <= 0.0f) {
      thr_p = mx;  // the argmax set (top-k keeps the maximum)
    } else if (fp.joint || (sum_k >= f::kMinSum && sum_k < INFINITY)) {
      // top_k_first with a kept sum < 1e-8: the renormalised row is zero, top-p keeps it all.
      const float target = fp.joint ? tp : tp * sum_k;
      const uint32_t floor_key = k_on ? f::key_of(thr_k) : 0u;
      // Cached slices (<= kCacheBytes / 4 values) always take the exact masses: a constant
      // there (a runtime flag kept 200 B of the top-p search's registers in local memory).
      thr_p = f::radix_threshold<true, false>(src, target, 0, fs, cluster, floor_key,
                                              kCache || p.slice <= f::kExactMassSlice)
                  .value;
    }
  }
  draw_row(p, i, src, start, fmaxf(thr_k, thr_p), tp != tp, s);
}

}  // namespace sampling_draw_detail

// samples int32/int64 [B'], valid bool [B'], probs [B, V] (last dim contiguous), indices optional
// int32/int64 [B'], seed/offset int64 [1] or [B'].
namespace sampling_draw_detail {

// Steps 1-2 of both entries: validate, fill Params; false when there is nothing to launch.
inline bool prepare(const char* op, Params& p, tvm::ffi::TensorView samples,
                    tvm::ffi::TensorView valid, tvm::ffi::TensorView probs,
                    const tvm::ffi::Optional<tvm::ffi::TensorView>& indices,
                    tvm::ffi::TensorView seed, tvm::ffi::TensorView offset) {
  namespace d = sampling_draw_detail;
  // 1. Validate.
  kernels::check_ndim(op, "probs", probs, 2);
  kernels::check_last_dim_contiguous(op, "probs", probs);
  kernels::check_device(op, "probs", probs, kDLCUDA);
  kernels::check_ndim(op, "samples", samples, 1);
  kernels::check_ndim(op, "valid", valid, 1);
  kernels::check_contiguous(op, "samples", samples);
  kernels::check_contiguous(op, "valid", valid);
  kernels::check_same_device(op, "samples", samples, "probs", probs);
  kernels::check_same_device(op, "valid", valid, "probs", probs);
  const int64_t rows = probs.size(0), cols = probs.size(1);
  const int64_t out_rows = samples.size(0);
  TVM_FFI_CHECK(valid.size(0) == out_rows, ValueError)
      << op << ": valid must have shape (" << out_rows << ",), got " << kernels::shape_string(valid);
  TVM_FFI_CHECK(kernels::is_dtype(valid.dtype(), kDLBool, 8) ||
                    kernels::is_dtype(valid.dtype(), kDLUInt, 8),
                TypeError)
      << op << ": valid must be bool";
  if (kernels::is_dtype(samples.dtype(), kDLInt, 64)) {
    p.samples64 = true;
  } else {
    TVM_FFI_CHECK(kernels::is_dtype(samples.dtype(), kDLInt, 32), TypeError)
        << op << ": samples must be int32 or int64";
  }
  if (indices.has_value()) {
    const tvm::ffi::TensorView t = indices.value();
    kernels::check_ndim(op, "indices", t, 1);
    kernels::check_contiguous(op, "indices", t);
    kernels::check_same_device(op, "indices", t, "probs", probs);
    TVM_FFI_CHECK(t.size(0) == out_rows, ValueError)
        << op << ": indices must have shape (" << out_rows << ",), got "
        << kernels::shape_string(t);
    if (kernels::is_dtype(t.dtype(), kDLInt, 64)) {
      p.indices64 = true;
    } else {
      TVM_FFI_CHECK(kernels::is_dtype(t.dtype(), kDLInt, 32), TypeError)
          << op << ": indices must be int32 or int64";
    }
    p.indices = kernels::data<const void>(t);
  } else {
    TVM_FFI_CHECK(out_rows == rows, ValueError)
        << op << ": samples must have shape (" << rows << ",), got "
        << kernels::shape_string(samples);
  }
  const char* names[2] = {"seed", "offset"};
  const tvm::ffi::TensorView* rng[2] = {&seed, &offset};
  for (int k = 0; k < 2; ++k) {
    const tvm::ffi::TensorView& t = *rng[k];
    kernels::check_ndim(op, names[k], t, 1);
    kernels::check_contiguous(op, names[k], t);
    kernels::check_same_device(op, names[k], t, "probs", probs);
    TVM_FFI_CHECK(kernels::is_dtype(t.dtype(), kDLInt, 64), TypeError)
        << op << ": " << names[k] << " must be int64";
    TVM_FFI_CHECK(t.size(0) == 1 || t.size(0) == out_rows, ValueError)
        << op << ": " << names[k] << " must have shape (1,) or (" << out_rows << ",), got "
        << kernels::shape_string(t);
  }
  TVM_FFI_CHECK(out_rows < (int64_t{1} << 31) && cols < (int64_t{1} << 31) - d::kThreads * 32,
                ValueError)
      << op << ": the CUDA kernel takes B' < 2^31 rows and V < 2^31 - 32768, got " << out_rows
      << " and " << cols;
  if (out_rows == 0) return false;  // V = 0: every row is invalid (the kernel reads nothing)
  p.x = kernels::data<const void>(probs);
  p.x_stride = probs.stride(0);
  p.rows = rows;
  p.cols = cols;
  p.samples = kernels::data<void>(samples);
  p.valid = kernels::data<bool>(valid);
  p.seed = kernels::data<const int64_t>(seed);
  p.offset = kernels::data<const int64_t>(offset);
  p.seed_per_row = seed.size(0) != 1;
  p.offset_per_row = offset.size(0) != 1;
  return true;
}

template <typename T>
bool vectorizable(const Params& p) {
  constexpr int64_t N = kernels::kVectorBytes / sizeof(T);
  return p.cols % N == 0 && p.x_stride % N == 0 && kernels::is_aligned(p.x);
}

// One cluster of p.cluster CTAs per output row (sampling_filters_detail::choose_shape): the
// cached kernel for batches whose clusters are all resident at once, else the streamed one with
// one CTA per output row.
template <typename T, bool kVec>
f::Shape shape_for(int device, int64_t out_rows, int64_t cols, bool filtered) {
  const auto cached = filtered ? reinterpret_cast<const void*>(top_k_top_p_kernel<T, kVec, true>)
                               : reinterpret_cast<const void*>(draw_kernel<T, kVec, true>);
  return f::choose_shape(cached, nullptr, device, out_rows, cols, kernels::pack_width<T, kVec>,
                         1, filtered);
}

template <typename T, bool kVec, typename... Extra>
void launch_vec(const kernels::Launch& ctx, int64_t out_rows, Params p, Extra... extra) {
  constexpr bool kFiltered = sizeof...(Extra) == 1;
  const f::Shape shape = shape_for<T, kVec>(ctx.device, out_rows, p.cols, kFiltered);
  p.cluster = shape.cluster;
  p.slice = shape.slice;
  if constexpr (kFiltered)
    f::launch_shape(ctx, shape, out_rows,
                    shape.cache ? top_k_top_p_kernel<T, kVec, true>
                                : top_k_top_p_kernel<T, kVec, false>,
                    p, extra...);
  else
    f::launch_shape(ctx, shape, out_rows,
                    shape.cache ? draw_kernel<T, kVec, true> : draw_kernel<T, kVec, false>, p);
}

// Dispatch on the pack width: extra is empty (sampling_from_probs) or the FilterParams.
template <typename T, typename... Extra>
void launch(const kernels::Launch& ctx, int64_t out_rows, const Params& p, Extra... extra) {
  if (vectorizable<T>(p))
    launch_vec<T, true>(ctx, out_rows, p, extra...);
  else
    launch_vec<T, false>(ctx, out_rows, p, extra...);
}

}  // namespace sampling_draw_detail

inline void sampling_from_probs(tvm::ffi::TensorView samples, tvm::ffi::TensorView valid,
                                tvm::ffi::TensorView probs,
                                tvm::ffi::Optional<tvm::ffi::TensorView> indices,
                                tvm::ffi::TensorView seed, tvm::ffi::TensorView offset,
                                bool /*deterministic*/) {
  namespace d = sampling_draw_detail;
  const char* op = "sampling.sampling_from_probs";
  // 1. Validate.
  d::Params p{};
  if (!d::prepare(op, p, samples, valid, probs, indices, seed, offset)) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(probs);
  const kernels::Launch ctx(op, probs);
  // 4. Dispatch on dtype and launch: one cluster (or CTA) per output row.
  KERNELS_DISPATCH_FLOAT(probs.dtype(), op, T, [&] {
    d::launch<T>(ctx, samples.size(0), p);
  });
}

// As sampling_from_probs, plus top_k (int32/int64 [B] per probs row, or top_k_val) and top_p
// (float32 [B], or top_p_val); filter_apply_order "top_k_first" or "joint".
inline void top_k_top_p_sampling_from_probs(
    tvm::ffi::TensorView samples, tvm::ffi::TensorView valid, tvm::ffi::TensorView probs,
    tvm::ffi::Optional<tvm::ffi::TensorView> top_k_arr, int64_t top_k_val,
    tvm::ffi::Optional<tvm::ffi::TensorView> top_p_arr, double top_p_val,
    tvm::ffi::Optional<tvm::ffi::TensorView> indices, tvm::ffi::String filter_apply_order,
    tvm::ffi::TensorView seed, tvm::ffi::TensorView offset, bool /*deterministic*/) {
  namespace d = sampling_draw_detail;
  const char* op = "sampling.top_k_top_p_sampling_from_probs";
  // 1. Validate.
  d::FilterParams fp{};
  const std::string order(filter_apply_order);
  TVM_FFI_CHECK(order == "top_k_first" || order == "joint", ValueError)
      << op << ": filter_apply_order must be 'top_k_first' or 'joint', got '" << order << "'";
  fp.joint = order == "joint";
  const int64_t rows = probs.ndim() == 2 ? probs.size(0) : 0;
  fp.k_val = top_k_val;
  fp.p_val = static_cast<float>(top_p_val);
  if (top_k_arr.has_value()) {
    const tvm::ffi::TensorView t = top_k_arr.value();
    kernels::check_ndim(op, "top_k", t, 1);
    kernels::check_contiguous(op, "top_k", t);
    kernels::check_same_device(op, "top_k", t, "probs", probs);
    TVM_FFI_CHECK(t.size(0) == rows, ValueError)
        << op << ": top_k must have shape (" << rows << ",), got " << kernels::shape_string(t);
    if (kernels::is_dtype(t.dtype(), kDLInt, 64)) {
      fp.k64 = true;
    } else {
      TVM_FFI_CHECK(kernels::is_dtype(t.dtype(), kDLInt, 32), TypeError)
          << op << ": top_k must be int32 or int64";
    }
    fp.k_arr = kernels::data<const void>(t);
  }
  if (top_p_arr.has_value()) {
    const tvm::ffi::TensorView t = top_p_arr.value();
    kernels::check_ndim(op, "top_p", t, 1);
    kernels::check_contiguous(op, "top_p", t);
    kernels::check_same_device(op, "top_p", t, "probs", probs);
    TVM_FFI_CHECK(t.size(0) == rows, ValueError)
        << op << ": top_p must have shape (" << rows << ",), got " << kernels::shape_string(t);
    TVM_FFI_CHECK(kernels::is_dtype(t.dtype(), kDLFloat, 32), TypeError)
        << op << ": top_p must be float32";
    fp.p_arr = kernels::data<const float>(t);
  }
  d::Params p{};
  if (!d::prepare(op, p, samples, valid, probs, indices, seed, offset)) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(probs);
  const kernels::Launch ctx(op, probs);
  // 4. Dispatch on dtype and launch: one cluster (or CTA) per output row.
  KERNELS_DISPATCH_FLOAT(probs.dtype(), op, T, [&] {
    d::launch<T>(ctx, samples.size(0), p, fp);
  });
}

// Test hook: the path a draw over probs with out_rows output rows takes (filtered: the
// top_k_top_p kernel): the cached cluster size, or 0 when streamed.
inline int64_t sampling_draw_path(tvm::ffi::TensorView probs, int64_t out_rows, bool filtered) {
  namespace d = sampling_draw_detail;
  constexpr const char* kOp = "sampling.draw_path";
  kernels::check_ndim(kOp, "probs", probs, 2);
  kernels::check_device(kOp, "probs", probs, kDLCUDA);
  kernels::DeviceGuard guard(probs);
  d::Params p{};
  p.x = kernels::data<const void>(probs);
  p.x_stride = probs.stride(0);
  p.cols = probs.size(1);
  const int device = probs.device().device_id;
  sampling_filters_detail::Shape shape{};
  KERNELS_DISPATCH_FLOAT(probs.dtype(), kOp, T, [&] {
    shape = d::vectorizable<T>(p) ? d::shape_for<T, true>(device, out_rows, p.cols, filtered)
                                  : d::shape_for<T, false>(device, out_rows, p.cols, filtered);
  });
  return shape.cache ? shape.cluster : 0;
}
