// sampling.{min_p,top_k,top_p}_renorm_probs and sampling.top_k_mask_logits, CUDA.
//
// Two launch shapes of one set of kernel bodies, chosen per call by choose_shape (below):
//  - cached (small batches, every row's cluster resident at once): a row over a thread-block
//    cluster of 1-16 CTAs of 1024 threads (4+ at V = 128256 fp32), each slice read from global
//    memory once (16-byte packs, four in flight per thread) into a <= 160 KB fp32 shared cache;
//    every pass below reads that copy.
//  - streamed (larger batches): one CTA of 1024 threads per row (a portable cluster of 2-8 CTAs
//    while the batch leaves SMs idle and the clusters are all resident at once), the row streamed
//    from global memory every pass. The first sweep records the largest key of each group of 32
//    packs in shared memory (4 KB a row at V = 128256 fp32); the passes after it read only the
//    groups that can hold what they look for, and the write stores the dropped value into the
//    others unread (k = 50 of 128256: ~5% of the row re-read instead of all of it, twice).
// Histograms and reductions of a cluster are combined through distributed shared memory in rank
// order (every CTA holds identical bits, no float atomics across CTAs). Passes:
//   min_p:  max (+ bad-row flag) | kept sum | write.
//   top_k:  3 radix digits of 11/11/10 bits over an order-preserving uint32 key of the fp32 value
//           (shared-memory count histograms; the first also flags bad rows; the last also yields
//           the kept sum: elements above the final range + the final bins) | write. Sorting-free;
//           ties kept together (keep iff v >= the k-th largest value). When the first digit's bin
//           holds <= kCandidates keys of the row (k = 50 at V = 128256: tens), one sweep gathers
//           them into a shared list held by every CTA (one cluster barrier) and each CTA runs the
//           last two digits over that list with block barriers only: 3 cluster barriers per
//           search instead of 6 and two full passes fewer (H200, V = 128256 fp32, A/B:
//           top_k_renorm B 1 / 128 / 512 18.6 / 90.8 / 339 -> 14.3 / 76.0 / 281 us; top_p
//           27.0 / 180 -> 22.5 / 167); else the last two digits sweep the row as passes.
//   top_p:  the same with mass histograms (exact: integer sums of key bits in 32-bit shared
//           atomics, since a bin's values share one scale, see exact_mass_add; the int64
//           significand sums over the list likewise) and the rule
//           "lowest non-empty bin whose strictly-greater mass < top_p" | write. p = 0.9 at V =
//           128256 puts ~500-900 keys in the list.
// Semantics follow kernels_sampling.reference exactly: bad rows (NaN/inf/negative entry), bad
// per-row parameters and an overflowing kept sum give an all-NaN row; kept sum < 1e-8 gives 0.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(7);

#include <kernels/checks.h>
#include <kernels/cluster.cuh>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>
#include <kernels/reduce.cuh>
#include <kernels/tensor.h>
#include <kernels/vec.cuh>

#include <cooperative_groups.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <tuple>
#include <type_traits>
#include <utility>

namespace sampling_filters_detail {

constexpr int kThreads = 1024;
constexpr int kBins = 2048;  // 11-bit digits
constexpr int kUnroll = 4;   // packs in flight per thread
constexpr int kMaxCluster = 16;         // CTAs per row, cached (a non-portable size above 8)
constexpr int kMaxStreamedCluster = 8;  // CTAs per row, streamed filters (portable)
constexpr float kMinSum = 1e-8f;
// Keys of the first pass's selected bin kept in shared memory (every CTA holds the row's list);
// a row with more there takes the second and third passes over the row instead.
constexpr int kCandidates = 3072;
// kMass histograms are exact integers (exact_mass_add) when every CTA's slice holds at most this
// many values (a bin's sum of 11-bit key fields then fits 32 bits); longer slices keep fp32
// shared atomics.
constexpr int64_t kExactMassSlice = int64_t{1} << 21;

enum Mode : int { kMinP = 0, kTopK = 1, kTopP = 2, kMaskTopK = 3 };
enum ParamKind : int { kNone = 0, kInt32 = 1, kInt64 = 2, kFloat32 = 3 };

struct Params {
  const void* x;
  void* out;
  int64_t x_stride, out_stride, cols;
  const void* param;  // per-row k (int32/int64) or p (float32), or null
  int param_kind;
  double value;   // the scalar k or p when param is null
  int cluster;    // CTAs per row (a thread-block cluster when > 1), each over one slice
  int64_t slice;  // elements per CTA slice (a multiple of the pack width)
  bool record;    // streamed: the groups' largest keys kept in dynamic shared memory
};

// Order-preserving key of a float: all NaNs are the largest (like torch.sort), -0 == +0.
__device__ __forceinline__ uint32_t key_of(float v) {
  if (v != v) return 0xFFFFFFFFu;
  v += 0.0f;  // -0 -> +0
  const uint32_t b = __float_as_uint(v);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}
__device__ __forceinline__ float value_of(uint32_t k) {
  return __uint_as_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}
__device__ __forceinline__ bool bad_prob(float v) { return !(v >= 0.0f && v < INFINITY); }

// fn(index, value) over the row: each thread kUnroll packs in flight (kStream: loads that
// bypass L1 and leave L2 early, for a row read once).
template <typename T, bool kVec, bool kStream, typename F>
__device__ __forceinline__ void for_row_indexed(const T* row, int64_t cols, F&& fn) {
  constexpr int N = kernels::pack_width<T, kVec>;
  using P = kernels::Pack<T, N>;
  const int64_t step = static_cast<int64_t>(blockDim.x) * N;
  for (int64_t base = static_cast<int64_t>(threadIdx.x) * N; base < cols; base += step * kUnroll) {
    P p[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u * step < cols) {
        if constexpr (kStream)
          p[u].load_stream(row + base + u * step);
        else
          p[u].load_cached(row + base + u * step);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u * step < cols) {
        float f[N];
        p[u].unpack(f);
#pragma unroll
        for (int j = 0; j < N; ++j) fn(base + u * step + j, f[j]);
      }
    }
  }
}

// fn(value) over the row, read with cached loads (the streamed passes re-read it).
template <typename T, bool kVec, typename F>
__device__ __forceinline__ void for_row(const T* row, int64_t cols, F&& fn) {
  for_row_indexed<T, kVec, false>(row, cols, [&](int64_t, float v) { fn(v); });
}

// out = fn(value) over the row.
template <typename T, bool kVec, typename F>
__device__ __forceinline__ void map_row(const T* row, T* out, int64_t cols, F&& fn) {
  constexpr int N = kernels::pack_width<T, kVec>;
  using P = kernels::Pack<T, N>;
  const int64_t step = static_cast<int64_t>(blockDim.x) * N;
  for (int64_t base = static_cast<int64_t>(threadIdx.x) * N; base < cols; base += step * kUnroll) {
    P p[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (base + u * step < cols) p[u].load_stream(row + base + u * step);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (base + u * step < cols) {
        float f[N];
        p[u].unpack(f);
#pragma unroll
        for (int j = 0; j < N; ++j) f[j] = fn(f[j]);
        P q;
        q.pack(f);
        q.store_stream(out + base + u * step);
      }
    }
  }
}

// Groups of the streamed passes: one warp's packs of one step of for_row (32 packs: 32 N
// consecutive values of the slice). The first sweep records each group's largest key_of in
// shared memory; later passes skip the groups whose largest key is below what they look for, and
// the write stores the dropped value there without reading them. At k = 50 of V = 128256 the
// top-k passes after the first and the write read ~5% of the row, where each re-read of a row of
// a large batch otherwise comes from HBM (128 rows of 513 KB overflow the L2).
template <typename T, bool kVec>
constexpr int64_t kGroupElems = int64_t{32} * kernels::pack_width<T, kVec>;

// The rounds of the thread's packs, in for_row's order: round(w, lane, step), w the start of the
// warp's first group of the round (warp-uniform), lane the thread's offset in a group, step one
// block-wide step; the round's groups start at w + u * step (u < kUnroll, those below cols).
template <typename T, bool kVec, typename Round>
__device__ __forceinline__ void for_groups(int64_t cols, Round&& round) {
  constexpr int N = kernels::pack_width<T, kVec>;
  const int64_t step = static_cast<int64_t>(blockDim.x) * N;
  const int64_t first = static_cast<int64_t>(threadIdx.x >> 5) * 32 * N;
  const int64_t lane = static_cast<int64_t>(threadIdx.x & 31) * N;
  for (int64_t w = first; w < cols; w += step * kUnroll) round(w, lane, step);
}

// fn(value) over the row as for_row (each thread's values in the same order), recording gmax[g],
// the largest key of group g (a warp reduction).
template <typename T, bool kVec, typename F>
__device__ __forceinline__ void for_row_recording(const T* row, int64_t cols, uint32_t* gmax,
                                                  F&& fn) {
  constexpr int N = kernels::pack_width<T, kVec>;
  using P = kernels::Pack<T, N>;
  for_groups<T, kVec>(cols, [&](int64_t w, int64_t lane, int64_t step) {
    P p[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
      if (w + u * step + lane < cols) p[u].load_cached(row + w + u * step + lane);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t g0 = w + u * step;
      if (g0 >= cols) break;  // warp-uniform
      uint32_t m = 0u;
      if (g0 + lane < cols) {
        float f[N];
        p[u].unpack(f);
#pragma unroll
        for (int j = 0; j < N; ++j) {
          fn(f[j]);
          m = max(m, key_of(f[j]));
        }
      }
      m = __reduce_max_sync(0xFFFFFFFFu, m);
      if (lane == 0) gmax[g0 / (32 * N)] = m;
    }
  });
}

// One round of the thread's packs (for_groups' w, lane, step): take[u] where the pack is in the
// slice and its group's recorded largest key is >= floor, those packs loaded (kStream: streaming
// loads, for the write).
template <bool kStream, typename T, typename P>
__device__ __forceinline__ void load_above(const T* row, int64_t cols, const uint32_t* gmax,
                                           uint32_t floor, int64_t w, int64_t lane, int64_t step,
                                           P (&p)[kUnroll], bool (&take)[kUnroll]) {
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    const int64_t g0 = w + u * step;
    take[u] = g0 + lane < cols && gmax[g0 / (32 * P::size)] >= floor;
    if (take[u]) {
      if constexpr (kStream)
        p[u].load_stream(row + g0 + lane);
      else
        p[u].load_cached(row + g0 + lane);
    }
  }
}

// fn(value) over the groups whose recorded largest key is >= floor (each thread's values in
// for_row's order); the others hold no value whose key is >= floor.
template <typename T, bool kVec, typename F>
__device__ __forceinline__ void for_row_above(const T* row, int64_t cols, const uint32_t* gmax,
                                              uint32_t floor, F&& fn) {
  constexpr int N = kernels::pack_width<T, kVec>;
  using P = kernels::Pack<T, N>;
  for_groups<T, kVec>(cols, [&](int64_t w, int64_t lane, int64_t step) {
    P p[kUnroll];
    bool take[kUnroll];
    load_above<false>(row, cols, gmax, floor, w, lane, step, p, take);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      if (take[u]) {
        float f[N];
        p[u].unpack(f);
#pragma unroll
        for (int j = 0; j < N; ++j) fn(f[j]);
      }
    }
  });
}

// out = fn(value) over the row, except the groups whose recorded largest key is below floor:
// `dropped` there, unread (fn must give `dropped` for every value whose key is below floor).
template <typename T, bool kVec, typename F>
__device__ __forceinline__ void map_row_above(const T* row, T* out, int64_t cols,
                                              const uint32_t* gmax, uint32_t floor, float dropped,
                                              F&& fn) {
  constexpr int N = kernels::pack_width<T, kVec>;
  using P = kernels::Pack<T, N>;
  for_groups<T, kVec>(cols, [&](int64_t w, int64_t lane, int64_t step) {
    P p[kUnroll];
    bool take[kUnroll];
    load_above<true>(row, cols, gmax, floor, w, lane, step, p, take);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t e = w + u * step + lane;
      if (e < cols) {
        float f[N];
        if (take[u]) {
          p[u].unpack(f);
#pragma unroll
          for (int j = 0; j < N; ++j) f[j] = fn(f[j]);
        } else {
#pragma unroll
          for (int j = 0; j < N; ++j) f[j] = dropped;
        }
        P q;
        q.pack(f);
        q.store_stream(out + e);
      }
    }
  });
}

// Exclusive prefix sum over the block (blockDim.x a multiple of 32, <= 1024), thread order.
template <typename V>
__device__ __forceinline__ V block_exclusive_scan(V x, V* warp_totals) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
  V inc = x;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const V y = __shfl_up_sync(0xFFFFFFFFu, inc, o);
    if (lane >= o) inc += y;
  }
  V exc = __shfl_up_sync(0xFFFFFFFFu, inc, 1);
  if (lane == 0) exc = V(0);
  if (lane == 31) warp_totals[warp] = inc;
  __syncthreads();
  if (warp == 0) {
    const V w = lane < warps ? warp_totals[lane] : V(0);
    V wi = w;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const V y = __shfl_up_sync(0xFFFFFFFFu, wi, o);
      if (lane >= o) wi += y;
    }
    V we = __shfl_up_sync(0xFFFFFFFFu, wi, 1);
    if (lane == 0) we = V(0);
    if (lane < warps) warp_totals[lane] = we;
  }
  __syncthreads();
  const V r = warp_totals[warp] + exc;
  __syncthreads();
  return r;
}

struct Shared {
  int count[kBins];  // this CTA's histogram
  union {
    float mass[kBins];        // kMass, slices over kExactMassSlice: fp32 bin masses
    uint32_t low_sum[kBins];  // kMass: sum of each bin's low 10 key bits (exact_mass_add)
  };
  int tot_count[kBins];  // cluster > 1: the row's histogram (each chunk pushed by its owner)
  float tot_mass[kBins];
  int in_bad[kMaxCluster];     // cluster > 1: rank r's bad-row flag, pushed by rank r
  float in_above[kMaxCluster];  // cluster > 1: rank r's sum above the final range, likewise
  float scan_f[32];
  int scan_i[32];
  int64_t scan_x[32];
  float red[32];
  int selected;
  int above_count;
  float above_mass;
  int selected_count;       // the row's count in the selected bin
  int64_t above_exact;      // candidate passes, kMass: exact mass above the selected bin
  int gathered;             // candidates of this CTA gathered so far
  int gather_base;          // this CTA's first slot in cand (the ranks before it, in order)
  float xfer;  // this CTA's partial for a cluster reduction
  union {
    uint32_t cand[kCandidates];  // the row's keys in the first pass's selected bin, rank order
    // kMass first pass (exact): sum of each bin's key bits 10-20. Read (remotely too) only
    // before the first pass's last barrier; cand is written only after it.
    uint32_t hi_sum[kBins];
  };
};
static_assert(kBins <= kCandidates, "hi_sum shares cand's storage");

// Reductions over the row: the block, then (cluster > 1) every CTA of the cluster. Lane r of each
// warp fetches rank r's partial and every warp combines them in rank order, so all CTAs (and all
// threads) hold the same bits.
__device__ __forceinline__ float cluster_combine(float v, Shared& s, int cluster, bool is_max) {
  if (cluster == 1) return v;
  namespace cg = cooperative_groups;
  cg::cluster_group cl = cg::this_cluster();
  if (threadIdx.x == 0) s.xfer = v;
  cl.sync();
  const int lane = static_cast<int>(threadIdx.x & 31);
  const float mine = lane < cluster ? *cl.map_shared_rank(&s.xfer, lane) : 0.0f;
  float t = is_max ? -INFINITY : 0.0f;
  for (int r = 0; r < cluster; ++r) {
    const float x = __shfl_sync(0xFFFFFFFFu, mine, r);
    t = is_max ? fmaxf(t, x) : t + x;
  }
  cl.sync();  // s.xfer is reused by the next reduction
  return t;
}
__device__ __forceinline__ float row_sum(float v, Shared& s, int cluster) {
  return cluster_combine(kernels::block_sum(v, s.red), s, cluster, false);
}
__device__ __forceinline__ float row_max(float v, Shared& s, int cluster) {
  return cluster_combine(kernels::block_max(v, s.red), s, cluster, true);
}
__device__ __forceinline__ bool row_or(bool b, Shared& s, int cluster) {
  return cluster_combine(__syncthreads_or(b) ? 1.0f : 0.0f, s, cluster, true) > 0.0f;
}

// Result of the radix threshold search over one row.
struct Threshold {
  float value;  // keep iff v >= value
  float kept_sum;
  bool bad;     // a probability row holding a NaN, inf or negative entry
};

// Exact masses inside one first-pass bin of non-negative values: its keys share the top 11 bits
// (sign, exponent, two mantissa bits), so each value is an integer significand times one power of
// two, and int64 sums of significands are exact in any order (the same bits in every CTA).
struct BinScale {
  uint32_t base;  // the significand of the bin's lowest key
  int exp;        // value = significand * 2^exp
  __device__ explicit BinScale(uint32_t bin_key) {
    const uint32_t bits = bin_key & 0x7FFFFFFFu;  // a non-negative value's key: its float bits
    const int e = static_cast<int>(bits >> 23);
    base = (e ? 0x800000u : 0u) | (bits & 0x600000u);
    exp = (e ? e : 1) - 150;
  }
  __device__ __forceinline__ int64_t significand(uint32_t key) const {
    return static_cast<int64_t>(base) + (key & 0x1FFFFFu);
  }
  // sum * 2^exp rounded once to fp32 (the double product is exact: 2^exp is a normal double
  // for exp in [-149, 105]); the same bits as ldexp, in fewer instructions and registers.
  __device__ __forceinline__ float to_float(int64_t sum) const {
    const double scale = __longlong_as_double(static_cast<long long>(exp + 1023) << 52);
    return static_cast<float>(static_cast<double>(sum) * scale);
  }
};

// Exact mass histograms of radix_threshold's kMass passes (exact_mass): a bin's values share
// its first-pass bin's scale (BinScale), so its mass is count * significand(bin's lowest key)
// plus the sum of the key bits below the digit, an integer: pass 0 sums bits 10-20 (hi_sum)
// and 0-9 (low_sum), pass 1 bits 0-9, pass 2 none (its bins are single keys). These are 32-bit
// shared integer atomics (native ATOMS.ADD; Σ < count * 2^11 fits while a slice holds <=
// kExactMassSlice values) in place of fp32 shared atomics, which sm_90 runs as a CAS loop
// (ATOMS.CAST.SPIN) that serialises on the few bins most of a softmax row falls in; and the
// masses are the same bits in any order (one rounding per bin, after the cluster's integer sum).
__device__ __forceinline__ void exact_mass_add(Shared& s, int pass, int bin, uint32_t k) {
  if (pass == 0) atomicAdd(&s.hi_sum[bin], (k >> 10) & 0x7FFu);
  if (pass < 2) atomicAdd(&s.low_sum[bin], k & 0x3FFu);
}
// The fp32 mass of the bin whose lowest key is `key`, from its count and sums (hi: pass 0 only).
__device__ __forceinline__ float exact_mass(uint32_t key, int64_t count, int64_t hi, int64_t lo) {
  if (count == 0) return 0.0f;
  const BinScale scale(key);
  return scale.to_float(count * scale.significand(key) + (hi << 10) + lo);
}

// The second and third digits of radix_threshold over the candidates alone: the first pass chose
// bin prefix >> 21 holding n <= kCandidates of the row's keys (>= floor_key), with above_k keys
// and above_m mass above it. One sweep of the slice gathers this CTA's keys of that bin into
// cand (at the slots after the lower ranks' keys, from their first-pass counts) and sums the
// values above it; cluster > 1 pushes them into every rank's cand and in_above (one cluster
// barrier). Every CTA then runs the last two digits over the same list in shared memory with
// only block barriers: integer count histograms, and (kMass) exact int64 bin masses from the
// count and the sum of the low 10 key bits (second digit) or the count alone (third).
template <bool kMass, typename Src>
__device__ Threshold radix_threshold_on_candidates(const Src& src, float target_p, int target_k,
                                                   Shared& s, int cluster, uint32_t floor_key,
                                                   uint32_t prefix, int n, int above_k,
                                                   float above_m, bool bad) {
  namespace cg = cooperative_groups;
  const uint32_t sel0 = prefix >> 21;
  int rank = 0;
  if (threadIdx.x < 32) {
    int before = 0;
    if (cluster > 1) {
      cg::cluster_group cl = cg::this_cluster();
      rank = static_cast<int>(cl.block_rank());
      const int lane = static_cast<int>(threadIdx.x);
      // Every rank's first-pass histogram stays untouched until the barrier below.
      if (lane < rank) before = cl.map_shared_rank(&s, lane)->count[sel0];
    }
    before = __reduce_add_sync(0xFFFFFFFFu, before);
    if (threadIdx.x == 0) {
      s.gather_base = before;
      s.gathered = 0;
    }
  }
  __syncthreads();
  const int base = s.gather_base;
  float above_local = 0.0f;
  src.each_above(max(floor_key, sel0 << 21), [&](float v) {
    const uint32_t k = key_of(v);
    if (k < floor_key) return;
    const uint32_t digit = k >> 21;
    if (digit == sel0) {
      const int slot = base + atomicAdd(&s.gathered, 1);
      if (slot < kCandidates) s.cand[slot] = k;
    } else if (digit > sel0) {
      above_local += v;
    }
  });
  float above = kernels::block_sum(above_local, s.red);  // ends with __syncthreads
  if (cluster > 1) {
    cg::cluster_group cl = cg::this_cluster();
    rank = static_cast<int>(cl.block_rank());
    const int mine = s.gathered;
    for (int j = threadIdx.x; j < mine * cluster; j += blockDim.x) {
      const int r = j % cluster, slot = base + j / cluster;
      if (r != rank && slot < kCandidates) cl.map_shared_rank(&s, r)->cand[slot] = s.cand[slot];
    }
    if (threadIdx.x < cluster)
      cl.map_shared_rank(&s, static_cast<int>(threadIdx.x))->in_above[rank] = above;
    cl.sync();  // every rank's keys and sum are in place; no remote access follows
    above = 0.0f;
    for (int r = 0; r < cluster; ++r) above += s.in_above[r];  // rank order
  }
  const BinScale scale(prefix);
  uint32_t himask = 0x7FFu << 21;
  int64_t above_x = 0;  // kMass: exact mass of the candidates above the selected bin
#pragma unroll 1
  for (int pass = 1; pass < 3; ++pass) {
    const int shift = pass == 1 ? 10 : 0;
    const uint32_t digit_mask = pass == 1 ? 0x7FFu : 0x3FFu;
    for (int b = threadIdx.x; b < kBins; b += blockDim.x) {
      s.count[b] = 0;
      if (kMass) s.low_sum[b] = 0u;
    }
    if (threadIdx.x == 0) s.selected = kBins;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const uint32_t k = s.cand[i];
      if (((k ^ prefix) & himask) == 0) {
        const int bin = static_cast<int>((k >> shift) & digit_mask);
        atomicAdd(&s.count[bin], 1);
        if (kMass && pass == 1) atomicAdd(&s.low_sum[bin], k & 0x3FFu);
      }
    }
    __syncthreads();
    // Bins in descending order: thread t owns bins hi = kBins-1-2t and lo = hi-1.
    const int hi = kBins - 1 - 2 * static_cast<int>(threadIdx.x), lo = hi - 1;
    const bool own = hi >= 1;
    const int c_hi = own ? s.count[hi] : 0, c_lo = own ? s.count[lo] : 0;
    int a_hi_k = 0, a_lo_k = 0;
    int64_t a_hi_x = 0, a_lo_x = 0;
    bool cand_hi, cand_lo;
    if (kMass) {
      int64_t m_hi = 0, m_lo = 0;
      if (own) {
        const uint32_t key_hi = prefix | (static_cast<uint32_t>(hi) << shift);
        const uint32_t key_lo = prefix | (static_cast<uint32_t>(lo) << shift);
        m_hi = c_hi * scale.significand(key_hi) + (pass == 1 ? s.low_sum[hi] : 0u);
        m_lo = c_lo * scale.significand(key_lo) + (pass == 1 ? s.low_sum[lo] : 0u);
      }
      a_hi_x = above_x + block_exclusive_scan<int64_t>(m_hi + m_lo, s.scan_x);
      a_lo_x = a_hi_x + m_hi;
      cand_hi = c_hi > 0 && above_m + scale.to_float(a_hi_x) < target_p;
      cand_lo = c_lo > 0 && above_m + scale.to_float(a_lo_x) < target_p;
    } else {
      a_hi_k = above_k + block_exclusive_scan<int>(c_hi + c_lo, s.scan_i);
      a_lo_k = a_hi_k + c_hi;
      cand_hi = c_hi > 0 && a_hi_k < target_k;
      cand_lo = c_lo > 0 && a_lo_k < target_k;
    }
    if (own && (cand_lo || cand_hi)) atomicMin(&s.selected, cand_lo ? lo : hi);
    __syncthreads();
    int sel = s.selected;
    if (sel == kBins) sel = 0;  // unreachable for a good row and a target in range
    if (own && (sel == hi || sel == lo)) {
      s.above_count = sel == hi ? a_hi_k : a_lo_k;
      s.above_exact = sel == hi ? a_hi_x : a_lo_x;
    }
    __syncthreads();
    above_k = s.above_count;
    above_x = s.above_exact;
    prefix |= static_cast<uint32_t>(sel) << shift;
    himask |= digit_mask << shift;
  }
  // Kept sum: the values above the candidates' bin plus the candidates >= the threshold, the
  // latter as an exact significand sum (the list's order follows the gather's atomics, so a
  // float sum over it would change its last bits from run to run). Probabilities only: a
  // logits row (top_k_mask_logits, which keeps no sum) may hold negative keys.
  int64_t part = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x)
    if (s.cand[i] >= prefix) part += scale.significand(s.cand[i]);
  const int64_t before = block_exclusive_scan<int64_t>(part, s.scan_x);
  if (threadIdx.x == blockDim.x - 1) s.above_exact = before + part;
  __syncthreads();
  return Threshold{value_of(prefix), above + scale.to_float(s.above_exact), bad};
}

// The k-th largest value (kMass = false, target = k, 1 <= k < cols) or the top-p threshold
// (kMass = true, target = p in (0, 1)): three passes of 11/11/10 bits over key_of(v), over the
// values whose key is >= floor_key only (the others are neither counted nor kept; the bad-row
// flag still sees every value). src.each(fn) calls fn(value) on every value of this CTA's slice.
// After the first pass, a selected bin of <= kCandidates keys hands the last two digits to
// radix_threshold_on_candidates (the decision is the row's, so the whole cluster takes it).
// Cluster > 1: two cluster barriers per pass. Before the first, each CTA pushes its block-level
// scalars (pass 0: the bad-row flag; last pass: the sum above the final range) into every rank's
// in_* slot; after it, each CTA sums its chunk of kBins / cluster bins over every rank (rank
// order) and pushes the totals into every rank's tot_*; after the second, every CTA reads the
// row's histogram and scalars from its own shared memory (deterministic: no float atomics across
// CTAs; no remote access after the last barrier, so the CTA may exit without another).
template <bool kMass, bool kProbs, typename Src>
__device__ Threshold radix_threshold(const Src& src, float target_p, int target_k, Shared& s,
                                     int cluster, uint32_t floor_key = 0,
                                     bool exact_mass_ok = false) {
  namespace cg = cooperative_groups;
  uint32_t prefix = 0, himask = 0;
  int above_k = 0;
  float above_m = 0.0f;
  bool bad = false;
  float kept_sum = 0.0f;
  // Remote shared memory is written only once every CTA of the cluster runs: the matching wait
  // comes before pass 0's first push, after the first sweep.
  if (cluster > 1) kernels::cluster_arrive_relaxed();
#pragma unroll 1
  for (int pass = 0; pass < 3; ++pass) {
    const int shift = pass == 0 ? 21 : (pass == 1 ? 10 : 0);
    const uint32_t digit_mask = pass == 2 ? 0x3FFu : 0x7FFu;
    // kMass: exact integer histograms (exact_mass_add) when every slice is short enough (the
    // caller's cluster-uniform exact_mass_ok), else fp32 atomics.
    const bool exact = kMass && exact_mass_ok;
    for (int b = threadIdx.x; b < kBins; b += blockDim.x) {
      s.count[b] = 0;
      if (kMass) s.low_sum[b] = 0u;  // also mass[b] = 0.0f
      if (exact && pass == 0) s.hi_sum[b] = 0u;
    }
    __syncthreads();
    float above_local = 0.0f;  // last pass: sum of the values above the final key range
    const bool last = pass == 2;
    // Pass 0 sees every value (the streamed kernels record the groups' largest keys); the later
    // passes only keys >= prefix, those in the range or above it.
    const auto visit = [&](float v) {
      if (kProbs && pass == 0) bad |= bad_prob(v);
      const uint32_t k = key_of(v);
      if (k < floor_key) return;
      if (((k ^ prefix) & himask) == 0) {
        const int bin = static_cast<int>((k >> shift) & digit_mask);
        atomicAdd(&s.count[bin], 1);
        if (exact)
          exact_mass_add(s, pass, bin, k);
        else if (kMass)
          atomicAdd(&s.mass[bin], v);
      } else if (last && (k & himask) > prefix) {
        above_local += v;
      }
    };
    if (pass == 0)
      src.each_first(visit);
    else
      src.each_above(max(floor_key, prefix), visit);
    // Block-level scalars; cluster > 1 combines them with the histograms below.
    if (kProbs && pass == 0) bad = __syncthreads_or(bad);
    if (!kProbs) bad = false;
    float above = last ? kernels::block_sum(above_local, s.red) : 0.0f;
    if (threadIdx.x == 0) s.selected = kBins;
    __syncthreads();
    // Bins in descending order: thread t owns bins hi = kBins-1-2t and lo = hi-1.
    const int hi = kBins - 1 - 2 * static_cast<int>(threadIdx.x), lo = hi - 1;
    const bool own = hi >= 1;
    int c_hi = 0, c_lo = 0;
    float m_hi = 0.0f, m_lo = 0.0f;
    if (cluster == 1) {
      if (own) {
        c_hi = s.count[hi];
        c_lo = s.count[lo];
        if (exact) {
          m_hi = exact_mass(prefix | (static_cast<uint32_t>(hi) << shift), c_hi,
                            pass == 0 ? s.hi_sum[hi] : 0u, s.low_sum[hi]);
          m_lo = exact_mass(prefix | (static_cast<uint32_t>(lo) << shift), c_lo,
                            pass == 0 ? s.hi_sum[lo] : 0u, s.low_sum[lo]);
        } else if (kMass) {
          m_hi = s.mass[hi];
          m_lo = s.mass[lo];
        }
      }
    } else {
      cg::cluster_group cl = cg::this_cluster();
      const int rank = static_cast<int>(cl.block_rank());
      if (pass == 0) kernels::cluster_wait();  // every CTA runs
      if (threadIdx.x < cluster) {
        Shared* dst = cl.map_shared_rank(&s, static_cast<int>(threadIdx.x));
        if (kProbs && pass == 0) dst->in_bad[rank] = bad;
        if (last) dst->in_above[rank] = above;
      }
      cl.sync();  // every CTA's histogram and scalars are complete
      if (kProbs && pass == 0) {
        int any = 0;
        for (int r = 0; r < cluster; ++r) any |= s.in_bad[r];
        bad = any != 0;
      }
      if (last) {
        above = 0.0f;
        for (int r = 0; r < cluster; ++r) above += s.in_above[r];  // rank order
      }
      const int chunk = kBins / cluster;  // cluster: a power of two <= kMaxCluster
      for (int j = threadIdx.x; j < chunk; j += blockDim.x) {
        const int b = rank * chunk + j;
        int c[kMaxCluster];
        uint32_t m[kMaxCluster];  // low_sum (exact) or the bits of mass
#pragma unroll
        for (int r = 0; r < kMaxCluster; ++r) {  // all loads in flight, then summed in rank order
          c[r] = 0;
          m[r] = 0u;
          if (r < cluster) {
            const Shared* remote = cl.map_shared_rank(&s, r);
            c[r] = remote->count[b];
            if (kMass) m[r] = remote->low_sum[b];
          }
        }
        int ct = 0;
        float mt = 0.0f;
        int64_t lt = 0, ht = 0;
#pragma unroll
        for (int r = 0; r < kMaxCluster; ++r) {
          ct += c[r];
          if (exact)
            lt += m[r];
          else if (kMass)
            mt += __uint_as_float(m[r]);
        }
        if (exact && pass == 0) {  // a second round of loads: fewer registers live at once
#pragma unroll
          for (int r = 0; r < kMaxCluster; ++r)
            m[r] = r < cluster ? cl.map_shared_rank(&s, r)->hi_sum[b] : 0u;
#pragma unroll
          for (int r = 0; r < kMaxCluster; ++r) ht += m[r];
        }
        if (exact) mt = exact_mass(prefix | (static_cast<uint32_t>(b) << shift), ct, ht, lt);
        for (int r = 0; r < cluster; ++r) {
          Shared* dst = cl.map_shared_rank(&s, r);
          dst->tot_count[b] = ct;
          if (kMass) dst->tot_mass[b] = mt;
        }
      }
      cl.sync();  // every chunk is summed and pushed (the next pass clears count after this)
      if (own) {
        c_hi = s.tot_count[hi];
        c_lo = s.tot_count[lo];
        if (kMass) {
          m_hi = s.tot_mass[hi];
          m_lo = s.tot_mass[lo];
        }
      }
      // tot_* and in_* are pushed again only after a later pass's (or search's) first cl.sync,
      // which every CTA reaches after these reads.
    }
    int a_hi_k = 0, a_lo_k = 0;
    float a_hi_m = 0.0f, a_lo_m = 0.0f;
    bool cand_hi, cand_lo;
    if (kMass) {
      a_hi_m = above_m + block_exclusive_scan<float>(m_hi + m_lo, s.scan_f);
      a_lo_m = a_hi_m + m_hi;
      cand_hi = c_hi > 0 && a_hi_m < target_p;
      cand_lo = c_lo > 0 && a_lo_m < target_p;
    } else {
      a_hi_k = above_k + block_exclusive_scan<int>(c_hi + c_lo, s.scan_i);
      a_lo_k = a_hi_k + c_hi;
      cand_hi = c_hi > 0 && a_hi_k < target_k;
      cand_lo = c_lo > 0 && a_lo_k < target_k;
    }
    if (own && (cand_lo || cand_hi)) atomicMin(&s.selected, cand_lo ? lo : hi);
    __syncthreads();
    int sel = s.selected;
    if (sel == kBins) sel = 0;  // unreachable for a good row and a target in range
    if (own && (sel == hi || sel == lo)) {
      s.above_count = sel == hi ? a_hi_k : a_lo_k;
      s.above_mass = sel == hi ? a_hi_m : a_lo_m;
      s.selected_count = sel == hi ? c_hi : c_lo;
    }
    __syncthreads();
    if (pass == 0 && s.selected_count <= kCandidates) {  // the row's count: cluster-uniform
      return radix_threshold_on_candidates<kMass>(
          src, target_p, target_k, s, cluster, floor_key, static_cast<uint32_t>(sel) << 21,
          s.selected_count, s.above_count, s.above_mass, bad);
    }
    if (last) {
      // Exact kept sum: values above the final range plus count * value of each kept bin
      // (the bins are the whole row's already: summed over the block only).
      float part = 0.0f;
      if (own) {
        if (hi >= sel && c_hi) part += static_cast<float>(c_hi) * value_of(prefix | hi);
        if (lo >= sel && c_lo) part += static_cast<float>(c_lo) * value_of(prefix | lo);
      }
      kept_sum = above + kernels::block_sum(part, s.red);
    }
    above_k = s.above_count;
    above_m = s.above_mass;
    prefix |= static_cast<uint32_t>(sel) << shift;
    himask |= digit_mask << shift;
    __syncthreads();
  }
  return Threshold{value_of(prefix), kept_sum, bad};
}

// A row (or a CTA's slice of one) as seen by the passes: streamed from global memory each pass, or
// (kCache) read once into shared memory as fp32 and every pass reads that copy.
template <typename T, bool kVec, bool kCache>
struct Src {
  static constexpr bool kCached = kCache;
  const T* g;
  const float* c;
  int64_t len;
  uint32_t* gmax = nullptr;  // streamed, where recorded: each group's largest key (kGroupElems)
  template <typename F>
  __device__ __forceinline__ void each(F&& fn) const {
    if constexpr (kCache) {
      for (int64_t i = threadIdx.x; i < len; i += blockDim.x) fn(c[i]);
    } else {
      for_row<T, kVec>(g, len, fn);
    }
  }
  // each(fn) as the kernel's first sweep: it records gmax (streamed, where recorded).
  template <typename F>
  __device__ __forceinline__ void each_first(F&& fn) const {
    if constexpr (!kCache) {
      if (gmax != nullptr) return for_row_recording<T, kVec>(g, len, gmax, fn);
    }
    each(fn);
  }
  // fn(value) for (at least) every value whose key is >= floor, after each_first.
  template <typename F>
  __device__ __forceinline__ void each_above(uint32_t floor, F&& fn) const {
    if constexpr (!kCache) {
      if (gmax != nullptr) return for_row_above<T, kVec>(g, len, gmax, floor, fn);
    }
    each(fn);
  }
  // map(out, fn), after each_first, where fn(v) is `dropped` for every v whose key is < floor.
  template <typename F>
  __device__ __forceinline__ void map_above(T* out, uint32_t floor, float dropped, F&& fn) const {
    if constexpr (!kCache) {
      if (gmax != nullptr) return map_row_above<T, kVec>(g, out, len, gmax, floor, dropped, fn);
    }
    map(out, fn);
  }
  // out = fn(value) over the slice.
  template <typename F>
  __device__ __forceinline__ void map(T* out, F&& fn) const {
    if constexpr (kCache) {
      constexpr int N = kernels::pack_width<T, kVec>;
      using P = kernels::Pack<T, N>;
      const int64_t step = static_cast<int64_t>(blockDim.x) * N;
      for (int64_t base = static_cast<int64_t>(threadIdx.x) * N; base < len; base += step) {
        float f[N];
#pragma unroll
        for (int j = 0; j < N; ++j) f[j] = fn(c[base + j]);
        P q;
        q.pack(f);
        q.store_stream(out + base);
      }
    } else {
      map_row<T, kVec>(g, out, len, fn);
    }
  }
};

// Copy len values of row (fp32) into the shared cache c; ends with __syncthreads.
template <typename T, bool kVec>
__device__ __forceinline__ void fill_cache(const T* row, float* c, int64_t len) {
  for_row_indexed<T, kVec, true>(row, len, [&](int64_t i, float v) { c[i] = v; });
  __syncthreads();
}

// This CTA's row and slice [start, start + len) of it (cluster > 1: rank = blockIdx.x % cluster).
__device__ __forceinline__ int64_t row_index(const Params& p) { return blockIdx.x / p.cluster; }
__device__ __forceinline__ int64_t slice_start(const Params& p) {
  return static_cast<int64_t>(blockIdx.x % p.cluster) * p.slice;
}
__device__ __forceinline__ int64_t slice_len(const Params& p) {
  const int64_t left = p.cols - slice_start(p);
  return left < 0 ? 0 : (left < p.slice ? left : p.slice);
}
template <typename T>
__device__ __forceinline__ const T* row_in(const Params& p) {
  return static_cast<const T*>(p.x) + row_index(p) * p.x_stride + slice_start(p);
}
template <typename T>
__device__ __forceinline__ T* row_out(const Params& p) {
  return static_cast<T*>(p.out) + row_index(p) * p.out_stride + slice_start(p);
}

// The dynamic shared cache of the kCache kernels (p.slice fp32 values).
extern __shared__ float4 filters_cache_[];

template <typename T, bool kVec, bool kCache>
__device__ __forceinline__ Src<T, kVec, kCache> make_src(const Params& p) {
  Src<T, kVec, kCache> src{row_in<T>(p), reinterpret_cast<const float*>(filters_cache_),
                           slice_len(p)};
  if constexpr (kCache)
    fill_cache<T, kVec>(src.g, reinterpret_cast<float*>(filters_cache_), src.len);
  else if (p.record)
    src.gmax = reinterpret_cast<uint32_t*>(filters_cache_);
  return src;
}

__device__ __forceinline__ float float_param(const Params& p) {
  return p.param_kind == kFloat32 ? static_cast<const float*>(p.param)[row_index(p)]
                                  : static_cast<float>(p.value);
}
__device__ __forceinline__ int64_t int_param(const Params& p) {
  if (p.param_kind == kInt32) return static_cast<const int32_t*>(p.param)[row_index(p)];
  if (p.param_kind == kInt64) return static_cast<const int64_t*>(p.param)[row_index(p)];
  return static_cast<int64_t>(p.value);
}

// The renorm write: bad -> NaN; kept -> v / sum (0 when sum < 1e-8); dropped -> 0.
template <typename S>
__device__ __forceinline__ void write_renorm(const Params& p, const S& src, float thr, float sum,
                                             bool bad) {
  using T = std::remove_const_t<std::remove_pointer_t<decltype(src.g)>>;
  bad = bad || !(sum < INFINITY);
  const bool tiny = sum < kMinSum;
  if (S::kCached) {  // one loop over the shared copy (the cached kernels' code as it was)
    src.map(row_out<T>(p), [&](float v) {
      if (bad) return NAN;
      return (v >= thr && !tiny) ? v / sum : 0.0f;
    });
    return;
  }
  if (bad || tiny) {
    src.map(row_out<T>(p), [&](float) { return bad ? NAN : 0.0f; });
    return;
  }
  // A good row holds no NaN: key_of(v) < key_of(thr) iff v < thr.
  src.map_above(row_out<T>(p), key_of(thr), 0.0f,
                [&](float v) { return v >= thr ? v / sum : 0.0f; });
}

// Sum of the values >= thr and the bad flag, as the kernel's first sweep.
template <typename S>
__device__ __forceinline__ float kept_sum_pass(const Params& p, const S& src, float thr, bool& bad,
                                               Shared& s) {
  float part = 0.0f;
  bool b = false;
  src.each_first([&](float v) {
    b |= bad_prob(v);
    if (v >= thr) part += v;
  });
  bad = row_or(b, s, p.cluster);
  return row_sum(part, s, p.cluster);
}

// Sum of the values >= thr after the first sweep (thr not NaN; every value >= thr is visited,
// in each thread's order, so the sum's bits do not depend on the groups skipped).
template <typename S>
__device__ __forceinline__ float kept_sum_above(const Params& p, const S& src, float thr,
                                                Shared& s) {
  float part = 0.0f;
  src.each_above(key_of(thr), [&](float v) {
    if (v >= thr) part += v;
  });
  return row_sum(part, s, p.cluster);
}

// The bad-row flag and the maximum, as the kernel's first sweep.
template <typename S>
__device__ __forceinline__ float bad_and_max(const Params& p, const S& src, bool& bad, Shared& s) {
  float mx = -INFINITY;
  bool b = false;
  src.each_first([&](float v) {
    b |= bad_prob(v);
    mx = fmaxf(mx, v);
  });
  bad = row_or(b, s, p.cluster);
  return row_max(mx, s, p.cluster);
}

template <typename T, bool kVec, bool kCache>
__global__ void __launch_bounds__(kThreads) min_p_kernel(bool, Params p) {
  __shared__ Shared s;
  const auto src = make_src<T, kVec, kCache>(p);
  bool bad;
  const float mx = fmaxf(bad_and_max(p, src, bad, s), 0.0f);
  const float mp = float_param(p);
  const bool bad_param = !(mp >= 0.0f && mp <= 1.0f);
  const float thr = mp * mx;
  const float sum = kept_sum_above(p, src, thr, s);
  write_renorm(p, src, thr, sum, bad || bad_param);
}

template <typename T, bool kVec, bool kCache>
__global__ void __launch_bounds__(kThreads) top_k_renorm_kernel(bool, Params p) {
  __shared__ Shared s;
  const auto src = make_src<T, kVec, kCache>(p);
  const int64_t k = int_param(p);
  if (k <= 0 || k >= p.cols) {
    bool bad;
    const float sum = kept_sum_pass(p, src, -INFINITY, bad, s);
    write_renorm(p, src, -INFINITY, sum, bad);
    return;
  }
  const Threshold t =
      radix_threshold<false, true>(src, 0.0f, static_cast<int>(k), s, p.cluster);
  write_renorm(p, src, t.value, t.kept_sum, t.bad);
}

template <typename T, bool kVec, bool kCache>
__global__ void __launch_bounds__(kThreads) top_p_renorm_kernel(bool, Params p) {
  __shared__ Shared s;
  const auto src = make_src<T, kVec, kCache>(p);
  const float tp = float_param(p);
  if (tp != tp) {  // a NaN top_p: the row is invalid
    src.map(row_out<T>(p), [](float) { return NAN; });
    return;
  }
  if (tp >= 1.0f || tp <= 0.0f) {
    // One pass for the bad-row flag and the maximum (as min_p), then the kept sum: tp is the
    // row's, so every CTA of the row's cluster takes the same branches.
    bool bad;
    const float mx = bad_and_max(p, src, bad, s);
    const float thr = tp <= 0.0f ? mx : -INFINITY;  // the argmax set, or the whole row
    const float sum = kept_sum_above(p, src, thr, s);
    write_renorm(p, src, thr, sum, bad);
    return;
  }
  const Threshold t =
      radix_threshold<true, true>(src, tp, 0, s, p.cluster, 0u,
                                  kCache || p.slice <= kExactMassSlice);  // cached: always
  write_renorm(p, src, t.value, t.kept_sum, t.bad);
}

template <typename T, bool kVec, bool kCache>
__global__ void __launch_bounds__(kThreads) top_k_mask_kernel(bool, Params p) {
  __shared__ Shared s;
  const auto src = make_src<T, kVec, kCache>(p);
  const int64_t k = int_param(p);
  float thr = -INFINITY;
  bool keep_all = k <= 0 || k >= p.cols;
  if (!keep_all)
    thr = radix_threshold<false, false>(src, 0.0f, static_cast<int>(k), s, p.cluster).value;
  if (kCache || keep_all) {
    src.map(row_out<T>(p), [&](float v) { return (keep_all || v >= thr) ? v : -INFINITY; });
    return;
  }
  // key_of(v) < key_of(thr) iff v < thr (a NaN v has the largest key: never skipped; a NaN thr
  // drops every value).
  src.map_above(row_out<T>(p), key_of(thr), -INFINITY,
                [&](float v) { return v >= thr ? v : -INFINITY; });
}

using KernelFn = void (*)(bool, Params);

template <typename T, bool kVec, bool kCache>
KernelFn kernel_for(int mode) {
  switch (mode) {
    case kMinP: return min_p_kernel<T, kVec, kCache>;
    case kTopK: return top_k_renorm_kernel<T, kVec, kCache>;
    case kTopP: return top_p_renorm_kernel<T, kVec, kCache>;
    default: return top_k_mask_kernel<T, kVec, kCache>;
  }
}

// Launch shape, chosen per call by choose_shape (one function for the filters and the draws):
//  - cached: a row over a thread-block cluster of `cluster` CTAs (a power of two up to
//    kMaxCluster = 16, a non-portable size Hopper allows), each slice (<= kCacheBytes as fp32)
//    read from global memory once into dynamic shared memory, every pass reading that copy. Small
//    batches: more CTAs per row (slices >= kMinCachedSlice) while rows * cluster * 2 <= SMs.
//  - streamed: one CTA per row, or for small batches a portable cluster of up to
//    `max_streamed` CTAs (slices >= kMinStreamedSlice), the row read from global memory (mostly
//    L2) every pass.
// The cached shape is taken only when every row's cluster is resident at once (rows <=
// cudaOccupancyMaxActiveClusters): one wave. Measured on the H200 at V = 128256 fp32 with the
// cached shape for every batch (b226898): B = 1 ran 1.4-3.5x faster (top_k_renorm 34.3 -> 24.7
// us, top_p 65.3 -> 34.6, top_k_mask 30.5 -> 16.7, top_k_top_p_sampling 229 -> 65.2), while
// B >= 128 ran 1.4-3.5x slower (top_k_renorm B = 128 91.5 -> 184.0, sampling_from_probs B = 256
// 66.8 -> 236.6): there 4 CTAs per row of 128 KiB each fit one per SM, so 512-1024 CTAs ran in
// 4-8 serial waves, each paying its HBM fill and on-chip passes, where the streamed kernels run
// one wave whose re-reads hit L2. At V = 128256 fp32 the cached shape therefore serves B <= ~33
// (4 CTAs per row, 132 SMs) and the streamed kernels everything larger.
constexpr int64_t kMinCachedSlice = 2048;
constexpr int64_t kMinStreamedSlice = 4096;
constexpr int kCacheBytes = 160 * 1024;
// A cached slice always takes the exact bin masses (the kernels pass kCache as the flag).
static_assert(kCacheBytes / 4 <= kExactMassSlice);

struct Shape {
  int cluster;
  bool cache;
  int64_t slice;
  size_t streamed_smem = 0;  // dynamic shared memory of a streamed launch (the group record)
};

// The streamed filters keep the group record (4 bytes per kGroupElems values of a slice: 4 KB at
// V = 128256 fp32 in one CTA) up to this size, else every pass reads the whole slice.
constexpr int64_t kMaxRecordBytes = 32 * 1024;

// Test hook (exported by both modules): -1 lets choose_shape decide, 0 forces the streamed
// kernels, 1 the cached ones (where a slice of at most 16 fits the cache). Per module (modules
// compile with -fno-gnu-unique).
inline int& forced_path() {
  static int path = -1;
  return path;
}
inline void force_path(int64_t path) {
  TVM_FFI_CHECK(path >= -1 && path <= 1, ValueError)
      << "sampling: force_path takes -1 (auto), 0 (streamed) or 1 (cached), got " << path;
  forced_path() = static_cast<int>(path);
}

inline int64_t slice_for(int64_t cols, int cluster, int64_t n) {
  const int64_t per = (cols + cluster - 1) / cluster;
  return (per + n - 1) / n * n;  // slices start on whole packs
}

// CTAs per row that a batch of `rows` leaves room for: doubled up to max_cluster while the grid
// is under half the SMs and every slice keeps min_slice elements.
inline int batch_cluster(int device, int64_t rows, int64_t cols, int max_cluster,
                         int64_t min_slice) {
  const int64_t sms = kernels::sm_count(device);
  int c = 1;
  while (c < max_cluster && rows * c * 2 <= sms && cols >= 2 * c * min_slice) c *= 2;
  return c;
}

// Clusters of `cluster` CTAs of `kernel` (`smem` dynamic bytes) resident at once (0: none fit,
// or the query was refused), cached per (kernel, device, cluster, smem). The first query of a
// cached kernel on a device opts it into non-portable cluster sizes and the shared cache; the
// streamed kernels (portable sizes, static shared memory alone) are queried as they launch.
inline int active_clusters(const void* kernel, int device, int cluster, int smem,
                           bool opt_in = true) {
  static std::mutex mu;
  static std::map<std::tuple<const void*, int, int, int>, int> memo;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_tuple(kernel, device, cluster, smem);
  const auto it = memo.find(key);
  if (it != memo.end()) return it->second;
  int active = 0;
  if (!opt_in ||
      (cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) ==
           cudaSuccess &&
       cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kCacheBytes) ==
           cudaSuccess)) {
    const kernels::LaunchConfig query(dim3(static_cast<unsigned>(cluster)), dim3(kThreads),
                                      static_cast<size_t>(smem), nullptr, false,
                                      static_cast<unsigned>(cluster));
    if (cudaOccupancyMaxActiveClusters(&active, kernel, &query.config) != cudaSuccess) active = 0;
  }
  (void)cudaGetLastError();  // a refused query or opt-in leaves no error behind
  memo[key] = active;
  return active;
}

// The shape for `rows` rows of `cols` elements in packs of n, given the cached and streamed
// kernels; the streamed kernels take clusters of at most max_streamed CTAs (filters 8, draws 1:
// `streamed` may be null there), halved while the batch's clusters are not all resident at once
// (the GPCs hold whole clusters: 132 SMs need not keep 16 clusters of 8, and a 16th cluster
// that waits for a free GPC doubles the call; min_p B 16 on the H200 took 24.9 us to B 1's
// 11.5 with the same CTAs per row, 2026-12-04). `caches`:
// whether the op's automatic choice may take the cached shape. Only the radix selects (top_k,
// top_p, top_k_mask, the top-k/top-p draw: 3+ passes over the row) gain from it; min_p and the
// plain draw read the row twice, mostly from L2, and were slower cached at B = 1 on the H200
// (2026-12-04, V = 128256: min_p 11.9 -> 14.2 us, sampling_from_probs 17.9 -> 25.4 us). The
// test hook still forces either shape for every op (one kernel body, kCache a parameter).
inline Shape choose_shape(const void* cached, const void* streamed, int device, int64_t rows,
                          int64_t cols, int64_t n, int max_streamed, bool caches) {
  const int force = forced_path();
  if (force == 1 || (force == -1 && caches)) {
    int fit = 1;  // CTAs per row for a slice to fit the cache
    while (fit <= kMaxCluster && slice_for(cols, fit, n) * 4 > kCacheBytes) fit *= 2;
    const int par = batch_cluster(device, rows, cols, kMaxCluster, kMinCachedSlice);
    for (int c = fit > par ? fit : par; c >= fit && fit <= kMaxCluster; c /= 2) {
      const int64_t slice = slice_for(cols, c, n);
      const int active = active_clusters(cached, device, c, static_cast<int>(slice * 4));
      if (force == 1 ? active > 0 : rows <= active) return Shape{c, true, slice};
    }
  }
  int c = batch_cluster(device, rows, cols, max_streamed, kMinStreamedSlice);
  while (c > 1) {
    const int active = active_clusters(streamed, device, c, 0, false);
    if (active == 0 || rows <= active) break;  // a refused query keeps the size
    c /= 2;
  }
  return Shape{c, false, slice_for(cols, c, n)};
}

// Opts a streamed kernel into kMaxRecordBytes of dynamic shared memory for the group record (its
// static Shared leaves ~2 KB of the default 48 KB per block), once per kernel and device; false
// where refused (the passes then read whole slices).
inline bool allow_record(const void* kernel, int device) {
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, bool> memo;
  std::lock_guard<std::mutex> lock(mu);
  const auto key = std::make_pair(kernel, device);
  const auto it = memo.find(key);
  if (it != memo.end()) return it->second;
  const bool ok = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                       static_cast<int>(kMaxRecordBytes)) == cudaSuccess;
  (void)cudaGetLastError();
  memo[key] = ok;
  return ok;
}

// The launch of a shape: kernel(args...) over rows clusters of shape.cluster CTAs (the cached
// kernel with its slice of dynamic shared memory). Shared with sampling_draw.cuh.
template <typename... Params, typename... Args>
void launch_shape(const kernels::Launch& ctx, const Shape& shape, int64_t rows,
                  void (*kernel)(Params...), Args&&... args) {
  // gridDim.x takes up to 2^31 - 1.
  TVM_FFI_CHECK(rows * shape.cluster < (int64_t{1} << 31), ValueError)
      << ctx.op << ": the CUDA kernel takes B < 2^31 / " << shape.cluster << " rows, got " << rows;
  kernels::LaunchConfig config(dim3(static_cast<unsigned>(rows * shape.cluster)), dim3(kThreads),
                               shape.cache ? static_cast<size_t>(shape.slice * 4)
                                           : shape.streamed_smem,
                               ctx.stream, false, static_cast<unsigned>(shape.cluster));
  kernels::check_launch(ctx.op, config.launch(kernel, std::forward<Args>(args)...));
}

template <typename T>
bool vectorizable(const Params& p) {
  constexpr int64_t N = kernels::kVectorBytes / sizeof(T);
  return p.cols % N == 0 && p.x_stride % N == 0 && p.out_stride % N == 0 &&
         kernels::is_aligned(p.x) && kernels::is_aligned(p.out);
}

template <typename T, bool kVec>
Shape shape_for(int mode, int device, int64_t rows, int64_t cols) {
  return choose_shape(reinterpret_cast<const void*>(kernel_for<T, kVec, true>(mode)),
                      reinterpret_cast<const void*>(kernel_for<T, kVec, false>(mode)), device,
                      rows, cols, kernels::pack_width<T, kVec>, kMaxStreamedCluster,
                      mode != kMinP);
}

template <typename T, bool kVec>
void launch_vec(const kernels::Launch& ctx, int mode, int64_t rows, Params p) {
  Shape shape = shape_for<T, kVec>(mode, ctx.device, rows, p.cols);
  p.cluster = shape.cluster;
  p.slice = shape.slice;
  const int64_t record = (shape.slice + kGroupElems<T, kVec> - 1) / kGroupElems<T, kVec> * 4;
  p.record = !shape.cache && record <= kMaxRecordBytes &&
             allow_record(reinterpret_cast<const void*>(kernel_for<T, kVec, false>(mode)),
                          ctx.device);
  if (p.record) shape.streamed_smem = static_cast<size_t>(record);
  launch_shape(ctx, shape, rows,
               shape.cache ? kernel_for<T, kVec, true>(mode) : kernel_for<T, kVec, false>(mode),
               false, p);
}

template <typename T>
void launch(const kernels::Launch& ctx, int mode, int64_t rows, Params p) {
  if (vectorizable<T>(p))
    launch_vec<T, true>(ctx, mode, rows, p);
  else
    launch_vec<T, false>(ctx, mode, rows, p);
}

inline void run(const char* op, int mode, tvm::ffi::TensorView out, tvm::ffi::TensorView x,
                tvm::ffi::Optional<tvm::ffi::TensorView> param, double value) {
  const char* xname = mode == kMaskTopK ? "logits" : "probs";
  const char* pname = mode == kMinP ? "min_p" : (mode == kTopP ? "top_p" : "top_k");
  // 1. Validate.
  kernels::check_ndim(op, xname, x, 2);
  kernels::check_ndim(op, "out", out, 2);
  kernels::check_same_shape(op, "out", out, xname, x);
  kernels::check_same_dtype(op, "out", out, xname, x);
  kernels::check_last_dim_contiguous(op, xname, x);
  kernels::check_last_dim_contiguous(op, "out", out);
  kernels::check_device(op, xname, x, kDLCUDA);
  kernels::check_same_device(op, "out", out, xname, x);
  const int64_t rows = x.size(0), cols = x.size(1);
  TVM_FFI_CHECK(rows < (int64_t{1} << 31), ValueError)
      << op << ": the CUDA kernel takes B < 2^31 rows, got " << rows;
  Params p{};
  p.value = value;
  p.param_kind = kNone;
  p.cluster = 1;
  if (param.has_value()) {
    const tvm::ffi::TensorView t = param.value();
    kernels::check_ndim(op, pname, t, 1);
    TVM_FFI_CHECK(t.size(0) == rows, ValueError)
        << op << ": " << pname << " must have shape (" << rows << ",), got "
        << kernels::shape_string(t);
    kernels::check_contiguous(op, pname, t);
    kernels::check_same_device(op, pname, t, xname, x);
    if (mode == kMinP || mode == kTopP) {
      TVM_FFI_CHECK(kernels::is_dtype(t.dtype(), kDLFloat, 32), TypeError)
          << op << ": " << pname << " must be float32";
      p.param_kind = kFloat32;
    } else if (kernels::is_dtype(t.dtype(), kDLInt, 32)) {
      p.param_kind = kInt32;
    } else {
      TVM_FFI_CHECK(kernels::is_dtype(t.dtype(), kDLInt, 64), TypeError)
          << op << ": " << pname << " must be int32 or int64";
      p.param_kind = kInt64;
    }
    p.param = kernels::data<const void>(t);
  }
  if (rows == 0 || cols == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  const kernels::Launch ctx(op, x);
  // 4. Dispatch on dtype and launch.
  p.x = kernels::data<const void>(x);
  p.out = kernels::data<void>(out);
  p.x_stride = x.stride(0);
  p.out_stride = out.stride(0);
  p.cols = cols;
  KERNELS_DISPATCH_FLOAT(x.dtype(), op, T, [&] { launch<T>(ctx, mode, rows, p); });
}

}  // namespace sampling_filters_detail

inline void min_p_renorm_probs(tvm::ffi::TensorView out, tvm::ffi::TensorView probs,
                               tvm::ffi::Optional<tvm::ffi::TensorView> min_p_arr,
                               double min_p_val) {
  namespace d = sampling_filters_detail;
  d::run("sampling.min_p_renorm_probs", d::kMinP, out, probs, min_p_arr, min_p_val);
}

inline void top_k_renorm_probs(tvm::ffi::TensorView out, tvm::ffi::TensorView probs,
                               tvm::ffi::Optional<tvm::ffi::TensorView> top_k_arr,
                               int64_t top_k_val) {
  namespace d = sampling_filters_detail;
  d::run("sampling.top_k_renorm_probs", d::kTopK, out, probs, top_k_arr,
         static_cast<double>(top_k_val));
}

inline void top_p_renorm_probs(tvm::ffi::TensorView out, tvm::ffi::TensorView probs,
                               tvm::ffi::Optional<tvm::ffi::TensorView> top_p_arr,
                               double top_p_val) {
  namespace d = sampling_filters_detail;
  d::run("sampling.top_p_renorm_probs", d::kTopP, out, probs, top_p_arr, top_p_val);
}

inline void top_k_mask_logits(tvm::ffi::TensorView out, tvm::ffi::TensorView logits,
                              tvm::ffi::Optional<tvm::ffi::TensorView> top_k_arr,
                              int64_t top_k_val) {
  namespace d = sampling_filters_detail;
  d::run("sampling.top_k_mask_logits", d::kMaskTopK, out, logits, top_k_arr,
         static_cast<double>(top_k_val));
}

// Test hooks. sampling_filters_path: the path a call of `mode` (0 min_p, 1 top_k, 2 top_p,
// 3 top_k_mask) on x (and an output laid out like it) takes: the cached cluster size, or minus
// the streamed one (-1: one CTA per row). sampling_force_path: see
// sampling_filters_detail::force_path.
inline int64_t sampling_filters_path(tvm::ffi::TensorView x, int64_t mode) {
  namespace d = sampling_filters_detail;
  constexpr const char* kOp = "sampling.filters_path";
  kernels::check_ndim(kOp, "x", x, 2);
  kernels::check_device(kOp, "x", x, kDLCUDA);
  TVM_FFI_CHECK(mode >= d::kMinP && mode <= d::kMaskTopK, ValueError)
      << kOp << ": mode must be 0-3, got " << mode;
  kernels::DeviceGuard guard(x);
  d::Params p{};
  p.x = kernels::data<const void>(x);
  p.out = kernels::data<void>(x);  // an output laid out like x
  p.x_stride = p.out_stride = x.stride(0);
  p.cols = x.size(1);
  const int device = x.device().device_id;
  d::Shape shape{};
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T, [&] {
    shape = d::vectorizable<T>(p)
                ? d::shape_for<T, true>(static_cast<int>(mode), device, x.size(0), p.cols)
                : d::shape_for<T, false>(static_cast<int>(mode), device, x.size(0), p.cols);
  });
  return shape.cache ? shape.cluster : -shape.cluster;
}

inline void sampling_force_path(int64_t path) { sampling_filters_detail::force_path(path); }
