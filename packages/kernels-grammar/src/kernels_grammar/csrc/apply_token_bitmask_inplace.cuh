// grammar.apply_token_bitmask_inplace, CUDA: logits[r, t] = -inf where bit t % 32 of word t / 32
// of bitmask[r] (read as uint32) is 0, for t < vocab_size; every other element is untouched.
//
// Only masked elements are written, so the time tracks the mask density. A warp owns 32 words
// (1024 tokens) of one row: each lane loads one word (a coalesced 128-byte read of the mask); a
// warp whose 32 words are all fully allowed stops there (fully allowed words cost the mask read
// alone). Otherwise each lane takes one 16-byte chunk per step (4 fp32 or 8 fp16/bf16 elements:
// one nibble/byte of a word, fetched by a shuffle): all masked -> one 16-byte store of -inf
// without reading the logits; mixed -> a 16-byte load, select and store (whole sectors, like
// the peers; all loads of a warp are issued before its first store); all allowed -> nothing.
// The lanes of one step cover kN consecutive words, i.e. 512 contiguous bytes of the row, so
// the accesses of a warp stay coalesced. The scalar path
// (logits not 16-byte aligned, or a row stride that is not a whole number of chunks) stores
// one element at a time where its bit is 0; the chunk that reaches past vocab_size always does.
//
// Rows are read from `indices` when given (int32 or int64); an index outside [0, rows) is
// skipped (the Python layer checks list indices; device ones are a precondition, no host sync).
// Values are moved as raw bits (the dtype only fixes the element width and the -inf pattern).
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/checks.h>
#include <kernels/dtype.h>
#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>
#include <kernels/tensor.h>
#include <kernels/vec.cuh>

#include <cstdint>

namespace apply_token_bitmask_detail {

constexpr int kThreads = 128;  // 4 warps, one 32-word (1024-token) slice each
constexpr int kWarps = kThreads / 32;
constexpr int kWordsPerWarp = 32;

struct Params {
  void* logits;
  const uint32_t* bitmask;
  const void* indices;
  int64_t index_stride;   // elements
  int64_t logits_stride;  // elements
  int64_t mask_stride;    // words
  int64_t rows;           // rows to process (B, or the number of indices)
  int64_t limit;          // valid row ids: [0, limit)
  int64_t vocab;          // vocab_size
  int64_t words;          // ceil(vocab / 32): words read per row
  uint32_t blocks_per_row;
};

// Bits: uint32_t (fp32) or uint16_t (fp16/bf16); kNegInf its -inf pattern. kIndex: 0 none,
// 1 int32, 2 int64. kVector: 16-byte chunks (aligned rows) or one element at a time.
template <typename Bits, Bits kNegInf, int kIndex, bool kVector>
__global__ void __launch_bounds__(kThreads) bitmask_kernel(bool pdl, Params p) {
  constexpr int kN = 16 / static_cast<int>(sizeof(Bits));  // elements (bits) per chunk
  constexpr int kChunksPerWord = 32 / kN;
  constexpr uint32_t kChunkBits = (1u << kN) - 1u;
  const int64_t task = blockIdx.x / p.blocks_per_row;
  const int64_t part = blockIdx.x % p.blocks_per_row;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (pdl) kernels::pdl_wait();
  int64_t row = task;
  if constexpr (kIndex == 1) row = static_cast<const int32_t*>(p.indices)[task * p.index_stride];
  if constexpr (kIndex == 2) row = static_cast<const int64_t*>(p.indices)[task * p.index_stride];
  const int64_t first_word = (part * kWarps + warp) * kWordsPerWarp;
  if (row < 0 || row >= p.limit || first_word >= p.words) {
    if (pdl) kernels::pdl_launch_dependents();
    return;
  }
  // One word per lane; words past the vocabulary (and bits past vocab_size in the last word)
  // read as allowed.
  const int64_t w = first_word + lane;
  uint32_t word = 0xffffffffu;
  if (w < p.words) {
    word = __ldcs(p.bitmask + row * p.mask_stride + w);
    const int64_t end = (w + 1) * 32;
    if (end > p.vocab) word |= ~0u << (32 - static_cast<int>(end - p.vocab));
  }
  if (pdl) kernels::pdl_launch_dependents();
  const unsigned todo = __ballot_sync(0xffffffffu, word != 0xffffffffu);
  if (todo == 0) return;
  Bits* out = static_cast<Bits*>(p.logits) + row * p.logits_stride;
  // Step s covers words [s*kN, s*kN + kN) of the slice; lane l takes chunk l % kChunksPerWord
  // of word s*kN + l / kChunksPerWord. Every load of the mixed chunks is issued before the first
  // store (one round trip per warp, not one per step).
  constexpr int kSteps = kWordsPerWarp / kN;
  uint32_t bits[kSteps];
  uint4 v[kSteps];
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    const int src = s * kN + lane / kChunksPerWord;
    const uint32_t mine = __shfl_sync(0xffffffffu, word, src);
    bits[s] = (mine >> ((lane % kChunksPerWord) * kN)) & kChunkBits;
    const int64_t col = (first_word + src) * 32 + (lane % kChunksPerWord) * kN;
    if (kVector && bits[s] != 0 && bits[s] != kChunkBits && col + kN <= p.vocab)
      v[s] = *reinterpret_cast<const uint4*>(out + col);
  }
#pragma unroll
  for (int s = 0; s < kSteps; ++s) {
    if (bits[s] == kChunkBits) continue;
    const int src = s * kN + lane / kChunksPerWord;
    const int64_t col = (first_word + src) * 32 + (lane % kChunksPerWord) * kN;
    Bits* at = out + col;
    if (kVector && col + kN <= p.vocab) {
      uint4 w;
      if (bits[s] == 0) {
        if constexpr (sizeof(Bits) == 4) {
          w = make_uint4(kNegInf, kNegInf, kNegInf, kNegInf);
        } else {
          const uint32_t two = (static_cast<uint32_t>(kNegInf) << 16) | kNegInf;
          w = make_uint4(two, two, two, two);
        }
      } else {
        Bits e[kN];
        memcpy(e, &v[s], 16);
#pragma unroll
        for (int i = 0; i < kN; ++i)
          if (!((bits[s] >> i) & 1u)) e[i] = kNegInf;
        memcpy(&w, e, 16);
      }
      *reinterpret_cast<uint4*>(at) = w;  // plain: the lines stay in L2 like the loaded ones
    } else {
#pragma unroll
      for (int i = 0; i < kN; ++i)
        if (!((bits[s] >> i) & 1u)) at[i] = kNegInf;  // bits past vocab_size are set: never here
    }
  }
}

template <typename Bits, Bits kNegInf, int kIndex>
inline void launch(const kernels::Launch& ctx, const Params& p, bool vector, unsigned grid) {
  if (vector)
    kernels::launch(ctx, bitmask_kernel<Bits, kNegInf, kIndex, true>, grid, kThreads, p);
  else
    kernels::launch(ctx, bitmask_kernel<Bits, kNegInf, kIndex, false>, grid, kThreads, p);
}

template <typename Bits, Bits kNegInf>
inline void launch_index(const kernels::Launch& ctx, const Params& p, int index, bool vector,
                         unsigned grid) {
  if (index == 0)
    launch<Bits, kNegInf, 0>(ctx, p, vector, grid);
  else if (index == 1)
    launch<Bits, kNegInf, 1>(ctx, p, vector, grid);
  else
    launch<Bits, kNegInf, 2>(ctx, p, vector, grid);
}

}  // namespace apply_token_bitmask_detail

// logits [B, V] or [V] (float32/float16/bfloat16, contiguous last dim, any row stride; modified
// in place), bitmask int32 [B', W] or [W] (same dims as logits, contiguous last dim), optional
// indices [n] int32/int64 (any stride), 0 <= vocab_size <= min(V, 32 W).
inline void apply_token_bitmask_inplace(tvm::ffi::TensorView logits, tvm::ffi::TensorView bitmask,
                                        tvm::ffi::Optional<tvm::ffi::TensorView> indices,
                                        int64_t vocab_size) {
  namespace detail = apply_token_bitmask_detail;
  constexpr const char* kOp = "grammar.apply_token_bitmask_inplace";
  // 1. Validate.
  TVM_FFI_CHECK(logits.ndim() == 1 || logits.ndim() == 2, ValueError)
      << kOp << ": logits must have 1 or 2 dims, got shape " << kernels::shape_string(logits);
  kernels::check_ndim(kOp, "bitmask", bitmask, logits.ndim());
  TVM_FFI_CHECK(kernels::is_dtype(bitmask.dtype(), kDLInt, 32), TypeError)
      << kOp << ": bitmask must be int32";
  kernels::check_last_dim_contiguous(kOp, "logits", logits);
  kernels::check_last_dim_contiguous(kOp, "bitmask", bitmask);
  kernels::check_device(kOp, "logits", logits, kDLCUDA);
  kernels::check_same_device(kOp, "bitmask", bitmask, "logits", logits);
  const bool two_d = logits.ndim() == 2;
  const int64_t vocab = logits.size(logits.ndim() - 1), words = bitmask.size(bitmask.ndim() - 1);
  const int64_t logit_rows = two_d ? logits.size(0) : 1, mask_rows = two_d ? bitmask.size(0) : 1;
  TVM_FFI_CHECK(vocab_size >= 0 && vocab_size <= vocab && vocab_size <= 32 * words, ValueError)
      << kOp << ": vocab_size must lie in [0, min(V, 32*W)] = [0, "
      << (vocab < 32 * words ? vocab : 32 * words) << "], got " << vocab_size;
  int index = 0;
  int64_t rows = logit_rows;
  const void* index_ptr = nullptr;
  int64_t index_stride = 1;
  if (indices.has_value()) {
    const tvm::ffi::TensorView ix = indices.value();
    TVM_FFI_CHECK(two_d, ValueError) << kOp << ": indices need 2-D logits [B, V]";
    kernels::check_ndim(kOp, "indices", ix, 1);
    kernels::check_same_device(kOp, "indices", ix, "logits", logits);
    const bool i64 = kernels::is_dtype(ix.dtype(), kDLInt, 64);
    TVM_FFI_CHECK(i64 || kernels::is_dtype(ix.dtype(), kDLInt, 32), TypeError)
        << kOp << ": indices must be int32 or int64";
    index = i64 ? 2 : 1;
    rows = ix.size(0);
    index_ptr = kernels::data<const void>(ix);
    index_stride = rows > 1 ? ix.stride(0) : 1;
  } else {
    TVM_FFI_CHECK(mask_rows == logit_rows, ValueError)
        << kOp << ": bitmask must have B = " << logit_rows << " rows like logits (or pass "
        << "indices), got shape " << kernels::shape_string(bitmask);
  }
  if (rows == 0 || vocab_size == 0 || logit_rows == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(logits);
  const kernels::Launch ctx(kOp, logits);
  // 4. Dispatch on the element width and launch.
  detail::Params p{};
  p.logits = kernels::data<void>(logits);
  p.bitmask = kernels::data<const uint32_t>(bitmask);
  p.indices = index_ptr;
  p.index_stride = index_stride;
  p.logits_stride = two_d && logit_rows > 1 ? logits.stride(0) : vocab;
  p.mask_stride = two_d && mask_rows > 1 ? bitmask.stride(0) : words;
  p.rows = rows;
  p.limit = logit_rows < mask_rows ? logit_rows : mask_rows;
  p.vocab = vocab_size;
  p.words = (vocab_size + 31) / 32;
  const int64_t slice = int64_t{detail::kWarps} * detail::kWordsPerWarp;
  p.blocks_per_row = static_cast<uint32_t>((p.words + slice - 1) / slice);
  const int64_t grid = rows * p.blocks_per_row;
  TVM_FFI_CHECK(grid < (int64_t{1} << 31), ValueError)
      << kOp << ": too many rows (" << rows << ") for one launch";
  KERNELS_DISPATCH_FLOAT(logits.dtype(), kOp, T, [&] {
    const int64_t chunk = 16 / static_cast<int64_t>(sizeof(T));
    const bool vector = kernels::is_aligned(p.logits) && p.logits_stride % chunk == 0;
    if constexpr (sizeof(T) == 4) {
      detail::launch_index<uint32_t, 0xff800000u>(ctx, p, index, vector,
                                                  static_cast<unsigned>(grid));
    } else if constexpr (std::is_same_v<T, kernels::half_t>) {
      detail::launch_index<uint16_t, uint16_t{0xfc00}>(ctx, p, index, vector,
                                                       static_cast<unsigned>(grid));
    } else {
      detail::launch_index<uint16_t, uint16_t{0xff80}>(ctx, p, index, vector,
                                                       static_cast<unsigned>(grid));
    }
  });
}
