// embeddings.vocab_parallel_embedding, CUDA: out[t] = weight[row(ids[t])] for ids in this shard's
// original or added vocab range, zeros otherwise. Pure data movement: a group of G threads per
// token (a power of two up to 256, about kUnroll 16-byte packs each, more threads for short
// batches), 256 threads per block so several tokens are in flight per CTA, the groups striding
// over the tokens in a grid of at most the resident blocks; each thread issues all its loads
// before its stores. An invalid lane never forms a weight pointer from its id: its row
// is clamped to -1 first and it stores zeros (a row past the end of weight, which the Python
// checks already rule out, is treated the same way).
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

namespace vocab_parallel_embedding_detail {

constexpr int kThreads = 256;
constexpr int kUnroll = 8;

struct Ranges {
  int64_t org_start, org_end, added_start, added_end, added_base, rows;
};

// One token's row: weight[row] or zeros, kUnroll packs in flight per thread.
template <typename T, int kN, typename Idx>
__device__ __forceinline__ void embed_token(T* __restrict__ out, const T* __restrict__ weight,
                                            int64_t w_stride, const Idx* __restrict__ ids,
                                            int64_t id_stride, int64_t token, const Ranges& r,
                                            uint32_t packs, uint32_t lane, int g, bool pdl) {
  const int64_t id = static_cast<int64_t>(ids[token * id_stride]);
  int64_t row = -1;
  if (id >= r.org_start && id < r.org_end) {
    row = id - r.org_start;
  } else if (id >= r.added_start && id < r.added_end) {
    row = id - r.added_start + r.added_base;
  }
  if (row >= r.rows) row = -1;
  const bool valid = row >= 0;
  const T* src = weight + (valid ? row : 0) * w_stride;  // clamped before the pointer is formed
  T* dst = out + token * static_cast<int64_t>(packs) * kN;
  const uint32_t step = static_cast<uint32_t>(g) * kUnroll;
  for (uint32_t base = lane; base < packs; base += step) {
    kernels::Pack<T, kN> v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint32_t c = base + u * g;
      if (c < packs) {
        if (valid)
          v[u].load(src + static_cast<int64_t>(c) * kN);
        else
          v[u].zero();
      }
    }
    if (pdl) kernels::pdl_launch_dependents();
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const uint32_t c = base + u * g;
      if (c < packs) v[u].store(dst + static_cast<int64_t>(c) * kN);
    }
  }
}

// Groups of G threads stride over the tokens (the grid is at most the resident blocks).
template <typename T, int kN, typename Idx>
__global__ void __launch_bounds__(kThreads)
    embed_kernel(bool pdl, T* __restrict__ out, const T* __restrict__ weight, int64_t w_stride,
                 const Idx* __restrict__ ids, int64_t id_stride, int64_t tokens, Ranges r,
                 uint32_t packs, int group_shift) {
  const int g = 1 << group_shift;
  const uint32_t lane = threadIdx.x & (g - 1);
  const int64_t first = (static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x) >> group_shift;
  const int64_t stride = (static_cast<int64_t>(gridDim.x) * kThreads) >> group_shift;
  if (pdl) kernels::pdl_wait();
  for (int64_t token = first; token < tokens; token += stride)
    embed_token<T, kN, Idx>(out, weight, w_stride, ids, id_stride, token, r, packs, lane, g, pdl);
}

template <typename T, typename Idx>
void launch(const kernels::Launch& ctx, T* out, const T* weight, int64_t w_stride, const Idx* ids,
            int64_t id_stride, int64_t tokens, int64_t hidden, const Ranges& r) {
  constexpr int kVec = kernels::kVectorBytes / static_cast<int>(sizeof(T));
  const bool vector = hidden % kVec == 0 && w_stride % kVec == 0 && kernels::is_aligned(out) &&
                      kernels::is_aligned(weight);
  const int kN = vector ? kVec : 1;
  const int64_t packs = hidden / kN;
  TVM_FFI_CHECK(packs < (int64_t{1} << 31), ValueError) << ctx.op << ": rows are too wide";
  const int g = kernels::threads_per_row(packs, tokens, kUnroll, kThreads, ctx.device);
  int shift = 0;
  while ((1 << shift) < g) ++shift;
  const int64_t needed = (tokens * g + kThreads - 1) / kThreads;
  const uint32_t p = static_cast<uint32_t>(packs);
  if (vector) {
    constexpr auto kernel = embed_kernel<T, kVec, Idx>;
    kernels::launch(ctx, kernel, kernels::resident_grid<kernel>(ctx.device, needed, kThreads),
                    kThreads, out, weight, w_stride, ids, id_stride, tokens, r, p, shift);
  } else {
    constexpr auto kernel = embed_kernel<T, 1, Idx>;
    kernels::launch(ctx, kernel, kernels::resident_grid<kernel>(ctx.device, needed, kThreads),
                    kThreads, out, weight, w_stride, ids, id_stride, tokens, r, p, shift);
  }
}

}  // namespace vocab_parallel_embedding_detail

// out [*ids.shape, H] contiguous, ids int32/int64 (contiguous, or 1-D with any stride), weight
// [Vs, H] (last dim contiguous, any row stride), the dtype of out.
inline void vocab_parallel_embedding(tvm::ffi::TensorView out, tvm::ffi::TensorView ids,
                                     tvm::ffi::TensorView weight, int64_t org_vocab_start,
                                     int64_t org_vocab_end, int64_t num_org_vocab_padding,
                                     int64_t added_vocab_start, int64_t added_vocab_end) {
  namespace detail = vocab_parallel_embedding_detail;
  constexpr const char* kOp = "embeddings.vocab_parallel_embedding";
  // 1. Validate.
  kernels::check_ndim(kOp, "weight", weight, 2);
  kernels::check_last_dim_contiguous(kOp, "weight", weight);
  kernels::check_same_dtype(kOp, "out", out, "weight", weight);
  kernels::check_contiguous(kOp, "out", out);
  const bool idx64 = kernels::is_dtype(ids.dtype(), kDLInt, 64);
  TVM_FFI_CHECK(idx64 || kernels::is_dtype(ids.dtype(), kDLInt, 32), TypeError)
      << kOp << ": ids must be int32 or int64";
  TVM_FFI_CHECK(ids.ndim() <= 1 || ids.IsContiguous(), ValueError)
      << kOp << ": ids must be contiguous (or 1-D)";
  bool shape_ok = out.ndim() == ids.ndim() + 1 && out.size(out.ndim() - 1) == weight.size(1);
  for (int i = 0; shape_ok && i < ids.ndim(); ++i) shape_ok = out.size(i) == ids.size(i);
  TVM_FFI_CHECK(shape_ok, ValueError)
      << kOp << ": out must be [*ids.shape, H] = " << kernels::shape_string(ids) << " + ["
      << weight.size(1) << "], got " << kernels::shape_string(out);
  for (const auto& [name, t] : {std::pair<const char*, const tvm::ffi::TensorView*>{"ids", &ids},
                                {"weight", &weight},
                                {"out", &out}}) {
    kernels::check_device(kOp, name, *t, kDLCUDA);
    kernels::check_same_device(kOp, name, *t, "weight", weight);
  }
  TVM_FFI_CHECK(org_vocab_start >= 0 && org_vocab_end >= org_vocab_start &&
                    num_org_vocab_padding >= 0 && added_vocab_start >= 0 &&
                    added_vocab_end >= added_vocab_start,
                ValueError)
      << kOp << ": the vocab ranges must be ordered and >= 0";
  const int64_t needed = (org_vocab_end - org_vocab_start) + num_org_vocab_padding +
                         (added_vocab_end - added_vocab_start);
  TVM_FFI_CHECK(needed <= weight.size(0), ValueError)
      << kOp << ": the ranges address " << needed << " rows, but weight has " << weight.size(0);
  const int64_t tokens = ids.numel(), hidden = weight.size(1);
  if (tokens == 0 || hidden == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(weight);
  const kernels::Launch ctx(kOp, weight);
  // 4. Dispatch on dtype and launch.
  const detail::Ranges r{org_vocab_start,
                         org_vocab_end,
                         added_vocab_start,
                         added_vocab_end,
                         (org_vocab_end - org_vocab_start) + num_org_vocab_padding,
                         weight.size(0)};
  const int64_t id_stride = ids.ndim() == 1 ? ids.stride(0) : 1;
  KERNELS_DISPATCH_FLOAT(weight.dtype(), kOp, T, [&] {
    T* o = kernels::data<T>(out);
    const T* w = kernels::data<const T>(weight);
    if (idx64)
      detail::launch<T, int64_t>(ctx, o, w, weight.stride(0), kernels::data<const int64_t>(ids),
                                 id_stride, tokens, hidden, r);
    else
      detail::launch<T, int32_t>(ctx, o, w, weight.stride(0), kernels::data<const int32_t>(ids),
                                 id_stride, tokens, hidden, r);
  });
}
