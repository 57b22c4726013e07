// memory.write_req_to_token_pool, CUDA: req_to_token[req_pool_indices[i], starts[i] + t] =
// out_cache_loc[off_i + t] for t < ends[i] - starts[i], off_i = sum_{j<i}(ends_j - starts_j).
//
// One launch, no host sync, one compiled kernel for every batch size: a grid of B x Y blocks of
// 256 threads; block (i, y) loads request i's row and range and sums ends_j - starts_j over j < i
// itself (a block reduction over at most B pairs read from L2: the device prefix sum, with no
// second launch), then copies request i's slots, four per thread per step (4 x 8-byte loads in
// flight), the Y blocks of a request interleaved. Y comes from host metadata only (N =
// len(out_cache_loc) and B): about 4096 slots per block for an even batch (a 64 x 65536 write:
// 1024 blocks). Values are cast to the table dtype. A row outside [0, R), a range outside [0, L]
// or an offset outside [0, N) is skipped (the torch reference raises; the kernel never writes out
// of bounds).
//
// Radix-cache prefixes (req_to_token[row_i, :len(p_i)] = p_i) are written by the same blocks in
// the same launch: their pointers and lengths (host metadata) travel as a table in the kernel
// parameters, kMaxPrefixes requests per launch (a batch with more takes one extra, prefix-only
// launch per kMaxPrefixes requests). Positions in [starts[i], ends[i]) keep the new slots, as in
// the reference, which writes the prefixes first; a prefix longer than L is clipped to L.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>

#include "memory_common.cuh"

namespace write_req_to_token_pool_detail {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;
constexpr int kMaxPrefixes = 200;  // 16 bytes each: the parameters stay under 4 KB

struct Prefix {
  const void* ptr;
  int64_t len_flag;  // length << 1 | (1 if int64)
};

struct Params {
  void* table;
  bool table_i64;
  int64_t rows, cols, table_stride;
  memory_detail::IndexRef index, starts, ends, locs;
  int64_t batch, total;
  uint32_t per_request;    // Y
  int64_t first_request;   // the blocks cover requests [first_request, ...)
  int prefix_count;        // prefixes[k] belongs to request first_request + k
  bool write_slots;        // false: a prefix-only launch
  Prefix prefixes[kMaxPrefixes];
};

__global__ void __launch_bounds__(kThreads) write_kernel(bool pdl, const __grid_constant__ Params p) {
  __shared__ int64_t scratch[32];
  const int64_t k = blockIdx.x / p.per_request;
  const int64_t i = p.first_request + k;
  const int64_t y = blockIdx.x % p.per_request;
  if (pdl) kernels::pdl_wait();
  // Request i's own entries are loaded with the earlier requests' (one round trip, not one more
  // after the barriers of the sum): 0.87-0.96 of the time at B <= 1024 (H100 A/B, 2026-12-05),
  // 1.00 at 1024 x 1024.
  const int64_t row = p.index[i], start = p.starts[i], end = p.ends[i];
  int64_t offset = 0;
  if (p.write_slots) {  // uniform over the launch
    for (int64_t j = threadIdx.x; j < i; j += kThreads) offset += p.ends[j] - p.starts[j];
    offset = memory_detail::block_sum(offset, scratch);
  }
  if (pdl) kernels::pdl_launch_dependents();
  if (row < 0 || row >= p.rows) return;
  if (k < p.prefix_count) {
    const Prefix pf = p.prefixes[k];
    const int64_t plen = (pf.len_flag >> 1) < p.cols ? (pf.len_flag >> 1) : p.cols;
    const bool i64 = pf.len_flag & 1;
    const int64_t pbase = row * p.table_stride;
    for (int64_t t = y * kThreads + threadIdx.x; t < plen;
         t += static_cast<int64_t>(p.per_request) * kThreads) {
      if (t >= start && t < end) continue;  // the new slots win, as in the reference
      const int64_t v = i64 ? static_cast<const int64_t*>(pf.ptr)[t]
                            : static_cast<int64_t>(static_cast<const int32_t*>(pf.ptr)[t]);
      if (p.table_i64)
        static_cast<int64_t*>(p.table)[pbase + t] = v;
      else
        static_cast<int32_t*>(p.table)[pbase + t] = static_cast<int32_t>(v);
    }
  }
  if (!p.write_slots || start < 0 || end > p.cols || end <= start || offset < 0 ||
      offset + (end - start) > p.total)
    return;
  const int64_t len = end - start;
  const int64_t base = row * p.table_stride + start;
  const int64_t step = static_cast<int64_t>(p.per_request) * kThreads * kUnroll;
  for (int64_t t0 = y * kThreads * kUnroll + threadIdx.x; t0 < len; t0 += step) {
    int64_t v[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t t = t0 + u * kThreads;
      v[u] = t < len ? p.locs[offset + t] : 0;
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int64_t t = t0 + u * kThreads;
      if (t < len) {
        if (p.table_i64)
          static_cast<int64_t*>(p.table)[base + t] = v[u];
        else
          static_cast<int32_t*>(p.table)[base + t] = static_cast<int32_t>(v[u]);
      }
    }
  }
}

}  // namespace write_req_to_token_pool_detail

// req_to_token [R, L] int32/int64 (contiguous last dim; modified in place), req_pool_indices,
// starts, ends [B], out_cache_loc [N] (int32/int64 each); prefixes: CPU int64 [0, 2] (none) or
// [B, 2], row i = (data pointer of request i's contiguous prefix, length << 1 | is_int64).
inline void write_req_to_token_pool(tvm::ffi::TensorView req_to_token,
                                    tvm::ffi::TensorView req_pool_indices,
                                    tvm::ffi::TensorView starts, tvm::ffi::TensorView ends,
                                    tvm::ffi::TensorView out_cache_loc,
                                    tvm::ffi::TensorView prefixes, int64_t prefix_tokens) {
  namespace detail = write_req_to_token_pool_detail;
  constexpr const char* kOp = "memory.write_req_to_token_pool";
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
  p.starts = memory_host::index_vector(kOp, "starts", starts, req_to_token, p.batch);
  p.ends = memory_host::index_vector(kOp, "ends", ends, req_to_token, p.batch);
  p.locs = memory_host::index_vector(kOp, "out_cache_loc", out_cache_loc, req_to_token, -1);
  p.total = out_cache_loc.size(0);
  kernels::check_ndim(kOp, "prefixes", prefixes, 2);
  kernels::check_device(kOp, "prefixes", prefixes, kDLCPU);
  kernels::check_contiguous(kOp, "prefixes", prefixes);
  const int64_t prefix_rows = prefixes.size(0);
  TVM_FFI_CHECK(kernels::is_dtype(prefixes.dtype(), kDLInt, 64) && prefixes.size(1) == 2 &&
                    (prefix_rows == 0 || prefix_rows == p.batch),
                ValueError)
      << kOp << ": prefixes must be a CPU int64 table [0, 2] or [B, 2], got "
      << kernels::shape_string(prefixes);
  const int64_t* prefix_table = kernels::data<const int64_t>(prefixes);
  for (int64_t k = 0; k < prefix_rows; ++k)
    TVM_FFI_CHECK(prefix_table[2 * k + 1] >= 0, ValueError)
        << kOp << ": prefixes row " << k << " has a negative length";
  if (p.batch == 0 || (p.total == 0 && prefix_tokens == 0)) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(req_to_token);
  const kernels::Launch ctx(kOp, req_to_token);
  // 4. Launch.
  p.table = kernels::data<void>(req_to_token);
  p.table_i64 = table_i64;
  p.rows = req_to_token.size(0);
  p.cols = req_to_token.size(1);
  p.table_stride = p.rows > 1 ? req_to_token.stride(0) : p.cols;
  constexpr int64_t kSlotsPerBlock = 4096;  // one step of 4 slots per thread
  const int64_t work = p.total + (prefix_tokens > 0 ? prefix_tokens : 0);
  int64_t y = (work + p.batch * kSlotsPerBlock - 1) / (p.batch * kSlotsPerBlock);
  y = y < 1 ? 1 : (y > 4096 ? 4096 : y);
  TVM_FFI_CHECK(p.batch * y < (int64_t{1} << 31), ValueError)
      << kOp << ": too many requests (" << p.batch << ") for one launch";
  p.per_request = static_cast<uint32_t>(y);
  // Launch 1: every request's new slots, and the prefixes of the first kMaxPrefixes requests;
  // then one prefix-only launch per further kMaxPrefixes requests.
  for (int64_t first = 0; first == 0 || first < prefix_rows; first += detail::kMaxPrefixes) {
    const int64_t left = prefix_rows - first;
    p.first_request = first;
    p.write_slots = first == 0 && p.total > 0;
    p.prefix_count = static_cast<int>(left < detail::kMaxPrefixes ? (left > 0 ? left : 0)
                                                                  : detail::kMaxPrefixes);
    for (int k = 0; k < p.prefix_count; ++k)
      p.prefixes[k] = detail::Prefix{
          reinterpret_cast<const void*>(static_cast<uintptr_t>(prefix_table[2 * (first + k)])),
          prefix_table[2 * (first + k) + 1]};
    const int64_t requests = first == 0 ? p.batch : p.prefix_count;
    if (p.write_slots || p.prefix_count > 0)
      kernels::launch(ctx, detail::write_kernel, static_cast<unsigned>(requests * y),
                      detail::kThreads, p);
  }
}
