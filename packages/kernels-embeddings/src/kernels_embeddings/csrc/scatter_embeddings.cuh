// embeddings.scatter_embeddings, CUDA: embeds[dest(i)] = cast(mm_embeds[i]), dest(i) =
// positions[i], or the i-th True position of mask (in token order). One launch, no host sync:
//
//   - block b owns mm rows [b * R, (b + 1) * R) (R <= kMaxRows, chosen so the grid fills the GPU)
//     and first finds their destinations in shared memory. With positions, one load each (a
//     position outside [0, T) is skipped: the reference raises, the kernel cannot without a host
//     sync). With a mask, the block scans the mask in tiles of 256 threads x 64 flags (four 16-byte
//     loads per thread where aligned), a block-wide exclusive scan of the per-thread counts giving
//     each True flag its rank, and stops at the tile where its last row's rank is reached: the
//     device prefix sum of the mask, recomputed per block from L2 (the mask is T bytes) instead of
//     a second kernel and a workspace. Ranks >= M (more True flags than rows) are left unchanged,
//     rows without a True flag (fewer) are not written: the reference raises for both.
//   - then the rows are copied by groups of G threads (16-byte packs of the wider type, e.g. 8
//     fp32 loaded as two vectors and stored as one bf16 vector; all loads of a thread before its
//     stores), values cast to the dtype of embeds.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/checks.h>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>
#include <kernels/tensor.h>
#include <kernels/vec.cuh>

#include <algorithm>
#include <cstdint>

namespace scatter_embeddings_detail {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int kUnroll = 8;
constexpr int kMaxRows = 256;
constexpr int kFlags = 64;  // mask flags per thread per tile (4 x 16-byte loads)

struct Params {
  void* embeds;
  const void* mm;
  const void* index;    // positions (int32/int64) or mask (bool bytes)
  int64_t e_stride;     // elements
  int64_t m_stride;     // elements
  int64_t index_stride; // elements
  int64_t tokens;       // T
  int64_t rows;         // M
  int rows_per_block;   // R
  uint32_t packs;       // packs per row
  int group_shift;      // log2(G)
  bool mask_vector;     // mask 16-byte aligned and contiguous
};

// Exclusive prefix of `value` over the block; `total` gets the block's sum. Ends synchronised.
__device__ __forceinline__ int block_exclusive_scan(int value, int& total, int* warp_sums) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int inclusive = value;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int up = __shfl_up_sync(0xffffffffu, inclusive, d);
    if (lane >= d) inclusive += up;
  }
  if (lane == 31) warp_sums[warp] = inclusive;
  __syncthreads();
  int before = 0;
  total = 0;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) {
    const int s = warp_sums[w];
    before += w < warp ? s : 0;
    total += s;
  }
  __syncthreads();  // warp_sums is reused by the next call
  return before + inclusive - value;
}

// The 64 flags of mask[t0, t0 + 64) as bits (bit k: token t0 + k), zero past T.
__device__ __forceinline__ uint64_t mask_bits(const Params& p, int64_t t0) {
  const uint8_t* mask = static_cast<const uint8_t*>(p.index);
  uint64_t bits = 0;
  if (p.mask_vector && t0 + kFlags <= p.tokens) {
    uint4 w[kFlags / 16];
#pragma unroll
    for (int a = 0; a < kFlags / 16; ++a) w[a] = reinterpret_cast<const uint4*>(mask + t0)[a];
#pragma unroll
    for (int a = 0; a < kFlags / 16; ++a) {
      const uint32_t words[4] = {w[a].x, w[a].y, w[a].z, w[a].w};
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int b = 0; b < 4; ++b)
          bits |= static_cast<uint64_t>(((words[i] >> (8 * b)) & 0xffu) != 0u)
                  << (16 * a + 4 * i + b);
    }
  } else {
    for (int k = 0; k < kFlags; ++k)
      if (t0 + k < p.tokens) bits |= static_cast<uint64_t>(mask[(t0 + k) * p.index_stride] != 0) << k;
  }
  return bits;
}

template <typename TIn, typename TOut, int kN, int kMode>  // kMode: 0 int32, 1 int64, 2 mask
__global__ void __launch_bounds__(kThreads) scatter_kernel(bool pdl, const Params p) {
  __shared__ int64_t dest[kMaxRows];
  __shared__ int warp_sums[kWarps];
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * p.rows_per_block;
  const int count = static_cast<int>(min(static_cast<int64_t>(p.rows_per_block), p.rows - r0));
  if (pdl) kernels::pdl_wait();
  // 1. The destinations of this block's rows.
  if constexpr (kMode == 2) {
    for (int i = threadIdx.x; i < count; i += kThreads) dest[i] = -1;
    __syncthreads();
    const int64_t r1 = r0 + count;
    int64_t running = 0;  // True flags before the tile (block-uniform)
    for (int64_t tile = 0; tile < p.tokens && running < r1; tile += kThreads * kFlags) {
      const int64_t t0 = tile + static_cast<int64_t>(threadIdx.x) * kFlags;
      uint64_t bits = t0 < p.tokens ? mask_bits(p, t0) : 0ull;
      const int mine = __popcll(bits);
      int total;
      int64_t rank = running + block_exclusive_scan(mine, total, warp_sums);
      if (rank + mine <= r0 || rank >= r1) bits = 0;  // none of this thread's ranks is ours
      while (bits) {
        const int k = __ffsll(static_cast<long long>(bits)) - 1;
        bits &= bits - 1;
        if (rank >= r0 && rank < r1) dest[rank - r0] = t0 + k;
        ++rank;
      }
      running += total;
    }
  } else {
    using Idx = std::conditional_t<kMode == 0, int32_t, int64_t>;
    const Idx* positions = static_cast<const Idx*>(p.index);
    for (int i = threadIdx.x; i < count; i += kThreads) {
      const int64_t d = static_cast<int64_t>(positions[(r0 + i) * p.index_stride]);
      dest[i] = d >= 0 && d < p.tokens ? d : -1;
    }
  }
  __syncthreads();
  // 2. The copies, one group of G threads per row.
  const int g = 1 << p.group_shift;
  const int groups = kThreads >> p.group_shift;
  const uint32_t lane = threadIdx.x & (g - 1);
  const TIn* mm = static_cast<const TIn*>(p.mm);
  TOut* embeds = static_cast<TOut*>(p.embeds);
  const uint32_t step = static_cast<uint32_t>(g) * kUnroll;
  for (int i = threadIdx.x >> p.group_shift; i < count; i += groups) {
    const int64_t d = dest[i];
    if (d < 0) continue;
    const TIn* src = mm + (r0 + i) * p.m_stride;
    TOut* dst = embeds + d * p.e_stride;
    for (uint32_t base = lane; base < p.packs; base += step) {
      kernels::Pack<TIn, kN> v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const uint32_t c = base + u * g;
        if (c < p.packs) v[u].load_stream(src + static_cast<int64_t>(c) * kN);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const uint32_t c = base + u * g;
        if (c < p.packs) {
          if constexpr (std::is_same_v<TIn, TOut>) {
            v[u].store(dst + static_cast<int64_t>(c) * kN);
          } else {
            float f[kN];
            v[u].unpack(f);
            kernels::Pack<TOut, kN> o;
            o.pack(f);
            o.store(dst + static_cast<int64_t>(c) * kN);
          }
        }
      }
    }
  }
  if (pdl) kernels::pdl_launch_dependents();
}

template <typename TIn, typename TOut, int kMode>
void launch(const kernels::Launch& ctx, Params p, int64_t hidden, const void* embeds_ptr,
            const void* mm_ptr) {
  constexpr int kVec = kernels::kVectorBytes /
                       static_cast<int>(sizeof(TIn) < sizeof(TOut) ? sizeof(TIn) : sizeof(TOut));
  const bool vector = hidden % kVec == 0 && p.e_stride % kVec == 0 && p.m_stride % kVec == 0 &&
                      kernels::is_aligned(embeds_ptr) && kernels::is_aligned(mm_ptr);
  const int kN = vector ? kVec : 1;
  const int64_t packs = hidden / kN;
  TVM_FFI_CHECK(packs < (int64_t{1} << 31), ValueError) << ctx.op << ": rows are too wide";
  p.packs = static_cast<uint32_t>(packs);
  const int sms = kernels::sm_count(ctx.device);
  const int g = kernels::threads_per_row(packs, p.rows, kUnroll, kThreads, ctx.device);
  int shift = 0;
  while ((1 << shift) < g) ++shift;
  p.group_shift = shift;
  // Rows per block: a multiple of the groups per block, enough blocks for ~4 per SM.
  const int groups = kThreads / g;
  int64_t per_block = (p.rows + 4 * sms - 1) / (4 * sms);
  per_block = (per_block + groups - 1) / groups * groups;
  p.rows_per_block = static_cast<int>(std::min<int64_t>(kMaxRows, std::max<int64_t>(per_block, 1)));
  const int64_t grid64 = (p.rows + p.rows_per_block - 1) / p.rows_per_block;
  TVM_FFI_CHECK(grid64 < (int64_t{1} << 31), ValueError) << ctx.op << ": too many rows";
  const unsigned grid = static_cast<unsigned>(grid64);
  if (vector)
    kernels::launch(ctx, scatter_kernel<TIn, TOut, kVec, kMode>, grid, kThreads, p);
  else
    kernels::launch(ctx, scatter_kernel<TIn, TOut, 1, kMode>, grid, kThreads, p);
}

}  // namespace scatter_embeddings_detail

// embeds [T, H] (modified in place), mm_embeds [M, H] (float32/float16/bfloat16 each, last dims
// contiguous, any row strides), exactly one of positions [M] int32/int64 and mask [T] bool.
inline void scatter_embeddings(tvm::ffi::TensorView embeds, tvm::ffi::TensorView mm_embeds,
                               tvm::ffi::Optional<tvm::ffi::TensorView> positions,
                               tvm::ffi::Optional<tvm::ffi::TensorView> mask) {
  namespace detail = scatter_embeddings_detail;
  constexpr const char* kOp = "embeddings.scatter_embeddings";
  // 1. Validate.
  kernels::check_ndim(kOp, "embeds", embeds, 2);
  kernels::check_ndim(kOp, "mm_embeds", mm_embeds, 2);
  kernels::check_last_dim_contiguous(kOp, "embeds", embeds);
  kernels::check_last_dim_contiguous(kOp, "mm_embeds", mm_embeds);
  kernels::check_device(kOp, "embeds", embeds, kDLCUDA);
  kernels::check_same_device(kOp, "mm_embeds", mm_embeds, "embeds", embeds);
  TVM_FFI_CHECK(mm_embeds.size(1) == embeds.size(1), ValueError)
      << kOp << ": mm_embeds must have H = " << embeds.size(1) << " columns like embeds, got "
      << kernels::shape_string(mm_embeds);
  TVM_FFI_CHECK(positions.has_value() != mask.has_value(), ValueError)
      << kOp << ": pass exactly one of positions= and mask=";
  const tvm::ffi::TensorView index = positions.has_value() ? positions.value() : mask.value();
  const char* index_name = positions.has_value() ? "positions" : "mask";
  kernels::check_ndim(kOp, index_name, index, 1);
  kernels::check_device(kOp, index_name, index, kDLCUDA);
  kernels::check_same_device(kOp, index_name, index, "embeds", embeds);
  int mode;
  if (positions.has_value()) {
    const bool i64 = kernels::is_dtype(index.dtype(), kDLInt, 64);
    TVM_FFI_CHECK(i64 || kernels::is_dtype(index.dtype(), kDLInt, 32), TypeError)
        << kOp << ": positions must be int32 or int64";
    TVM_FFI_CHECK(index.size(0) == mm_embeds.size(0), ValueError)
        << kOp << ": positions must have M = " << mm_embeds.size(0) << " entries";
    mode = i64 ? 1 : 0;
  } else {
    TVM_FFI_CHECK(kernels::is_dtype(index.dtype(), kDLBool, 8) ||
                      kernels::is_dtype(index.dtype(), kDLUInt, 8),
                  TypeError)
        << kOp << ": mask must be bool";
    TVM_FFI_CHECK(index.size(0) == embeds.size(0), ValueError)
        << kOp << ": mask must have T = " << embeds.size(0) << " entries like embeds";
    mode = 2;
  }
  const int64_t rows = mm_embeds.size(0), hidden = embeds.size(1);
  if (rows == 0 || embeds.size(0) == 0 || hidden == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(embeds);
  const kernels::Launch ctx(kOp, embeds);
  // 4. Dispatch on dtypes and mode, and launch.
  detail::Params p{};
  p.embeds = kernels::data<void>(embeds);
  p.mm = kernels::data<const void>(mm_embeds);
  p.index = kernels::data<const void>(index);
  p.e_stride = embeds.size(0) == 1 ? hidden : embeds.stride(0);
  p.m_stride = rows == 1 ? hidden : mm_embeds.stride(0);
  p.index_stride = index.size(0) == 1 ? 1 : index.stride(0);
  p.tokens = embeds.size(0);
  p.rows = rows;
  p.mask_vector = mode == 2 && p.index_stride == 1 && kernels::is_aligned(p.index);
  KERNELS_DISPATCH_FLOAT(embeds.dtype(), kOp, TOut, [&] {
    KERNELS_DISPATCH_FLOAT(mm_embeds.dtype(), kOp, TIn, [&] {
      if (mode == 0)
        detail::launch<TIn, TOut, 0>(ctx, p, hidden, p.embeds, p.mm);
      else if (mode == 1)
        detail::launch<TIn, TOut, 1>(ctx, p, hidden, p.embeds, p.mm);
      else
        detail::launch<TIn, TOut, 2>(ctx, p, hidden, p.embeds, p.mm);
    });
  });
}
