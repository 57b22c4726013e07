// The small-M GEMM engine of dsv3_router_gemm and dsv3_fused_a_gemm: out[m, n] = sum_k x[m, k] *
// w[n, k] for M <= 16 rows of bf16 activations against a bf16 weight [N, K] (rows contiguous in K),
// fp32 accumulation, the result rounded once to the output type (fp32 or bf16).
//
// At M <= 16 the op is weight-bandwidth bound (DeepSeek-V3: 256 x 7168 router = 3.7 MB, 2112 x 7168
// fused q_a/kv_a = 30.3 MB), so the kernel streams the weight once with 16-byte loads and does its
// arithmetic on tensor cores (mma.sync m16n8k16, bf16 in, fp32 accumulate): the M <= 16 rows are
// the MMA's 16-row A operand (rows past M load as zeros; M <= 8 skips rows 8-15), 8 weight rows
// its B operand.
//
// The k order inside a 32-wide chunk is a free permutation as long as A and B agree on it, so each
// lane loads 16 contiguous bytes (8 k values) of its weight row and of its x rows: lane (g, t) of
// an MMA pair holds k = chunk + 8t + {0..3} for the first MMA and 8t + {4..7} for the second, where
// the MMA wants k = {2t, 2t+1, 2t+8, 2t+9}. One LDG.128 of weight feeds two MMAs, with no shuffles,
// no shared-memory staging and no conversions.
//
// Work split: a CTA of kWarps warps owns kTiles groups of 8 weight rows (kTiles * 8 output columns)
// over one K slice; its warps take contiguous runs of 32-wide chunks of that slice, kUnroll chunks
// per stage, two stages in flight (ping-pong registers: loads of the next stage are issued before
// the MMAs of the current one). When the columns alone leave SMs idle (the router: 32 groups of 8
// experts for 132 SMs), `split` CTAs of a thread-block cluster take one K slice each and reduce
// their partial tiles through distributed shared memory, in rank order (deterministic): no
// workspace, no atomics, one launch: each CTA pushes its partial of an element into the shared
// memory of the rank that owns it (st.async, counted on the owner's mbarrier), and each owner
// waits for the bytes pushed into it, not for a cluster barrier, before it sums its own shared
// memory. The host picks (kTiles, split) per shape (`plan`).
//
// Long runs (at least kRingMinChunks chunks a warp: fused_a's 28) take ring_kernel instead, the
// same split and arithmetic with the loads staged through a per-warp ring of shared memory
// (cp.async, 192 KB a CTA, one CTA per SM): 80-112 KB of weight in flight per SM instead of the
// registers' 16-48 KB (see ring_kernel). The rest of this note is about gemm_kernel.
//
// Two CTAs per SM (__launch_bounds__(kThreads, 2): at most 128 registers, so a stage holds at most
// kStageVectors = 10 16-byte vectors, two stages 80 registers; sm_90a: 112-118 registers, no
// spills). The grid is at most one CTA per SM, and the second slot is for the next kernel: with
// PDL its CTAs become resident while this grid runs. At the former 168-192 registers (one CTA per
// SM) the next kernel's CTAs could not start before this one's had left, so PDL overlapped nothing
// (the L2 prefetch ran just before the wait that released at once), and the router's 32 clusters
// of 4 needed 4 free SMs per cluster inside one GPC, which 132 SMs in GPCs of unequal size may
// not offer in one wave.
//
// PDL: launched with programmatic stream serialization, a CTA may start while the previous kernel
// on the stream still runs. It first prefetches into L2 (cp.async.bulk.prefetch: L2 is the point
// of coherence, so this can never observe stale data) the x rows of its runs, spread over the
// column groups (x is read by all of them), and the part of each warp's weight run head (at most
// kPrefetchBytes per CTA) that it does not load itself before the wait. Then it LOADS ITS FIRST
// WEIGHT STAGES BEFORE griddepcontrol.wait (gemm_kernel: two register stages, the router's whole
// 28 KB slice at M <= 8; ring_kernel: the whole shared-memory ring, fused_a's first 128 of 229 KB
// at M <= 8), so the weight, most of the bytes, streams while the previous kernel finishes; only
// x waits. That is the ops' PDL contract: with PDL the weight is read before the preceding kernel
// completes, so that kernel (or any earlier one still running because it released its
// dependents before its own wait) must not write it; a model's weights are written by nothing
// during inference, and the kernel before these GEMMs writes x (a norm). TensorRT-LLM's fused-A
// kernel reads its weight without waiting in the same way. Without PDL the launch is serialized
// and the wait is a no-op, so the order changes nothing. After the wait the CTA issues its first
// x loads and at once lets the next kernel launch (griddepcontrol.launch_dependents), whose CTAs
// (gemm_kernel: in the SM's second slot) load their own weight while this one computes.
// Back-to-back calls thus keep HBM busy across the kernel boundary instead of paying launch, CTA
// start and a cold DRAM round trip each, and after the wait only x moves from L2 (the router at
// M = 1: 3.5 KB per CTA) instead of x and each CTA's 28 KB weight slice.
//
// Host switches (Switches, passed by each op from module attributes it reads every call, so an
// in-process A/B can flip them): whether the ring kernel is taken (ring_max_m: at most this M;
// 0 never), whether the split-K reduction pushes partials with st.async (push; else DSMEM stores
// and a second cluster barrier), and whether under PDL the weight is loaded before the wait
// (weight_first; else everything waits, with the L2 prefetch of each run's head before it). The
// last two are template bools, every kernel being instantiated both ways; with both false
// gemm_kernel is the kernel of before the ring (SASS identical at sm_90a).
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(8);

#include <cooperative_groups.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <kernels/checks.h>
#include <kernels/cluster.cuh>
#include <kernels/cuda_dtype.cuh>
#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>
#include <kernels/tensor.h>
#include <kernels/vec.cuh>

#include <cstdint>

namespace small_m_gemm {

namespace cg = cooperative_groups;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kChunk = 32;     // k per chunk: two m16n8k16 MMAs
constexpr int kMaxRows = 16;   // the MMA's M
constexpr int kMaxSplit = 4;   // CTAs per cluster (K slices)
constexpr int kVec = 8;        // bf16 per 16-byte load
constexpr int kStageVectors = 10;  // 16-byte vectors per pipeline stage (40 registers)
constexpr uint32_t kPrefetchBytes = 96 * 1024;  // L2 prefetch per CTA under PDL

struct Params {
  const __nv_bfloat16* x;  // [M, K], row stride sx (elements)
  const __nv_bfloat16* w;  // [N, K], row stride sw
  void* out;               // [M, N], strides so_m, so_n
  int64_t sx;
  int64_t sw;
  int64_t so_m;
  int64_t so_n;
  int m;
  int n;
  int k;
  int split;          // CTAs per cluster, each over one K slice
  int slice_chunks;   // 32-wide chunks per slice
};

// Registers of one pipeline stage: kUnroll chunks of kTiles weight vectors and kHalves x vectors
// (rows g and g + 8 of the MMA).
template <int kUnroll, int kTiles, int kHalves>
struct Stage {
  uint4 w[kUnroll][kTiles];
  uint4 x[kUnroll][kHalves];
};

__device__ __forceinline__ uint4 load_or_zero(const __nv_bfloat16* p, bool ok) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if (ok) v = __ldg(reinterpret_cast<const uint4*>(p));
  return v;
}

__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                         uint32_t a3, uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#endif
}

__device__ __forceinline__ void prefetch_l2(const void* p, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

template <typename OutT>
__device__ __forceinline__ void store_out(void* out, int64_t offset, float v) {
  static_cast<OutT*>(out)[offset] = kernels::from_float<OutT>(v);
}

// What a lane works on: its CTA's rank in the cluster and first column, its warp's run of 32-wide
// chunks of K, its weight rows (row col0 + 8j + g of each tile) and x rows (g and g + 8), with
// whether each exists (rows past N or M load as zeros).
template <int kTiles, int kHalves>
struct Work {
  int rank;
  int col0;
  int run_begin;
  int run_end;
  const __nv_bfloat16* wrow[kTiles];
  bool wok[kTiles];
  const __nv_bfloat16* xrow[kHalves];
  bool xok[kHalves];
};

// The start of both kernels: the cluster's first arrive, the run, the rows and, under PDL, the
// prefetch into L2 of what the kernel reads after the wait: x, and the part of the weight run's
// head past its first kPreloadChunks chunks (those the kernel itself loads before the wait). It
// returns BEFORE griddepcontrol.wait when kWeightFirst (the caller issues its weight loads, then
// kernels::pdl_wait(), then reads x: see the header's PDL note), else after it (kPreloadChunks 0).
// kPush: the inbox barrier is armed (st.async pushes), else the reduction stores and synchronizes.
template <int kTiles, int kHalves, int kPreloadChunks, bool kWeightFirst, bool kPush>
__device__ __forceinline__ Work<kTiles, kHalves> begin(bool pdl, const Params& p,
                                                      uint64_t* inbox_bar) {
  static_assert(kWeightFirst || kPreloadChunks == 0, "nothing is loaded before the wait");
  Work<kTiles, kHalves> wk;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int g = lane >> 2;  // MMA group: weight row within a tile, x rows g and g + 8
  const int t = lane & 3;   // k quad
  const int split = p.split;
  // Phase 1 of the cluster barrier, waited for before the first push into another CTA: every CTA
  // of the cluster has started (its shared memory exists) and armed its inbox's barrier for the
  // split pushes of each of its kTiles * 128 / split elements.
  if (split > 1) {
    if constexpr (kPush) {
      if (threadIdx.x == 0) kernels::push_barrier_init(inbox_bar, kTiles * 128 * sizeof(float));
    }
    kernels::cluster_arrive_relaxed();
  }
  const int rank = static_cast<int>(blockIdx.x) % split;
  wk.rank = rank;
  const int col0 = static_cast<int>(blockIdx.x) / split * (kTiles * 8);
  wk.col0 = col0;
  const int chunks = (p.k + kChunk - 1) / kChunk;
  const int slice_begin = rank * p.slice_chunks;
  const int slice_end = min(slice_begin + p.slice_chunks, chunks);

  // This warp's run of chunks, and of K (elements): what it loads and, under PDL, prefetches.
  const int per_warp = (slice_end - slice_begin + kWarps - 1) / kWarps;
  const int run_begin = slice_begin + warp * per_warp;
  const int run_end = min(run_begin + per_warp, slice_end);
  wk.run_begin = run_begin;
  wk.run_end = run_end;
  const int64_t run_k = static_cast<int64_t>(run_begin) * kChunk;
  const uint32_t run_bytes = static_cast<uint32_t>(
      max(min(static_cast<int64_t>(run_end) * kChunk, static_cast<int64_t>(p.k)) - run_k,
          int64_t{0}) *
      sizeof(__nv_bfloat16));

  if (pdl) {  // the head of this warp's run of each weight row into L2 (see the header)
    constexpr int kRows = kTiles * 8;
    constexpr uint32_t kPerRun = kPrefetchBytes / (kRows * kWarps) / 16 * 16;
    // The first kPreloadChunks chunks are loaded before the wait anyway: only the rest of the
    // head (router M > 8: its 7th chunk; fused_a and the router at M <= 8: nothing).
    constexpr uint32_t kPreloaded = kPreloadChunks * kChunk * sizeof(__nv_bfloat16);
    static_assert(kRows + kMaxRows <= 32, "one weight row, then one x row, per lane");
    if constexpr (kPreloadChunks == 0) {  // as before the weight-first order (same SASS)
      if (lane < kRows && col0 + lane < p.n && run_bytes > 0)
        prefetch_l2(p.w + static_cast<int64_t>(col0 + lane) * p.sw + run_k,
                    min(run_bytes, kPerRun));
    } else {
      const uint32_t head = min(run_bytes, kPerRun);
      if (lane < kRows && col0 + lane < p.n && head > kPreloaded)
        prefetch_l2(
            p.w + static_cast<int64_t>(col0 + lane) * p.sw + run_k + kPreloadChunks * kChunk,
            head - kPreloaded);
    }
    // The run's x rows too (unless the previous kernel just wrote x, a DRAM round trip after the
    // wait otherwise): each (run, row) by one column group, as every group reads them.
    const int m = lane - kRows;
    const int groups = static_cast<int>(gridDim.x) / split;
    if (m >= 0 && m < p.m && run_bytes > 0 && (warp * p.m + m) % groups == col0 / (kTiles * 8))
      prefetch_l2(p.x + static_cast<int64_t>(m) * p.sx + run_k, run_bytes);
  }
  if constexpr (!kWeightFirst) kernels::pdl_wait();

  // This lane's rows: weight row col0 + 8j + g of each tile; x rows g and g + 8.
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    const int n = col0 + j * 8 + g;
    wk.wok[j] = n < p.n;
    wk.wrow[j] = p.w + static_cast<int64_t>(wk.wok[j] ? n : 0) * p.sw + t * kVec;
  }
#pragma unroll
  for (int h = 0; h < kHalves; ++h) {
    const int m = g + 8 * h;
    wk.xok[h] = m < p.m;
    wk.xrow[h] = p.x + static_cast<int64_t>(wk.xok[h] ? m : 0) * p.sx + t * kVec;
  }

  return wk;
}

// A warp's accumulators in both kernels, acc[kChains<kTiles>][kTiles][4] (MMA C fragments). With
// one tile, a chunk's second MMA accumulates into a second set of registers: two dependent MMA
// chains of half the length, as with two tiles (the MMAs after the last loads land are on the
// critical path). finish adds the sets before the warps' tiles are summed.
template <int kTiles>
constexpr int kChains = kTiles == 1 ? 2 : 1;

template <int kTiles>
__device__ __forceinline__ void zero_acc(float (&acc)[kChains<kTiles>][kTiles][4]) {
#pragma unroll
  for (int c = 0; c < kChains<kTiles>; ++c) {
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[c][j][i] = 0.0f;
    }
  }
}

// One chunk of tile j: the lane's x rows g (lo) and g + 8 (hi) against its weight vector b, k
// values 0-3 of each into the first chain, 4-7 into the last (see the header's k order).
template <int kTiles>
__device__ __forceinline__ void mma_chunk(float (&acc)[kChains<kTiles>][kTiles][4], int j,
                                          uint4 lo, uint4 hi, uint4 b) {
  mma_bf16(acc[0][j], lo.x, hi.x, lo.y, hi.y, b.x, b.y);
  mma_bf16(acc[kChains<kTiles> - 1][j], lo.z, hi.z, lo.w, hi.w, b.z, b.w);
}

// The end of both kernels: the chains into one, the warps' tiles summed in warp order in shared
// memory, then (split > 1) across the cluster in rank order, and stored. `acc`: this warp's
// accumulators (see zero_acc).
template <typename OutT, int kTiles, bool kPush>
__device__ __forceinline__ void finish(float (&acc)[kChains<kTiles>][kTiles][4],
                                       float (*partial)[kTiles * 128],
                                       float (*inbox)[kTiles * 128], uint64_t* inbox_bar,
                                       const Params& p, int rank, int col0) {
  constexpr int kTileElems = kTiles * 128;  // a 16 x 8 fp32 tile per 8 columns
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int split = p.split;
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    if (kChains<kTiles> > 1) {
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[0][j][i] += acc[kChains<kTiles> - 1][j][i];
    }
  }
#pragma unroll
  for (int j = 0; j < kTiles; ++j) {
    *reinterpret_cast<float4*>(&partial[warp][j * 128 + lane * 4]) =
        make_float4(acc[0][j][0], acc[0][j][1], acc[0][j][2], acc[0][j][3]);
  }
  __syncthreads();
  const int e = threadIdx.x;  // kTileElems <= kThreads: one element per thread
  float sum = 0.0f;
  if (e < kTileElems) {
#pragma unroll
    for (int w = 0; w < kWarps; ++w) sum += partial[w][e];
  }
  // Element e of the tiles: tile j, lane l, value i of the MMA's C fragment.
  const int j = e / 128, l = (e % 128) / 4, i = e % 4;
  const int row = l / 4 + (i >= 2 ? 8 : 0);
  const int col = col0 + j * 8 + (l % 4) * 2 + (i & 1);
  const bool live = e < kTileElems && row < p.m && col < p.n;
  if (split == 1) {
    if (live) store_out<OutT>(p.out, row * p.so_m + col * p.so_n, sum);
    return;
  }
  // Across the cluster: rank e % split owns element e; each CTA pushes its slice's partial into
  // the owner's inbox (st.async, counted on the owner's barrier), each owner waits for the pushes
  // into it and sums its inbox in rank order (deterministic). Every CTA waits for every push into
  // it, so none exits while another still writes into it. One cluster barrier fewer than stores
  // followed by arrive.release / wait.acquire (whose release is a MEMBAR.GPU), as in the row
  // engine's split rows.
  // Without kPush: DSMEM stores, then arrive.release / wait.acquire (the kernel before st.async).
  const int owner = e % split;
  kernels::cluster_wait();
  if constexpr (kPush) {
    if (e < kTileElems) kernels::cluster_push(&inbox[rank][e], inbox_bar, owner, sum);
    kernels::push_barrier_wait(inbox_bar);
  } else {
    if (live) *cg::this_cluster().map_shared_rank(&inbox[rank][e], owner) = sum;
    kernels::cluster_arrive();
    kernels::cluster_wait();
  }
  if (live && owner == rank) {
    float v = 0.0f;
#pragma unroll
    for (int q = 0; q < kMaxSplit; ++q) {
      if (q < split) v += inbox[q][e];
    }
    store_out<OutT>(p.out, row * p.so_m + col * p.so_n, v);
  }
}

// kUnroll chosen so that one stage holds at most kStageVectors vectors; at least 2. Router (1 tile,
// 7-chunk runs): 5 chunks a stage at M <= 8 (the whole run in flight at once), 3 at M > 8 (6 of 7);
// fused_a (2 tiles, 28-chunk runs): 3 chunks at M <= 8, 2 at M > 8.
template <int kTiles, int kHalves>
struct Unroll {
  static constexpr int value =
      kStageVectors / (kTiles + kHalves) > 2 ? kStageVectors / (kTiles + kHalves) : 2;
};

// grid: (column groups) * split CTAs, clusters of `split` consecutive CTAs; block: kThreads.
// kWeightFirst, kPush: the host switches (see the header).
template <typename OutT, int kTiles, int kHalves, bool kWeightFirst, bool kPush>
__global__ void __launch_bounds__(kThreads, 2) gemm_kernel(bool pdl, Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kUnroll = Unroll<kTiles, kHalves>::value;
  constexpr int kTileElems = kTiles * 128;  // a 16 x 8 fp32 tile per 8 columns
  __shared__ __align__(16) float partial[kWarps][kTileElems];
  __shared__ float inbox[kMaxSplit][kTileElems];  // the ranks' partials of the elements owned here
  __shared__ __align__(8) uint64_t inbox_bar;      // counts the bytes pushed into inbox

  const Work<kTiles, kHalves> wk =
      begin<kTiles, kHalves, kWeightFirst ? 2 * kUnroll : 0, kWeightFirst, kPush>(pdl, p,
                                                                                 &inbox_bar);
  const int rank = wk.rank, col0 = wk.col0, run_begin = wk.run_begin, run_end = wk.run_end;
  const int t = threadIdx.x & 3;

  const int stages = run_end > run_begin ? (run_end - run_begin + kUnroll - 1) / kUnroll : 0;

  float acc[kChains<kTiles>][kTiles][4];
  zero_acc<kTiles>(acc);

  using S = Stage<kUnroll, kTiles, kHalves>;
  // Chunk u of a stage: its first k, and whether this lane's 8 values exist (the chunk is in the
  // run and, K % 8 == 0, the values all inside K, else all outside).
  auto chunk = [&](int stage, int u, int64_t& k) {
    const int c = run_begin + stage * kUnroll + u;
    k = static_cast<int64_t>(c) * kChunk;
    return c < run_end && k + t * kVec < p.k;
  };
  // A stage's weight vectors, and its x vectors: the first two stages' weight is loaded before the
  // PDL wait, their x after it.
  auto load_w = [&](S& s, int stage) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      int64_t k;
      const bool in = chunk(stage, u, k);
#pragma unroll
      for (int j = 0; j < kTiles; ++j) s.w[u][j] = load_or_zero(wk.wrow[j] + k, in && wk.wok[j]);
    }
  };
  auto load_x = [&](S& s, int stage) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      int64_t k;
      const bool in = chunk(stage, u, k);
#pragma unroll
      for (int h = 0; h < kHalves; ++h) s.x[u][h] = load_or_zero(wk.xrow[h] + k, in && wk.xok[h]);
    }
  };
  auto compute = [&](const S& s) {
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint4 lo = s.x[u][0];
      const uint4 hi = kHalves > 1 ? s.x[u][kHalves - 1] : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
      for (int j = 0; j < kTiles; ++j) mma_chunk<kTiles>(acc, j, lo, hi, s.w[u][j]);
    }
  };

  S a, b;
  if constexpr (kWeightFirst) {
    // Two stages in flight: each stage's refill goes out right after its MMAs, before the other
    // stage's. Under PDL the first two stages' weight (the router's whole run at M <= 8, 6 of its 7
    // chunks at M > 8) is loaded before griddepcontrol.wait, while the previous kernel finishes (the
    // op's contract: that kernel does not write the weight), and only x after it.
    if (stages > 0) load_w(a, 0);
    if (stages > 1) load_w(b, 1);
    kernels::pdl_wait();
    if (stages > 0) load_x(a, 0);
    if (stages > 1) load_x(b, 1);
    // This CTA's first loads are out: the next kernel may launch (its CTAs take the SM's second
    // slot, load their weight, and wait for this grid to finish before reading x).
    kernels::pdl_launch_dependents();
#pragma unroll 1
    for (int s = 0; s < stages; s += 2) {
      compute(a);
      if (s + 2 < stages) {
        load_w(a, s + 2);
        load_x(a, s + 2);
      }
      if (s + 1 < stages) {
        compute(b);
        if (s + 3 < stages) {
          load_w(b, s + 3);
          load_x(b, s + 3);
        }
      }
    }
  } else {
    // The kernel of before the weight-first order: begin() waited; the next stage's loads go out
    // before this stage's MMAs, weight and x together.
    auto load = [&](S& s, int stage) {
      const int c0 = run_begin + stage * kUnroll;
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int c = c0 + u;
        const int64_t k = static_cast<int64_t>(c) * kChunk;
        // K % 8 == 0, so a lane's 8 values are all inside K or all outside.
        const bool in = c < run_end && k + t * kVec < p.k;
#pragma unroll
        for (int j = 0; j < kTiles; ++j) s.w[u][j] = load_or_zero(wk.wrow[j] + k, in && wk.wok[j]);
#pragma unroll
        for (int h = 0; h < kHalves; ++h) s.x[u][h] = load_or_zero(wk.xrow[h] + k, in && wk.xok[h]);
      }
    };
    if (stages > 0) load(a, 0);
    kernels::pdl_launch_dependents();
#pragma unroll 1
    for (int s = 0; s < stages; s += 2) {
      if (s + 1 < stages) load(b, s + 1);
      compute(a);
      if (s + 2 < stages) load(a, s + 2);
      if (s + 1 < stages) compute(b);
    }
  }

  finish<OutT, kTiles, kPush>(acc, partial, inbox, &inbox_bar, p, rank, col0);
#endif
}

// The ring kernel: the same work split, MMAs and sums as gemm_kernel, for long runs (fused_a: 28
// chunks a warp). Its loads go through shared memory instead of registers: each lane copies its
// own 16-byte vectors (cp.async.cg, zero-filled outside M, N and K) into its own slots of its
// warp's ring of kRingStages stages of kRingUnroll chunks, and reads back only what it copied
// itself, so cp.async.wait_group alone orders the two (no barrier, no shuffle). All kRingStages
// stages are in flight while the oldest is computed: 192 KB of ring per CTA, one CTA per SM,
// holds 112 KB of weight in flight per SM at M <= 8 (7 stages of 2 chunks of 2 tiles a warp)
// and 80 KB at M > 8, where gemm_kernel's two register stages hold 24-48 KB and 16-32 KB.
// Little's law at ~3.5 TB/s and ~1-1.5 us of loaded DRAM latency asks 27-40 KB per SM on average
// over the whole kernel; gemm_kernel dips below it at each stage boundary (cold fused_a: 2.5 TB/s,
// 12.2-14.4 us), while TRT-LLM's fused_a kernel (cp.async stages, ~128 KB of weight per SM)
// reaches 8.8 us. A refill goes into the slot just computed: its values are in registers (the
// MMAs that read them issued before it), so the copy cannot overwrite them early.
constexpr int kRingUnroll = 2;       // chunks per ring stage
constexpr int kRingVectors = 48;     // 16-byte slots per lane: 8 warps x 48 x 512 B = 192 KB
constexpr int kRingMinChunks = 16;   // runs at least this long (per warp) take the ring kernel
constexpr int64_t kRingBytes = int64_t{kWarps} * kRingVectors * 32 * 16;

template <int kTiles, int kHalves>
struct Ring {
  static constexpr int kVectors = kTiles + kHalves;  // per chunk: weight tiles, then x halves
  static constexpr int kStages = kRingVectors / (kRingUnroll * kVectors);
  static_assert(kStages >= 2, "a ring of at least two stages");
};

__device__ __forceinline__ void cp_async_16(uint32_t dst, const void* src, bool ok) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
               "r"(ok ? 16 : 0)
               : "memory");
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}

template <int kPending>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
#endif
}

// grid, block and clusters as gemm_kernel; kRingBytes of dynamic shared memory. kWeightFirst,
// kPush: the host switches (see the header).
template <typename OutT, int kTiles, int kHalves, bool kWeightFirst, bool kPush>
__global__ void __launch_bounds__(kThreads, 1) ring_kernel(bool pdl, Params p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int kV = Ring<kTiles, kHalves>::kVectors;
  constexpr int kStages = Ring<kTiles, kHalves>::kStages;
  constexpr int kTileElems = kTiles * 128;
  __shared__ __align__(16) float partial[kWarps][kTileElems];
  __shared__ float inbox[kMaxSplit][kTileElems];
  __shared__ __align__(8) uint64_t inbox_bar;
  extern __shared__ __align__(16) uint4 ring[];

  const Work<kTiles, kHalves> wk =
      begin<kTiles, kHalves, kWeightFirst ? kStages * kRingUnroll : 0, kWeightFirst, kPush>(
          pdl, p, &inbox_bar);
  const int run_begin = wk.run_begin, run_end = wk.run_end;
  const int lane = threadIdx.x & 31;
  const int warp = threadIdx.x >> 5;
  const int t = lane & 3;
  const int stages =
      run_end > run_begin ? (run_end - run_begin + kRingUnroll - 1) / kRingUnroll : 0;

  // Slot (stage r, chunk u, vector v) of this lane: 32 lanes' 16 bytes side by side, so each
  // copy and each read of a warp is 512 contiguous bytes (no bank conflicts).
  const uint4* mine = ring + warp * (kStages * kRingUnroll * kV * 32) + lane;
  const uint32_t mine_s = static_cast<uint32_t>(__cvta_generic_to_shared(mine));
  auto slot = [&](int r, int u, int v) { return ((r * kRingUnroll + u) * kV + v) * 32; };

  // Stage s (if it exists) into ring slot r: its weight vectors, its x vectors, or both; then a
  // group is committed either way, so the count of groups, and the wait below, do not depend on
  // the run's length.
  auto issue = [&](int s, int r, bool weight, bool x) {
    if (s < stages) {
#pragma unroll
      for (int u = 0; u < kRingUnroll; ++u) {
        const int c = run_begin + s * kRingUnroll + u;
        const int64_t k = static_cast<int64_t>(c) * kChunk;
        // K % 8 == 0, so a lane's 8 values are all inside K or all outside.
        const bool in = c < run_end && k + t * kVec < p.k;
        if (weight) {
#pragma unroll
          for (int j = 0; j < kTiles; ++j) {
            const bool ok = in && wk.wok[j];
            cp_async_16(mine_s + slot(r, u, j) * 16, ok ? wk.wrow[j] + k : wk.wrow[j], ok);
          }
        }
        if (x) {
#pragma unroll
          for (int h = 0; h < kHalves; ++h) {
            const bool ok = in && wk.xok[h];
            cp_async_16(mine_s + slot(r, u, kTiles + h) * 16, ok ? wk.xrow[h] + k : wk.xrow[h],
                        ok);
          }
        }
      }
    }
    cp_async_commit();
  };

  // The whole ring's weight before the PDL wait (fused_a at M <= 8: 128 KB of the CTA's 229 KB),
  // while the previous kernel finishes (the op's contract: that kernel does not write the weight);
  // x after it. Groups 0..kStages-1 then hold the stages' weight, kStages..2 kStages-1 their x,
  // and the refill of stage s >= kStages (issued at step s - kStages) is group kStages + s: stage
  // s always completes with group kStages + s, and at step s, 2 kStages + s groups are committed,
  // so waiting until at most kStages - 1 are pending still means stage s has landed.
  // Without kWeightFirst (begin() waited) each stage is one group, weight and x: stage s completes
  // with group s, and waiting until at most kStages - 1 are pending means the same.
  if constexpr (kWeightFirst) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) issue(s, s, true, false);
    kernels::pdl_wait();
#pragma unroll
    for (int s = 0; s < kStages; ++s) issue(s, s, false, true);
  } else {
#pragma unroll
    for (int s = 0; s < kStages; ++s) issue(s, s, true, true);
  }
  // This CTA's first loads are out: the next kernel may launch.
  kernels::pdl_launch_dependents();

  float acc[kChains<kTiles>][kTiles][4];
  zero_acc<kTiles>(acc);

  int r = 0;
#pragma unroll 1
  for (int s = 0; s < stages; ++s) {
    cp_async_wait<kStages - 1>();  // stage s's groups have landed: it is in slot r
#pragma unroll
    for (int u = 0; u < kRingUnroll; ++u) {
      const uint4 lo = mine[slot(r, u, kTiles)];
      const uint4 hi = kHalves > 1 ? mine[slot(r, u, kTiles + 1)] : make_uint4(0u, 0u, 0u, 0u);
#pragma unroll
      for (int j = 0; j < kTiles; ++j) mma_chunk<kTiles>(acc, j, lo, hi, mine[slot(r, u, j)]);
    }
    issue(s + kStages, r, true, true);
    r = r + 1 == kStages ? 0 : r + 1;
  }

  finish<OutT, kTiles, kPush>(acc, partial, inbox, &inbox_bar, p, wk.rank, wk.col0);
#endif
}

using KernelFn = void (*)(bool, Params);

// The host switches of one call (see the header), read by the ops from module attributes.
struct Switches {
  int ring_max_m = kMaxRows;  // the ring kernel for long runs at M <= this (0: never)
  bool push = true;           // split-K partials pushed with st.async (else stores + barrier)
  bool weight_first = true;   // under PDL the weight loaded before griddepcontrol.wait
};

template <typename OutT, bool kWeightFirst, bool kPush>
inline KernelFn kernel_for(int tiles, int halves) {
  if (tiles == 1)
    return halves == 1 ? gemm_kernel<OutT, 1, 1, kWeightFirst, kPush>
                       : gemm_kernel<OutT, 1, 2, kWeightFirst, kPush>;
  return halves == 1 ? gemm_kernel<OutT, 2, 1, kWeightFirst, kPush>
                     : gemm_kernel<OutT, 2, 2, kWeightFirst, kPush>;
}

// (kTiles, split) for an [N, K] weight: the fewest weight bytes per SM (CTAs in waves of one per
// SM), then the fewest column groups (each reads all of x), then the smallest cluster. Slices
// keep at least 2 chunks per warp. DeepSeek-V3 on 132 SMs: router 256 x 7168 -> 8 experts per CTA
// in clusters of 4 (128 CTAs); 384 experts -> 16 per CTA in clusters of 4 (96 CTAs); fused_a
// 2112 x 7168 -> 16 columns per CTA, no split (132 CTAs).
struct Plan {
  int tiles = 1;
  int split = 1;
  int slice_chunks = 0;
  int64_t ctas = 0;
};

inline Plan plan(int device, int64_t n, int64_t k) {
  const int64_t sms = kernels::sm_count(device) > 0 ? kernels::sm_count(device) : 132;
  const int64_t n_tiles = (n + 7) / 8;
  const int64_t chunks = (k + kChunk - 1) / kChunk;
  Plan best;
  int64_t best_cost = -1, best_groups = 0;
  for (int tiles = 2; tiles >= 1; --tiles) {
    for (int split = 1; split <= kMaxSplit; split *= 2) {
      if (split > 1 && chunks < static_cast<int64_t>(split) * kWarps * 2) continue;
      const int64_t groups = (n_tiles + tiles - 1) / tiles;
      const int64_t ctas = groups * split;
      const int64_t slice = (chunks + split - 1) / split;
      const int64_t cost = (ctas + sms - 1) / sms * tiles * slice;
      const bool better = best_cost < 0 || cost < best_cost ||
                          (cost == best_cost && groups < best_groups);
      if (better) {
        best_cost = cost;
        best_groups = groups;
        best.tiles = tiles;
        best.split = split;
        best.slice_chunks = static_cast<int>(slice);
        best.ctas = ctas;
      }
    }
  }
  return best;
}

// The ring kernel for one (tiles, halves), opted in to its shared memory (allow_dynamic_smem).
template <typename OutT, int kTiles, int kHalves, bool kWeightFirst, bool kPush>
inline void launch_ring(const kernels::Launch& ctx, const Plan& pl, bool pdl, const Params& p) {
  constexpr auto kernel = ring_kernel<OutT, kTiles, kHalves, kWeightFirst, kPush>;
  kernels::allow_dynamic_smem<kernel>(ctx.op, ctx.device, kRingBytes);
  kernels::LaunchConfig config(dim3(static_cast<unsigned>(pl.ctas)), dim3(kThreads),
                               static_cast<size_t>(kRingBytes), ctx.stream, pdl,
                               pl.split > 1 ? static_cast<unsigned>(pl.split) : 0);
  kernels::check_launch(ctx.op, config.launch(kernel, pdl, p));
}

// One call with the switches' template bools fixed: the ring kernel or gemm_kernel.
template <typename OutT, bool kWeightFirst, bool kPush>
inline void launch_with(const kernels::Launch& ctx, const Plan& pl, bool pdl, const Params& p,
                        bool ring, int halves) {
  if (ring) {
    if (pl.tiles == 1) {
      if (halves == 1) return launch_ring<OutT, 1, 1, kWeightFirst, kPush>(ctx, pl, pdl, p);
      return launch_ring<OutT, 1, 2, kWeightFirst, kPush>(ctx, pl, pdl, p);
    }
    if (halves == 1) return launch_ring<OutT, 2, 1, kWeightFirst, kPush>(ctx, pl, pdl, p);
    return launch_ring<OutT, 2, 2, kWeightFirst, kPush>(ctx, pl, pdl, p);
  }
  const KernelFn kernel = kernel_for<OutT, kWeightFirst, kPush>(pl.tiles, halves);
  kernels::LaunchConfig config(dim3(static_cast<unsigned>(pl.ctas)), dim3(kThreads), 0, ctx.stream,
                               pdl, pl.split > 1 ? static_cast<unsigned>(pl.split) : 0);
  kernels::check_launch(ctx.op, config.launch(kernel, pdl, p));
}

// OutT: float or __nv_bfloat16. Runs of at least kRingMinChunks chunks a warp (fused_a) take the
// ring kernel at M <= sw.ring_max_m, the rest (the router's runs of 7) gemm_kernel, whose two
// register stages already hold a whole run and which leaves an SM's second slot to the next
// kernel under PDL.
template <typename OutT>
inline void launch(const kernels::Launch& ctx, Params p, const Switches& sw) {
  const Plan pl = plan(ctx.device, p.n, p.k);
  p.split = pl.split;
  p.slice_chunks = pl.slice_chunks;
  const int halves = p.m > 8 ? 2 : 1;
  const bool pdl = kernels::pdl_for_grid(ctx.enable_pdl, ctx.device,
                                         static_cast<unsigned>(pl.ctas), kThreads);
  const bool ring =
      p.m <= sw.ring_max_m && (pl.slice_chunks + kWarps - 1) / kWarps >= kRingMinChunks;
  if (sw.weight_first) {
    if (sw.push) return launch_with<OutT, true, true>(ctx, pl, pdl, p, ring, halves);
    return launch_with<OutT, true, false>(ctx, pl, pdl, p, ring, halves);
  }
  if (sw.push) return launch_with<OutT, false, true>(ctx, pl, pdl, p, ring, halves);
  return launch_with<OutT, false, false>(ctx, pl, pdl, p, ring, halves);
}

// The switches from the ops' int64 arguments (ring_max_m, push, weight_first: 0 or 1).
inline Switches switches(const char* op, int64_t ring_max_m, int64_t push, int64_t weight_first) {
  TVM_FFI_CHECK(ring_max_m >= 0 && ring_max_m <= kMaxRows && (push == 0 || push == 1) &&
                    (weight_first == 0 || weight_first == 1),
                ValueError)
      << op << ": switches ring_max_m in [0, " << kMaxRows << "], push and weight_first 0 or 1, "
      << "got " << ring_max_m << ", " << push << ", " << weight_first;
  Switches sw;
  sw.ring_max_m = static_cast<int>(ring_max_m);
  sw.push = push != 0;
  sw.weight_first = weight_first != 0;
  return sw;
}

// The checks both ops share, on the weight as [N, K] with row stride `w_stride` (the router's w
// itself; fused_a's b [K, N] column-major read as its transpose). Returns false on empty output.
inline bool check_and_fill(const char* op, tvm::ffi::TensorView out, tvm::ffi::TensorView x,
                           const char* x_name, tvm::ffi::TensorView w, const char* w_name,
                           int64_t n, int64_t k, int64_t w_stride, int64_t enable_pdl, Params& p) {
  kernels::check_ndim(op, x_name, x, 2);
  kernels::check_ndim(op, w_name, w, 2);
  kernels::check_ndim(op, "out", out, 2);
  kernels::check_device(op, x_name, x, kDLCUDA);
  kernels::check_same_device(op, w_name, w, x_name, x);
  kernels::check_same_device(op, "out", out, x_name, x);
  TVM_FFI_CHECK(kernels::is_dtype(x.dtype(), kDLBfloat, 16), TypeError)
      << op << ": " << x_name << " must be bfloat16";
  TVM_FFI_CHECK(kernels::is_dtype(w.dtype(), kDLBfloat, 16), TypeError)
      << op << ": " << w_name << " must be bfloat16";
  kernels::check_last_dim_contiguous(op, x_name, x);
  const int64_t m = x.size(0);
  TVM_FFI_CHECK(x.size(1) == k, ValueError)
      << op << ": " << x_name << " " << kernels::shape_string(x) << " and " << w_name << " "
      << kernels::shape_string(w) << " must share K";
  TVM_FFI_CHECK(out.size(0) == m && out.size(1) == n, ValueError)
      << op << ": out must have shape [" << m << ", " << n << "], got "
      << kernels::shape_string(out);
  TVM_FFI_CHECK(m <= kMaxRows, ValueError)
      << op << ": the CUDA kernel takes M <= " << kMaxRows << " rows, got " << m
      << " (larger M runs on the torch backend)";
  TVM_FFI_CHECK(k % kVec == 0, ValueError)
      << op << ": the CUDA kernel needs K % 8 == 0 (16-byte rows), got K = " << k;
  TVM_FFI_CHECK(n < (int64_t{1} << 30) && k < (int64_t{1} << 30), ValueError)
      << op << ": the CUDA kernel takes N, K < 2^30, got N = " << n << ", K = " << k;
  TVM_FFI_CHECK(enable_pdl >= -1 && enable_pdl <= 1, ValueError)
      << op << ": enable_pdl must be -1 (auto), 0 or 1, got " << enable_pdl;
  // Strides of one row, or of nothing at all (K = 0), are never used.
  const int64_t sx = m > 1 && k > 0 ? x.stride(0) : 0;
  const int64_t sw = n > 1 && k > 0 ? w_stride : 0;
  TVM_FFI_CHECK(k == 0 || (kernels::is_aligned(kernels::data(x)) &&
                           kernels::is_aligned(kernels::data(w)) && sx % kVec == 0 &&
                           sw % kVec == 0),
                ValueError)
      << op << ": the CUDA kernel needs 16-byte aligned " << x_name << " and " << w_name
      << " rows (data pointers, row strides % 8 == 0)";
  kernels::check_no_overlap(op, "out", out, x_name, x);
  kernels::check_no_overlap(op, "out", out, w_name, w);
  p.x = kernels::data<const __nv_bfloat16>(x);
  p.w = kernels::data<const __nv_bfloat16>(w);
  p.out = kernels::data<void>(out);
  p.sx = sx;
  p.sw = sw;
  p.so_m = out.stride(0);
  p.so_n = out.stride(1);
  p.m = static_cast<int>(m);
  p.n = static_cast<int>(n);
  p.k = static_cast<int>(k);
  return m > 0 && n > 0;
}

}  // namespace small_m_gemm
