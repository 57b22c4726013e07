// The row engine: row reductions (the norms of kernels-layernorm,
// elementwise.fused_dual_residual_rmsnorm, and any op with a norm inside) as one register-resident
// kernel and one looping kernel, parameterised by an op struct, the way the pointwise engine takes
// a functor. An op keeps only its struct and its host entry; launch_rows picks the kernel and the
// launch plan. PDL per grid (kernels::pdl_for_grid from the entry's enable_pdl).
//
// The op struct derives from its Params (which hold `shape`, a RowShape) and rowwise::RowOp (the
// defaults), and is a template over T and the access width kN (a 16-byte pack of T, or 1 on the
// scalar path); csrc/rmsnorm.cuh is the example. With Pack = kernels::Pack<T, kN> it provides:
//   kN, kStats, Pack           kStats: row statistics, in order (RMS: 1; LayerNorm: mean, var)
//   Row row(r)                 row r's pointers; Row has `T* out`, where output() is stored
//   Regs                       the per-access operands held beside x (weights, bias, residual)
//   load_input(row, i, x, cache)  register kernel: access i of the row, loaded with `cache`
//                              (kernels::Cache, a constant: see kRowLoads)
//   load(row, i, regs, late, cache)  register kernel: its operands, issued with the row's loads
//                              (but for `late`, those that load_late loads); the row-sized ones
//                              (a residual) with `cache`, weights with load_cached
//   load_pass(pass, row, i, x, regs)  loop kernel: what pass `pass` reads (pass kStats: output)
//   update(s, x, regs, stats)  pre-reduce, in registers, before statistic s (x += residual)
//   load_late(s, row, i, regs) register kernel at kLateFrom or more vectors per thread: operands
//                              loaded after update s, to bound the registers held at once
//   store(s, row, i, x)        update s's result to memory (the sum into residual; mid)
//   accumulate(s, x, stats, acc, valid)  statistic s's partial sum over one access
//   finish(s, sum)             the row's sum -> statistic s (mean, rstd)
//   output(x, regs, stats)     the output access (weight, 1 + weight, bias)
// and optionally kMaxVectorsPerThread (register budget), kRegisterMinVectors (shorter rows take
// the loop kernel), kLateFrom (with kLateByLaunch and late_rows, a host choice per launch) and
// kSplitRows (see "Split rows"). The hooks are general enough for the row ops still to come
// (per-token absmax quantization, adaLN scale/shift, moe_sum_reduce, all-reduce + rmsnorm).
//
// Thread layout. A row is split over `tpr` threads ("threads per row"). Either tpr <= 32 is a power
// of two and the row's threads are an aligned group of lanes of one warp (reduction: shuffles
// only; a block holds several rows), or tpr > 32 is a multiple of 32 equal to the block size (one
// row per block; reduction: shuffles, one shared-memory step, one barrier). Thread `lane` of a row
// owns the accesses lane, lane + tpr, lane + 2 tpr, ... so each access of the row's threads is one
// coalesced sweep over the row.
//
// Split rows (decode). With few rows the grid leaves most SMs idle and each CTA's row is one long
// latency chain (load, reduce, store). When every row's CTAs still fit one per SM, launch_rows
// splits each long row over a thread-block cluster of `split` CTAs (row_split): each CTA holds a
// contiguous slice of the row in registers (kSplitVectorsPerThread vectors per thread), reduces
// it like a block's row, pushes its partial into every CTA's shared memory (distributed shared
// memory: st.async on an mbarrier per statistic, split_sum) and adds the partials in rank order,
// so every CTA of the row gets the same bits and results are deterministic. Twice (four times)
// the SMs and bytes in flight for the same rows; the sums' order differs from the unsplit
// kernel's (the results differ within rounding of the statistics). An op stays on the unsplit
// kernel with kSplitRows = false.
//
// Rows in memory. A tensor's leading dims are merged where its layout allows into at most two
// levels (outer, inner): row r starts at element (r / inner) * s0 + (r % inner) * s1. That covers
// contiguous and row-strided [T, H] (inner = 1) and head-strided [T, heads, D] views such as q and
// k inside a fused qkv buffer.
#pragma once

#include <kernels/checks.h>
#include <kernels/cluster.cuh>
#include <kernels/cuda_dtype.cuh>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>
#include <kernels/reduce.cuh>
#include <kernels/tensor.h>
#include <kernels/vec.cuh>

#include <cstdint>

namespace rowwise {

// Largest block; the register kernels declare it in __launch_bounds__, which caps them at
// 65536 / 512 = 128 registers per thread (1024 would cap them at 64 and spill the row).
constexpr int kMaxBlock = 512;
// Accesses per thread of the register kernels (8 x 16 bytes: 64 bf16 values, 32 registers).
constexpr int kMaxVectorsPerThread = 8;
// Rows of at most this many 16-byte vectors stay in registers between the reduction and the
// normalisation (32768 bf16/fp16 or 16384 fp32 elements); longer rows take the loop kernel, which
// reads the row again (from L2) for the normalisation.
constexpr int kRegisterMaxVectors = kMaxBlock * kMaxVectorsPerThread;
// Warps per block when several rows share a block.
constexpr int kMaxWarpsPerBlock = 8;
// Split rows (see the top): at most this many CTAs per row (a portable cluster size)...
constexpr int kMaxSplit = 4;
// ...each over a slice of at least this many 16-byte vectors (4 KiB: 2048 bf16 values, so rows
// of 8192 bf16 split in up to 4): below it a CTA's slice takes the SM less time to move than the
// exchange of the partials (a distributed shared-memory round trip per statistic) adds.
constexpr int kSplitMinSlice = 256;
// ...and only rows of at least this many vectors (14 KiB: 7168 bf16 values) split at all.
// Measured on the H200 (A/B against the unsplit kernels, bf16): rows of 4096 values lost with
// the split (fused_add_rmsnorm 64 x 4096 2.04 -> 2.11 us, fused_dual_residual_rmsnorm 16 / 64 x
// 4096 1.71 / 2.29 -> 1.77 / 2.40), rows of 7168 and 8192 gained (fused_add_rmsnorm 1 x 8192
// 1.62 -> 1.23, 64 x 8192 2.79 -> 2.68).
constexpr int kSplitMinRow = 896;
// Vectors per thread of the split kernel (its only instantiation): slices up to kMaxBlock * 2
// vectors (a row of 16384 bf16 in 2 CTAs, 32768 in 4); longer slices are not split.
constexpr int kSplitVectorsPerThread = 2;

// ---------------------------------------------------------------------------------------------
// Device side.

using kernels::Pack;
using kernels::RowMap;

// The launch plan's row layout and the row count, in every op's Params (as `shape`).
struct RowShape {
  int64_t rows;  // all rows
  int hidden;    // elements per row
  int tpr, tpr_shift, rows_per_block;
  // 1 / hidden, set by launch_plan: the statistics' finish multiplies by it, off the reduction's
  // path (in the kernel, the division sat between the reduction and the output: a MUFU.RCP, its
  // refinement and a slow-path branch).
  float inv_hidden;
  // Split rows, set by launch_plan: CTAs per row (1: none; a power of two) and vectors per CTA
  // (rank r holds vectors [r * slice, (r + 1) * slice) of its row).
  int split, slice;
};

__device__ __forceinline__ int64_t row_offset(const kernels::RowMap& m, int64_t r, uint32_t inner) {
  if (inner == 1) return r * m.s0;
  // row_layout() guarantees rows < 2^32 when inner > 1, so 32-bit division (a few instructions
  // instead of a 64-bit division routine) is exact.
  const uint32_t r32 = static_cast<uint32_t>(r);
  return static_cast<int64_t>(r32 / inner) * m.s0 + static_cast<int64_t>(r32 % inner) * m.s1;
}

// Thread coordinates of the row layout described at the top of this file.
struct RowThread {
  int lane;     // index among the row's threads
  int64_t row;  // global row index (may be >= rows in the last block: such threads only reduce)
};

__device__ __forceinline__ RowThread row_thread(int tpr, int tpr_shift, int rows_per_block) {
  if (tpr <= 32) {
    return {static_cast<int>(threadIdx.x & (tpr - 1)),
            static_cast<int64_t>(blockIdx.x) * rows_per_block + (threadIdx.x >> tpr_shift)};
  }
  return {static_cast<int>(threadIdx.x), static_cast<int64_t>(blockIdx.x)};
}

// Sum of `v` over the threads of one row; every thread of the row gets it. All threads of the
// block must call it (threads of a row past the end pass 0). `shared` holds 32 floats and is used
// once per kernel call site (distinct arrays for successive reductions, so no trailing barrier).
// A block's row: after the barrier each group of `p` lanes (the warp count rounded up to a power
// of two) holds the warp sums, zero-padded, and shuffles over log2(p) steps instead of 5 (2 warps,
// the 8-vector rows of 4096 bf16: 1 step; 8 warps, decode rows of 4096 bf16: 3 steps).
__device__ __forceinline__ float row_sum(float v, int tpr, float* shared) {
  if (tpr <= 32) {
    for (int offset = tpr >> 1; offset > 0; offset >>= 1)
      v += __shfl_xor_sync(0xffffffffu, v, offset);
    return v;
  }
  v = kernels::warp_sum(v);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  const int warps = static_cast<int>(blockDim.x >> 5);  // 2..kMaxBlock / 32
  const int p = 1 << (32 - __clz(warps - 1));
  const int k = lane & (p - 1);
  v = k < warps ? shared[k] : 0.0f;
  for (int offset = p >> 1; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

// Sum over a split row's cluster of each CTA's row_sum `v`: threads r < split push v into slot
// `rank` of CTA r's `inbox` (kernels::cluster_push: st.async, counted on CTA r's `bar`), every
// thread waits for its own CTA's `split` slots, then adds them in rank order (identical bits in
// every CTA). No cluster barrier and no fence: the release arrive of one would wait for the
// fused ops' residual stores (MEMBAR.GPU). `first`: the first call waits for the arrive at kernel
// start (every CTA of the cluster runs and has initialised its barriers). Each statistic has its
// own slots and barrier, and each CTA waits for every push into it, so none exits early.
__device__ __forceinline__ float split_sum(float v, float (&inbox)[kMaxSplit], uint64_t* bar,
                                          int rank, int split, bool first) {
  if (first) kernels::cluster_wait();
  if (static_cast<int>(threadIdx.x) < split)
    kernels::cluster_push(&inbox[rank], bar, threadIdx.x, v);
  kernels::push_barrier_wait(bar);
  float sum = inbox[0];
#pragma unroll
  for (int r = 1; r < kMaxSplit; ++r) {
    if (r < split) sum += inbox[r];
  }
  return sum;
}

// Sum of `v`, added pairwise (a dependency chain of log2(kN) adds).
template <int kN>
__device__ __forceinline__ float pairwise_sum(float (&v)[kN]) {
#pragma unroll
  for (int w = 1; w < kN; w *= 2) {
#pragma unroll
    for (int j = 0; j + w < kN; j += 2 * w) v[j] += v[j + w];
  }
  return v[0];
}

// The two statistics of a LayerNorm, for the accumulate/finish hooks of an op struct with
// kStats = 2: statistic 0 the sum (-> mean), statistic 1 the centred squares of the row's own
// lanes (-> rstd): the exact two-pass variance, no E[x^2] - mean^2 cancellation. layernorm and
// diffusion.layernorm_scale_shift use them.
template <typename Pack>
__device__ __forceinline__ float layernorm_accumulate(int s, const Pack& x, const float* stats,
                                                      float acc, bool valid) {
  float f[Pack::size];
  x.unpack(f);
  if (s == 0) {
#pragma unroll
    for (int k = 0; k < Pack::size; ++k) acc += f[k];
  } else if (valid) {
#pragma unroll
    for (int k = 0; k < Pack::size; ++k) {
      const float d = f[k] - stats[0];
      acc = fmaf(d, d, acc);
    }
  }
  return acc;
}
__device__ __forceinline__ float layernorm_finish(int s, float sum, const RowShape& shape,
                                                 float eps) {
  const float m = sum * shape.inv_hidden;
  return s == 0 ? m : rsqrtf(m + eps);
}

// Accesses per thread and pass that the loop kernel issues together before their first use:
// their loads are in flight at once even where out aliases the input (which keeps the compiler
// from moving loads across stores).
constexpr int kLoopBatch = 4;

// Threads an SM of the 8-vector register kernels that hold their operands beside x (121-128
// registers: 16 warps).
constexpr int kHeldThreadsPerSm = 512;
// Peak DRAM bandwidth (kernels::dram_gbps) from which those 16 warps an SM keep too few bytes in
// flight over many waves of rows: the H200 (4097) gained from late loads there, the H100 (3352)
// did not (see late_loads_pay).
constexpr int kLateMinDramGbps = 3800;

// Whether `rows` rows of `tpr` threads exceed `waves` waves of such a kernel on `device`: where
// they do not, the rows are all in flight at once and late loads only add their round trip.
inline bool rows_past_held_waves(int64_t rows, int tpr, int device, int waves) {
  return rows > int64_t{waves} * kernels::sm_count(device) * (kHeldThreadsPerSm / tpr);
}

// Where the 8-vector kernel with late loads (twice the rows in flight or more) beats the one
// holding its operands: past one wave of the latter, it runs two waves' rows in one; past two, it
// pays only where DRAM outruns what 16 warps an SM keep in flight. Measured (layernorm bf16 A/B,
// 2026-12-05, time ratios late / held): 1024 x 7168 / 8192 H200 0.92 / 0.93, H100 0.92 / 0.93;
// 8192-32768 rows H200 0.93-0.99, H100 1.004-1.006.
inline bool late_loads_pay(int64_t rows, int tpr, int device) {
  return rows_past_held_waves(rows, tpr, device, 1) &&
         (!rows_past_held_waves(rows, tpr, device, 2) ||
          kernels::dram_gbps(device) >= kLateMinDramGbps);
}

// Defaults of the op hooks: no update, no late loads, no intermediate stores, 8 vectors per
// thread at most, every register kernel built, rows split at decode.
struct RowOp {
  // Whether launch_rows may split a row over a cluster (row_split); false keeps the op on the
  // unsplit kernels (and spares the split instantiation).
  static constexpr bool kSplitRows = true;
  static constexpr int kMaxVectorsPerThread = rowwise::kMaxVectorsPerThread;
  // Rows of fewer vectors take the loop kernel (spares the small register instantiations).
  static constexpr int kRegisterMinVectors = 1;
  // Vectors per thread from which load() leaves some operands to load_late().
  static constexpr int kLateFrom = 1 << 30;
  // Whether launch_rows asks late_rows per launch between the kLateFrom kernel with late loads
  // and the same kernel holding every operand from the row's loads on (both then instantiated):
  // late loads free registers for more rows in flight but add a round trip per vector after the
  // statistics, which only pays where the rows exceed what the holding kernel keeps in flight.
  static constexpr bool kLateByLaunch = false;
  bool late_rows(int64_t rows, int tpr, int device) const {
    return late_loads_pay(rows, tpr, device);
  }
  template <typename Pack, typename Regs>
  __device__ __forceinline__ void update(int, Pack&, Regs&, const float*) const {}
  template <typename Row, typename Regs>
  __device__ __forceinline__ void load_late(int, const Row&, int, Regs&) const {}
  template <typename Row, typename Pack>
  __device__ __forceinline__ void store(int, const Row&, int, const Pack&) const {}
};

// The cache policy of the register kernel's row-sized loads: plain in the 8-vector kernel (the
// many-rows plan of long rows), evict-first in the others. Measured on the H200 (bf16,
// interleaved A/B against evict-first loads everywhere, 2026-12-04): rmsnorm 0.957-0.972 of its
// time at 8192/32768 x 4096-8192, fused_add_rmsnorm 0.978-0.984, layernorm 0.987-1.000, decode
// shapes unchanged; plain loads in the 2-vector plan of 64 x 4096 had cost 1.14 (rmsnorm) and
// 1.09 (layernorm) in the experiment of 2026-12-03.
template <int kVectorsPerThread>
constexpr kernels::Cache kRowLoads =
    kVectorsPerThread >= 8 ? kernels::Cache::kPlain : kernels::Cache::kStream;

// The register kernel: the row stays in registers from its one read to its one write (the
// minimum traffic). Rows up to kMaxBlock * kVectorsPerThread vectors. kSplit: launched in
// clusters of s.split CTAs per row, each over its slice (split_sum combines the statistics).
// kLate: load() leaves operands to load_late() (from Op::kLateFrom vectors per thread, unless the
// host chose otherwise: RowOp::kLateByLaunch).
template <typename Op, int kVectorsPerThread, bool kSplit = false,
          bool kLate = (kVectorsPerThread >= Op::kLateFrom)>
__global__ void __launch_bounds__(kMaxBlock) row_registers(bool pdl, const __grid_constant__ Op op) {
  constexpr int kN = Op::kN;
  constexpr int kStats = Op::kStats;
  using P = typename Op::Pack;
  using Regs = typename Op::Regs;
  __shared__ float shared[kStats][32];
  // kSplit: split_sum's slots and their barriers, one each per statistic.
  __shared__ float inbox[kSplit ? kStats : 1][kMaxSplit];
  __shared__ uint64_t inbox_bar[kSplit ? kStats : 1];
  const RowShape& s = op.shape;
  RowThread th;
  int rank = 0, begin = 0, end;  // this CTA's rank in the row's cluster, its vectors [begin, end)
  if constexpr (kSplit) {
    if (threadIdx.x == 0) {
#pragma unroll
      for (int st = 0; st < kStats; ++st)
        kernels::push_barrier_init(&inbox_bar[st], s.split * sizeof(float));
    }
    kernels::cluster_arrive_relaxed();  // waited for before the first push (split_sum)
    // split is a power of two: the row and rank without a division ahead of the loads.
    const int shift = __ffs(s.split) - 1;
    th = {static_cast<int>(threadIdx.x), static_cast<int64_t>(blockIdx.x >> shift)};
    rank = static_cast<int>(blockIdx.x & (s.split - 1));
    begin = rank * s.slice;
    end = min(begin + s.slice, s.hidden / kN);  // the grid holds exactly rows * split CTAs
  } else {
    th = row_thread(s.tpr, s.tpr_shift, s.rows_per_block);
    end = th.row < s.rows ? s.hidden / kN : 0;
  }
  const typename Op::Row row = op.row(th.row);

  if (pdl) kernels::pdl_wait();
  P x[kVectorsPerThread];
  Regs regs[kVectorsPerThread];
#pragma unroll
  for (int j = 0; j < kVectorsPerThread; ++j) {
    const int i = begin + th.lane + j * s.tpr;
    if (i < end) {
      op.load_input(row, i, x[j], kRowLoads<kVectorsPerThread>);
    } else {
      x[j].zero();
    }
  }
  // The operands go out with the row's loads: issued after a store (the fused ops' residual),
  // they would wait for it (the compiler cannot prove that they do not overlap), which cost a
  // whole memory round trip at decode.
#pragma unroll
  for (int j = 0; j < kVectorsPerThread; ++j) {
    const int i = begin + th.lane + j * s.tpr;
    if (i < end) op.load(row, i, regs[j], kLate, kRowLoads<kVectorsPerThread>);
  }
  // The next kernel's blocks may start once every block of this grid has issued its loads (they
  // wait in pdl_wait for this grid to finish): the dependent launch and its prologue overlap this
  // grid's memory round trip and reduction instead of only its output. Dependents launch once the
  // last wave's blocks have all triggered, so they take no slots from this grid's blocks.
  if (pdl) kernels::pdl_launch_dependents();
  float stats[kStats];
#pragma unroll
  for (int st = 0; st < kStats; ++st) {
#pragma unroll
    for (int j = 0; j < kVectorsPerThread; ++j) {
      const int i = begin + th.lane + j * s.tpr;
      if (i < end) {
        op.update(st, x[j], regs[j], stats);
        // Each access's store right after its update, as the hand-written fused rmsnorm did:
        // with the stores in a later loop, nvcc issued 2 of the 24 loads of an 8-vector row
        // after the arithmetic had begun (a second memory round trip; 4-8% at 1024+ rows).
        if constexpr (!kLate) op.store(st, row, i, x[j]);
      }
    }
    if constexpr (kLate) {  // operands loaded late go out before the stores (else they wait)
#pragma unroll
      for (int j = 0; j < kVectorsPerThread; ++j) {
        const int i = begin + th.lane + j * s.tpr;
        if (i < end) op.load_late(st, row, i, regs[j]);
      }
#pragma unroll
      for (int j = 0; j < kVectorsPerThread; ++j) {
        const int i = begin + th.lane + j * s.tpr;
        if (i < end) op.store(st, row, i, x[j]);
      }
    }
    // One partial sum per access, added pairwise: a chain of kN + log2(kVectorsPerThread)
    // dependent adds instead of kN * kVectorsPerThread (64 for 8 bf16 vectors: ~256 cycles of
    // FADD/FFMA latency per statistic between the loads' arrival and the row's reduction).
    float part[kVectorsPerThread];
#pragma unroll
    for (int j = 0; j < kVectorsPerThread; ++j)
      part[j] = op.accumulate(st, x[j], stats, 0.0f, begin + th.lane + j * s.tpr < end);
    float acc = row_sum(pairwise_sum(part), s.tpr, shared[st]);
    if constexpr (kSplit) acc = split_sum(acc, inbox[st], &inbox_bar[st], rank, s.split, st == 0);
    stats[st] = op.finish(st, acc);
  }
#pragma unroll
  for (int j = 0; j < kVectorsPerThread; ++j) {
    const int i = begin + th.lane + j * s.tpr;
    if (i < end) op.output(x[j], regs[j], stats).store(row.out + i * kN);
  }
}

// The loop kernel: any row (16-byte vectors for rows too long for registers, kN = 1 when the
// row, a pointer or a row stride is not in whole vectors). One pass per statistic and one for
// the output, each re-reading what it needs (from L1/L2). Each thread re-reads only what it read
// or wrote itself (same indices), so outputs may alias inputs without a barrier.
template <typename Op>
__global__ void __launch_bounds__(kMaxBlock) row_loop(bool pdl, const __grid_constant__ Op op) {
  constexpr int kN = Op::kN;
  constexpr int kStats = Op::kStats;
  constexpr int kBatch = kLoopBatch;
  using P = typename Op::Pack;
  using Regs = typename Op::Regs;
  __shared__ float shared[kStats][32];
  const RowShape& s = op.shape;
  const RowThread th = row_thread(s.tpr, s.tpr_shift, s.rows_per_block);
  const int n = th.row < s.rows ? s.hidden / kN : 0;
  const typename Op::Row row = op.row(th.row);
  const int step = s.tpr;

  if (pdl) kernels::pdl_wait();
  float stats[kStats];
#pragma unroll
  for (int st = 0; st < kStats; ++st) {
    float acc = 0.0f;
    for (int base = th.lane; base < n; base += kBatch * step) {
      P x[kBatch];
      Regs regs[kBatch];
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = base + u * step;
        if (i < n) {
          op.load_pass(st, row, i, x[u], regs[u]);
        } else {
          x[u].zero();
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u) {
        const int i = base + u * step;
        if (i < n) {
          op.update(st, x[u], regs[u], stats);
          op.store(st, row, i, x[u]);
        }
      }
#pragma unroll
      for (int u = 0; u < kBatch; ++u)
        acc = op.accumulate(st, x[u], stats, acc, base + u * step < n);
    }
    acc = row_sum(acc, s.tpr, shared[st]);
    if (st == kStats - 1 && pdl) kernels::pdl_launch_dependents();
    stats[st] = op.finish(st, acc);
  }
  for (int base = th.lane; base < n; base += kBatch * step) {
    P x[kBatch];
    Regs regs[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * step;
      if (i < n) op.load_pass(kStats, row, i, x[u], regs[u]);
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int i = base + u * step;
      if (i < n) op.output(x[u], regs[u], stats).store(row.out + i * kN);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Host side.

using tvm::ffi::TensorView;

// Threads per row, vectors per thread and the grid of one launch.
struct Plan {
  int vectors_per_thread;  // register kernels: the template argument; loop kernels: unused
  int tpr;
  int tpr_shift;  // log2(tpr) when tpr <= 32
  int rows_per_block;
  unsigned block;
  unsigned grid;
  int split;  // split register kernel: CTAs per row, a cluster (0 or 1: not split)
  int slice;  // split register kernel: vectors per CTA
};

inline int log2_exact(int x) {
  int s = 0;
  while ((1 << s) < x) ++s;
  return s;
}

using kernels::next_pow2;

// Blocks of several rows shrink for few rows so that they spread over the SMs (decode: one warp
// per block), and grow to kMaxWarpsPerBlock warps once there are rows to fill every SM.
inline void finish_plan(Plan& plan, int64_t rows, int device) {
  if (plan.tpr > 32) {
    plan.tpr_shift = 0;
    plan.rows_per_block = 1;
    plan.block = static_cast<unsigned>(plan.tpr);
  } else {
    plan.tpr_shift = log2_exact(plan.tpr);
    const int64_t warps = (rows * plan.tpr + 31) / 32;
    const int64_t sms = kernels::sm_count(device);
    int64_t per_block = (warps + sms - 1) / sms;
    per_block = per_block < 1 ? 1 : (per_block > kMaxWarpsPerBlock ? kMaxWarpsPerBlock : per_block);
    plan.block = static_cast<unsigned>(per_block * 32);
    plan.rows_per_block = static_cast<int>(plan.block) / plan.tpr;
  }
  const int64_t grid = (rows + plan.rows_per_block - 1) / plan.rows_per_block;
  TVM_FFI_CHECK(grid < (int64_t{1} << 31), ValueError) << "too many rows (" << rows << ")";
  plan.grid = static_cast<unsigned>(grid);
}

// Register kernels: `vectors` 16-byte vectors per row (or other per-thread units: quantization
// plans 16-element pieces with it). Short rows spread over a few lanes of a warp (qk heads of 128:
// 8 lanes x 2 vectors; up to 1024 bf16: one warp x 4, or x max_per_thread if fewer). Longer rows:
//   - few rows (at most two per SM: decode, small batches): the fewest vectors per thread, from
//     `few_rows_min` (2), that fit a block of kMaxBlock threads (H = 4096 bf16: 256 threads x 2),
//     so that a row's accesses spread over many threads;
//   - more rows: max_per_thread (8) vectors per thread (H = 4096 bf16: 64 threads), which keeps
//     more loads in flight per thread.
// Measured on the H200 (2026-12-02, bf16): the wide layout took rmsnorm at one token from 1.57 to
// 1.15 us and fused_add_rmsnorm from 2.07 to 1.57 us, but at 8192 rows and more it was up to 30%
// slower than the 8-vector layout for rmsnorm and up to 28% for layernorm (7168 and 8192 wide).
inline Plan plan_registers(int64_t vectors, int64_t rows, int device,
                           int max_per_thread = kMaxVectorsPerThread, int few_rows_min = 2) {
  Plan plan{};
  const int warp_per_thread = max_per_thread < 4 ? max_per_thread : 4;
  if (vectors <= 4) {
    plan.vectors_per_thread = 1;
    plan.tpr = next_pow2(vectors);
  } else if (vectors <= 64) {
    plan.vectors_per_thread = 2;
    plan.tpr = next_pow2((vectors + 1) / 2);
  } else if (vectors <= 32 * int64_t{warp_per_thread}) {
    plan.vectors_per_thread = warp_per_thread;
    plan.tpr = 32;
  } else {
    int per_thread = max_per_thread;
    if (rows <= 2 * int64_t{kernels::sm_count(device)}) {
      per_thread = few_rows_min;
      while (per_thread < max_per_thread && vectors > int64_t{kMaxBlock} * per_thread)
        per_thread *= 2;
    }
    plan.vectors_per_thread = per_thread;
    const int64_t threads = (vectors + per_thread - 1) / per_thread;
    plan.tpr = static_cast<int>(threads <= 32 ? 32 : (threads + 31) / 32 * 32);
  }
  finish_plan(plan, rows, device);
  return plan;
}

// CTAs per row for the split register kernel (see the top; 1: do not split): doubled up to
// kMaxSplit while the rows' CTAs still fit one per SM and each slice keeps kSplitMinSlice
// vectors, on sm_90+ (thread-block clusters; kernels::pdl_supported tests that compute
// capability), where kSplitVectorsPerThread vectors per thread in a block hold the slice. On the
// H200 (132 SMs), bf16: rows of 7168-16384 values split in 2 at 34-66 rows; rows of 7168-8191 in
// 2 and of 8192-32768 in 4 at 1-33 rows; shorter rows (kSplitMinRow) and 67 rows or more are not
// split. Measured (fused_add_rmsnorm, bf16, us, unsplit -> split): 1 x 7168 1.57 -> 1.29, 1 x 8192
// 1.62 -> 1.23, 16 x 8192 1.84 -> 1.55, 64 x 7168 2.60 -> 2.54, 64 x 8192 2.79 -> 2.68.
inline int row_split(int64_t vectors, int64_t rows, int device) {
  if (vectors < kSplitMinRow || !kernels::pdl_supported(device)) return 1;
  const int64_t sms = kernels::sm_count(device);
  int split = 1;
  while (split < kMaxSplit && rows * split * 2 <= sms &&
         vectors >= int64_t{split} * 2 * kSplitMinSlice)
    split *= 2;
  const int64_t slice = (vectors + split - 1) / split;
  return slice <= int64_t{kMaxBlock} * kSplitVectorsPerThread ? split : 1;
}

// The split register kernel's plan: `split` CTAs per row (row_split), one block of threads per
// slice, kSplitVectorsPerThread vectors per thread.
inline Plan plan_split(int64_t vectors, int64_t rows, int split) {
  Plan plan{};
  plan.vectors_per_thread = kSplitVectorsPerThread;
  plan.split = split;
  plan.slice = static_cast<int>((vectors + split - 1) / split);
  const int threads = (plan.slice + kSplitVectorsPerThread - 1) / kSplitVectorsPerThread;
  plan.tpr = (threads + 31) / 32 * 32;  // > 32: a slice has at least kSplitMinSlice vectors
  plan.tpr_shift = 0;
  plan.rows_per_block = 1;
  plan.block = static_cast<unsigned>(plan.tpr);
  plan.grid = static_cast<unsigned>(rows * split);  // rows * split <= the SM count
  return plan;
}

// Loop kernels: `accesses` per row (16-byte vectors or scalars), about 4 per thread per pass for
// short rows, up to kMaxBlock threads for long ones.
inline Plan plan_loop(int64_t accesses, int64_t rows, int device) {
  Plan plan{};
  plan.vectors_per_thread = 0;
  const int64_t threads = (accesses + 3) / 4;
  if (threads <= 32) {
    plan.tpr = next_pow2(threads);
  } else {
    const int64_t t = (threads + 31) / 32 * 32;
    plan.tpr = static_cast<int>(t > kMaxBlock ? kMaxBlock : t);
  }
  finish_plan(plan, rows, device);
  return plan;
}

// The plan's layout into the op's shape, then the launch.
template <typename Op>
inline void launch_plan(const kernels::Launch& ctx, void (*kernel)(bool, Op), const Plan& plan,
                        Op op) {
  op.shape.tpr = plan.tpr;
  op.shape.tpr_shift = plan.tpr_shift;
  op.shape.rows_per_block = plan.rows_per_block;
  op.shape.inv_hidden = 1.0f / static_cast<float>(op.shape.hidden);
  op.shape.split = plan.split > 1 ? plan.split : 1;
  op.shape.slice = plan.slice;
  if (plan.split <= 1) return kernels::launch(ctx, kernel, plan.grid, plan.block, op);
  const bool pdl = kernels::pdl_for_grid(ctx.enable_pdl, ctx.device, plan.grid, plan.block);
  kernels::LaunchConfig config(dim3(plan.grid), dim3(plan.block), 0, ctx.stream, pdl,
                               static_cast<unsigned>(plan.split));
  kernels::check_launch(ctx.op, config.launch(kernel, pdl, op));
}

// Runs the op template `OpT<T, kN>` (constructed from `params`) over params.shape.rows rows of
// params.shape.hidden elements: the register kernel when `vector` (16-byte vectors fit every row,
// see kernels::vectors_fit) and the row fits the op's register budget (split over a cluster per
// row where row_split says so and the op allows it), else the loop kernel over vectors or, when
// !vector, elements.
template <template <typename, int> class OpT, typename T, typename Params>
inline void launch_rows(const kernels::Launch& ctx, const Params& params, bool vector) {
  constexpr int kVec = kernels::kVectorBytes / static_cast<int>(sizeof(T));
  using VecOp = OpT<T, kVec>;
  const int64_t rows = params.shape.rows;
  const int vectors = params.shape.hidden / kVec;
  if (vector && vectors >= VecOp::kRegisterMinVectors &&
      vectors <= int64_t{kMaxBlock} * VecOp::kMaxVectorsPerThread) {
    if constexpr (VecOp::kSplitRows && VecOp::kMaxVectorsPerThread >= kSplitVectorsPerThread) {
      const int split = row_split(vectors, rows, ctx.device);
      if (split > 1) {
        return launch_plan(ctx, row_registers<VecOp, kSplitVectorsPerThread, true>,
                           plan_split(vectors, rows, split), VecOp{params});
      }
    }
    const Plan plan = plan_registers(vectors, rows, ctx.device, VecOp::kMaxVectorsPerThread);
    const VecOp op{params};
    void (*kernel)(bool, VecOp) = nullptr;
    switch (plan.vectors_per_thread) {
      case 1:
        if constexpr (VecOp::kRegisterMinVectors <= 4) kernel = row_registers<VecOp, 1>;
        break;
      case 2:
        kernel = row_registers<VecOp, 2>;
        break;
      case 4:
        kernel = row_registers<VecOp, 4>;
        break;
      case 8:
        if constexpr (VecOp::kMaxVectorsPerThread >= 8) {
          kernel = row_registers<VecOp, 8>;
          if constexpr (VecOp::kLateByLaunch && 8 >= VecOp::kLateFrom) {
            if (!op.late_rows(rows, plan.tpr, ctx.device))
              kernel = row_registers<VecOp, 8, false, false>;
          }
        }
        break;
    }
    TVM_FFI_CHECK(kernel != nullptr, InternalError)
        << ctx.op << ": no register kernel of " << plan.vectors_per_thread
        << " vectors per thread";
    return launch_plan(ctx, kernel, plan, op);
  }
  if (vector) {
    return launch_plan(ctx, row_loop<VecOp>, plan_loop(vectors, rows, ctx.device),
                       VecOp{params});
  }
  using ScalarOp = OpT<T, 1>;
  launch_plan(ctx, row_loop<ScalarOp>, plan_loop(params.shape.hidden, rows, ctx.device),
              ScalarOp{params});
}

// Argument checks of the host entry points. Device checks come last, so that every other check
// can be exercised with CPU tensors on a machine without a GPU.

// [..., H] with at least one dim and a contiguous last dim.
inline void check_rows(const char* op, const char* arg, const TensorView& t) {
  const DLDataType d = t.dtype();
  TVM_FFI_CHECK(kernels::is_dtype(d, kDLFloat, 32) || kernels::is_dtype(d, kDLFloat, 16) ||
                    kernels::is_dtype(d, kDLBfloat, 16),
                TypeError)
      << op << ": " << arg << " must have dtype float32, float16 or bfloat16";
  TVM_FFI_CHECK(t.ndim() >= 1, ValueError)
      << op << ": " << arg << " must have at least 1 dim [..., hidden], got a scalar";
  kernels::check_last_dim_contiguous(op, arg, t);
  TVM_FFI_CHECK(t.size(-1) < (int64_t{1} << 30), ValueError)
      << op << ": " << arg << " has a last dim of " << t.size(-1) << " (at most 2^30)";
}

inline void check_vector_shape(const char* op, const char* arg, const TensorView& t, int64_t n,
                               const char* like_name);

// A 1-D [n] tensor with unit stride and the dtype of `like` (a weight or bias).
inline void check_vector_arg(const char* op, const char* arg, const TensorView& t, int64_t n,
                             const char* like_name, const TensorView& like) {
  check_vector_shape(op, arg, t, n, like_name);
  kernels::check_same_dtype(op, arg, t, like_name, like);
}

// A 1-D [n] tensor with unit stride.
inline void check_vector_shape(const char* op, const char* arg, const TensorView& t, int64_t n,
                               const char* like_name) {
  TVM_FFI_CHECK(t.ndim() == 1 && t.size(0) == n, ValueError)
      << op << ": " << arg << " must have shape [" << n << "] (the last dim of " << like_name
      << "), got " << kernels::shape_string(t);
  TVM_FFI_CHECK(n <= 1 || t.stride(0) == 1, ValueError)
      << op << ": " << arg << " must be contiguous, got stride " << t.stride(0);
}

}  // namespace rowwise
