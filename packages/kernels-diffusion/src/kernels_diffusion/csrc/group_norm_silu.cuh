// diffusion.group_norm_silu, CUDA: out = silu((x - mean) * rstd * weight[c] + bias[c]), the mean
// and the biased variance in fp32 per (sample, group) over C/G channels x all spatial positions,
// rounded once. x is contiguous [N, C, *spatial] (a group is one contiguous chunk of
// C/G * S elements) or, channels-last, [N, *spatial, C] (a group is S rows of C/G contiguous
// elements, row stride C). Both are "rows of contiguous segments" to the kernels.
//
// Two schemes, both splitting a group across CTAs (1 x 32 groups must fill 132 SMs):
//   - the one-read kernel (group_norm_silu_waves) where a group fits the shared memory of the
//     SMs (two stages of up to ~113 KB per SM: groups of up to ~14.9 MB on the H200): a persistent
//     grid, one CTA per SM, takes the groups in waves of whole groups; each CTA holds its tile
//     of a group in shared memory, publishes its shifted sums, waits on the group's counter,
//     combines them in fp64 and normalises the held tile, while the next wave's tile is already
//     being copied into its other stage. x read once, out written once. Predicted (H200, bf16):
//     1 x 128 x 20 x 256 x 256 in 32 waves of one 10.5 MB group, DRAM-bound at ~80-90% of copy;
//     1 x 128 x 128 x 512 channels-last in 2 waves of 16 groups; 2 x 256 x 64 x 64 in one wave.
//   - otherwise two kernels, grid = N x G x `splits` CTAs of 256 threads, each owning one slice
//     of a group: (1) stats: each CTA sums (x - K) and (x - K)^2 over its slice (K = the group's
//     first element, a shift that keeps the fp32 sums of squares from cancelling), 4 packs in
//     flight per thread, into the workspace [N x G, splits, 2]; (2) normalize: each warp
//     combines its group's partials in fp64, then the CTA streams its slice again, in reverse
//     CTA order so that the tail of x still in L2 is read from there. x read twice.
// weight and bias: x's dtype or float32 (one dtype). Packs need the segment length, and for NC*
// the spatial size, in whole packs; otherwise the same kernels run on scalars (the one-read
// kernel then stages them through registers, not cp.async).
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(5);

#include <kernels/activation_math.cuh>
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
      if (u0 + k * kThreads < s.end) {
        float f[W];
        v[k].unpack(f);
#pragma unroll
        for (int j = 0; j < W; ++j) {
          const float d = f[j] - shift;
          s1 += d;
          s2 = fmaf(d, d, s2);
        }
      }
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
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    a += __shfl_xor_sync(0xffffffffu, a, o);
    b += __shfl_xor_sync(0xffffffffu, b, o);
  }
  const T* gx = x + s.base;
  T* go = out + s.base;
  const double inv_n = p.inv_count;
  const double m = a * inv_n;
  const double var = fmax(b * inv_n - m * m, 0.0);
  const float mean = kernels::to_float(gx[0]) + static_cast<float>(m);
  const float rstd = rsqrtf(static_cast<float>(var) + p.eps);
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
        if constexpr (kChannelsLast) {
          kernels::Pack<WT, W> wp, bp;
          wp.load_cached(weight + c0 + col[k] * W);
          bp.load_cached(bias + c0 + col[k] * W);
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
// The one-read kernel: x read once, out written once (the minimum traffic). A persistent grid of
// `groups_per_wave` x `tiles_per_group` CTAs, one per SM (all resident: a cooperative launch
// guarantees it or fails), walks the N x G groups in waves of whole groups: CTA c owns tile
// c % tiles_per_group of group wave * groups_per_wave + c / tiles_per_group. Its tile lives in
// one of two shared-memory stages, filled by cp.async (packs; scalars are staged through
// registers). Per wave: issue the copies of the next wave's tile into the other stage, wait for
// this wave's, reduce its shifted sums, publish them (partial[wave % 2][c]) and arrive at the
// group's counter, wait for the group, combine its partials in fp64 (warp 0), normalise the
// stage and store. The next wave's reads are in flight while the group waits and stores.
// Deadlock-free: every CTA publishes its tile of wave w before it waits on wave w, and a group
// never straddles two waves. A group has a count and a generation: the last arriver resets the
// count to 0 and bumps the generation the others wait on, so the counters need no zeroing
// between launches (a launch leaves every count at 0). Partials are double-buffered by wave
// parity: a CTA writes wave w's only after its group's CTAs arrived at wave w - 1, after they
// read wave w - 2's. One tile per group (many small groups) needs neither counter nor partial.
constexpr int kWaveThreads = 512;
// A wave's fixed cost (barrier, combine, the pipeline's fill), in bytes of one SM's share of the
// copy bandwidth (predicted ~2 us x 32 GB/s): the planner trades waves against tile size.
constexpr int64_t kWaveOverheadBytes = 64 * 1024;

struct Waves {
  uint32_t tiles_per_group;  // CTAs per group
  uint32_t groups_per_wave;
  uint32_t waves;
  uint32_t groups;      // N x G
  uint32_t tile_units;  // units per tile (the last tiles of a group may be short or empty)
  uint32_t stage_bytes;
};

__device__ __forceinline__ int load_acquire(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

__device__ __forceinline__ void store_release(int* p, int v) {
  asm volatile("st.release.gpu.global.b32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ void copy_async_16(void* shared_dst, const void* src) {
  const unsigned dst = static_cast<unsigned>(__cvta_generic_to_shared(shared_dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(src) : "memory");
}

__device__ __forceinline__ void copy_async_commit() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}

template <int kPending>
__device__ __forceinline__ void copy_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Unit i of a stage (one 16-byte shared load for packs).
template <bool kPacked, typename Unit>
__device__ __forceinline__ Unit stage_unit(const Unit* stage, uint32_t i) {
  Unit u;
  if constexpr (kPacked) {
    u.set(0, reinterpret_cast<const uint4*>(stage)[i]);
  } else {
    u = stage[i];
  }
  return u;
}

// Element offset of group grp (n * G + g) and its g.
__device__ __forceinline__ int64_t group_base(const Geometry& p, uint32_t grp, uint32_t& g) {
  uint32_t n;
  p.groups.divmod(grp, n, g);
  return static_cast<int64_t>(n) * p.sample_stride + static_cast<int64_t>(g) * p.group_stride;
}

template <typename T, typename WT, bool kPacked, bool kChannelsLast>
__global__ void __launch_bounds__(kWaveThreads, 1)
    group_norm_silu_waves(bool, T* __restrict__ out, const T* __restrict__ x,
                          const WT* __restrict__ weight, const WT* __restrict__ bias,
                          float* __restrict__ partial, int* __restrict__ counters, Geometry p,
                          Waves v) {
  constexpr int W = kernels::pack_width<T, kPacked>;
  using Unit = kernels::Pack<T, W>;
  extern __shared__ __align__(16) unsigned char stages[];
  __shared__ float shared[2][32];
  __shared__ float group_stats[2];
  const uint32_t slot = blockIdx.x / v.tiles_per_group;  // the CTA's group within a wave
  const uint32_t tile = blockIdx.x - slot * v.tiles_per_group;
  const uint32_t begin = min(p.units, tile * v.tile_units);
  const uint32_t count = min(p.units - begin, v.tile_units);
  // Starts the copies of this CTA's tile of wave w into `stage`; returns the group's shift.
  auto issue = [&](uint32_t w, int stage) -> float {
    const uint32_t grp = w * v.groups_per_wave + slot;
    if (grp >= v.groups) return 0.0f;
    uint32_t g;
    const T* gx = x + group_base(p, grp, g);
    Unit* dst = reinterpret_cast<Unit*>(stages + stage * v.stage_bytes);
#pragma unroll 4
    for (uint32_t i = threadIdx.x; i < count; i += kWaveThreads) {
      uint32_t col;
      const T* src = gx + unit_offset<W>(p, begin + i, col);
      if constexpr (kPacked) {
        copy_async_16(dst + i, src);
      } else {
        dst[i].load_stream(src);
      }
    }
    return kernels::to_float(gx[0]);
  };
  float shift = issue(0, 0);
  copy_async_commit();
  for (uint32_t w = 0; w < v.waves; ++w) {
    const int stage = static_cast<int>(w & 1);
    const float next_shift = w + 1 < v.waves ? issue(w + 1, stage ^ 1) : 0.0f;
    copy_async_commit();
    copy_async_wait<1>();  // this thread's copies of wave w have landed
    __syncthreads();       // and every thread's
    const uint32_t grp = w * v.groups_per_wave + slot;
    if (grp < v.groups) {  // uniform over the CTA
      const Unit* held = reinterpret_cast<const Unit*>(stages + stage * v.stage_bytes);
      float s1 = 0.0f, s2 = 0.0f;
#pragma unroll 4
      for (uint32_t i = threadIdx.x; i < count; i += kWaveThreads) {
        float e[W];
        stage_unit<kPacked>(held, i).unpack(e);
#pragma unroll
        for (int j = 0; j < W; ++j) {
          const float d = e[j] - shift;
          s1 += d;
          s2 = fmaf(d, d, s2);
        }
      }
      s1 = kernels::block_sum(s1, shared[0]);
      s2 = kernels::block_sum(s2, shared[1]);
      const uint32_t peers = v.tiles_per_group;
      float* published = partial + 2 * (static_cast<int64_t>(stage) * gridDim.x + blockIdx.x);
      if (peers > 1 && threadIdx.x == 0) {  // publish, arrive, wait for the group
        published[0] = s1;
        published[1] = s2;
        int* arrivals = counters + 2 * static_cast<int64_t>(grp);
        const int generation = load_acquire(arrivals + 1);  // before arriving: it moves after
        __threadfence();
        if (atomicAdd(arrivals, 1) == static_cast<int>(peers) - 1) {
          __threadfence();
          atomicExch(arrivals, 0);  // left at 0 for the next launch
          store_release(arrivals + 1, generation + 1);
        } else {
          while (load_acquire(arrivals + 1) == generation) __nanosleep(64);
        }
      }
      if (threadIdx.x < 32) {  // warp 0 combines the group's partials in fp64
        double a = 0.0, b = 0.0;
        if (peers == 1) {
          a = threadIdx.x == 0 ? s1 : 0.0;
          b = threadIdx.x == 0 ? s2 : 0.0;
        } else {
          __syncwarp();
          __threadfence();
          const float* mine =
              partial + 2 * (static_cast<int64_t>(stage) * gridDim.x + slot * peers);
          for (uint32_t j = threadIdx.x; j < peers; j += 32) {
            a += __ldcg(mine + 2 * j);
            b += __ldcg(mine + 2 * j + 1);
          }
#pragma unroll
          for (int o = 16; o > 0; o >>= 1) {
            a += __shfl_xor_sync(0xffffffffu, a, o);
            b += __shfl_xor_sync(0xffffffffu, b, o);
          }
        }
        if (threadIdx.x == 0) {
          const double m = a * p.inv_count;
          const double var = fmax(b * p.inv_count - m * m, 0.0);
          group_stats[0] = shift + static_cast<float>(m);
          group_stats[1] = rsqrtf(static_cast<float>(var) + p.eps);
        }
      }
      __syncthreads();
      const float mean = group_stats[0], rstd = group_stats[1];
      uint32_t g;
      T* go = out + group_base(p, grp, g);
      const int c0 = static_cast<int>(g) * p.channels_per_group;
#pragma unroll 2
      for (uint32_t i = threadIdx.x; i < count; i += kWaveThreads) {
        const uint32_t u = begin + i;
        uint32_t col;
        const int64_t off = unit_offset<W>(p, u, col);
        float e[W], wv[W], c[W];
        if constexpr (kChannelsLast) {
          kernels::Pack<WT, W> wp, bp;
          wp.load_cached(weight + c0 + col * W);
          bp.load_cached(bias + c0 + col * W);
          wp.unpack(wv);
          bp.unpack(c);
        } else {
          const int ch = c0 + static_cast<int>(p.per_channel.div(u));
          const float wc = kernels::to_float(weight[ch]), bc = kernels::to_float(bias[ch]);
#pragma unroll
          for (int j = 0; j < W; ++j) {
            wv[j] = wc;
            c[j] = bc;
          }
        }
        Unit y = stage_unit<kPacked>(held, i);
        y.unpack(e);
#pragma unroll
        for (int j = 0; j < W; ++j) {
          e[j] = kernels::math::silu(fmaf((e[j] - mean) * rstd, wv[j], c[j]));
        }
        y.pack(e);
        y.store_stream(go + off);
      }
    }
    __syncthreads();  // the stage is refilled and group_stats rewritten by the next wave
    shift = next_shift;
  }
}

// Bytes of one shared-memory stage at most (two per CTA, beside the static shared memory).
inline int64_t stage_capacity(int device) {
  static int cached[64] = {0};
  int bytes = device >= 0 && device < 64 ? cached[device] : 0;
  if (bytes == 0) {
    cudaDeviceGetAttribute(&bytes, cudaDevAttrMaxSharedMemoryPerBlockOptin, device);
    if (device >= 0 && device < 64) cached[device] = bytes;
  }
  return std::max<int64_t>(0, (bytes - 1024) / 2) / 16 * 16;
}

// The waves of the one-read kernel: the tiles per group (at most one CTA per SM in all, a tile
// at most one stage) with the least predicted time, waves x (tile bytes + a wave's overhead).
// tiles_per_group 0: no group fits.
inline Waves plan_waves(int64_t units, int64_t unit_bytes, int64_t groups, int64_t ctas,
                        int64_t capacity) {
  Waves best{};
  int64_t best_cost = 0;
  const int64_t overhead = kWaveOverheadBytes / unit_bytes;
  for (int64_t tiles = 1; tiles <= ctas; ++tiles) {
    const int64_t tile = (units + tiles - 1) / tiles;
    if (tile * unit_bytes <= capacity) {
      const int64_t per_wave = std::min(ctas / tiles, groups);
      const int64_t waves = (groups + per_wave - 1) / per_wave;
      const int64_t cost = waves * (tile + overhead);
      if (best.tiles_per_group == 0 || cost < best_cost) {
        best_cost = cost;
        best.tiles_per_group = static_cast<uint32_t>(tiles);
        best.groups_per_wave = static_cast<uint32_t>(per_wave);
        best.waves = static_cast<uint32_t>(waves);
        best.groups = static_cast<uint32_t>(groups);
        best.tile_units = static_cast<uint32_t>(tile);
        best.stage_bytes = static_cast<uint32_t>((tile * unit_bytes + 15) / 16 * 16);
      }
    }
    if (tile <= 1) break;
  }
  return best;
}

// Launches the one-read kernel (cooperatively where a group has more than one tile); the status.
template <typename T, typename WT, bool kPacked, bool kChannelsLast>
cudaError_t launch_waves(T* out, const T* x, const WT* weight, const WT* bias, float* partial,
                         int* counters, const Geometry& p, const Waves& v,
                         const kernels::Launch& ctx) {
  constexpr auto kernel = group_norm_silu_waves<T, WT, kPacked, kChannelsLast>;
  const int64_t smem = 2 * int64_t{v.stage_bytes};
  kernels::allow_dynamic_smem<kernel>(ctx.op, ctx.device, smem);
  const unsigned grid = v.groups_per_wave * v.tiles_per_group;
  kernels::LaunchConfig config(dim3(grid), dim3(kWaveThreads), static_cast<size_t>(smem),
                               ctx.stream, false, 0, v.tiles_per_group > 1);
  return config.launch(kernel, false, out, x, weight, bias, partial, counters, p, v);
}

template <typename T, typename WT>
void run(T* out, const T* x, const WT* weight, const WT* bias, float* partial,
         int64_t workspace_floats, int* arrived, int64_t batch, int64_t channels, int64_t spatial,
         int64_t groups, int64_t max_splits, bool channels_last, float eps,
         const kernels::Launch& ctx) {
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
  // The one-read kernel where a group fits the stages of the resident CTAs (one per SM).
  const Waves v = plan_waves(units, w * static_cast<int64_t>(sizeof(T)), ng,
                             kernels::sm_count(ctx.device), stage_capacity(ctx.device));
  const int64_t ctas = int64_t{v.groups_per_wave} * v.tiles_per_group;
  if (v.tiles_per_group > 0 && 4 * ctas <= workspace_floats &&
      (v.tiles_per_group == 1 ||
       (arrived != nullptr && kernels::cooperative_supported(ctx.device)))) {
    auto launch = packed ? (channels_last ? launch_waves<T, WT, true, true>
                                          : launch_waves<T, WT, true, false>)
                         : (channels_last ? launch_waves<T, WT, false, true>
                                          : launch_waves<T, WT, false, false>);
    const cudaError_t status = launch(out, x, weight, bias, partial, arrived, p, v, ctx);
    if (status != cudaErrorCooperativeLaunchTooLarge) {
      kernels::check_launch(ctx.op, status);
      return;
    }
    cudaGetLastError();  // fewer CTAs fit than one per SM (a shared GPU): two kernels
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
// no zeroing needed): the one-read kernel needs 4 per CTA (at most one CTA per SM), the
// two-kernel path N * G * 2 * max_splits. arrived: int32 [2 * N * G] (a count and a generation
// per group), zeroed once: every launch leaves the counts at 0; an empty tensor leaves the
// one-read kernel to groups of one tile.
inline void group_norm_silu(tvm::ffi::TensorView out, tvm::ffi::TensorView x, int64_t num_groups,
                            tvm::ffi::TensorView weight, tvm::ffi::TensorView bias, double eps,
                            bool channels_last, tvm::ffi::TensorView workspace,
                            tvm::ffi::TensorView arrived, int64_t max_splits) {
  namespace detail = group_norm_silu_detail;
  constexpr const char* kOp = "diffusion.group_norm_silu";
  // 1. Validate.
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
                                 arrived.IsContiguous() &&
                                 arrived.numel() >= 2 * batch * num_groups),
                ValueError)
      << kOp << ": arrived must be a contiguous int32 [2 * N * G] (or empty)";
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
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T, [&] {
    if (fp32_weight && !std::is_same_v<T, float>) {
      detail::run<T, float>(kernels::data<T>(out), kernels::data<const T>(x),
                            kernels::data<const float>(weight), kernels::data<const float>(bias),
                            partial, floats, counters, batch, channels, spatial, num_groups,
                            max_splits, channels_last, static_cast<float>(eps), ctx);
    } else {
      detail::run<T, T>(kernels::data<T>(out), kernels::data<const T>(x),
                        kernels::data<const T>(weight), kernels::data<const T>(bias), partial,
                        floats, counters, batch, channels, spatial, num_groups, max_splits,
                        channels_last, static_cast<float>(eps), ctx);
    }
  });
}
