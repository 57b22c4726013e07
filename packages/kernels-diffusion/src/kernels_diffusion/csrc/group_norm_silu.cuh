// diffusion.group_norm_silu, CUDA: out = silu((x - mean) * rstd * weight[c] + bias[c]), the mean
// and the biased variance in fp32 per (sample, group) over C/G channels x all spatial positions,
// rounded once. x is contiguous [N, C, *spatial] (a group is one contiguous chunk of
// C/G * S elements) or, channels-last, [N, *spatial, C] (a group is S rows of C/G contiguous
// elements, row stride C). Both are "rows of contiguous segments" to the kernels.
//
// Three schemes, all splitting a group across CTAs (1 x 32 groups must fill 132 SMs):
//   - the streamed kernel (group_norm_silu_stream) for x of at least `stream_min_bytes` (set by
//     the Python side above the L2 size): tiles ticketed in one order, each read twice, the
//     second read `lag` tiles after the first, from L2 (details at the kernel). x read once
//     from DRAM, out written once, no grid-wide lockstep.
//   - the one-read kernel (group_norm_silu_fused), where every tile of a group (256 threads x
//     8 packs, 32 KB of bf16 held in registers) can be resident at once: each CTA publishes its
//     tile's shifted sums, waits for the group's other tiles (an arrival counter per group),
//     combines them in fp64 and normalises the registers. x read once, out written once.
//     Launched cooperatively (residency guaranteed, or the launch fails with an error).
//   - otherwise two kernels, grid = N x G x `splits` CTAs of 256 threads, each owning one slice
//     of a group: (1) stats: each CTA sums (x - K) and (x - K)^2 over its slice (K = the group's
//     first element, a shift that keeps the fp32 sums of squares from cancelling), 4 packs in
//     flight per thread, into the workspace [N x G, splits, 2]; (2) normalize: each warp
//     combines its group's partials in fp64, then the CTA streams its slice again, in reverse
//     CTA order so that the tail of x still in L2 is read from there. x read twice.
// weight and bias: x's dtype or float32 (one dtype). Packs need the segment length, and for NC*
// the spatial size, in whole packs; otherwise the same kernels run on scalars.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(10);

#include <kernels/activation_math.cuh>
#include <kernels/bulk.cuh>
#include <kernels/checks.h>
#include <kernels/cuda_dtype.cuh>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>
#include <kernels/pointwise.cuh>
#include <kernels/reduce.cuh>
#include <kernels/tensor.h>
#include <kernels/vec.cuh>

#include <algorithm>

namespace group_norm_silu_detail {

using kernels::FastDivmod;

constexpr int kThreads = 256;
constexpr int kUnroll = 4;

struct Geometry {
  FastDivmod groups;       // G: group index -> (n, g)
  FastDivmod splits;       // CTAs per group
  FastDivmod per_segment;  // units (packs or elements) per contiguous segment
  FastDivmod per_channel;  // NC*: units per channel (S / W)
  int64_t sample_stride;   // elements between samples
  int64_t group_stride;    // elements between groups of a sample
  int64_t segment_stride;  // elements between segments of a group (channels-last: C)
  uint32_t units;          // units per group
  uint32_t units_per_split;
  int channels_per_group;
  double inv_count;        // 1 / (elements per group)
  float eps;
};

struct Slice {
  int64_t base;    // element offset of the group
  int group;       // n * G + g
  int g;
  uint32_t begin;  // units [begin, end) of this CTA
  uint32_t end;
};

__device__ __forceinline__ Slice slice_of(const Geometry& p, uint32_t block) {
  Slice s;
  uint32_t grp, split, n, g;
  p.splits.divmod(block, grp, split);
  p.groups.divmod(grp, n, g);
  s.base = static_cast<int64_t>(n) * p.sample_stride + static_cast<int64_t>(g) * p.group_stride;
  s.group = static_cast<int>(grp);
  s.g = static_cast<int>(g);
  s.begin = split * p.units_per_split;
  s.end = min(p.units, s.begin + p.units_per_split);
  return s;
}

// Element offset of unit u of a group (from the group's base).
template <int W>
__device__ __forceinline__ int64_t unit_offset(const Geometry& p, uint32_t u, uint32_t& col) {
  uint32_t seg;
  p.per_segment.divmod(u, seg, col);
  return static_cast<int64_t>(seg) * p.segment_stride + static_cast<int64_t>(col) * W;
}

// Adds a pack's shifted values (x - shift) and their squares to the sums s1 and s2.
template <typename T, int W>
__device__ __forceinline__ void add_shifted_sums(const kernels::Pack<T, W>& v, float shift,
                                                 float& s1, float& s2) {
  float f[W];
  v.unpack(f);
#pragma unroll
  for (int j = 0; j < W; ++j) {
    const float d = f[j] - shift;
    s1 += d;
    s2 = fmaf(d, d, s2);
  }
}

// Sums a and b over the warp (the fp64 partials of a group's statistics).
__device__ __forceinline__ void warp_sum(double& a, double& b) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
}

// The group's mean and rstd from its summed shifted sums: a = sum(x - shift), b = sum of squares.
__device__ __forceinline__ void mean_rstd(const Geometry& p, double a, double b, float shift,
                                          float& mean, float& rstd) {
  const double m = a * p.inv_count;
  const double var = fmax(b * p.inv_count - m * m, 0.0);
  mean = shift + static_cast<float>(m);
  rstd = rsqrtf(static_cast<float>(var) + p.eps);
}

// The group's partials (tiles_per_group float2 shifted sums from partial[grp * tpg], published)
// summed in fp64 in one fixed order by a block of kBlock threads: every thread gets the same (a,
// b), so every tile of the group gets the same mean and rstd. shared: 2 x kBlock / 32 doubles.
template <int kBlock>
__device__ __forceinline__ void combine_partials(const float* partial, uint32_t grp, uint32_t tpg,
                                                 double (&shared)[2][kBlock / 32], double& a,
                                                 double& b) {
  const float2* mine = reinterpret_cast<const float2*>(partial) + grp * tpg;
  a = 0.0;
  b = 0.0;
  for (uint32_t j = threadIdx.x; j < tpg; j += kBlock) {
    const float2 q = __ldcg(mine + j);
    a += q.x;
    b += q.y;
  }
  warp_sum(a, b);
  if ((threadIdx.x & 31) == 0) {
    shared[0][threadIdx.x >> 5] = a;
    shared[1][threadIdx.x >> 5] = b;
  }
  __syncthreads();
  a = 0.0;
  b = 0.0;
#pragma unroll
  for (int w = 0; w < kBlock / 32; ++w) {
    a += shared[0][w];
    b += shared[1][w];
  }
}

// The weight and bias of unit u's W values (column col of its segment): channels-last, W
// consecutive channels; otherwise one channel for the whole pack. c0: the group's first channel.
template <bool kChannelsLast, typename WT, int W>
__device__ __forceinline__ void load_affine(const WT* weight, const WT* bias, const Geometry& p,
                                            int c0, uint32_t u, uint32_t col, float (&w)[W],
                                            float (&c)[W]) {
  if constexpr (kChannelsLast) {
    kernels::Pack<WT, W> wp, bp;
    wp.load_cached(weight + c0 + col * W);
    bp.load_cached(bias + c0 + col * W);
    wp.unpack(w);
    bp.unpack(c);
  } else {
    const int ch = c0 + static_cast<int>(p.per_channel.div(u));
    const float wc = kernels::to_float(weight[ch]), bc = kernels::to_float(bias[ch]);
#pragma unroll
    for (int j = 0; j < W; ++j) {
      w[j] = wc;
      c[j] = bc;
    }
  }
}

// Normalises the pack of unit u (column col of its segment), applies weight, bias and silu, and
// stores it to dst; c0: the group's first channel. The output path of the one-read and streamed
// kernels (group_norm_silu_kernel shares only load_affine: this whole helper there changes its
// register allocation, e.g. 55 -> 48 registers and 8 more instructions at fp16 channels-last).
template <bool kChannelsLast, typename T, typename WT, int W>
__device__ __forceinline__ void normalize_silu_store(kernels::Pack<T, W>& v, T* dst,
                                                     const WT* weight, const WT* bias,
                                                     const Geometry& p, int c0, uint32_t u,
                                                     uint32_t col, float mean, float rstd) {
  float f[W], w[W], c[W];
  load_affine<kChannelsLast>(weight, bias, p, c0, u, col, w, c);
  v.unpack(f);
#pragma unroll
  for (int j = 0; j < W; ++j) f[j] = kernels::math::silu(fmaf((f[j] - mean) * rstd, w[j], c[j]));
  v.pack(f);
  v.store_stream(dst);
}

template <typename T, bool kPacked>
__global__ void __launch_bounds__(kThreads)
    group_stats_kernel(bool pdl, const T* __restrict__ x, float* __restrict__ partial,
                       Geometry p) {
  constexpr int W = kernels::pack_width<T, kPacked>;
  __shared__ float shared[2][32];
  const Slice s = slice_of(p, blockIdx.x);
  if (pdl) kernels::pdl_wait();
  const T* gx = x + s.base;
  const float shift = kernels::to_float(gx[0]);
  float s1 = 0.0f, s2 = 0.0f;
  for (uint32_t u0 = s.begin + threadIdx.x; u0 < s.end; u0 += kThreads * kUnroll) {
    kernels::Pack<T, W> v[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const uint32_t u = u0 + k * kThreads;
      uint32_t col;
      if (u < s.end) {
        v[k].load_stream(gx + unit_offset<W>(p, u, col));
      } else {
        v[k].zero();
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      if (u0 + k * kThreads < s.end) add_shifted_sums(v[k], shift, s1, s2);
    }
  }
  s1 = kernels::block_sum(s1, shared[0]);
  s2 = kernels::block_sum(s2, shared[1]);
  if (threadIdx.x == 0) {
    partial[2 * static_cast<int64_t>(blockIdx.x)] = s1;
    partial[2 * static_cast<int64_t>(blockIdx.x) + 1] = s2;
  }
}

template <typename T, typename WT, bool kPacked, bool kChannelsLast>
__global__ void __launch_bounds__(kThreads)
    group_norm_silu_kernel(bool pdl, T* __restrict__ out, const T* __restrict__ x,
                           const WT* __restrict__ weight, const WT* __restrict__ bias,
                           const float* __restrict__ partial, Geometry p) {
  constexpr int W = kernels::pack_width<T, kPacked>;
  const Slice s = slice_of(p, gridDim.x - 1 - blockIdx.x);
  const int splits = static_cast<int>(p.splits.divisor);
  if (pdl) kernels::pdl_wait();
  // Every warp combines the group's partial sums (fp64: no cancellation across CTAs).
  const float* mine = partial + 2 * static_cast<int64_t>(s.group) * splits;
  double a = 0.0, b = 0.0;
  for (int j = threadIdx.x & 31; j < splits; j += 32) {
    a += mine[2 * j];
    b += mine[2 * j + 1];
  }
  warp_sum(a, b);
  const T* gx = x + s.base;
  T* go = out + s.base;
  float mean, rstd;
  mean_rstd(p, a, b, kernels::to_float(gx[0]), mean, rstd);
  const int c0 = s.g * p.channels_per_group;
  for (uint32_t u0 = s.begin + threadIdx.x; u0 < s.end; u0 += kThreads * kUnroll) {
    kernels::Pack<T, W> v[kUnroll];
    int64_t off[kUnroll];
    uint32_t col[kUnroll];
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const uint32_t u = u0 + k * kThreads;
      if (u < s.end) {
        off[k] = unit_offset<W>(p, u, col[k]);
        v[k].load_stream(gx + off[k]);
      }
    }
#pragma unroll
    for (int k = 0; k < kUnroll; ++k) {
      const uint32_t u = u0 + k * kThreads;
      if (u < s.end) {
        float f[W], w[W], c[W];
        load_affine<kChannelsLast>(weight, bias, p, c0, u, col[k], w, c);
        v[k].unpack(f);
#pragma unroll
        for (int j = 0; j < W; ++j) {
          const float y = fmaf((f[j] - mean) * rstd, w[j], c[j]);
          f[j] = kernels::math::silu(y);
        }
        v[k].pack(f);
        v[k].store_stream(go + off[k]);
      }
    }
  }
}


// ---------------------------------------------------------------------------------------------
// The one-read kernel: x read once, out written once (the minimum traffic). A group is cut into
// tiles of kFusedThreads x kFusedPacks units held in registers; CTA c takes tiles c, c + grid,
// ... in order. Per tile: load it, reduce its shifted sums, publish them (partial[tile], then a
// release add to the group's arrival counter), wait until every tile of the group has arrived,
// combine the group's partials in fp64 (warp 0), normalise the registers and store.
// Deadlock-free because every CTA is resident (a cooperative launch guarantees it or fails) and
// a group spans at most `grid` tiles: a tile's peers are either in the same round or in the next
// one, whose CTAs only wait on earlier groups first (induction over groups).
constexpr int kFusedThreads = 256;
constexpr int kFusedPacks = 8;
constexpr int kFusedTile = kFusedThreads * kFusedPacks;  // units per tile

struct Fused {
  uint32_t tiles_per_group;
  uint32_t total_tiles;
};

__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void red_release(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Element offset of group grp (n * G + g) and its g.
__device__ __forceinline__ int64_t group_base(const Geometry& p, uint32_t grp, uint32_t& g) {
  uint32_t n;
  p.groups.divmod(grp, n, g);
  return static_cast<int64_t>(n) * p.sample_stride + static_cast<int64_t>(g) * p.group_stride;
}

// A tile of a group held in registers (the one-read and streamed kernels): kTileThreads x kPacks
// units from unit `begin`, thread t holding units begin + t + k * kTileThreads. Units past the
// group's end are zeros, neither summed nor stored.

// Loads this thread's packs of the tile with load(pack, address).
template <int kTileThreads, typename T, int W, int kPacks, typename Load>
__device__ __forceinline__ void load_tile(kernels::Pack<T, W> (&v)[kPacks], const T* gx,
                                          const Geometry& p, uint32_t begin, Load load) {
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const uint32_t u = begin + threadIdx.x + k * kTileThreads;
    uint32_t col;
    if (u < p.units) {
      load(v[k], gx + unit_offset<W>(p, u, col));
    } else {
      v[k].zero();
    }
  }
}

// Adds this thread's packs of the tile to the shifted sums s1 and s2.
template <int kTileThreads, typename T, int W, int kPacks>
__device__ __forceinline__ void add_tile_sums(const kernels::Pack<T, W> (&v)[kPacks],
                                              const Geometry& p, uint32_t begin, float shift,
                                              float& s1, float& s2) {
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    if (begin + threadIdx.x + k * kTileThreads < p.units) add_shifted_sums(v[k], shift, s1, s2);
  }
}

// Normalises and stores this thread's packs of the tile (go: the group's output).
template <int kTileThreads, bool kChannelsLast, typename T, typename WT, int W, int kPacks>
__device__ __forceinline__ void normalize_silu_store_tile(
    kernels::Pack<T, W> (&v)[kPacks], T* go, const WT* weight, const WT* bias, const Geometry& p,
    int c0, uint32_t begin, float mean, float rstd) {
#pragma unroll
  for (int k = 0; k < kPacks; ++k) {
    const uint32_t u = begin + threadIdx.x + k * kTileThreads;
    if (u < p.units) {
      uint32_t col;
      const int64_t off = unit_offset<W>(p, u, col);
      normalize_silu_store<kChannelsLast>(v[k], go + off, weight, bias, p, c0, u, col, mean,
                                          rstd);
    }
  }
}

template <typename T, typename WT, bool kPacked, bool kChannelsLast>
__global__ void __launch_bounds__(kFusedThreads, 4)
    group_norm_silu_fused(bool, T* __restrict__ out, const T* __restrict__ x,
                          const WT* __restrict__ weight, const WT* __restrict__ bias,
                          float* __restrict__ partial, int* __restrict__ arrived, Geometry p,
                          Fused f) {
  constexpr int W = kernels::pack_width<T, kPacked>;
  __shared__ float shared[2][32];
  __shared__ float group_stats[2];
  for (uint32_t tile = blockIdx.x; tile < f.total_tiles; tile += gridDim.x) {
    const uint32_t grp = tile / f.tiles_per_group;
    const uint32_t in_group = tile - grp * f.tiles_per_group;
    uint32_t g;
    const int64_t base = group_base(p, grp, g);
    const T* gx = x + base;
    const uint32_t begin = in_group * kFusedTile;
    kernels::Pack<T, W> v[kFusedPacks];
    load_tile<kFusedThreads>(v, gx, p, begin,
                             [](kernels::Pack<T, W>& pack, const T* at) { pack.load_stream(at); });
    const float shift = kernels::to_float(gx[0]);
    float s1 = 0.0f, s2 = 0.0f;
    add_tile_sums<kFusedThreads>(v, p, begin, shift, s1, s2);
    s1 = kernels::block_sum(s1, shared[0]);
    s2 = kernels::block_sum(s2, shared[1]);
    if (threadIdx.x == 0) {
      partial[2 * static_cast<int64_t>(tile)] = s1;
      partial[2 * static_cast<int64_t>(tile) + 1] = s2;
      __threadfence();
      atomicAdd(arrived + grp, 1);
    }
    if (threadIdx.x < 32) {  // warp 0: wait for the group, combine its partials in fp64
      if (threadIdx.x == 0) {
        while (load_acquire(arrived + grp) < static_cast<int>(f.tiles_per_group)) __nanosleep(64);
      }
      __syncwarp();
      __threadfence();
      const float* mine = partial + 2 * static_cast<int64_t>(grp) * f.tiles_per_group;
      double a = 0.0, b = 0.0;
      for (uint32_t j = threadIdx.x; j < f.tiles_per_group; j += 32) {
        a += __ldcg(mine + 2 * j);
        b += __ldcg(mine + 2 * j + 1);
      }
      warp_sum(a, b);
      if (threadIdx.x == 0) mean_rstd(p, a, b, shift, group_stats[0], group_stats[1]);
    }
    __syncthreads();
    const float mean = group_stats[0], rstd = group_stats[1];
    const int c0 = static_cast<int>(g) * p.channels_per_group;
    normalize_silu_store_tile<kFusedThreads, kChannelsLast>(v, out + base, weight, bias, p, c0,
                                                            begin, mean, rstd);
    __syncthreads();  // group_stats is rewritten by the next tile
  }
}

// Resident CTAs of one fused kernel on the device (cached per instantiation and device).
template <typename T, typename WT, bool kPacked, bool kChannelsLast>
inline int resident_ctas(int device) {
  static int cached[64] = {0};
  if (device >= 0 && device < 64 && cached[device]) return cached[device] > 0 ? cached[device] : 0;
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &per_sm, group_norm_silu_fused<T, WT, kPacked, kChannelsLast>, kFusedThreads, 0) !=
      cudaSuccess) {
    cudaGetLastError();
    per_sm = 0;
  }
  const int ctas = per_sm * kernels::sm_count(device);
  if (device >= 0 && device < 64) cached[device] = ctas > 0 ? ctas : -1;
  return ctas;
}

// ---------------------------------------------------------------------------------------------
// The streamed kernel, for x larger than L2 (two reads of x from DRAM would cost 1.5x the
// minimum traffic, and the one-read kernel's groups wait on each other in lockstep rounds): x is
// cut into tiles of kStreamTile units (tiles never straddle groups), and each tile is one
// "stats" item (read it from DRAM with an L2 evict-last hint, publish its shifted sums) and one
// "norm" item (read it again, from L2 now, evict-first; normalise, store evict-first). The items
// run in one global order given out by a ticket counter (atomicAdd): the first `lag` tiles' stats,
// then stats(lag + k) and norm(k) alternating, then the last norms. So DRAM sees one steady read
// stream (stats) and one write stream (norms) at the same rate, and a tile is re-read `lag` tiles
// (~one group + the tiles in flight, ~20 MB at 1 x 128 x 20 x 256 x 256 bf16) after its first
// read, well inside the 50 MB L2. A stats item stores its tile's shifted sums (partial[tile]) and
// arrives at its group's counter with a release add, deferred until the CTA's next loads are in
// flight (nothing waits on a round trip); a norm item issues its loads, waits until the counter
// reaches the group's tile count (with the lag it rarely waits), and combines the group's partials
// in fp64 in one fixed order (every tile of a group gets the same mean and rstd).
// Deadlock-free without co-residency: a norm item waits only on stats items of smaller tickets
// (lag >= tiles per group), a ticket is only ever held by a running CTA, which finishes its items
// in ticket order and publishes an arrival before it can wait; so the smallest unfinished ticket
// always proceeds (induction). The tickets also balance the SMs.
// counters: [N x G] arrivals and the ticket counter after them, zeroed before every launch (a
// memset node in CUDA graphs: replays start from zero).
constexpr int kStreamThreads = 256;
constexpr int kStreamPacks = 8;
constexpr int kStreamTile = kStreamThreads * kStreamPacks;  // units per tile
// The lag beyond one group, in eighths of the grid: about half the items in flight are stats,
// so a norm item `group + grid / 2` tiles behind finds its group's last stats item finished;
// 5/8 leaves a margin (1 x 128 x 20 x 256 x 256 bf16: 320 + 330 tiles, 21 MB of x in L2). The
// host entry takes it as an argument (the Python default; a test sets 0: the tightest order).
constexpr int kStreamLagEighths = 5;

struct Stream {
  FastDivmod tiles_per_group;
  uint32_t tiles;   // M: tiles of x (N x G x tiles_per_group)
  uint32_t lag;     // stats tiles issued before the first norm tile
  uint32_t groups;  // N x G (the ticket counter is counters[groups])
};

// A pack of x (read-only for the whole kernel) through the non-coherent path, not kept in L1,
// with an L2 eviction policy; scalars take a plain load.
template <typename T, int W>
__device__ __forceinline__ void load_hinted(kernels::Pack<T, W>& v, const T* p, uint64_t policy) {
  if constexpr (W * sizeof(T) % 16 == 0) {
#pragma unroll
    for (int a = 0; a < kernels::Pack<T, W>::kAccesses; ++a) {
      uint4 r;
      asm volatile(
          "ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
          : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
          : "l"(reinterpret_cast<const uint4*>(p) + a), "l"(policy));
      v.set(a, r);
    }
  } else {
    v.load_stream(p);
  }
}

// Ticket -> tile; true for a norm item.
__device__ __forceinline__ bool stream_item(const Stream& s, uint32_t ticket, uint32_t& tile) {
  if (ticket < s.lag) {
    tile = ticket;
    return false;
  }
  const uint32_t j = ticket - s.lag;
  const uint32_t paired = 2 * (s.tiles - s.lag);
  if (j < paired) {
    tile = (j & 1) ? j >> 1 : s.lag + (j >> 1);
    return (j & 1) != 0;
  }
  tile = s.tiles - s.lag + (j - paired);
  return true;
}

template <typename T, typename WT, bool kPacked, bool kChannelsLast>
__global__ void __launch_bounds__(kStreamThreads, 4)
    group_norm_silu_stream(bool pdl, T* __restrict__ out, const T* __restrict__ x,
                           const WT* __restrict__ weight, const WT* __restrict__ bias,
                           float* __restrict__ partial, int* __restrict__ counters, Geometry p,
                           Stream s) {
  constexpr int W = kernels::pack_width<T, kPacked>;
  constexpr int kWarps = kStreamThreads / 32;
  __shared__ float shared[2][32];
  __shared__ double shared64[2][kWarps];
  __shared__ int tickets[2];  // by item parity
  if (pdl) kernels::pdl_wait();
  int* ticket_counter = counters + s.groups;
  if (threadIdx.x == 0) tickets[0] = atomicAdd(ticket_counter, 1);
  __syncthreads();
  const uint32_t items = 2 * s.tiles;
  const uint32_t tpg = s.tiles_per_group.divisor;
  int pending = -1;  // thread 0: the group whose arrival is still to be published
  uint32_t ticket = static_cast<uint32_t>(tickets[0]);
  for (int parity = 1; ticket < items; parity ^= 1) {
    // The next ticket, in a register until the end of this item (no stall on its latency).
    int next = 0;
    if (threadIdx.x == 0) next = atomicAdd(ticket_counter, 1);
    uint32_t tile, grp, in_group, g;
    const bool norm = stream_item(s, ticket, tile);
    s.tiles_per_group.divmod(tile, grp, in_group);
    const int64_t base = group_base(p, grp, g);
    const T* gx = x + base;
    const uint32_t begin = in_group * kStreamTile;
    kernels::Pack<T, W> v[kStreamPacks];
    const uint64_t policy = norm ? kernels::l2_evict_first() : kernels::l2_evict_last();
    load_tile<kStreamThreads>(v, gx, p, begin, [policy](kernels::Pack<T, W>& pack, const T* at) {
      load_hinted(pack, at, policy);
    });
    // The previous stats item's arrival, released now that this item's loads are in flight
    // (the release waits for its partial-sum store, not the CTA).
    if (threadIdx.x == 0 && pending >= 0) {
      red_release(counters + pending, 1);
      pending = -1;
    }
    const float shift = kernels::to_float(gx[0]);
    if (!norm) {
      float s1 = 0.0f, s2 = 0.0f;
      add_tile_sums<kStreamThreads>(v, p, begin, shift, s1, s2);
      s1 = kernels::block_sum(s1, shared[0]);
      s2 = kernels::block_sum(s2, shared[1]);
      if (threadIdx.x == 0) {
        __stcg(reinterpret_cast<float2*>(partial) + tile, make_float2(s1, s2));
        pending = static_cast<int>(grp);
      }
    } else {
      if (threadIdx.x == 0) {  // the loads above are in flight meanwhile
        while (load_acquire(counters + grp) < static_cast<int>(tpg)) __nanosleep(128);
      }
      __syncthreads();  // the group's partials are published
      // The group's statistics: its partials in fp64, in one fixed order.
      double a, b;
      combine_partials<kStreamThreads>(partial, grp, tpg, shared64, a, b);
      float mean, rstd;
      mean_rstd(p, a, b, shift, mean, rstd);
      const int c0 = static_cast<int>(g) * p.channels_per_group;
      normalize_silu_store_tile<kStreamThreads, kChannelsLast>(v, out + base, weight, bias, p, c0,
                                                               begin, mean, rstd);
    }
    if (threadIdx.x == 0) tickets[parity] = next;
    __syncthreads();  // the next ticket; shared sums free again
    ticket = static_cast<uint32_t>(tickets[parity]);
  }
  if (threadIdx.x == 0 && pending >= 0) red_release(counters + pending, 1);
}

// Resident CTAs of one streamed kernel per SM (cached per instantiation and device); the grid
// only needs to fill the GPU, not to be co-resident (tickets keep it deadlock-free).
template <typename T, typename WT, bool kPacked, bool kChannelsLast>
inline int stream_ctas_per_sm(int device) {
  static int cached[64] = {0};
  if (device >= 0 && device < 64 && cached[device]) return cached[device];
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(
          &per_sm, group_norm_silu_stream<T, WT, kPacked, kChannelsLast>, kStreamThreads, 0) !=
      cudaSuccess) {
    cudaGetLastError();
    per_sm = 0;
  }
  per_sm = std::max(per_sm, 1);
  if (device >= 0 && device < 64) cached[device] = per_sm;
  return per_sm;
}

// ---------------------------------------------------------------------------------------------
// The staged kernel (sm_90+, contiguous NC* x in 16-byte packs, x larger than L2): the streamed
// kernel's scheme with each tile held between its two uses in shared memory instead of L2, so
// its second read never depends on what L2 kept. Each CTA (kStagedThreads, two per SM) owns a
// ring of kStagedSlots tiles of kStagedTile packs (32 KB each); its thread 0 takes tiles in one
// global order from a ticket counter and fills free slots with TMA bulk copies
// (kernels/bulk.cuh, L2 evict-first: x is read from DRAM once). The CTA then repeats one step:
//   - final: its last stats step completed a group (the arrival's atomic returned tiles - 1):
//     combine the group's partial sums in fp64, publish (mean, rstd) as one 8-byte word;
//   - stats: the oldest tile not yet summed (preferably one whose bytes have landed): its shifted
//     sums, stored as partial[tile], then an acq_rel arrival at its group's counter, whose
//     result is looked at one step later (no stall on the round trip);
//   - norm: the oldest summed tile once its group's word is published: normalise, silu, store
//     (streaming stores from registers), which frees its slot.
// thread 0 decides, the block follows (one barrier a step); the next ticket (taken with a norm
// step, for the slot it frees) and the group word are loaded a step ahead of their use.
// Deadlock-free with every CTA resident (a cooperative launch): a CTA waits on a group only when
// every tile it holds, ticketed or loaded, has been summed; the held tiles of all CTAs are
// consecutive tickets, more than a group (grid x kStagedSlots > tiles per group, checked on the
// host), so the oldest unfinished group is entirely held and summed: its last arrival finalises
// it. (A model of this protocol with CTAs interleaved at random deadlocked when a ticket was
// taken ahead for a full ring, and when the slots held no more than a group.)
// The group word: (mean bits, ~rstd bits) in zeroed int32 memory; 0 in the second word means
// "not yet" (~bits is 0 only for the bit pattern 0xffffffff, which no arithmetic produces).
constexpr int kStagedThreads = 512;
constexpr int kStagedSlots = 3;
constexpr int kStagedTile = 2048;  // packs of 16 bytes: 32 KB
constexpr int kStagedTileBytes = kStagedTile * 16;
constexpr int kStagedPacks = kStagedTile / kStagedThreads;
constexpr int kStagedBarBytes = 128;  // the slots' mbarriers, ahead of the slots
constexpr int kStagedSmem = kStagedBarBytes + kStagedSlots * kStagedTileBytes;

struct Staged {
  FastDivmod tiles_per_group;
  uint32_t tiles;
  uint32_t groups;                // N x G: counters[groups] is the ticket counter
  unsigned long long* words;      // [N x G] group words, zeroed
};

enum StagedStep : int { kStagedDone, kStagedStats, kStagedNorm, kStagedFinal };

__device__ __forceinline__ int atom_add_acq_rel(int* p, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v)
               : "memory");
  return old;
}

__device__ __forceinline__ unsigned long long load_word(const unsigned long long* p) {
  unsigned long long v;
  asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store_word(unsigned long long* p, unsigned long long v) {
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

__device__ __forceinline__ bool word_ready(unsigned long long w) {
  return static_cast<uint32_t>(w >> 32) != 0u;
}

template <typename T, typename WT>
__global__ void __launch_bounds__(kStagedThreads, 2)
    group_norm_silu_staged(bool pdl, T* __restrict__ out, const T* __restrict__ x,
                           const WT* __restrict__ weight, const WT* __restrict__ bias,
                           float* __restrict__ partial, int* __restrict__ counters, Geometry p,
                           Staged s) {
  constexpr int W = kernels::Pack<T>::size;
  using P = kernels::Pack<T, W>;
  constexpr int kWarps = kStagedThreads / 32;
  extern __shared__ __align__(128) unsigned char staged_smem[];
  __shared__ float2 warp_sums[kWarps];
  __shared__ double warp_sums64[2][kWarps];
  __shared__ int slot_tile[kStagedSlots];
  __shared__ int step, step_group;
  __shared__ float group_mean, group_rstd;
  const uint32_t bars = kernels::shared_address(staged_smem);
  const uint4* tiles = reinterpret_cast<const uint4*>(staged_smem + kStagedBarBytes);
  const uint32_t lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const uint32_t tpg = s.tiles_per_group.divisor;
  if (threadIdx.x < kStagedSlots) kernels::mbarrier_init(bars + 8 * threadIdx.x);
  kernels::mbarrier_init_fence();
  __syncthreads();
  if (pdl) kernels::pdl_wait();
  int* ticket_counter = counters + s.groups;
  // thread 0's state: the next ticket (taken a step ahead, only for a slot that is free or is
  // freed by the current step, so it is issued at the next refill: a CTA never waits on a group
  // while holding a ticket it has not summed), tiles issued, the arrival whose result is looked
  // at next step, the group word probed for the oldest summed tile.
  int next = 0, arrival = -1, arrival_group = -1, ready_group = -1, probe_group = -1;
  bool have_next = false;
  unsigned long long probe = 0, ready_word = 0;
  uint32_t issued = 0;
  const uint64_t policy = kernels::l2_evict_first();
  // Every thread: tiles summed and normalised (the slots' uses, in ring order).
  uint32_t summed = 0, normed = 0;
  for (;;) {
    if (threadIdx.x == 0) {
      // Refill the free slots (a ticket not taken ahead is taken here, and waited for).
      while (issued - normed < kStagedSlots) {
        if (!have_next) {
          next = atomicAdd(ticket_counter, 1);
          have_next = true;
        }
        if (next >= static_cast<int>(s.tiles)) break;  // kept: no more tickets to take
        const uint32_t slot = issued % kStagedSlots;
        uint32_t grp, in_group, g;
        s.tiles_per_group.divmod(static_cast<uint32_t>(next), grp, in_group);
        const int64_t base = group_base(p, grp, g);
        const uint32_t begin = in_group * kStagedTile;
        const uint32_t bytes = min(p.units - begin, static_cast<uint32_t>(kStagedTile)) * 16u;
        const uint32_t bar = bars + 8 * slot;
        kernels::mbarrier_expect_tx(bar, bytes);
        kernels::bulk_load(bars + kStagedBarBytes + slot * kStagedTileBytes,
                           x + base + static_cast<int64_t>(begin) * W, bytes, bar, policy);
        slot_tile[slot] = next;
        ++issued;
        have_next = false;
      }
      int d = kStagedDone, group = -1;
      if (arrival >= 0 && arrival == static_cast<int>(tpg) - 1) {
        d = kStagedFinal;
        group = arrival_group;
      } else {
        // The oldest summed tile's group: published already, or probed last step, or probe now.
        bool norm_ready = false;
        if (normed < summed) {
          const int need = static_cast<int>(
              s.tiles_per_group.div(static_cast<uint32_t>(slot_tile[normed % kStagedSlots])));
          if (ready_group != need && probe_group == need && word_ready(probe)) {
            ready_group = need;
            ready_word = probe;
          }
          norm_ready = ready_group == need;
          if (!norm_ready) {
            probe_group = need;
            probe = load_word(s.words + need);  // looked at next step
          }
          group = need;
        }
        const bool can_sum = summed < issued;
        // Preferably a tile whose bulk copies have landed.
        if (can_sum && (kernels::mbarrier_test(bars + 8 * (summed % kStagedSlots),
                                               (summed / kStagedSlots) & 1u) ||
                        !norm_ready)) {
          d = kStagedStats;
        } else if (normed < summed) {
          // Every held tile is summed (or the norm is ready): wait for the group if need be.
          while (!norm_ready) {
            __nanosleep(100);
            probe = load_word(s.words + group);
            if (word_ready(probe)) {
              ready_group = group;
              ready_word = probe;
              norm_ready = true;
            }
          }
          d = kStagedNorm;
          group_mean = __uint_as_float(static_cast<uint32_t>(ready_word));
          group_rstd = __uint_as_float(~static_cast<uint32_t>(ready_word >> 32));
          if (!have_next) {  // for the slot this step frees; used at the next refill
            next = atomicAdd(ticket_counter, 1);
            have_next = true;
          }
        }
      }
      arrival = -1;
      step = d;
      step_group = group;
    }
    __syncthreads();
    const int d = step;
    if (d == kStagedDone) break;
    if (d == kStagedFinal) {
      // The group's partial sums in fp64 in one fixed order, then its word.
      const uint32_t grp = static_cast<uint32_t>(step_group);
      double a, b;
      combine_partials<kStagedThreads>(partial, grp, tpg, warp_sums64, a, b);
      if (threadIdx.x == 0) {
        uint32_t g;
        const float shift = kernels::to_float(x[group_base(p, grp, g)]);
        float mean, rstd;
        mean_rstd(p, a, b, shift, mean, rstd);
        store_word(s.words + grp,
                   (static_cast<unsigned long long>(~__float_as_uint(rstd)) << 32) |
                       __float_as_uint(mean));
      }
    } else {
      const uint32_t n = d == kStagedStats ? summed : normed;
      const uint32_t slot = n % kStagedSlots;
      const uint32_t t = static_cast<uint32_t>(slot_tile[slot]);
      uint32_t grp, in_group, g;
      s.tiles_per_group.divmod(t, grp, in_group);
      const int64_t base = group_base(p, grp, g);
      const uint32_t begin = in_group * kStagedTile;
      const uint32_t count = min(p.units - begin, static_cast<uint32_t>(kStagedTile));
      const uint4* tile = tiles + slot * kStagedTile;
      if (d == kStagedStats) {
        const float shift = kernels::to_float(x[base]);  // in flight while the bytes land
        kernels::mbarrier_wait(bars + 8 * slot, (n / kStagedSlots) & 1u);
        float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
        for (int k = 0; k < kStagedPacks; ++k) {
          const uint32_t u = threadIdx.x + k * kStagedThreads;
          if (u < count) {
            P v;
            v.set(0, tile[u]);
            add_shifted_sums(v, shift, s1, s2);
          }
        }
        s1 = kernels::warp_sum(s1);
        s2 = kernels::warp_sum(s2);
        if (lane == 0) warp_sums[warp] = make_float2(s1, s2);
        __syncthreads();
        if (threadIdx.x == 0) {
          float2 total = warp_sums[0];
#pragma unroll
          for (int w = 1; w < kWarps; ++w) {
            total.x += warp_sums[w].x;
            total.y += warp_sums[w].y;
          }
          __stcg(reinterpret_cast<float2*>(partial) + t, total);
          arrival = atom_add_acq_rel(counters + grp, 1);  // looked at next step
          arrival_group = static_cast<int>(grp);
        }
        ++summed;
      } else {
        const float mean = group_mean, rstd = group_rstd;
        const int c0 = static_cast<int>(g) * p.channels_per_group;
        T* go = out + base;
#pragma unroll
        for (int k = 0; k < kStagedPacks; ++k) {
          const uint32_t u = begin + threadIdx.x + k * kStagedThreads;
          if (u - begin < count) {
            P v;
            v.set(0, tile[u - begin]);
            normalize_silu_store<false>(v, go + static_cast<int64_t>(u) * W, weight, bias, p, c0,
                                        u, 0u, mean, rstd);
          }
        }
        ++normed;
      }
    }
    __syncthreads();  // the step's shared values, and a normalised slot, free again
  }
}

// Resident CTAs of the staged kernel per SM, with its shared memory opted in (0: none fit).
template <typename T, typename WT>
inline int staged_ctas_per_sm(const char* op, int device) {
  static int cached[64] = {0};
  if (device >= 0 && device < 64 && cached[device]) return cached[device] > 0 ? cached[device] : 0;
  kernels::allow_dynamic_smem<group_norm_silu_staged<T, WT>>(op, device, kStagedSmem);
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, group_norm_silu_staged<T, WT>,
                                                    kStagedThreads, kStagedSmem) != cudaSuccess) {
    cudaGetLastError();
    per_sm = 0;
  }
  if (device >= 0 && device < 64) cached[device] = per_sm > 0 ? per_sm : -1;
  return per_sm;
}

template <typename T, typename WT>
void run(T* out, const T* x, const WT* weight, const WT* bias, float* partial,
         int64_t workspace_floats, int* arrived, int64_t arrived_count, int64_t batch,
         int64_t channels, int64_t spatial, int64_t groups, int64_t max_splits,
         int64_t stream_min_bytes, int64_t stream_lag_eighths, int64_t staged_min_bytes,
         bool channels_last, float eps, const kernels::Launch& ctx) {
  constexpr int P = kernels::Pack<T>::size;
  const int64_t cpg = channels / groups;
  const int64_t elems = cpg * spatial;
  const bool packed = kernels::is_aligned(out) && kernels::is_aligned(x) &&
                      (channels_last ? cpg % P == 0 && channels % P == 0 &&
                                           kernels::is_aligned(weight) &&
                                           kernels::is_aligned(bias)
                                     : spatial % P == 0);
  const int64_t w = packed ? P : 1;
  Geometry p;
  p.groups = FastDivmod(static_cast<uint32_t>(groups));
  p.sample_stride = channels * spatial;
  if (channels_last) {
    p.group_stride = cpg;
    p.segment_stride = channels;
    p.per_segment = FastDivmod(static_cast<uint32_t>(cpg / w));
    p.per_channel = FastDivmod(1);
  } else {
    p.group_stride = elems;
    p.segment_stride = 0;
    p.per_segment = FastDivmod(static_cast<uint32_t>(elems / w));
    p.per_channel = FastDivmod(static_cast<uint32_t>(spatial / w));
  }
  const int64_t units = elems / w;
  p.units = static_cast<uint32_t>(units);
  // Splits: about 4 CTAs per SM over the whole grid, each with at least 8 packs per thread.
  const int64_t ng = batch * groups;
  const int64_t want = (4 * int64_t{kernels::sm_count(ctx.device)} + ng - 1) / ng;
  const int64_t most = std::max<int64_t>(1, units / (kThreads * 8));
  const int64_t splits = std::max<int64_t>(1, std::min({want, most, max_splits}));
  const int64_t per_split = (units + splits - 1) / splits;
  p.splits = FastDivmod(static_cast<uint32_t>(splits));
  p.units_per_split = static_cast<uint32_t>(per_split);
  p.channels_per_group = static_cast<int>(cpg);
  p.inv_count = 1.0 / static_cast<double>(elems);
  p.eps = eps;
  const int64_t x_bytes = ng * elems * static_cast<int64_t>(sizeof(T));
  // The staged kernel for x of at least staged_min_bytes: packed NC* x on sm_90+, every CTA
  // resident (a cooperative launch) and their slots holding more than a group.
  const int64_t staged_tiles_per_group = (units + kStagedTile - 1) / kStagedTile;
  const int64_t staged_tiles = ng * staged_tiles_per_group;
  const int64_t words_at = (ng + 2) & ~int64_t{1};  // the group words, 8-byte aligned
  if (arrived != nullptr && staged_min_bytes >= 0 && x_bytes >= staged_min_bytes && packed &&
      !channels_last && kernels::pdl_supported(ctx.device) &&
      kernels::cooperative_supported(ctx.device) && arrived_count >= words_at + 2 * ng &&
      kernels::is_aligned(arrived, 8) && 2 * staged_tiles <= workspace_floats &&
      kernels::is_aligned(partial, sizeof(float2)) && staged_tiles < (int64_t{1} << 31)) {
    const int per_sm = staged_ctas_per_sm<T, WT>(ctx.op, ctx.device);
    const int64_t grid =
        std::min<int64_t>(int64_t{per_sm} * kernels::sm_count(ctx.device), staged_tiles);
    if (per_sm > 0 && grid * kStagedSlots > staged_tiles_per_group) {
      Staged st;
      st.tiles_per_group = FastDivmod(static_cast<uint32_t>(staged_tiles_per_group));
      st.tiles = static_cast<uint32_t>(staged_tiles);
      st.groups = static_cast<uint32_t>(ng);
      st.words = reinterpret_cast<unsigned long long*>(arrived + words_at);
      kernels::LaunchConfig config(dim3(static_cast<unsigned>(grid)), dim3(kStagedThreads),
                                   kStagedSmem, ctx.stream, false, 0, true);
      const cudaError_t status = config.launch(group_norm_silu_staged<T, WT>, false, out, x,
                                               weight, bias, partial, arrived, p, st);
      if (status != cudaErrorCooperativeLaunchTooLarge) {
        kernels::check_launch(ctx.op, status);
        return;
      }
      cudaGetLastError();  // fewer CTAs fit than the occupancy said (a shared GPU): streamed
    }
  }
  // The streamed kernel for x of at least stream_min_bytes (x larger than L2).
  const int64_t stream_tiles_per_group = (units + kStreamTile - 1) / kStreamTile;
  const int64_t stream_tiles = ng * stream_tiles_per_group;
  if (arrived != nullptr && stream_min_bytes >= 0 && x_bytes >= stream_min_bytes &&
      arrived_count >= ng + 1 && 2 * stream_tiles <= workspace_floats &&
      kernels::is_aligned(partial, sizeof(float2))) {
    const int per_sm =
        packed ? (channels_last ? stream_ctas_per_sm<T, WT, true, true>(ctx.device)
                                : stream_ctas_per_sm<T, WT, true, false>(ctx.device))
               : (channels_last ? stream_ctas_per_sm<T, WT, false, true>(ctx.device)
                                : stream_ctas_per_sm<T, WT, false, false>(ctx.device));
    const int64_t grid =
        std::min<int64_t>(int64_t{per_sm} * kernels::sm_count(ctx.device), 2 * stream_tiles);
    if (2 * stream_tiles + grid < (int64_t{1} << 31)) {
      // The lag: one group (a norm item's whole group must be ticketed before it: deadlock
      // freedom) plus a share of the items in flight, so that a norm item rarely waits.
      const int64_t lag =
          std::min(stream_tiles, stream_tiles_per_group + (stream_lag_eighths * grid) / 8);
      Stream st;
      st.tiles_per_group = FastDivmod(static_cast<uint32_t>(stream_tiles_per_group));
      st.tiles = static_cast<uint32_t>(stream_tiles);
      st.lag = static_cast<uint32_t>(lag);
      st.groups = static_cast<uint32_t>(ng);
      auto stream = packed ? (channels_last ? group_norm_silu_stream<T, WT, true, true>
                                            : group_norm_silu_stream<T, WT, true, false>)
                           : (channels_last ? group_norm_silu_stream<T, WT, false, true>
                                            : group_norm_silu_stream<T, WT, false, false>);
      kernels::launch(ctx, stream, static_cast<unsigned>(grid), kStreamThreads, out, x, weight,
                      bias, partial, arrived, p, st);
      return;
    }
  }
  // The one-read kernel where every tile of a group can be resident at once.
  auto fused = packed ? (channels_last ? group_norm_silu_fused<T, WT, true, true>
                                       : group_norm_silu_fused<T, WT, true, false>)
                      : (channels_last ? group_norm_silu_fused<T, WT, false, true>
                                       : group_norm_silu_fused<T, WT, false, false>);
  const int64_t tiles_per_group = (units + kFusedTile - 1) / kFusedTile;
  const int64_t total_tiles = ng * tiles_per_group;
  int resident = 0;
  if (arrived != nullptr && kernels::cooperative_supported(ctx.device)) {
    resident = packed ? (channels_last ? resident_ctas<T, WT, true, true>(ctx.device)
                                       : resident_ctas<T, WT, true, false>(ctx.device))
                      : (channels_last ? resident_ctas<T, WT, false, true>(ctx.device)
                                       : resident_ctas<T, WT, false, false>(ctx.device));
  }
  if (arrived != nullptr && tiles_per_group <= resident &&
      2 * total_tiles <= workspace_floats && total_tiles < (int64_t{1} << 31)) {
    Fused f{static_cast<uint32_t>(tiles_per_group), static_cast<uint32_t>(total_tiles)};
    const unsigned grid = static_cast<unsigned>(std::min<int64_t>(resident, total_tiles));
    kernels::LaunchConfig config(dim3(grid), dim3(kFusedThreads), 0, ctx.stream, false, 0, true);
    const cudaError_t status =
        config.launch(fused, false, out, x, weight, bias, partial, arrived, p, f);
    if (status != cudaErrorCooperativeLaunchTooLarge) {
      kernels::check_launch(ctx.op, status);
      return;
    }
    cudaGetLastError();  // fewer CTAs fit than the occupancy said (a shared GPU): two kernels
  }
  const unsigned grid = static_cast<unsigned>(ng * splits);
  kernels::launch(ctx, packed ? group_stats_kernel<T, true> : group_stats_kernel<T, false>, grid,
                  kThreads, x, partial, p);
  auto norm = packed ? (channels_last ? group_norm_silu_kernel<T, WT, true, true>
                                      : group_norm_silu_kernel<T, WT, true, false>)
                     : (channels_last ? group_norm_silu_kernel<T, WT, false, true>
                                      : group_norm_silu_kernel<T, WT, false, false>);
  kernels::launch(ctx, norm, grid, kThreads, out, x, weight, bias,
                  static_cast<const float*>(partial), p);
}

}  // namespace group_norm_silu_detail

// out, x: contiguous [N, C, *spatial] (or [N, *spatial, C] with channels_last), one dtype.
// weight, bias: [C], one dtype, x's or float32. workspace: contiguous float32 (the partial sums;
// no zeroing needed): the one-read and streamed kernels need 2 per tile of 2048 units, the
// two-kernel path N * G * 2 * max_splits. arrived: int32,
// zeroed: [N * G] (the one-read kernel's arrival counters), [N * G + 1] for the streamed kernel
// (arrivals, then its ticket counter); an empty tensor selects the two-kernel path.
// stream_min_bytes: the streamed kernel for x of at least this many bytes (negative: never);
// stream_lag_eighths: its lag beyond one group, in eighths of its grid (>= 0; kStreamLagEighths).
// staged_min_bytes: the staged kernel (before the streamed one) for packed NC* x of at least
// this many bytes (negative: never); it needs arrived of [3 * N * G + 2] (arrivals, tickets, the
// group words).
inline void group_norm_silu(tvm::ffi::TensorView out, tvm::ffi::TensorView x, int64_t num_groups,
                            tvm::ffi::TensorView weight, tvm::ffi::TensorView bias, double eps,
                            bool channels_last, tvm::ffi::TensorView workspace,
                            tvm::ffi::TensorView arrived, int64_t max_splits,
                            int64_t stream_min_bytes, int64_t stream_lag_eighths,
                            int64_t staged_min_bytes) {
  namespace detail = group_norm_silu_detail;
  constexpr const char* kOp = "diffusion.group_norm_silu";
  // 1. Validate.
  TVM_FFI_CHECK(stream_lag_eighths >= 0, ValueError)
      << kOp << ": stream_lag_eighths must be >= 0, got " << stream_lag_eighths;
  TVM_FFI_CHECK(x.ndim() >= 2, ValueError)
      << kOp << ": x must have >= 2 dims [N, C, ...], got " << kernels::shape_string(x);
  kernels::check_same_shape(kOp, "out", out, "x", x);
  kernels::check_same_dtype(kOp, "out", out, "x", x);
  kernels::check_contiguous(kOp, "x", x);
  kernels::check_contiguous(kOp, "out", out);
  const int64_t batch = x.size(0);
  const int64_t channels = channels_last ? x.size(x.ndim() - 1) : x.size(1);
  const int64_t spatial = batch && channels ? x.numel() / (batch * channels) : 0;
  TVM_FFI_CHECK(num_groups >= 1 && channels % num_groups == 0, ValueError)
      << kOp << ": num_groups must be >= 1 and divide C = " << channels << ", got "
      << num_groups;
  for (const auto& [name, v] :
       {std::pair<const char*, const tvm::ffi::TensorView*>{"weight", &weight}, {"bias", &bias}}) {
    TVM_FFI_CHECK(
        v->ndim() == 1 && v->size(0) == channels && (channels <= 1 || v->stride(0) == 1),
        ValueError)
        << kOp << ": " << name << " must be a contiguous [C] = [" << channels << "], got "
        << kernels::shape_string(*v);
  }
  kernels::check_same_dtype(kOp, "bias", bias, "weight", weight);
  const bool fp32_weight = kernels::is_dtype(weight.dtype(), kDLFloat, 32);
  TVM_FFI_CHECK(weight.dtype() == x.dtype() || fp32_weight, TypeError)
      << kOp << ": weight and bias must have x's dtype or float32";
  kernels::check_eps(kOp, eps);
  const int64_t cpg = channels / num_groups;
  TVM_FFI_CHECK(cpg * spatial < (int64_t{1} << 31) && batch * num_groups < (int64_t{1} << 31),
                ValueError)
      << kOp << ": a group of x " << kernels::shape_string(x) << " has 2^31 or more elements";
  TVM_FFI_CHECK(max_splits >= 1 && kernels::is_dtype(workspace.dtype(), kDLFloat, 32) &&
                    workspace.IsContiguous() &&
                    workspace.numel() >= batch * num_groups * 2 * max_splits,
                ValueError)
      << kOp << ": workspace must be contiguous float32 with N * G * 2 * max_splits elements";
  const bool use_arrived = arrived.numel() > 0;
  TVM_FFI_CHECK(!use_arrived || (kernels::is_dtype(arrived.dtype(), kDLInt, 32) &&
                                 arrived.IsContiguous() && arrived.numel() >= batch * num_groups),
                ValueError)
      << kOp << ": arrived must be a contiguous int32 [N * G] (or empty)";
  kernels::check_device(kOp, "x", x, kDLCUDA);
  kernels::check_same_device(kOp, "out", out, "x", x);
  kernels::check_same_device(kOp, "weight", weight, "x", x);
  kernels::check_same_device(kOp, "bias", bias, "x", x);
  kernels::check_same_device(kOp, "workspace", workspace, "x", x);
  if (use_arrived) kernels::check_same_device(kOp, "arrived", arrived, "x", x);
  if (x.numel() == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  const kernels::Launch ctx(kOp, x);
  // 4. Dispatch on dtype and launch (checked).
  float* partial = kernels::data<float>(workspace);
  int* counters = use_arrived ? kernels::data<int>(arrived) : nullptr;
  const int64_t floats = workspace.numel();
  const int64_t counted = use_arrived ? arrived.numel() : 0;
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T, [&] {
    if (fp32_weight && !std::is_same_v<T, float>) {
      detail::run<T, float>(kernels::data<T>(out), kernels::data<const T>(x),
                            kernels::data<const float>(weight), kernels::data<const float>(bias),
                            partial, floats, counters, counted, batch, channels, spatial,
                            num_groups, max_splits, stream_min_bytes, stream_lag_eighths,
                            staged_min_bytes, channels_last, static_cast<float>(eps), ctx);
    } else {
      detail::run<T, T>(kernels::data<T>(out), kernels::data<const T>(x),
                        kernels::data<const T>(weight), kernels::data<const T>(bias), partial,
                        floats, counters, counted, batch, channels, spatial, num_groups,
                        max_splits, stream_min_bytes, stream_lag_eighths, staged_min_bytes,
                        channels_last, static_cast<float>(eps), ctx);
    }
  });
}
