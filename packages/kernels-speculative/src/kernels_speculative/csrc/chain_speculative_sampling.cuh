// speculative.chain_speculative_sampling, CUDA: a thread-block cluster of C CTAs (1024 threads
// each, C = 1..8) per request, each CTA over one slice of the vocabulary.
//   1. Every CTA decides the drafts (threads i < n, scalars only): u_i = U(seed, offset, b, i)
//      (the project RNG, bit for bit with kernels_jit.rng), accept iff u_i * q < p (fp32,
//      strict); the first rejection r and the independent accepted count come from shared
//      atomics. The seed, offset and draft ids load together, then p and q, before the first
//      barrier (two memory latencies ahead of the pass, not three). Only p[r] and q[r] are
//      needed before any full-row read, so ONE pass over the vocabulary follows: target row r
//      and draft row r (or target row n when every draft was accepted).
//   2. The pass: each CTA reads its slice once, in tiles of 16 elements per thread (four 16-byte
//      fp32 loads of each row in flight, coalesced), for the slice sums of relu(t - d) and of t
//      and the last positive index of each; each warp records its share of every tile's weight
//      sum (the first kRecordedTiles tiles) in shared memory; the last tile stays in registers
//      (the whole slice at V = 128256, C = 8) and the weights of up to kStoredTiles earlier ones
//      in dynamic shared memory (64 KiB each: C = 4 at B = 32 keeps tile 0, C = 2 tiles 0-2).
//   3. The slice sums go through distributed shared memory: every CTA adds them in rank order
//      (identical bits everywhere), picks the weights (the residual when its mass is > 0, else
//      the target row), the threshold u * total with U(seed, offset, b, n), and the one slice k
//      whose running prefix P_k <= threshold < P_k+1.
//   4. That CTA alone finds the tile that holds the draw from the recorded tile sums (no memory
//      read), then block-scans that tile in vocabulary order, from registers when it is the last
//      one, from shared memory when it is a stored one, else re-read once (mostly from L2),
//      for the smallest j whose running sum exceeds the threshold on a positive weight
//      (walking on to later tiles if rounding leaves none); the slice's (else the row's) last
//      positive index when rounding leaves none at all; 0 for a zero or NaN total. Before, the
//      draw re-read the slice tile by tile from its start (up to 8 dependent tile reads at
//      C = 1). The stored tiles take the draw's L2 re-read (128 KiB of
//      fp32 rows by one SM, after the cluster barrier: predicted ~1 us of tail, which the worst of
//      32 clusters at B = 32 pays almost surely) off the critical path; the occupancy counts are
//      taken with the most dynamic shared memory (1 CTA per SM either way).
// C (host, cluster_for): the largest C <= 8 whose clusters hold the whole batch in ONE wave
// (B <= the resident clusters of C CTAs, as the occupancy API counts them: clusters live inside
// one GPC, so a GPU whose GPCs' SM counts are not multiples of C holds fewer than SMs / C),
// keeping slices of >= kMinSlice elements; C need not be a power of two. The earlier rule
// (powers of two while B * C <= SMs) launched e.g. B = 32 as 32 clusters of 4 on 132 SMs, a
// second wave whenever some GPC's SM count is not a multiple of 4 (B = 32 was at 36% of copy,
// about two one-wave runs; with this rule and the recorded tile sums, H200 2026-12-04: B = 32
// 21.2 -> 15.9 us, B = 64 26.8 -> 20.8 us; the stored tiles above are not yet timed).
// Sums run in a different order from torch's cumsum (and from the one-CTA kernel before this
// one), so a draw whose threshold falls within rounding of a CDF boundary may differ from the
// reference (probability ~1e-7 per draw); every accept / reject decision is exact. A draft id
// outside [0, V) counts as rejected (the reference raises).
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(7);

#include <kernels/cluster.cuh>
#include <kernels/cuda_dtype.cuh>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>

#include <cooperative_groups.h>

#include <type_traits>

#include "speculative_common.cuh"

namespace chain_speculative_sampling_detail {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
constexpr int kPer = 16;  // elements per thread and tile
constexpr int kTile = kThreads * kPer;
constexpr int kMaxCluster = 8;
constexpr int64_t kMinSlice = 4096;  // a cluster of C CTAs needs V >= C * kMinSlice
constexpr int kRecordedTiles = 16;   // tiles per slice whose sums the pass records (the draw's map)
constexpr int kStoredTiles = 3;      // tiles per slice whose weights stay in shared memory
constexpr int kStoredBytes = kStoredTiles * kTile * static_cast<int>(sizeof(float));  // 192 KiB
constexpr int kNone = 0x7fffffff;
constexpr const char* kOp = "speculative.chain_speculative_sampling";  // for errors

template <typename T>
struct Params {
  int32_t* out;  // [B, n+1] contiguous
  int32_t* accepted;
  int64_t accepted_s;
  int32_t* emitted;
  int64_t emitted_s;
  const T* draft;  // [B, n, V], last dim contiguous
  int64_t d_s0, d_s1;
  const T* target;  // [B, n+1, V], last dim contiguous
  int64_t t_s0, t_s1;
  speculative_detail::IndexRef ids, seed, offset;
  int64_t n, vocab;
  int cluster;    // CTAs per request, 1..kMaxCluster (a thread-block cluster when > 1)
  int64_t slice;  // elements per CTA (a multiple of the pack width)
  int stored;     // leading tiles of a slice whose weights stay in shared memory (<= kStoredTiles)
};

// What a CTA publishes to its cluster: its slice's sums and last positive indices.
struct Partial {
  float sum_res, sum_t;
  int last_res, last_t;
};

// The sums and maxima of v over the 32 lanes of a warp (xor butterfly: every lane gets them).
__device__ __forceinline__ Partial warp_reduce(Partial v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    v.sum_res += __shfl_xor_sync(0xffffffffu, v.sum_res, o);
    v.sum_t += __shfl_xor_sync(0xffffffffu, v.sum_t, o);
    v.last_res = max(v.last_res, __shfl_xor_sync(0xffffffffu, v.last_res, o));
    v.last_t = max(v.last_t, __shfl_xor_sync(0xffffffffu, v.last_t, o));
  }
  return v;
}

// The sum of v over the 32 lanes of a warp (xor butterfly: every lane gets the same bits).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

template <typename T, int N>
__device__ __forceinline__ void load(const T* p, int64_t j, float (&v)[N]) {
  if constexpr (N == 4 && sizeof(T) == 4) {
    const float4 x = *reinterpret_cast<const float4*>(p + j);
    v[0] = x.x;
    v[1] = x.y;
    v[2] = x.z;
    v[3] = x.w;
  } else if constexpr (N == 4 && sizeof(T) == 2) {
    const uint2 x = *reinterpret_cast<const uint2*>(p + j);
    const T* h = reinterpret_cast<const T*>(&x);
#pragma unroll
    for (int k = 0; k < 4; ++k) v[k] = kernels::to_float(h[k]);
  } else {
#pragma unroll
    for (int k = 0; k < N; ++k) v[k] = kernels::to_float(p[j + k]);
  }
}

// relu(t - d) (the residual) or t.
__device__ __forceinline__ float weight(float t, float d, bool residual) {
  if (!residual) return t;
  const float r = __fsub_rn(t, d);
  return r > 0.f ? r : 0.f;
}

// The tile of this thread: packs u = 0..U-1 at base + (u * kThreads + tid) * N (coalesced), in
// vocabulary order u-major; zeros at or past `end` (a multiple of N). `t` gets the target values
// and `w` the weights (relu(t - d) when `residual`, else t).
template <typename T, int N>
__device__ __forceinline__ void load_tile(const T* trow, const T* drow, bool residual,
                                          int64_t base, int64_t end, float (&t)[kPer / N][N],
                                          float (&w)[kPer / N][N]) {
  constexpr int U = kPer / N;
  float d[U][N];
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const int64_t j = base + (static_cast<int64_t>(u) * kThreads + threadIdx.x) * N;
#pragma unroll
    for (int k = 0; k < N; ++k) t[u][k] = d[u][k] = 0.f;
    if (j < end) {  // end is a multiple of N: whole packs only
      load<T, N>(trow, j, t[u]);
      if (residual) load<T, N>(drow, j, d[u]);
    }
  }
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int k = 0; k < N; ++k) w[u][k] = weight(t[u][k], d[u][k], residual);
}

// A tile's weights (laid out as load_tile's) to or from shared memory: pack u of thread tid at
// ((u * kThreads) + tid) * N, so a warp's 16-byte accesses are contiguous (no bank conflicts).
template <int N>
__device__ __forceinline__ void store_tile(float* tile, const float (&w)[kPer / N][N]) {
#pragma unroll
  for (int u = 0; u < kPer / N; ++u) {
    float* at = tile + (u * kThreads + threadIdx.x) * N;
    if constexpr (N == 4)
      *reinterpret_cast<float4*>(at) = make_float4(w[u][0], w[u][1], w[u][2], w[u][3]);
    else
#pragma unroll
      for (int k = 0; k < N; ++k) at[k] = w[u][k];
  }
}

template <int N>
__device__ __forceinline__ void read_tile(const float* tile, float (&w)[kPer / N][N]) {
#pragma unroll
  for (int u = 0; u < kPer / N; ++u) {
    const float* at = tile + (u * kThreads + threadIdx.x) * N;
    if constexpr (N == 4) {
      const float4 x = *reinterpret_cast<const float4*>(at);
      w[u][0] = x.x;
      w[u][1] = x.y;
      w[u][2] = x.z;
      w[u][3] = x.w;
    } else {
#pragma unroll
      for (int k = 0; k < N; ++k) w[u][k] = at[k];
    }
  }
}

struct Shared {
  float scan[kPer][kWarps];  // up to kPer pack columns per block scan
  float tile_sums[kRecordedTiles][kWarps];  // each warp's share of each tile's weight sum
  Partial red[kWarps];  // each warp's sums and last indices
  Partial part;   // this CTA's, read by the cluster
  int reject, count, token;
  int winner;     // the slice holding the draw, -1 for none
  int residual;   // the weights are relu(t - d)
  int last;       // the row's last positive weight, -1 for none
  int start;      // the tile of the slice where the drawing CTA starts its search
  float carry;    // the running sum before this CTA's slice (then before tile `start`)
  float threshold;
};

// Searches one tile (weights w, laid out as load_tile's) for the smallest index whose running sum
// (from `carry`) exceeds `threshold` on a positive weight; records it in s.token (atomicMin).
// Returns the tile's total (for the next tile's carry). Every thread of the CTA calls it.
template <int N>
__device__ __forceinline__ float search_tile(const float (&w)[kPer / N][N], int64_t base,
                                             float carry, float threshold, Shared& s) {
  constexpr int U = kPer / N;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  float inc[U];  // this thread's pack sums, then their inclusive warp scans, then run starts
#pragma unroll
  for (int u = 0; u < U; ++u) {
    inc[u] = 0.f;
#pragma unroll
    for (int k = 0; k < N; ++k) inc[u] += w[u][k];
  }
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const float y = __shfl_up_sync(0xffffffffu, inc[u], o);
      if (lane >= o) inc[u] += y;
    }
  }
  __syncthreads();  // s.scan is free (an earlier tile's readers are done)
  if (lane == 31) {
#pragma unroll
    for (int u = 0; u < U; ++u) s.scan[u][warp] = inc[u];
  }
  __syncthreads();
  float before = 0.f;  // the totals of the pack columns u' < u
#pragma unroll
  for (int u = 0; u < U; ++u) {
    const float ws = s.scan[u][lane];  // kWarps == 32: one warp total per lane
    float winc = ws;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const float y = __shfl_up_sync(0xffffffffu, winc, o);
      if (lane >= o) winc += y;
    }
    const float column = __shfl_sync(0xffffffffu, winc, 31);
    const float warp_prefix = __shfl_sync(0xffffffffu, winc - ws, warp);
    float x = 0.f;
#pragma unroll
    for (int k = 0; k < N; ++k) x += w[u][k];
    inc[u] = carry + before + warp_prefix + (inc[u] - x);  // where this pack's run starts
    before += column;
  }
  if (carry + before > threshold) {  // uniform: the crossing is in this tile (up to rounding)
#pragma unroll
    for (int u = 0; u < U; ++u) {
      float run = inc[u];
      const int64_t j = base + (static_cast<int64_t>(u) * kThreads + threadIdx.x) * N;
#pragma unroll
      for (int k = 0; k < N; ++k) {
        run += w[u][k];
        if (w[u][k] > 0.f && run > threshold) {
          atomicMin(&s.token, static_cast<int>(j + k));
          break;
        }
      }
    }
  }
  __syncthreads();
  return before;
}

template <typename T, int N>
__global__ void __launch_bounds__(kThreads) chain_kernel(bool pdl, Params<T> p) {
  namespace cg = cooperative_groups;
  constexpr int U = kPer / N;
  __shared__ Shared s;
  extern __shared__ float4 stored_raw[];  // p.stored tiles of weights (p.stored * kTile floats)
  float* const stored = reinterpret_cast<float*>(stored_raw);
  const int cluster = p.cluster;
  const int rank = static_cast<int>(blockIdx.x % cluster);
  const int64_t b = blockIdx.x / cluster;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  if (pdl) kernels::pdl_wait();
  const int64_t seed = p.seed[b], offset = p.offset[b];
  // 1. Accept or reject each draft (every CTA of the cluster, the same way).
  auto accepts = [&](int64_t i) {
    const int64_t d = p.ids.at(b, i);
    if (d < 0 || d >= p.vocab) return false;
    const float q = kernels::to_float(p.draft[b * p.d_s0 + i * p.d_s1 + d]);
    const float pt = kernels::to_float(p.target[b * p.t_s0 + i * p.t_s1 + d]);
    return __fmul_rn(speculative_detail::uniform(seed, offset, b, i), q) < pt;
  };
  // The first draft of each thread is decided before the barrier, so its id, seed and offset
  // loads overlap (the barrier only orders the shared counters' initialisation).
  const bool first_ok = tid < p.n && accepts(tid);
  // The draw's uniform, now: one register across the pass instead of the seed and offset.
  const float u_draw = speculative_detail::uniform(seed, offset, b, p.n);
  if (tid == 0) {
    s.reject = static_cast<int>(p.n);
    s.count = 0;
    s.token = kNone;
  }
  __syncthreads();
  for (int64_t i = tid; i < p.n; i += kThreads) {
    if (i == tid ? first_ok : accepts(i))
      atomicAdd(&s.count, 1);
    else
      atomicMin(&s.reject, static_cast<int>(i));
  }
  __syncthreads();
  const int64_t r = s.reject;
  const bool has_residual = r < p.n;
  const T* trow = p.target + b * p.t_s0 + r * p.t_s1;
  const T* drow = has_residual ? p.draft + b * p.d_s0 + r * p.d_s1 : trow;
  const int64_t begin = static_cast<int64_t>(rank) * p.slice;
  const int64_t end = begin + p.slice < p.vocab ? begin + p.slice : p.vocab;
  // 2. The pass over this CTA's slice: sums and last positive indices. `w` keeps the last tile.
  float t[U][N], w[U][N];
#pragma unroll
  for (int u = 0; u < U; ++u)
#pragma unroll
    for (int k = 0; k < N; ++k) w[u][k] = 0.f;
  float sum_res = 0.f, sum_t = 0.f;
  int last_res = -1, last_t = -1;
  int tile = 0;
  for (int64_t base = begin; base < end; base += kTile, ++tile) {
    load_tile<T, N>(trow, drow, has_residual, base, end, t, w);
    if (tile < p.stored) store_tile<N>(stored + static_cast<int64_t>(tile) * kTile, w);
    float tile_sum = 0.f;  // this thread's weights in the tile (w is t without a residual)
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int j = static_cast<int>(base + (static_cast<int64_t>(u) * kThreads + tid) * N);
#pragma unroll
      for (int k = 0; k < N; ++k) {
        sum_t += t[u][k];
        if (t[u][k] > 0.f) last_t = j + k;
        tile_sum += w[u][k];
        if (w[u][k] > 0.f) last_res = j + k;
      }
    }
    sum_res += tile_sum;
    if (tile < kRecordedTiles) {  // uniform: the draw's map of where the weight lies
      tile_sum = warp_sum(tile_sum);
      if (lane == 0) s.tile_sums[tile][warp] = tile_sum;
    }
  }
  const Partial mine = warp_reduce(Partial{sum_res, sum_t, last_res, last_t});
  if (lane == 0) s.red[warp] = mine;
  __syncthreads();
  if (warp == 0) {  // kWarps == 32: one warp's partials per lane, summed in warp order
    const Partial all = warp_reduce(s.red[lane]);
    if (lane == 0)
      s.part = Partial{has_residual ? all.sum_res : 0.f, all.sum_t,
                       has_residual ? all.last_res : -1, all.last_t};
  }
  // 3. The slices' sums, combined in rank order by every CTA: the weights, threshold, winner.
  cg::cluster_group cl = cg::this_cluster();
  if (cluster > 1)
    cl.sync();
  else
    __syncthreads();
  if (warp == 0) {  // lane k holds rank k's partial; every lane adds them in rank order
    Partial mine{0.f, 0.f, -1, -1};
    if (lane < cluster) mine = cluster > 1 ? *cl.map_shared_rank(&s.part, lane) : s.part;
    float total_res = 0.f;
#pragma unroll
    for (int k = 0; k < kMaxCluster; ++k)
      if (k < cluster) total_res += __shfl_sync(0xffffffffu, mine.sum_res, k);
    const bool residual = has_residual && total_res > 0.f;
    const float sum = residual ? mine.sum_res : mine.sum_t;
    int last = residual ? mine.last_res : mine.last_t;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) last = max(last, __shfl_xor_sync(0xffffffffu, last, o));
    float total = 0.f;
#pragma unroll
    for (int k = 0; k < kMaxCluster; ++k)
      if (k < cluster) total += __shfl_sync(0xffffffffu, sum, k);
    int winner = -1;
    float carry = 0.f, threshold = 0.f;
    if (total > 0.f) {
      threshold = __fmul_rn(u_draw, total);
      float prefix = 0.f;
#pragma unroll
      for (int k = 0; k < kMaxCluster; ++k) {
        if (k < cluster) {
          const float next = prefix + __shfl_sync(0xffffffffu, sum, k);
          if (winner < 0 && next > threshold) {
            winner = k;
            carry = prefix;
          }
          prefix = next;
        }
      }
    }
    if (lane == 0) {
      if (!(total > 0.f))
        s.token = 0;  // a zero or NaN total
      else if (winner < 0)
        s.token = last < 0 ? 0 : last;  // an infinite total: rank 0 writes it
      s.winner = winner;
      s.residual = residual;
      s.last = last;
      s.carry = carry;
      s.threshold = threshold;
    }
  }
  __syncthreads();
  // This CTA is done reading the others' shared memory (the values are used): a relaxed arrive,
  // no fence; the others wait for it before they exit.
  if (cluster > 1) kernels::cluster_arrive_relaxed();
  const int winner = s.winner;
  // 4. The draw, by the CTA whose slice holds it.
  if (winner == rank) {
    const bool residual = s.residual;
    const float threshold = s.threshold;
    // The recorded tile sums (of the pass's weights: usable unless the residual had no mass)
    // skip the whole tiles that end at or below the threshold.
    if (warp == 0) {
      int start = 0;
      float carry = s.carry;
      if (residual == has_residual) {
        const int64_t tiles = (end - begin + kTile - 1) / kTile;
        const int recorded = tiles < kRecordedTiles ? static_cast<int>(tiles) : kRecordedTiles;
        for (; start < recorded; ++start) {
          const float sum = warp_sum(s.tile_sums[start][lane]);
          if (carry + sum > threshold) break;
          carry += sum;
        }
      }
      if (lane == 0) {
        s.start = start;
        s.carry = carry;
      }
    }
    __syncthreads();
    float carry = s.carry;
    const int64_t from = begin + static_cast<int64_t>(s.start) * kTile;
    if (from < end && from + kTile >= end && residual == has_residual) {
      search_tile<N>(w, from, carry, threshold, s);  // the slice's last tile is in registers
    } else {
      for (int64_t base = from; base < end; base += kTile) {
        const int64_t index = (base - begin) / kTile;
        if (residual == has_residual && index < p.stored)  // the pass's weights, kept
          read_tile<N>(stored + index * kTile, w);
        else
          load_tile<T, N>(trow, drow, residual, base, end, t, w);
        carry += search_tile<N>(w, base, carry, threshold, s);
        if (s.token != kNone) break;
      }
    }
    if (tid == 0 && s.token == kNone) {  // rounding: no element crossed
      const int own = residual ? s.part.last_res : s.part.last_t;
      s.token = own >= 0 ? own : (s.last < 0 ? 0 : s.last);
    }
    __syncthreads();
  }
  // Outputs: rank 0 writes all but position r, which the drawing CTA (else rank 0) writes.
  int32_t* out = p.out + b * (p.n + 1);
  const bool writes_token = winner >= 0 ? winner == rank : rank == 0;
  if (rank == 0) {
    for (int64_t i = tid; i <= p.n; i += kThreads) {
      if (i != r) out[i] = i < r ? static_cast<int32_t>(p.ids.at(b, i)) : -1;
    }
    if (tid == 0) {
      p.accepted[b * p.accepted_s] = s.count;
      p.emitted[b * p.emitted_s] = static_cast<int32_t>(r);
    }
  }
  if (writes_token && tid == 0) out[r] = s.token;
  if (pdl) kernels::pdl_launch_dependents();
  if (cluster > 1) cl.barrier_wait();  // keep s.part alive until every CTA has read it
}

// How many clusters of `c` CTAs of chain_kernel<T, N> the device holds at once (0 when none
// fit, e.g. a GPU partition with small GPCs), cached per device and size. A cluster lives
// inside one GPC, so this is below SMs / c where GPCs' SM counts are not multiples of c.
template <typename T, int N>
inline int resident_clusters(int device, int c) {
  static int cached[64][kMaxCluster + 1] = {};  // the count + 1; 0 unknown
  if (c < 1 || c > kMaxCluster) return 0;
  if (device >= 0 && device < 64 && cached[device][c]) return cached[device][c] - 1;
  // Counted with the most dynamic shared memory a launch takes (one CTA per SM either way: 1024
  // threads of more than 32 registers), so the count holds for every launch.
  kernels::allow_dynamic_smem<chain_kernel<T, N>>(kOp, device, kStoredBytes);
  int count = 0;
  if (c == 1) {
    int per_sm = 0;
    if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, chain_kernel<T, N>, kThreads,
                                                      kStoredBytes) != cudaSuccess)
      cudaGetLastError();
    count = (per_sm > 1 ? per_sm : 1) * kernels::sm_count(device);
  } else {
    const kernels::LaunchConfig query(dim3(static_cast<unsigned>(c)), dim3(kThreads),
                                      kStoredBytes, nullptr, false, static_cast<unsigned>(c));
    if (cudaOccupancyMaxActiveClusters(&count, chain_kernel<T, N>, &query.config) != cudaSuccess) {
      cudaGetLastError();  // a refused query leaves no error behind
      count = 0;
    }
  }
  if (device >= 0 && device < 64) cached[device][c] = count + 1;
  return count;
}

// CTAs per request: the largest C <= kMaxCluster whose clusters hold the whole batch in one
// wave, each slice keeping kMinSlice elements or more; 1 otherwise (single CTAs, in waves when
// B exceeds the resident CTAs).
template <typename T, int N>
inline int cluster_for(int device, int64_t batch, int64_t vocab) {
  for (int c = kMaxCluster; c > 1; --c)
    if (vocab >= c * kMinSlice && batch <= resident_clusters<T, N>(device, c)) return c;
  return 1;
}

// `cluster`: CTAs per request, 0 for cluster_for's choice.
template <typename T, int N>
void launch(const kernels::Launch& ctx, int64_t batch, int64_t cluster, Params<T> p) {
  if (cluster == 0) cluster = cluster_for<T, N>(ctx.device, batch, p.vocab);
  TVM_FFI_CHECK(cluster >= 1 && cluster <= kMaxCluster, ValueError)
      << ctx.op << ": the cluster size must lie in [1, " << kMaxCluster << "], got " << cluster;
  const bool fits = resident_clusters<T, N>(ctx.device, static_cast<int>(cluster)) > 0;
  TVM_FFI_CHECK(fits, ValueError)
      << ctx.op << ": clusters of " << cluster << " CTAs do not fit on this device";
  p.cluster = static_cast<int>(cluster);
  const int64_t per = (p.vocab + p.cluster - 1) / p.cluster;
  p.slice = (per + N - 1) / N * N;  // slices start on whole packs
  // Every tile but the last (in registers) up to kStoredTiles: the draw re-reads none of them.
  const int64_t tiles = (p.slice + kTile - 1) / kTile;
  p.stored = static_cast<int>(tiles - 1 < kStoredTiles ? tiles - 1 : kStoredTiles);
  const size_t smem = static_cast<size_t>(p.stored) * kTile * sizeof(float);
  kernels::allow_dynamic_smem<chain_kernel<T, N>>(ctx.op, ctx.device, kStoredBytes);
  TVM_FFI_CHECK(batch * p.cluster < (int64_t{1} << 31), ValueError)
      << ctx.op << ": the CUDA kernel takes B < 2^31 / " << p.cluster << " requests, got "
      << batch;
  const unsigned grid = static_cast<unsigned>(batch * p.cluster);
  const bool pdl = kernels::pdl_for_grid(ctx.enable_pdl, ctx.device, grid, kThreads);
  kernels::LaunchConfig config(dim3(grid), dim3(kThreads), smem, ctx.stream, pdl,
                               static_cast<unsigned>(p.cluster));
  kernels::check_launch(ctx.op, config.launch(chain_kernel<T, N>, pdl, p));
}

// Whether rows of T can be read in packs of 4 (16-byte fp32, 8-byte fp16 / bf16 loads): the
// vocabulary and every row start aligned. The kernel's pack width N follows.
template <typename T>
inline bool packed_rows(const Params<T>& p, int64_t batch) {
  const int64_t align = 4 * static_cast<int64_t>(sizeof(T));
  return p.vocab % 4 == 0 && (p.t_s0 % 4 == 0 || batch == 1) && p.t_s1 % 4 == 0 &&
         (p.d_s0 % 4 == 0 || batch == 1) && (p.d_s1 % 4 == 0 || p.n <= 1) &&
         reinterpret_cast<uintptr_t>(p.target) % align == 0 &&
         reinterpret_cast<uintptr_t>(p.draft) % align == 0;
}

}  // namespace chain_speculative_sampling_detail

namespace chain_speculative_sampling_detail {

// The entry point with `cluster` CTAs per request (0: cluster_for's choice).
inline void run(tvm::ffi::TensorView output_token_ids, tvm::ffi::TensorView accepted_num,
                tvm::ffi::TensorView emitted_num, tvm::ffi::TensorView draft_probs,
                tvm::ffi::TensorView draft_token_ids, tvm::ffi::TensorView target_probs,
                tvm::ffi::TensorView seed, tvm::ffi::TensorView offset, int64_t cluster) {
  namespace detail = chain_speculative_sampling_detail;
  // 1. Validate.
  kernels::check_ndim(kOp, "draft_probs", draft_probs, 3);
  kernels::check_ndim(kOp, "target_probs", target_probs, 3);
  kernels::check_device(kOp, "draft_probs", draft_probs, kDLCUDA);
  kernels::check_same_device(kOp, "target_probs", target_probs, "draft_probs", draft_probs);
  kernels::check_same_dtype(kOp, "target_probs", target_probs, "draft_probs", draft_probs);
  const int64_t batch = draft_probs.size(0), n = draft_probs.size(1), vocab = draft_probs.size(2);
  TVM_FFI_CHECK(target_probs.size(0) == batch && target_probs.size(1) == n + 1 &&
                    target_probs.size(2) == vocab,
                ValueError)
      << kOp << ": target_probs must have shape [B, n+1, V] = [" << batch << ", " << n + 1 << ", "
      << vocab << "], got " << kernels::shape_string(target_probs);
  TVM_FFI_CHECK(vocab < (int64_t{1} << 30), ValueError)
      << kOp << ": the vocabulary must have fewer than 2^30 entries";
  kernels::check_last_dim_contiguous(kOp, "draft_probs", draft_probs);
  kernels::check_last_dim_contiguous(kOp, "target_probs", target_probs);
  const auto ids = speculative_host::index_tensor(kOp, "draft_token_ids", draft_token_ids,
                                                  draft_probs, 2);
  TVM_FFI_CHECK(draft_token_ids.size(0) == batch && draft_token_ids.size(1) == n, ValueError)
      << kOp << ": draft_token_ids must have shape [B, n] = [" << batch << ", " << n << "]";
  auto rng = [&](const char* name, const tvm::ffi::TensorView& t) {
    auto r = speculative_host::index_tensor(kOp, name, t, draft_probs, 1);
    TVM_FFI_CHECK(r.i64, TypeError) << kOp << ": " << name << " must be int64";
    TVM_FFI_CHECK(t.size(0) == 1 || t.size(0) == batch, ValueError)
        << kOp << ": " << name << " must have shape [1] or [B]";
    if (t.size(0) == 1) r.s0 = 0;
    return r;
  };
  const auto seed_ref = rng("seed", seed), offset_ref = rng("offset", offset);
  for (const auto* t : {&output_token_ids, &accepted_num, &emitted_num}) {
    kernels::check_same_device(kOp, "an output", *t, "draft_probs", draft_probs);
    TVM_FFI_CHECK(kernels::is_dtype(t->dtype(), kDLInt, 32), TypeError)
        << kOp << ": the outputs must be int32";
  }
  kernels::check_ndim(kOp, "output_token_ids", output_token_ids, 2);
  kernels::check_contiguous(kOp, "output_token_ids", output_token_ids);
  TVM_FFI_CHECK(output_token_ids.size(0) == batch && output_token_ids.size(1) == n + 1 &&
                    accepted_num.ndim() == 1 && accepted_num.size(0) == batch &&
                    emitted_num.ndim() == 1 && emitted_num.size(0) == batch,
                ValueError)
      << kOp << ": outputs must be [B, n+1], [B], [B] with B = " << batch;
  if (batch == 0) return;
  TVM_FFI_CHECK(vocab > 0, ValueError) << kOp << ": the vocabulary must not be empty";
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(draft_probs);
  const kernels::Launch ctx(kOp, draft_probs);
  // 4. Dispatch on dtype and launch.
  KERNELS_DISPATCH_FLOAT(draft_probs.dtype(), kOp, T, [&] {
    detail::Params<T> p{};
    p.out = kernels::data<int32_t>(output_token_ids);
    p.accepted = kernels::data<int32_t>(accepted_num);
    p.accepted_s = accepted_num.stride(0);
    p.emitted = kernels::data<int32_t>(emitted_num);
    p.emitted_s = emitted_num.stride(0);
    p.draft = kernels::data<const T>(draft_probs);
    p.d_s0 = draft_probs.stride(0);
    p.d_s1 = draft_probs.stride(1);
    p.target = kernels::data<const T>(target_probs);
    p.t_s0 = target_probs.stride(0);
    p.t_s1 = target_probs.stride(1);
    p.ids = ids;
    p.seed = seed_ref;
    p.offset = offset_ref;
    p.n = n;
    p.vocab = vocab;
    if (detail::packed_rows(p, batch))
      detail::launch<T, 4>(ctx, batch, cluster, p);
    else
      detail::launch<T, 1>(ctx, batch, cluster, p);
  });
}

}  // namespace chain_speculative_sampling_detail

// output_token_ids [B, n+1] int32 (contiguous), accepted_num / emitted_num [B] int32,
// draft_probs [B, n, V] and target_probs [B, n+1, V] (float32/float16/bfloat16, one dtype, last
// dim contiguous), draft_token_ids [B, n] int32/int64, seed / offset int64 [1] or [B].
inline void chain_speculative_sampling(tvm::ffi::TensorView output_token_ids,
                                       tvm::ffi::TensorView accepted_num,
                                       tvm::ffi::TensorView emitted_num,
                                       tvm::ffi::TensorView draft_probs,
                                       tvm::ffi::TensorView draft_token_ids,
                                       tvm::ffi::TensorView target_probs,
                                       tvm::ffi::TensorView seed, tvm::ffi::TensorView offset,
                                       bool deterministic) {
  (void)deterministic;  // every path is deterministic
  chain_speculative_sampling_detail::run(output_token_ids, accepted_num, emitted_num, draft_probs,
                                         draft_token_ids, target_probs, seed, offset, 0);
}

// chain_speculative_sampling with `cluster` CTAs per request (1..8, clusters that fit the
// device) instead of the host's choice: for tests of every cluster size the choice can take.
inline void chain_speculative_sampling_in_clusters(
    tvm::ffi::TensorView output_token_ids, tvm::ffi::TensorView accepted_num,
    tvm::ffi::TensorView emitted_num, tvm::ffi::TensorView draft_probs,
    tvm::ffi::TensorView draft_token_ids, tvm::ffi::TensorView target_probs,
    tvm::ffi::TensorView seed, tvm::ffi::TensorView offset, int64_t cluster) {
  TVM_FFI_CHECK(cluster >= 1, ValueError)
      << chain_speculative_sampling_detail::kOp << ": the cluster size must be >= 1, got "
      << cluster;
  chain_speculative_sampling_detail::run(output_token_ids, accepted_num, emitted_num, draft_probs,
                                         draft_token_ids, target_probs, seed, offset, cluster);
}

namespace chain_speculative_sampling_detail {

// `query(T*, device)` for the packed kernel of draft_probs' dtype (T) on its device.
template <typename F>
inline int64_t query_packed_kernel(const tvm::ffi::TensorView& draft_probs, F query) {
  kernels::check_ndim(kOp, "draft_probs", draft_probs, 3);
  kernels::check_device(kOp, "draft_probs", draft_probs, kDLCUDA);
  kernels::DeviceGuard guard(draft_probs);
  int64_t out = 0;
  KERNELS_DISPATCH_FLOAT(draft_probs.dtype(), kOp, T, [&] {
    out = query(static_cast<T*>(nullptr), draft_probs.device().device_id);
  });
  return out;
}

}  // namespace chain_speculative_sampling_detail

// The CTAs per request (the cluster size) chain_speculative_sampling launches for draft_probs
// [B, n, V] on its device: for tests asserting which path a shape takes.
inline int64_t chain_speculative_sampling_cluster(tvm::ffi::TensorView draft_probs) {
  return chain_speculative_sampling_detail::query_packed_kernel(
      draft_probs, [&](auto* tag, int device) {
        using T = std::remove_pointer_t<decltype(tag)>;
        return chain_speculative_sampling_detail::cluster_for<T, 4>(device, draft_probs.size(0),
                                                                   draft_probs.size(2));
      });
}

// How many clusters of `cluster` CTAs (1..8) of the packed kernel for draft_probs' dtype its
// device holds at once (0: they do not fit): for tests re-deriving the host's choice.
inline int64_t chain_speculative_sampling_resident_clusters(tvm::ffi::TensorView draft_probs,
                                                            int64_t cluster) {
  return chain_speculative_sampling_detail::query_packed_kernel(
      draft_probs, [&](auto* tag, int device) {
        using T = std::remove_pointer_t<decltype(tag)>;
        return chain_speculative_sampling_detail::resident_clusters<T, 4>(
            device, static_cast<int>(cluster));
      });
}
