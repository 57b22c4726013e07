// memory.alloc_decode, CUDA: out[i] = last_loc[i] + 1 where (seq_lens[i] - 1) % page_size != 0,
// else free_pages[rank_i] * page_size with rank_i the number of earlier requests that need a
// page (the free list is consumed in request order).
//
// One CTA of 1024 threads scans the batch in chunks of 1024 (a warp-shuffle block scan with the
// running count carried between chunks), so one compiled kernel serves every batch size with no
// host sync. Preconditions are not checked here (validate=True checks them on the host before
// the launch): a rank >= F gives -1 (the list is never read past its end), a negative page id
// the negative slot page * page_size, last_loc is used as given.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>

#include "memory_common.cuh"

namespace alloc_decode_detail {

constexpr int kThreads = 1024;

struct Params {
  int64_t* out;
  memory_detail::IndexRef seq, last, free;
  int64_t batch, free_count, page_size;
};

__global__ void __launch_bounds__(kThreads) alloc_decode_kernel(bool pdl, Params p) {
  __shared__ int64_t warp_sums[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (pdl) kernels::pdl_wait();
  int64_t carry = 0;
  for (int64_t c = 0; c < p.batch; c += kThreads) {
    const int64_t i = c + threadIdx.x;
    const bool valid = i < p.batch;
    const int64_t s = valid ? p.seq[i] : 1;
    const bool needs = valid && memory_detail::floor_mod(s - 1, p.page_size) == 0;
    // Inclusive warp scan, then the warp totals.
    int64_t x = needs ? 1 : 0;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int64_t y = __shfl_up_sync(0xffffffffu, x, o);
      if (lane >= o) x += y;
    }
    __syncthreads();  // warp_sums of the previous chunk are read
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    int64_t before = 0, chunk_total = 0;
    for (int w = 0; w < kThreads / 32; ++w) {
      const int64_t t = warp_sums[w];
      before += w < warp ? t : 0;
      chunk_total += t;
    }
    if (valid) {
      int64_t slot;
      if (needs) {
        const int64_t rank = carry + before + x - 1;
        slot = rank < p.free_count ? p.free[rank] * p.page_size : -1;
      } else {
        slot = p.last[i] + 1;
      }
      p.out[i] = slot;
    }
    carry += chunk_total;
  }
  if (pdl) kernels::pdl_launch_dependents();
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
  // 4. Launch: one CTA.
  p.out = kernels::data<int64_t>(out);
  kernels::launch(ctx, detail::alloc_decode_kernel, 1u, detail::kThreads, p);
}
