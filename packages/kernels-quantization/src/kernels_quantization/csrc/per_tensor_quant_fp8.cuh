// quantization.per_tensor_quant_fp8, CUDA: q = cvt_satfinite_rne(x / s) with one fp32 scale,
// static (given) or dynamic s = max(absmax(x), 1e-10) / 448.
//
// Work items are 16-byte vectors of x (8 bf16/fp16 or 4 fp32 values; one element on the scalar
// path), over x seen either as one flat row (x and q contiguous; the last < 8 elements, the
// tail, go to block 0 as scalars) or as rows of its last dim (merged leading dims, one or two
// levels, a FastDivmod per item).
//   - small dynamic inputs (<= 512 x 8 vectors: 32768 bf16): one block does everything: the
//     tensor in registers, a block max (16-bit inputs in their own format), the scale, the
//     quantized packs (one launch);
//   - mid dynamic inputs (<= 16 x 1024 x 2 vectors: 256K bf16, 128K fp32; kClusterMaxVPT):
//     one thread-block cluster of 16 CTAs (a non-portable size; 8 where the device keeps no
//     cluster of 16 CTAs of 1024 threads resident) holds x in registers: each CTA's block max
//     goes to its shared memory, one cluster barrier, every warp reads the cluster's maxima
//     through distributed shared memory, then each CTA quantizes its registers. One launch and
//     one cluster barrier where the cooperative launch below pays a grid barrier across 100+
//     CTAs; measured on the H200: [16, 7168] 3.76 us (4.20 cooperative); larger x is limited
//     by the 16 SMs' load bandwidth ([128, 7168] 7.55 with 8 vectors a thread, 6.23
//     cooperative), hence the 2-vector limit;
//   - where no cluster launches (a refused size or query) or past a cluster of 8, flat vectors
//     up to one chunk of 256 vectors per resident CTA (about 1M bf16 on the H200: 511 CTAs):
//     one cooperative launch of one CTA per chunk (every CTA resident, or the launch fails and
//     the two-kernel path below runs); CTA b, one vector per thread:
//       1. loads chunk b, folding |x| into its candidate scale max(absmax_b, eps) / 448, which it
//          writes (as bits) to word b of q, used as scratch: q[0, 4G) (word G, zeroed by CTA 0
//          before the barrier, counts the CTAs that have read the candidates);
//       2. grid barrier (cooperative groups); every CTA takes the maximum of the G candidates
//          (the division by 448 is monotone, so that is the scale; NaN bits sort above all
//          others and propagate), then bumps the count;
//       3. it quantizes its chunk, still in its registers. Chunk 0 holds the scratch words: CTA
//          0 waits for the count to reach G before storing it.
//     One launch and one read of x instead of memset + two kernels, where the launches are most
//     of the time. G <= (chunk's q bytes) / 4 - 1.
//   - large dynamic inputs, flat vectors beyond what the SMs' shared memory holds, up to 5
//     times that (kResidentMaxRatio) (G = one CTA
//     of 1024 threads per SM, each with a resident chunk of C vectors, C x 16 bytes the largest
//     whole multiple of 16 KiB that fits: 224 KiB, 29.6 MB on the H200's 132 SMs; bf16 past
//     15.1M elements, fp32 past 7.6M; smaller x mostly fits the L2, which the two kernels below
//     re-read): one cooperative launch, x = the resident part R (chunk b: vectors [b C,
//     (b + 1) C)) then the rest N:
//       1. CTA b starts TMA bulk copies (cp.async.bulk, 16 KiB each, L2 evict-first) of chunk b
//          into its shared memory, sweeps its share of N front to back for the absmax (8
//          vectors per thread in flight, plain loads: the end of N stays in L2), then folds in
//          chunk b's absmax from shared memory and writes its candidate to q's scratch words as
//          above;
//       2. grid barrier; the scale as above;
//       3. N quantized back to front (the first round of CTAs re-reads what L2 still holds),
//          then chunk b from shared memory (CTA 0 last: the scratch words, after the count).
//     DRAM traffic 2 |x| + |q| - (L2 hits) becomes 2 |x| - R + |q| - (L2 hits): measured on
//     the H200 [8192, 7168] 77.07 us (78.88 with the two kernels below), but [32768, 4096]
//     169.33 (165.52), where one CTA per SM sweeps the 9x larger rest slower than the two
//     kernels' 2048 threads per SM; where the launch is refused, the two kernels run;
//   - other dynamic inputs (row mode, scalars, flat vectors between the cooperative launch's
//     reach and the SMs' shared memory, a refused cooperative launch): the scale word is zeroed
//     (cudaMemsetAsync on the caller's stream), a persistent grid (2048 threads per SM, 4
//     vectors per thread in flight) sweeps x front to back and atomicMax-es each block's
//     candidate scale as bits into s; then the quantize pass (256 threads x 4 vectors per block)
//     runs its blocks in reverse order, so the first blocks re-read the end of x, which the
//     sweep left in L2;
//   - static: the quantize pass alone, one read of x and one write of q (one vector a thread
//     while 4 a thread would leave SMs idle).
// Dynamic kernels quantize with quant::Q8::quantize_bounded (the scale bounds every quotient);
// only the static path and the tail keep Div's per-element overflow check.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(9);

#include <kernels/bulk.cuh>
#include <kernels/checks.h>
#include <kernels/cluster.cuh>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>
#include <kernels/pointwise.cuh>
#include <kernels/rowwise.cuh>
#include <kernels/tensor.h>
#include <kernels/vec.cuh>

#include <cooperative_groups.h>

#include "quant_common.cuh"

namespace per_tensor_quant_fp8_detail {

constexpr int kBlock = 256;
constexpr int kUnroll = 4;
constexpr int kFusedBlock = 512;
constexpr int kFusedMaxVPT = 8;
constexpr float kEps = 1e-10f;
constexpr int kClusterBlock = 1024;
// At most 2 vectors per thread (32768 vectors: 262144 bf16 in a cluster of 16). Measured on the
// H200 (bf16, us, the cooperative kernel -> this one): [16, 7168] (1 vector a thread) 4.20 ->
// 3.76, [128, 7168] (8 a thread) 6.23 -> 7.55: 16 SMs cannot pull ~2 MB as fast as 100+ CTAs.
constexpr int kClusterMaxVPT = 2;
constexpr int kClusterMaxRowVPT = 2;
// The resident kernel only where the resident part is at least 1/5 of x. Measured on the H200
// (bf16, us, the two kernels -> the resident kernel): [8192, 7168] (x = 3.97 x the resident
// part) 78.88 -> 77.07, [32768, 4096] (9.1 x) 165.52 -> 169.33.
constexpr int kResidentMaxRatio = 5;
constexpr int kMaxCluster = 16;
constexpr int kResidentBlock = 1024;
constexpr int kResidentUnroll = 8;
constexpr int kResidentPiece = 16 * 1024;  // bytes per bulk copy; the chunk is a multiple of it

// Test hook (per module: modules compile with -fno-gnu-unique): dynamic calls skip the paths
// whose bits are set (kSkipCluster, kSkipResident), so that the fallbacks run where they would
// not.
constexpr int kSkipCluster = 1;
constexpr int kSkipResident = 2;
inline int& skipped_paths() {
  static int mask = 0;
  return mask;
}

struct View {
  const void* x;
  uint8_t* q;
  kernels::RowMap x_map, q_map;
  uint32_t inner;
  kernels::FastDivmod per_row;  // items per row (row mode)
  int64_t items;                // vectors (or elements), the tail excluded
  int tail;                     // flat mode: trailing elements after the last whole vector
  bool flat;
};

template <int kN, bool kFlatOnly = false>
__device__ __forceinline__ void offsets(const View& v, int64_t i, int64_t& xo, int64_t& qo) {
  if (kFlatOnly || v.flat) {
    xo = qo = i * kN;
    return;
  }
  uint32_t r, c;
  v.per_row.divmod(static_cast<uint32_t>(i), r, c);
  xo = rowwise::row_offset(v.x_map, r, v.inner) + static_cast<int64_t>(c) * kN;
  qo = rowwise::row_offset(v.q_map, r, v.inner) + static_cast<int64_t>(c) * kN;
}

// The flat tail (threads below v.tail of one block): element items * kN + threadIdx.x.
template <typename T, int kN>
__device__ __forceinline__ float tail_value(const View& v) {
  kernels::Pack<T, 1> e;
  e.load(static_cast<const T*>(v.x) + v.items * kN + threadIdx.x);
  float f[1];
  e.unpack(f);
  return f[0];
}

template <typename T, int kN>
__device__ __forceinline__ void store_tail(const View& v, float value, float s) {
  quant::Q8<1> out;
  const float f[1] = {value};
  out.template quantize<false>(f, quant::Div(s));
  out.store(v.q + v.items * kN + threadIdx.x);
}

// Dynamic, large: one sweep over x, the block's candidate scale atomicMax-ed into s (zeroed).
template <typename T, int kN>
__global__ void __launch_bounds__(kBlock)
    absmax_kernel(bool pdl, const __grid_constant__ View v, float* s) {
  using P = kernels::Pack<T, kN>;
  __shared__ uint32_t shared[32];
  const T* x = static_cast<const T*>(v.x);
  constexpr int64_t kChunk = int64_t{kBlock} * kUnroll;
  if (pdl) kernels::pdl_wait();
  uint32_t m = 0;
  for (int64_t base = blockIdx.x * kChunk; base < v.items; base += gridDim.x * kChunk) {
    P p[kUnroll];
    m = quant::load_absmax(p, m, [&](int u, P& pack) {
      const int64_t i = base + u * kBlock + threadIdx.x;
      if (i >= v.items) return false;
      int64_t xo, qo;
      offsets<kN>(v, i, xo, qo);
      pack.load(x + xo);  // not streaming: the quantize pass re-reads the end of x from L2
      return true;
    });
  }
  if (blockIdx.x == 0 && static_cast<int>(threadIdx.x) < v.tail)
    m = max(m, quant::abs_bits(tail_value<T, kN>(v)));
  m = quant::block_max(m, shared);
  if (pdl) kernels::pdl_launch_dependents();
  if (threadIdx.x == 0)
    atomicMax(reinterpret_cast<unsigned int*>(s),
              __float_as_uint(quant::dynamic_scale(m, kEps, quant::kFp8Max)));
}

// The quantize pass with the scale in s, kU vectors a thread; blocks in reverse order of the
// data (block 0 takes the last chunk and the tail).
template <typename T, int kN, int kU = kUnroll>
__global__ void __launch_bounds__(kBlock)
    quantize_kernel(bool pdl, const __grid_constant__ View v, const float* s_ptr) {
  using P = kernels::Pack<T, kN>;
  const T* x = static_cast<const T*>(v.x);
  constexpr int64_t kChunk = int64_t{kBlock} * kU;
  const int64_t base = static_cast<int64_t>(gridDim.x - 1 - blockIdx.x) * kChunk;
  if (pdl) kernels::pdl_wait();
  P p[kU];
  int64_t qo[kU];
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    const int64_t i = base + u * kBlock + threadIdx.x;
    qo[u] = -1;
    if (i < v.items) {
      int64_t xo;
      offsets<kN>(v, i, xo, qo[u]);
      p[u].load_stream(x + xo);
    }
  }
  const float s = *s_ptr;
  const quant::Div div(s);
  if (pdl) kernels::pdl_launch_dependents();
#pragma unroll
  for (int u = 0; u < kU; ++u) {
    if (qo[u] >= 0) {
      float f[kN];
      p[u].unpack(f);
      quant::Q8<kN> out;
      out.template quantize<false>(f, div);
      out.store_stream(v.q + qo[u]);
    }
  }
  if (blockIdx.x == 0 && static_cast<int>(threadIdx.x) < v.tail)
    store_tail<T, kN>(v, tail_value<T, kN>(v), s);
}

// Dynamic, small: one block holds x in registers (items <= blockDim.x * kVPT).
template <typename T, int kN, int kVPT>
__global__ void __launch_bounds__(kFusedBlock)
    fused_kernel(bool pdl, const __grid_constant__ View v, float* s_out) {
  using P = kernels::Pack<T, kN>;
  __shared__ uint32_t shared[32];
  const T* x = static_cast<const T*>(v.x);
  if (pdl) kernels::pdl_wait();
  P p[kVPT];
  int64_t qo[kVPT];
#pragma unroll
  for (int j = 0; j < kVPT; ++j) {
    const int64_t i = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    qo[j] = -1;
    if (i < v.items) {
      int64_t xo;
      offsets<kN>(v, i, xo, qo[j]);
      p[j].load_stream(x + xo);
    } else {
      p[j].zero();
    }
  }
  const bool has_tail = static_cast<int>(threadIdx.x) < v.tail;
  const float t = has_tail ? tail_value<T, kN>(v) : 0.0f;
  quant::Absmax<T, kN> am;  // 16-bit inputs in their own format
#pragma unroll
  for (int j = 0; j < kVPT; ++j) am.add(p[j]);
  uint32_t m = max(am.bits(), quant::abs_bits(t));
  m = quant::block_max(m, shared);
  if (pdl) kernels::pdl_launch_dependents();
  const float s = quant::dynamic_scale(m, kEps, quant::kFp8Max);
  if (threadIdx.x == 0) *s_out = s;
  const quant::Div div(s);
#pragma unroll
  for (int j = 0; j < kVPT; ++j) {
    if (qo[j] >= 0) {
      float f[kN];
      p[j].unpack(f);
      quant::Q8<kN> out;
      out.template quantize_bounded<false>(f, div);  // s bounds every |x|
      out.store_stream(v.q + qo[j]);
    }
  }
  if (has_tail) store_tail<T, kN>(v, t, s);
}

// Dynamic, mid: one cluster of gridDim.x CTAs (the grid is the cluster: blockIdx.x is the rank)
// holds x in registers, CTA r items [r, r + 1) * kVPT * blockDim.x (items <= gridDim.x *
// blockDim.x * kVPT). The block maxima meet in distributed shared memory; the second cluster
// barrier's wait, at the end, keeps every CTA's shared memory alive until all have read it.
// kFlat: x flat (no row offsets: row mode's offsets, kept across the barrier, spill at kVPT 8).
template <typename T, int kN, int kVPT, bool kFlat>
__global__ void __launch_bounds__(kClusterBlock)
    cluster_kernel(bool pdl, const __grid_constant__ View v, float* s_out) {
  using P = kernels::Pack<T, kN>;
  __shared__ uint32_t shared[32];
  __shared__ uint32_t block_absmax;  // read by every CTA of the cluster
  const T* x = static_cast<const T*>(v.x);
  const int first = static_cast<int>((blockIdx.x * kVPT) * blockDim.x + threadIdx.x);  // < 2^17
  if (pdl) kernels::pdl_wait();
  P p[kVPT];
#pragma unroll
  for (int j = 0; j < kVPT; ++j) {
    const int i = first + j * static_cast<int>(blockDim.x);
    if (i < v.items) {
      int64_t xo, qo;
      offsets<kN, kFlat>(v, i, xo, qo);
      p[j].load_stream(x + xo);
    } else {
      p[j].zero();
    }
  }
  const bool has_tail = blockIdx.x == 0 && static_cast<int>(threadIdx.x) < v.tail;
  const float t = has_tail ? tail_value<T, kN>(v) : 0.0f;
  uint32_t m = quant::abs_bits(t);
#pragma unroll
  for (int j = 0; j < kVPT; ++j) {
    float f[kN];
    p[j].unpack(f);
    m = quant::absmax_bits(f, m);
  }
  m = quant::block_max(m, shared);
  if (pdl) kernels::pdl_launch_dependents();
  if (threadIdx.x == 0) block_absmax = m;
  kernels::cluster_arrive();  // releases block_absmax
  kernels::cluster_wait();
  // Lane r of every warp reads rank r's maximum (gridDim.x <= 16 lanes).
  const unsigned lane = threadIdx.x & 31u;
  uint32_t c = 0u;
  if (lane < gridDim.x)
    c = *cooperative_groups::this_cluster().map_shared_rank(&block_absmax, static_cast<int>(lane));
  c = quant::lanes_max<32>(c);
  kernels::cluster_arrive();  // this CTA has read every rank's word
  const float s = quant::dynamic_scale(c, kEps, quant::kFp8Max);
  if (blockIdx.x == 0 && threadIdx.x == 0) *s_out = s;
  const quant::Div div(s);
#pragma unroll
  for (int j = 0; j < kVPT; ++j) {
    const int i = first + j * static_cast<int>(blockDim.x);
    if (i < v.items) {
      int64_t xo, qo;
      offsets<kN, kFlat>(v, i, xo, qo);
      float f[kN];
      p[j].unpack(f);
      quant::Q8<kN> out;
      out.template quantize_bounded<false>(f, div);  // s bounds every |x|
      out.store_stream(v.q + qo);
    }
  }
  if (has_tail) store_tail<T, kN>(v, t, s);
  kernels::cluster_wait();  // every CTA has read this CTA's block_absmax
}

// ld.acquire.gpu: the count CTA 0 waits on.
__device__ __forceinline__ uint32_t load_acquire(const uint32_t* p) {
  uint32_t v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}

// Steps 1-2 of the cooperative kernels (the header's list), after this CTA's block max m (bits
// of max |x|): its candidate scale to scratch word blockIdx.x, the grid barrier, the maximum of
// the `grid` candidates (the scale; CTA 0 stores it to s_out), then a bump of the count in word
// `grid` saying this CTA is done reading the scratch words.
template <int kThreads>
__device__ __forceinline__ float grid_scale(uint32_t m, uint32_t* scratch, int64_t grid,
                                            float* s_out, uint32_t* shared_all) {
  if (threadIdx.x == 0)
    scratch[blockIdx.x] = __float_as_uint(quant::dynamic_scale(m, kEps, quant::kFp8Max));
  cooperative_groups::this_grid().sync();
  uint32_t c = 0;
  for (int64_t j = threadIdx.x; j < grid; j += kThreads) c = max(c, __ldcg(scratch + j));
  c = quant::block_max(c, shared_all);  // its barrier: every thread's reads have returned
  const float s = __uint_as_float(c);
  if (threadIdx.x == 0) {
    if (blockIdx.x == 0) *s_out = s;
    __threadfence();
    atomicAdd(scratch + grid, 1u);
  }
  return s;
}

// Dynamic, flat vectors, one cooperative launch (the header's steps 1-3): CTA b quantizes chunk
// b. q's words [0, G] are scratch until CTA 0 stores chunk 0.
template <typename T, int kN>
__global__ void __launch_bounds__(kBlock, 6)
    cooperative_kernel(const __grid_constant__ View v, float* s_out) {
  using P = kernels::Pack<T, kN>;
  __shared__ uint32_t shared_own[32], shared_all[32];
  const T* x = static_cast<const T*>(v.x);
  uint32_t* scratch = reinterpret_cast<uint32_t*>(v.q);
  const int64_t grid = gridDim.x;
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kBlock + threadIdx.x;  // its vector
  const bool active = i < v.items;
  if (blockIdx.x == 0 && threadIdx.x == 0) scratch[grid] = 0u;  // the count, before the barrier
  // 1. The chunk's candidate scale.
  P p;
  if (active) {
    p.load(x + i * kN);
  } else {
    p.zero();
  }
  float f[kN];
  p.unpack(f);
  uint32_t m = quant::absmax_bits(f, 0u);
  const bool has_tail = blockIdx.x == 0 && static_cast<int>(threadIdx.x) < v.tail;
  const float t = has_tail ? tail_value<T, kN>(v) : 0.0f;
  m = quant::block_max(max(m, quant::abs_bits(t)), shared_own);
  const float s = grid_scale<kBlock>(m, scratch, grid, s_out, shared_all);
  // 3. Quantize the chunk from the registers.
  if (blockIdx.x == 0) {  // chunk 0 holds the scratch: wait until every CTA has read it
    if (threadIdx.x == 0) {
      while (load_acquire(scratch + grid) < static_cast<uint32_t>(grid)) __nanosleep(64);
    }
    __syncthreads();
  }
  if (active) {
    quant::Q8<kN> out;
    out.template quantize_bounded<false>(f, quant::Div(s));  // s bounds every |x|: finite
    out.store_stream(v.q + i * kN);
  }
  if (has_tail) store_tail<T, kN>(v, t, s);
}

// The cooperative launch, one CTA per chunk of kBlock vectors; false where x has more chunks
// than CTAs fit at once (or than chunk 0's q bytes hold scratch words for: G candidates and the
// count), or where the device refuses the launch (no cooperative launch, or fewer CTAs resident
// than the occupancy said: a shared GPU).
template <typename T, int kN>
inline bool launch_cooperative(const kernels::Launch& ctx, const View& v, float* s) {
  constexpr auto kernel = cooperative_kernel<T, kN>;
  constexpr int64_t kScratchWords = int64_t{kBlock} * kN / 4 - 1;
  const int64_t chunks = (v.items + kBlock - 1) / kBlock;
  if (chunks > kernels::resident_grid<kernel>(ctx.device, kScratchWords, kBlock)) return false;
  kernels::LaunchConfig config(dim3(static_cast<unsigned>(chunks)), dim3(kBlock), 0, ctx.stream,
                               false, 0, true);
  const cudaError_t status = config.launch(kernel, v, s);
  if (status == cudaErrorCooperativeLaunchTooLarge) {
    cudaGetLastError();
    return false;
  }
  kernels::check_launch(ctx.op, status);
  return true;
}

// Dynamic, large, flat vectors (the header's resident steps 1-3): CTA b of G holds chunk b
// (per_cta vectors, per_cta * 16 bytes of dynamic shared memory) of the resident part
// R = G * per_cta < items; the rest N = [R, items) is swept in chunks of kResidentBlock *
// kResidentUnroll vectors, forward for the absmax, backward for the quantize pass. q's words
// [0, G] are scratch until CTA 0 stores chunk 0.
template <typename T, int kN>
__global__ void __launch_bounds__(kResidentBlock, 1)
    resident_kernel(const __grid_constant__ View v, float* s_out, int per_cta) {
  using P = kernels::Pack<T, kN>;
  extern __shared__ uint4 resident[];
  __shared__ uint64_t filled;
  __shared__ uint32_t shared_own[32], shared_all[32];
  const T* x = static_cast<const T*>(v.x);
  uint32_t* scratch = reinterpret_cast<uint32_t*>(v.q);
  const int64_t grid = gridDim.x;
  const int64_t own = static_cast<int64_t>(blockIdx.x) * per_cta;  // the chunk's first vector
  const int64_t rest = grid * per_cta;                              // N's first vector
  constexpr int64_t kChunk = int64_t{kResidentBlock} * kResidentUnroll;
  const int64_t chunks = (v.items - rest + kChunk - 1) / kChunk;  // of N
  // 1. The chunk's bulk copies in flight while the CTA sweeps its share of N.
  if (threadIdx.x == 0) {
    const uint32_t bytes = static_cast<uint32_t>(per_cta) * 16u;
    const uint32_t bar = kernels::shared_address(&filled);
    kernels::mbarrier_init(bar);
    kernels::mbarrier_init_fence();  // visible to the copies
    kernels::mbarrier_expect_tx(bar, bytes);
    const char* src = reinterpret_cast<const char*>(x + own * kN);
    const uint32_t dst = kernels::shared_address(resident);
    // L2 evict-first: the copied lines are not read again.
    for (uint32_t b = 0; b < bytes; b += kResidentPiece)
      kernels::bulk_load(dst + b, src + b, kResidentPiece, bar, kernels::l2_evict_first());
    if (blockIdx.x == 0) scratch[grid] = 0u;  // the count, before the barrier
  }
  uint32_t m = 0;
  for (int64_t k = blockIdx.x; k < chunks; k += grid) {
    P p[kResidentUnroll];
    m = quant::load_absmax(p, m, [&](int u, P& pack) {
      const int64_t i = rest + k * kChunk + u * kResidentBlock + threadIdx.x;
      if (i >= v.items) return false;
      pack.load(x + i * kN);  // not streaming: step 3 re-reads the end of N from L2
      return true;
    });
  }
  const bool has_tail = blockIdx.x == 0 && static_cast<int>(threadIdx.x) < v.tail;
  const float t = has_tail ? tail_value<T, kN>(v) : 0.0f;
  m = max(m, quant::abs_bits(t));
  __syncthreads();  // the mbarrier's initialization, before any thread waits on it
  kernels::mbarrier_wait(kernels::shared_address(&filled), 0);  // the bulk copies' bytes
#pragma unroll 2
  for (int j = threadIdx.x; j < per_cta; j += kResidentBlock) {
    P p;
    p.set(0, resident[j]);
    float f[kN];
    p.unpack(f);
    m = quant::absmax_bits(f, m);
  }
  m = quant::block_max(m, shared_own);
  const float s = grid_scale<kResidentBlock>(m, scratch, grid, s_out, shared_all);
  const quant::Div div(s);
  // 3. N back to front (round r of the grid takes chunks chunks - 1 - r G - b), then the chunk.
  for (int64_t k = chunks - 1 - blockIdx.x; k >= 0; k -= grid) {
    P p[kResidentUnroll];
#pragma unroll
    for (int u = 0; u < kResidentUnroll; ++u) {
      const int64_t i = rest + k * kChunk + u * kResidentBlock + threadIdx.x;
      if (i < v.items) p[u].load_stream(x + i * kN);
    }
#pragma unroll
    for (int u = 0; u < kResidentUnroll; ++u) {
      const int64_t i = rest + k * kChunk + u * kResidentBlock + threadIdx.x;
      if (i < v.items) {
        float f[kN];
        p[u].unpack(f);
        quant::Q8<kN> out;
        out.template quantize_bounded<false>(f, div);  // s bounds every |x|
        out.store_stream(v.q + i * kN);
      }
    }
  }
  if (has_tail) store_tail<T, kN>(v, t, s);
  if (blockIdx.x == 0) {  // chunk 0 holds the scratch: wait until every CTA has read it
    if (threadIdx.x == 0) {
      while (load_acquire(scratch + grid) < static_cast<uint32_t>(grid)) __nanosleep(64);
    }
    __syncthreads();
  }
#pragma unroll 2
  for (int j = threadIdx.x; j < per_cta; j += kResidentBlock) {
    P p;
    p.set(0, resident[j]);
    float f[kN];
    p.unpack(f);
    quant::Q8<kN> out;
    out.template quantize_bounded<false>(f, div);
    out.store_stream(v.q + (own + j) * kN);
  }
}

// The resident kernel's shape on a device: its dynamic shared memory per CTA (0: no launch)
// and the CTAs resident at once (one per SM where the occupancy says so). Cached per device.
struct ResidentShape {
  int bytes, grid;
};

template <typename T, int kN>
inline ResidentShape resident_shape(int device) {
  static ResidentShape cached[64] = {};
  static bool known[64] = {};
  if (device >= 0 && device < 64 && known[device]) return cached[device];
  constexpr auto kernel = resident_kernel<T, kN>;
  ResidentShape shape{0, 0};
  int optin = 0, per_sm = 0;
  cudaFuncAttributes attributes{};
  if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) ==
          cudaSuccess &&
      cudaFuncGetAttributes(&attributes, kernel) == cudaSuccess) {
    const int bytes = (optin - static_cast<int>(attributes.sharedSizeBytes)) /
                      kResidentPiece * kResidentPiece;
    if (bytes >= kResidentPiece &&
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes) ==
            cudaSuccess &&
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kResidentBlock, bytes) ==
            cudaSuccess &&
        per_sm > 0) {
      shape = ResidentShape{bytes, per_sm * kernels::sm_count(device)};
    }
  }
  (void)cudaGetLastError();  // a refused query or opt-in leaves no error behind
  if (device >= 0 && device < 64) {
    cached[device] = shape;
    known[device] = true;
  }
  return shape;
}

// The resident kernel where x is larger than the resident part; false where it is not, where
// the device has no room for it, or where the cooperative launch is refused.
template <typename T, int kN>
inline bool launch_resident(const kernels::Launch& ctx, const View& v, float* s) {
  if (!kernels::cooperative_supported(ctx.device)) return false;
  const ResidentShape shape = resident_shape<T, kN>(ctx.device);
  const int per_cta = shape.bytes / 16;
  const int64_t held = int64_t{shape.grid} * per_cta;
  if (shape.bytes == 0 || v.items <= held || v.items > held * kResidentMaxRatio) return false;
  kernels::LaunchConfig config(dim3(static_cast<unsigned>(shape.grid)), dim3(kResidentBlock),
                               static_cast<size_t>(shape.bytes), ctx.stream, false, 0, true);
  const cudaError_t status = config.launch(resident_kernel<T, kN>, v, s, per_cta);
  if (status == cudaErrorCooperativeLaunchTooLarge) {
    cudaGetLastError();
    return false;
  }
  kernels::check_launch(ctx.op, status);
  return true;
}

// The cluster kernel with kVPT vectors per thread (1 or kClusterMaxVPT = 2).
template <typename T, int kN>
inline auto cluster_kernel_for(int vpt, bool flat) {
  static_assert(kClusterMaxVPT == 2 && kClusterMaxRowVPT == 2);
  if (!flat) return vpt == 1 ? cluster_kernel<T, kN, 1, false> : cluster_kernel<T, kN, 2, false>;
  return vpt == 1 ? cluster_kernel<T, kN, 1, true> : cluster_kernel<T, kN, 2, true>;
}

// CTAs per cluster of the cluster kernels on `device`: 16 (non-portable) where a cluster of 16
// CTAs of kClusterBlock threads fits at once (cudaOccupancyMaxActiveClusters), else 8, else 0
// (no cluster launch: before sm_90, or a refused opt-in or query). Cached per device; the first
// call opts every instantiation in to non-portable sizes, and the flat kVPT = 2 one (the most
// registers) stands for all in the query.
template <typename T, int kN>
inline int cluster_size(int device) {
  static int cached[64] = {0};  // 0 unknown, else the size + 1
  if (device >= 0 && device < 64 && cached[device]) return cached[device] - 1;
  int major = 0, size = 0;
  cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
  bool allowed = major >= 9;
  for (int vpt = 1; vpt <= kClusterMaxVPT && allowed; vpt *= 2) {
    for (const bool flat : {true, false}) {
      allowed = allowed && cudaFuncSetAttribute(cluster_kernel_for<T, kN>(vpt, flat),
                                                cudaFuncAttributeNonPortableClusterSizeAllowed,
                                                1) == cudaSuccess;
    }
  }
  for (int c = kMaxCluster; allowed && c >= 8 && size == 0; c /= 2) {
    const kernels::LaunchConfig query(dim3(static_cast<unsigned>(c)), dim3(kClusterBlock), 0,
                                      nullptr, false, static_cast<unsigned>(c));
    int active = 0;
    if (cudaOccupancyMaxActiveClusters(&active, cluster_kernel_for<T, kN>(kClusterMaxVPT, true),
                                       &query.config) == cudaSuccess &&
        active > 0)
      size = c;
  }
  (void)cudaGetLastError();  // a refused opt-in or query leaves no error behind
  if (device >= 0 && device < 64) cached[device] = size + 1;
  return size;
}

// The cluster kernel where x fits its registers: the fewest vectors per thread (1 or 2)
// that cover x with every CTA of the cluster, then the fewest threads (whole
// warps). False where no cluster launches or x is larger.
template <typename T, int kN>
inline bool launch_cluster(const kernels::Launch& ctx, const View& v, float* s) {
  const int cluster = cluster_size<T, kN>(ctx.device);
  const int max_vpt = v.flat ? kClusterMaxVPT : kClusterMaxRowVPT;
  if (cluster == 0 || v.items > int64_t{cluster} * kClusterBlock * max_vpt) return false;
  int vpt = 1;
  while (v.items > int64_t{cluster} * kClusterBlock * vpt) vpt *= 2;
  const int64_t per_cta = (v.items + cluster - 1) / cluster;
  const unsigned block = static_cast<unsigned>(((per_cta + vpt - 1) / vpt + 31) / 32 * 32);
  const unsigned grid = static_cast<unsigned>(cluster);
  const bool pdl = kernels::pdl_for_grid(ctx.enable_pdl, ctx.device, grid, block);
  kernels::LaunchConfig config(dim3(grid), dim3(block), 0, ctx.stream, pdl, grid);
  kernels::check_launch(ctx.op, config.launch(cluster_kernel_for<T, kN>(vpt, v.flat), pdl, v, s));
  return true;
}

template <typename T, int kN>
inline void launch_fused(const kernels::Launch& ctx, const View& v, float* s) {
  int vpt = 1;
  while (v.items > int64_t{kFusedBlock} * vpt) vpt *= 2;
  int64_t threads = (v.items + vpt - 1) / vpt;
  threads = threads < 32 ? 32 : (threads + 31) / 32 * 32;
  void (*kernel)(bool, View, float*) = nullptr;
  switch (vpt) {
    case 1:
      kernel = fused_kernel<T, kN, 1>;
      break;
    case 2:
      kernel = fused_kernel<T, kN, 2>;
      break;
    case 4:
      kernel = fused_kernel<T, kN, 4>;
      break;
    default:
      kernel = fused_kernel<T, kN, 8>;
      break;
  }
  kernels::launch(ctx, kernel, 1u, static_cast<unsigned>(threads), v, s);
}

template <typename T, int kN>
inline void launch_all(const kernels::Launch& ctx, const View& v, float* s, bool is_static) {
  constexpr int64_t kChunk = int64_t{kBlock} * kUnroll;
  const unsigned quant_grid =
      static_cast<unsigned>(std::max<int64_t>(1, (v.items + kChunk - 1) / kChunk));
  if (is_static) {
    // While the unrolled grid would leave SMs idle, one vector a thread over 4x the CTAs: at
    // decode one CTA of 4 vectors a thread is bound by its SM's issue slots (H200, bf16 1 x
    // 7168: 1.86 us, torch.compile's 7 CTAs 1.15).
    if (v.items <= int64_t{kernels::sm_count(ctx.device)} * kChunk) {
      const unsigned grid = static_cast<unsigned>((v.items + kBlock - 1) / kBlock);
      kernels::launch(ctx, quantize_kernel<T, kN, 1>, std::max(grid, 1u), kBlock, v,
                      static_cast<const float*>(s));
      return;
    }
    kernels::launch(ctx, quantize_kernel<T, kN>, quant_grid, kBlock, v,
                    static_cast<const float*>(s));
    return;
  }
  if (v.items <= int64_t{kFusedBlock} * kFusedMaxVPT) return launch_fused<T, kN>(ctx, v, s);
  if (!(skipped_paths() & kSkipCluster) && launch_cluster<T, kN>(ctx, v, s)) return;
  if constexpr (kN > 1) {
    // Only while one chunk per CTA covers x, where the launches are most of the time (H200,
    // 2026-12-04: [16, 7168] 6.10 -> 4.45 us, [128, 7168] 7.86 -> 6.41). Above it a persistent
    // cooperative sweep of 4 vectors per thread lost to the two kernels (32768 x 4096: 176.0
    // vs 166.7 us; 8192 x 7168: 77.7 vs 78.8).
    if (v.flat && kernels::cooperative_supported(ctx.device) &&
        launch_cooperative<T, kN>(ctx, v, s))
      return;
    if (v.flat && !(skipped_paths() & kSkipResident) && launch_resident<T, kN>(ctx, v, s)) return;
  }
  kernels::check_launch(ctx.op, cudaMemsetAsync(s, 0, sizeof(float), ctx.stream));
  const int64_t resident = int64_t{kernels::sm_count(ctx.device)} * (2048 / kBlock);
  const int64_t needed = (v.items + kChunk - 1) / kChunk;
  const unsigned grid = static_cast<unsigned>(std::min(resident, needed));
  // Without PDL: the previous node is the memset.
  kernels::check_launch(ctx.op, kernels::launch_pdl(absmax_kernel<T, kN>, dim3(grid), dim3(kBlock),
                                                    0, ctx.stream, false, false, v, s));
  kernels::launch(ctx, quantize_kernel<T, kN>, quant_grid, kBlock, v, static_cast<const float*>(s));
}

}  // namespace per_tensor_quant_fp8_detail

// q: x's shape, float8_e4m3fn; s: one fp32 element (written when dynamic, read when static);
// x: fp32/fp16/bf16, contiguous last dim. x and q contiguous, or with leading dims that merge
// into at most two levels of rows (fewer than 2^31 items then).
inline void per_tensor_quant_fp8(tvm::ffi::TensorView q, tvm::ffi::TensorView s,
                                 tvm::ffi::TensorView x, bool is_static) {
  namespace detail = per_tensor_quant_fp8_detail;
  constexpr const char* kOp = "quantization.per_tensor_quant_fp8";
  // 1. Validate.
  const DLDataType d = x.dtype();
  TVM_FFI_CHECK(kernels::is_dtype(d, kDLFloat, 32) || kernels::is_dtype(d, kDLFloat, 16) ||
                    kernels::is_dtype(d, kDLBfloat, 16),
                TypeError)
      << kOp << ": x must have dtype float32, float16 or bfloat16";
  kernels::check_last_dim_contiguous(kOp, "x", x);
  kernels::check_same_shape(kOp, "q", q, "x", x);
  TVM_FFI_CHECK(kernels::is_dtype(q.dtype(), kDLFloat8_e4m3fn, 8), TypeError)
      << kOp << ": q must have dtype float8_e4m3fn";
  kernels::check_last_dim_contiguous(kOp, "q", q);
  TVM_FFI_CHECK(kernels::is_dtype(s.dtype(), kDLFloat, 32), TypeError)
      << kOp << ": s must have dtype float32";
  TVM_FFI_CHECK(s.numel() == 1, ValueError)
      << kOp << ": s must hold exactly one element, got shape " << kernels::shape_string(s);
  kernels::check_no_overlap(kOp, "q", q, "x", x);
  kernels::check_no_overlap(kOp, "s", s, "x", x);
  kernels::check_no_overlap(kOp, "s", s, "q", q);
  kernels::check_device(kOp, "x", x, kDLCUDA);
  kernels::check_same_device(kOp, "q", q, "x", x);
  kernels::check_same_device(kOp, "s", s, "x", x);
  if (x.numel() == 0) return;

  detail::View v{};
  v.x = kernels::data(x);
  v.q = kernels::data<uint8_t>(q);
  float* s_ptr = kernels::data<float>(s);
  const bool flat = x.IsContiguous() && q.IsContiguous();
  kernels::RowLayout rows;
  int64_t cols = 1;
  if (!flat) {
    rows = kernels::row_layout(kOp, "x", {&x, &q});
    cols = x.size(-1);
  }
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  const kernels::Launch ctx(kOp, x);
  // 4. Dispatch on dtype and launch (checked).
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T, [&] {
    constexpr int kVec = kernels::kVectorBytes / static_cast<int>(sizeof(T));
    if (flat) {
      const bool vector = kernels::is_aligned(v.x) && reinterpret_cast<uintptr_t>(v.q) % kVec == 0;
      v.flat = true;
      if (vector) {
        v.items = x.numel() / kVec;
        v.tail = static_cast<int>(x.numel() % kVec);
        detail::launch_all<T, kVec>(ctx, v, s_ptr, is_static);
      } else {
        v.items = x.numel();
        detail::launch_all<T, 1>(ctx, v, s_ptr, is_static);
      }
      return;
    }
    v.x_map = rows.map[0];
    v.q_map = rows.map[1];
    v.inner = static_cast<uint32_t>(rows.inner);
    const bool vector = kernels::vectors_fit(cols, kVec, {v.x}, {v.x_map}) &&
                        reinterpret_cast<uintptr_t>(v.q) % kVec == 0 && v.q_map.s0 % kVec == 0 &&
                        v.q_map.s1 % kVec == 0;
    const int64_t per_row = vector ? cols / kVec : cols;
    v.items = rows.rows() * per_row;
    TVM_FFI_CHECK(v.items < (int64_t{1} << 31), ValueError)
        << kOp << ": a strided x " << kernels::shape_string(x)
        << " must have fewer than 2^31 vectors; pass a contiguous tensor";
    v.per_row = kernels::FastDivmod(static_cast<uint32_t>(per_row));
    if (vector) {
      detail::launch_all<T, kVec>(ctx, v, s_ptr, is_static);
    } else {
      detail::launch_all<T, 1>(ctx, v, s_ptr, is_static);
    }
  });
}

// Test hooks. per_tensor_quant_fp8_skip_paths: dynamic calls skip the paths in `mask` (bit 0
// the cluster kernel, bit 1 the resident kernel; 0 restores the automatic choice).
// per_tensor_quant_fp8_limits, for x's dtype (vector path) on x's device: which = 0, the CTAs
// of the cluster kernel (0: none launches); 1, the resident kernel's resident vectors G x C
// (it takes flat x of more vectors; 0: it does not launch).
inline void per_tensor_quant_fp8_skip_paths(int64_t mask) {
  namespace detail = per_tensor_quant_fp8_detail;
  TVM_FFI_CHECK(mask >= 0 && mask <= (detail::kSkipCluster | detail::kSkipResident), ValueError)
      << "per_tensor_quant_fp8_skip_paths: mask must be 0-3, got " << mask;
  per_tensor_quant_fp8_detail::skipped_paths() = static_cast<int>(mask);
}

inline int64_t per_tensor_quant_fp8_limits(tvm::ffi::TensorView x, int64_t which) {
  namespace detail = per_tensor_quant_fp8_detail;
  constexpr const char* kOp = "quantization.per_tensor_quant_fp8_limits";
  kernels::check_device(kOp, "x", x, kDLCUDA);
  TVM_FFI_CHECK(which == 0 || which == 1, ValueError) << kOp << ": which must be 0 or 1";
  kernels::DeviceGuard guard(x);
  const int device = x.device().device_id;
  int64_t limit = 0;
  KERNELS_DISPATCH_FLOAT(x.dtype(), kOp, T, [&] {
    constexpr int kVec = kernels::kVectorBytes / static_cast<int>(sizeof(T));
    if (which == 0) {
      limit = detail::cluster_size<T, kVec>(device);
    } else {
      const detail::ResidentShape shape = detail::resident_shape<T, kVec>(device);
      limit = int64_t{shape.grid} * (shape.bytes / 16);
    }
  });
  return limit;
}
