// memory.alloc_decode, CUDA: out[i] = last_loc[i] + 1 where (seq_lens[i] - 1) % page_size != 0,
// else free_pages[rank_i] * page_size with rank_i the number of earlier requests that need a
// page (the free list is consumed in request order).
//
// One CTA (32 * ceil(B / 32) threads, at most 1024) takes the batch in chunks of its size, one
// request per thread, with no host sync and one compiled kernel for every batch size. Each chunk
// is one round of memory: a thread loads its request's seq_len and last_loc and, beside them, the
// free-list entry its position in the chunk would take (free[carry + t], carry = the pages the
// earlier chunks took) before anything depends on them; a request's rank among those needing a
// page comes from a warp ballot and the warp counts, and the page it takes is read from the
// thread that loaded free[carry + rank] (a shuffle within one warp, shared memory across warps)
// instead of a second, dependent global load (H200, A/B, 2026-12-04: B = 1 / 64 / 256 / 1024
// 2.60 / 2.83 / 2.91 / 3.09 -> 1.19 / 1.30 / 1.44 / 2.71 us). Preconditions are not checked
// here (validate=True checks them on the host before the launch): a rank >= F gives -1 (the
// list is never read past its end), a negative page id the negative slot page * page_size,
// last_loc is used as given.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>

#include "memory_common.cuh"

namespace alloc_decode_detail {

constexpr int kMaxThreads = 1024;

struct Params {
  int64_t* out;
  memory_detail::IndexRef seq, last, free;
  int64_t batch, free_count, page_size;
};

__global__ void __launch_bounds__(kMaxThreads) alloc_decode_kernel(bool pdl, Params p) {
  __shared__ int warp_counts[kMaxThreads / 32];
  __shared__ int64_t pages[kMaxThreads];  // free[carry + t], for the threads of other warps
  const int t = threadIdx.x, lane = t % 32, warp = t / 32, warps = blockDim.x / 32;
  const unsigned below = (1u << lane) - 1u;
  if (pdl) kernels::pdl_wait();
  int64_t carry = 0;
  for (int64_t c = 0; c < p.batch; c += blockDim.x) {
    const int64_t i = c + t;
    const bool valid = i < p.batch;
    const int64_t s = valid ? p.seq[i] : 1;
    const int64_t l = valid ? p.last[i] : 0;
    const int64_t page = carry + t < p.free_count ? p.free[carry + t] : -1;
    // The next kernel's launch overlaps this one once the first chunk's loads are out (it waits
    // in pdl_wait for this grid's stores); at the end it had added its launch latency to B = 1.
    if (pdl && c == 0) kernels::pdl_launch_dependents();
    const bool needs = valid && memory_detail::floor_mod(s - 1, p.page_size) == 0;
    const unsigned ballot = __ballot_sync(0xffffffffu, needs);
    int rank = __popc(ballot & below);  // within the chunk, once the earlier warps are added
    int chunk_total = __popc(ballot);
    int64_t taken;
    if (warps == 1) {
      taken = __shfl_sync(0xffffffffu, page, rank & 31);
    } else {
      if (lane == 0) warp_counts[warp] = chunk_total;
      pages[t] = page;
      __syncthreads();
      int before = 0;
      chunk_total = 0;
      for (int w = 0; w < warps; ++w) {
        const int n = warp_counts[w];
        before += w < warp ? n : 0;
        chunk_total += n;
      }
      rank += before;
      taken = pages[rank < kMaxThreads ? rank : 0];
    }
    if (valid) {
      int64_t slot;
      if (needs) {
        slot = carry + rank < p.free_count ? taken * p.page_size : -1;
      } else {
        slot = l + 1;
      }
      p.out[i] = slot;
    }
    carry += chunk_total;
    if (warps > 1) __syncthreads();  // warp_counts and pages are rewritten by the next chunk
  }
}

}  // namespace alloc_decode_detail

// out [B] int64 (contiguous), seq_lens [B], last_loc [B], free_pages [F] int32/int64, page_size.
inline void alloc_decode(tvm::ffi::TensorView out, tvm::ffi::TensorView seq_lens,
                         tvm::ffi::TensorView last_loc, tvm::ffi::TensorView free_pages,
                         int64_t page_size) {
  namespace detail = alloc_decode_detail;
  constexpr const char* kOp = "memory.alloc_decode";
  // 1. Validate.
  kernels::check_device(kOp, "seq_lens", seq_lens, kDLCUDA);
  detail::Params p{};
  p.seq = memory_host::index_vector(kOp, "seq_lens", seq_lens, seq_lens, -1);
  p.batch = seq_lens.size(0);
  p.last = memory_host::index_vector(kOp, "last_loc", last_loc, seq_lens, p.batch);
  p.free = memory_host::index_vector(kOp, "free_pages", free_pages, seq_lens, -1);
  p.free_count = free_pages.size(0);
  kernels::check_ndim(kOp, "out", out, 1);
  TVM_FFI_CHECK(kernels::is_dtype(out.dtype(), kDLInt, 64), TypeError)
      << kOp << ": out must be int64";
  kernels::check_contiguous(kOp, "out", out);
  kernels::check_same_device(kOp, "out", out, "seq_lens", seq_lens);
  TVM_FFI_CHECK(out.size(0) == p.batch, ValueError)
      << kOp << ": out must have " << p.batch << " entries, got " << out.size(0);
  TVM_FFI_CHECK(page_size >= 1, ValueError) << kOp << ": page_size must be >= 1, got " << page_size;
  p.page_size = page_size;
  if (p.batch == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(seq_lens);
  const kernels::Launch ctx(kOp, seq_lens);
  // 4. Launch: one CTA of whole warps, one thread per request up to 1024.
  p.out = kernels::data<int64_t>(out);
  const int64_t warps = (p.batch + 31) / 32;
  const unsigned threads = static_cast<unsigned>(warps < 32 ? warps * 32 : detail::kMaxThreads);
  kernels::launch(ctx, detail::alloc_decode_kernel, 1u, threads, p);
}
