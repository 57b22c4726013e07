// memory.get_last_loc, CUDA: last[i] = req_to_token[req_pool_indices[i], prefix_lens[i] - 1], or
// -1 where prefix_lens[i] == 0. One thread per request (a gather: B loads of each vector and one of
// the table), one compiled kernel for every batch size and int32/int64 mix (dtypes are runtime
// flags). A row outside [0, R) or a prefix length outside [0, L] gives -1 (the torch reference
// raises; the kernel never reads out of bounds and never syncs with the host).
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>

#include "memory_common.cuh"

namespace get_last_loc_detail {

constexpr int kThreads = 128;

struct Params {
  void* last;
  bool last_i64;
  const void* table;
  bool table_i64;
  int64_t rows, cols, table_stride;
  memory_detail::IndexRef index, prefix;
  int64_t batch;
};

__global__ void __launch_bounds__(kThreads) last_loc_kernel(bool pdl, Params p) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  if (pdl) kernels::pdl_wait();
  if (i < p.batch) {
    const int64_t row = p.index[i], len = p.prefix[i];
    int64_t v = -1;
    if (row >= 0 && row < p.rows && len > 0 && len <= p.cols) {
      const int64_t at = row * p.table_stride + len - 1;
      v = p.table_i64 ? static_cast<const int64_t*>(p.table)[at]
                      : static_cast<const int32_t*>(p.table)[at];
    }
    if (p.last_i64)
      static_cast<int64_t*>(p.last)[i] = v;
    else
      static_cast<int32_t*>(p.last)[i] = static_cast<int32_t>(v);
  }
  if (pdl) kernels::pdl_launch_dependents();
}

}  // namespace get_last_loc_detail

// last [B] (the dtype of prefix_lens, contiguous), req_to_token [R, L] int32/int64 (contiguous last
// dim), req_pool_indices [B], prefix_lens [B] int32/int64.
inline void get_last_loc(tvm::ffi::TensorView last, tvm::ffi::TensorView req_to_token,
                         tvm::ffi::TensorView req_pool_indices, tvm::ffi::TensorView prefix_lens) {
  namespace detail = get_last_loc_detail;
  constexpr const char* kOp = "memory.get_last_loc";
  // 1. Validate.
  kernels::check_ndim(kOp, "req_to_token", req_to_token, 2);
  kernels::check_device(kOp, "req_to_token", req_to_token, kDLCUDA);
  kernels::check_last_dim_contiguous(kOp, "req_to_token", req_to_token);
  const bool table_i64 = kernels::is_dtype(req_to_token.dtype(), kDLInt, 64);
  TVM_FFI_CHECK(table_i64 || kernels::is_dtype(req_to_token.dtype(), kDLInt, 32), TypeError)
      << kOp << ": req_to_token must be int32 or int64";
  detail::Params p{};
  p.index = memory_host::index_vector(kOp, "req_pool_indices", req_pool_indices, req_to_token, -1);
  p.batch = req_pool_indices.size(0);
  p.prefix = memory_host::index_vector(kOp, "prefix_lens", prefix_lens, req_to_token, p.batch);
  memory_host::index_vector(kOp, "last", last, req_to_token, p.batch);
  kernels::check_contiguous(kOp, "last", last);
  kernels::check_same_dtype(kOp, "last", last, "prefix_lens", prefix_lens);
  if (p.batch == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(req_to_token);
  const kernels::Launch ctx(kOp, req_to_token);
  // 4. Launch.
  p.last = kernels::data<void>(last);
  p.last_i64 = kernels::is_dtype(last.dtype(), kDLInt, 64);
  p.table = kernels::data<const void>(req_to_token);
  p.table_i64 = table_i64;
  p.rows = req_to_token.size(0);
  p.cols = req_to_token.size(1);
  p.table_stride = p.rows > 1 ? req_to_token.stride(0) : p.cols;
  kernels::launch(ctx, detail::last_loc_kernel, kernels::ceil_div(p.batch, detail::kThreads),
                  detail::kThreads, p);
}
