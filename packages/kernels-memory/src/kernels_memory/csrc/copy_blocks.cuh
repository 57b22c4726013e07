// memory.copy_blocks, CUDA: cache[dst] = cache[src] (the whole block) for every (src, dst) row of
// block_mapping and every cache (each layer's key and value cache), in one launch.
//
// The caches travel as a pointer table in the kernel parameters (base, block stride and block
// bytes of each cache, up to kMaxCaches per launch; more caches take more launches), built on the
// host from tensor metadata: no device allocation, no copy, no sync, so the call is capturable
// in a CUDA graph. One block of 256 threads per (pair, cache) copies the block with 16-byte
// loads and stores, 4 per thread in flight (16 KB per step), when every base, stride and block
// size is a multiple of 16 bytes; with 1-byte accesses otherwise. Destinations must be unique
// and disjoint from the sources (the torch reference checks it, with validate=True the public
// function does), so blocks are copied in any order; a pair with src or dst outside [0, NB) is
// skipped.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>

#include "memory_common.cuh"

namespace copy_blocks_detail {

constexpr int kThreads = 256;
constexpr int kUnroll = 4;
constexpr int kMaxCaches = 128;  // 128 x 24 bytes of table: the parameters stay under 4 KB

struct Cache {
  char* base;
  int64_t stride;  // bytes between blocks
  int64_t bytes;   // bytes of one block
};

struct Params {
  Cache caches[kMaxCaches];
  memory_detail::IndexRef mapping;  // [N, 2] as a flat vector: (src, dst) at 2n, 2n + 1
  int64_t mapping_row;              // element stride between rows
  int64_t mapping_col;              // element stride between src and dst
  int64_t blocks;                   // NB
  int count;                        // caches in this launch
};

template <bool kVector>
__global__ void __launch_bounds__(kThreads) copy_kernel(bool pdl, const __grid_constant__ Params p) {
  const int64_t pair = blockIdx.x / p.count;
  const int c = static_cast<int>(blockIdx.x % p.count);
  if (pdl) kernels::pdl_wait();
  const int64_t src = p.mapping[pair * p.mapping_row];
  const int64_t dst = p.mapping[pair * p.mapping_row + p.mapping_col];
  if (pdl) kernels::pdl_launch_dependents();
  if (src < 0 || src >= p.blocks || dst < 0 || dst >= p.blocks) return;
  const Cache cache = p.caches[c];
  const char* from = cache.base + src * cache.stride;
  char* to = cache.base + dst * cache.stride;
  if constexpr (kVector) {
    const int64_t n = cache.bytes / 16;
    const uint4* s = reinterpret_cast<const uint4*>(from);
    uint4* d = reinterpret_cast<uint4*>(to);
    for (int64_t i0 = threadIdx.x; i0 < n; i0 += kThreads * kUnroll) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = i0 + u * kThreads;
        if (i < n) v[u] = __ldcs(s + i);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t i = i0 + u * kThreads;
        if (i < n) __stcs(d + i, v[u]);
      }
    }
  } else {
    for (int64_t i = threadIdx.x; i < cache.bytes; i += kThreads) to[i] = from[i];
  }
}

}  // namespace copy_blocks_detail

// table: CPU int64 [C, 3] (data pointer, block stride in bytes, block bytes) of the C caches, all
// on the device of block_mapping [N, 2] int32/int64, with `blocks` = NB blocks each.
inline void copy_blocks(tvm::ffi::TensorView table, tvm::ffi::TensorView block_mapping,
                        int64_t blocks) {
  namespace detail = copy_blocks_detail;
  constexpr const char* kOp = "memory.copy_blocks";
  // 1. Validate.
  kernels::check_ndim(kOp, "table", table, 2);
  kernels::check_device(kOp, "table", table, kDLCPU);
  kernels::check_contiguous(kOp, "table", table);
  TVM_FFI_CHECK(kernels::is_dtype(table.dtype(), kDLInt, 64) && table.size(1) == 3, ValueError)
      << kOp << ": table must be int64 [C, 3], got " << kernels::shape_string(table);
  kernels::check_ndim(kOp, "block_mapping", block_mapping, 2);
  kernels::check_device(kOp, "block_mapping", block_mapping, kDLCUDA);
  TVM_FFI_CHECK(block_mapping.size(1) == 2, ValueError)
      << kOp << ": block_mapping must have shape [N, 2] (src, dst), got "
      << kernels::shape_string(block_mapping);
  const bool i64 = kernels::is_dtype(block_mapping.dtype(), kDLInt, 64);
  TVM_FFI_CHECK(i64 || kernels::is_dtype(block_mapping.dtype(), kDLInt, 32), TypeError)
      << kOp << ": block_mapping must be int32 or int64";
  const int64_t pairs = block_mapping.size(0), caches = table.size(0);
  if (pairs == 0 || caches == 0 || blocks == 0) return;
  const int64_t* rows = kernels::data<const int64_t>(table);
  bool vector = true;
  for (int64_t c = 0; c < caches; ++c) {
    TVM_FFI_CHECK(rows[3 * c + 1] >= 0 && rows[3 * c + 2] >= 0, ValueError)
        << kOp << ": table row " << c << " has a negative stride or size";
    vector = vector && rows[3 * c] % 16 == 0 && rows[3 * c + 1] % 16 == 0 &&
             rows[3 * c + 2] % 16 == 0;
  }
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(block_mapping);
  // PDL only for small grids: in grids of thousands of blocks its instructions cost bandwidth
  // (see kernels/pointwise.cuh); a large copy gains nothing from the earlier launch.
  const int64_t first_grid = pairs * (caches < detail::kMaxCaches ? caches : detail::kMaxCaches);
  const kernels::Launch ctx(kOp, block_mapping, first_grid > 1024 ? 0 : -1);
  // 4. Launch, kMaxCaches caches at a time.
  detail::Params p{};
  p.mapping.ptr = kernels::data<const void>(block_mapping);
  p.mapping.stride = 1;
  p.mapping.i64 = i64;
  p.mapping_row = block_mapping.stride(0);
  p.mapping_col = block_mapping.stride(1);
  p.blocks = blocks;
  for (int64_t first = 0; first < caches; first += detail::kMaxCaches) {
    const int64_t count = caches - first < detail::kMaxCaches ? caches - first : detail::kMaxCaches;
    for (int64_t c = 0; c < count; ++c) {
      const int64_t* r = rows + 3 * (first + c);
      p.caches[c] = detail::Cache{reinterpret_cast<char*>(static_cast<uintptr_t>(r[0])), r[1], r[2]};
    }
    p.count = static_cast<int>(count);
    TVM_FFI_CHECK(pairs * count < (int64_t{1} << 31), ValueError)
        << kOp << ": too many block pairs (" << pairs << ") for one launch";
    const unsigned grid = static_cast<unsigned>(pairs * count);
    if (vector)
      kernels::launch(ctx, detail::copy_kernel<true>, grid, detail::kThreads, p);
    else
      kernels::launch(ctx, detail::copy_kernel<false>, grid, detail::kThreads, p);
  }
}
