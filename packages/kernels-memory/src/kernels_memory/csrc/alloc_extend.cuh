// memory.alloc_extend, CUDA: the slots of tokens [p_i, s_i) of every request, in request then
// token order. Request i first continues its partly filled last page (last_loc + 1, ...), then
// takes new_i = ceil(s/ps) - ceil(p/ps) pages free_pages[P_i : P_i + new_i], P_i = sum_{j<i} new_j
// (the free list is consumed in request order), writing out[E_i + t], E_i = sum_{j<i}(s_j - p_j).
//
// One launch, no host sync, one compiled kernel for every batch size: a grid of B x Y blocks of
// 256 threads; block (i, y) sums (s_j - p_j, new_j) over j < i itself (block reductions over at
// most B pairs, from L2), then writes request i's slots, the Y blocks of a request interleaved.
// Y comes from host metadata (extend_num_tokens and B). Preconditions are not checked here
// (validate=True checks them on the host before the launch): only out[:extend_num_tokens] is
// written, a page index >= F gives -1 (never read past the list), a negative page id gives the
// negative slots page * ps + offset, last_loc is used as given.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>

#include "memory_common.cuh"

namespace alloc_extend_detail {

constexpr int kThreads = 256;

struct Params {
  int64_t* out;
  memory_detail::IndexRef prefix, seq, last, free;
  int64_t batch, total, free_count, page_size;
  uint32_t per_request;  // Y
};

__global__ void __launch_bounds__(kThreads) alloc_extend_kernel(bool pdl, Params p) {
  __shared__ int64_t scratch[32];
  const int64_t i = blockIdx.x / p.per_request;
  const int64_t y = blockIdx.x % p.per_request;
  const int64_t ps = p.page_size;
  if (pdl) kernels::pdl_wait();
  int64_t tokens = 0, pages = 0;
  for (int64_t j = threadIdx.x; j < i; j += kThreads) {
    const int64_t pj = p.prefix[j], sj = p.seq[j];
    tokens += sj - pj;
    pages += memory_detail::ceil_div_floor(sj, ps) - memory_detail::ceil_div_floor(pj, ps);
  }
  const int64_t out_offset = memory_detail::block_sum(tokens, scratch);
  const int64_t page_offset = memory_detail::block_sum(pages, scratch);
  // Loaded after the sums: before them (with last_loc, as write_req_to_token_pool does) measured
  // 0.96-0.98 of the time at B >= 64 but 1.05 at B 1 (H100 A/B, 2026-12-05).
  const int64_t prefix = p.prefix[i], seq = p.seq[i];
  if (pdl) kernels::pdl_launch_dependents();
  const int64_t len = seq - prefix;
  if (len <= 0 || out_offset < 0) return;
  const int64_t first_new = memory_detail::ceil_div_floor(prefix, ps) * ps;
  const int64_t last = first_new > prefix ? p.last[i] : 0;  // read only where it is used
  const int64_t step = static_cast<int64_t>(p.per_request) * kThreads;
  for (int64_t t = y * kThreads + threadIdx.x; t < len; t += step) {
    const int64_t at = out_offset + t;
    if (at >= p.total) break;
    const int64_t position = prefix + t;
    int64_t slot;
    if (position < first_new) {
      slot = last + 1 + t;
    } else {
      const int64_t from = position - first_new;  // >= 0
      const int64_t page_index = page_offset + from / ps;
      slot = page_index >= 0 && page_index < p.free_count ? p.free[page_index] * ps + from % ps
                                                          : -1;
    }
    p.out[at] = slot;
  }
}

}  // namespace alloc_extend_detail

// out [extend_num_tokens] int64 (contiguous), prefix_lens, seq_lens, last_loc [B], free_pages [F]
// int32/int64, page_size.
inline void alloc_extend(tvm::ffi::TensorView out, tvm::ffi::TensorView prefix_lens,
                         tvm::ffi::TensorView seq_lens, tvm::ffi::TensorView last_loc,
                         tvm::ffi::TensorView free_pages, int64_t page_size) {
  namespace detail = alloc_extend_detail;
  constexpr const char* kOp = "memory.alloc_extend";
  // 1. Validate.
  kernels::check_device(kOp, "prefix_lens", prefix_lens, kDLCUDA);
  detail::Params p{};
  p.prefix = memory_host::index_vector(kOp, "prefix_lens", prefix_lens, prefix_lens, -1);
  p.batch = prefix_lens.size(0);
  p.seq = memory_host::index_vector(kOp, "seq_lens", seq_lens, prefix_lens, p.batch);
  p.last = memory_host::index_vector(kOp, "last_loc", last_loc, prefix_lens, p.batch);
  p.free = memory_host::index_vector(kOp, "free_pages", free_pages, prefix_lens, -1);
  p.free_count = free_pages.size(0);
  kernels::check_ndim(kOp, "out", out, 1);
  TVM_FFI_CHECK(kernels::is_dtype(out.dtype(), kDLInt, 64), TypeError)
      << kOp << ": out must be int64";
  kernels::check_contiguous(kOp, "out", out);
  kernels::check_same_device(kOp, "out", out, "prefix_lens", prefix_lens);
  TVM_FFI_CHECK(page_size >= 1, ValueError) << kOp << ": page_size must be >= 1, got " << page_size;
  p.page_size = page_size;
  p.total = out.size(0);
  if (p.batch == 0 || p.total == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(prefix_lens);
  const kernels::Launch ctx(kOp, prefix_lens);
  // 4. Launch.
  p.out = kernels::data<int64_t>(out);
  constexpr int64_t kSlotsPerBlock = 2048;
  int64_t y = (p.total + p.batch * kSlotsPerBlock - 1) / (p.batch * kSlotsPerBlock);
  y = y < 1 ? 1 : (y > 4096 ? 4096 : y);
  TVM_FFI_CHECK(p.batch * y < (int64_t{1} << 31), ValueError)
      << kOp << ": too many requests (" << p.batch << ") for one launch";
  p.per_request = static_cast<uint32_t>(y);
  kernels::launch(ctx, detail::alloc_extend_kernel, static_cast<unsigned>(p.batch * y),
                  detail::kThreads, p);
}
