// kv_canary.kv_canary_verify, CUDA: fail_bits[i] = 1 chain | 2 position | 4 kv bytes | 8 token
// (OPS.md section 15), bit for bit with the torch reference. G = 1, 2 or 4 adjacent threads per
// entry (the number of sources rounded up to a power of two), each hashing one source's bytes of
// the slot, combined through warp shuffles in source order; the group's first thread checks the
// canary row. The bytes arrive staged (kv_canary_common.cuh: cooperative cp.async of whole lines
// into a per-warp shared-memory ring, CTAs of 128 threads) when every source is 16-byte aligned,
// else by direct 16/8/1-byte loads (CTAs of 256). A slot outside the canary or a source's rows, or
// a prev slot outside the canary, is reported with every bit set (15) without a read out of bounds
// (the torch reference raises). No host sync.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(4);

#include <kernels/launch.cuh>
#include <kernels/pdl.cuh>

#include "kv_canary_common.cuh"

namespace kv_canary_verify_detail {

constexpr int kThreads = 256, kStagedThreads = 128;

struct Params {
  int32_t* fail_bits;
  const int64_t* canary;  // [S, 4] contiguous
  int64_t canary_rows;
  kv_canary_detail::Sources src;
  kv_canary_detail::IndexRef slots, prev, positions, tokens;
  bool has_tokens;
  int64_t skip_slot;
  int64_t entries;
  int group_log2;
};

template <bool kStaged>
__global__ void __launch_bounds__(kThreads) verify_kernel(bool pdl, Params p) {
  using namespace kv_canary_detail;
  extern __shared__ __align__(128) unsigned char smem[];
  staged::Ring ring;
  if constexpr (kStaged) ring.init(smem);
  const int64_t t = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int g = 1 << p.group_log2;
  const int64_t i = t >> p.group_log2;
  const int k = static_cast<int>(t & (g - 1));
  if (pdl) kernels::pdl_wait();
  int64_t slot = -1;
  if (i < p.entries) slot = p.slots[i];
  const bool checked = i < p.entries && slot >= 0 && slot != p.skip_slot;
  const bool in_range = checked && slot < p.canary_rows && slot_in_sources(p.src, slot);
  const uint64_t acc = group_kv_hash<kStaged>(p.src, slot, in_range, p.group_log2, &ring);
  if (k == 0 && i < p.entries) {
    int32_t bits = 0;
    if (checked && !in_range) {
      bits = 15;
    } else if (checked) {
      const int64_t* row = p.canary + slot * 4;
      const longlong2 a = make_longlong2(row[0], row[1]);
      const longlong2 b = make_longlong2(row[2], row[3]);
      const int64_t prev_slot = p.prev[i];
      if (prev_slot >= 0) {
        if (prev_slot >= p.canary_rows) {
          bits |= 1;
        } else {
          const int64_t* pr = p.canary + prev_slot * 4;
          const uint64_t want = mix3(static_cast<uint64_t>(pr[2]), static_cast<uint64_t>(pr[0]),
                                     static_cast<uint64_t>(pr[1]));
          if (static_cast<uint64_t>(b.x) != want) bits |= 1;
        }
      }
      if (a.y != p.positions[i]) bits |= 2;
      if (static_cast<uint64_t>(b.y) != acc) bits |= 4;
      if (p.has_tokens) {
        const int64_t want = p.tokens[i];
        if (want != -1 && a.x != want) bits |= 8;
      }
    }
    p.fail_bits[i] = bits;
  }
  if (pdl) kernels::pdl_launch_dependents();
}

}  // namespace kv_canary_verify_detail

// fail_bits [N] int32 (contiguous), canary [S, 4] int64 (contiguous), slots / prev_slots /
// expected_positions / expected_tokens (optional) [N] int32 or int64, then up to 4 sources, each
// an optional contiguous cache and its page_size, bytes_per_token, read_bytes.
inline void kv_canary_verify(
    tvm::ffi::TensorView fail_bits, tvm::ffi::TensorView canary, tvm::ffi::TensorView slots,
    tvm::ffi::TensorView prev_slots, tvm::ffi::TensorView expected_positions,
    tvm::ffi::Optional<tvm::ffi::TensorView> expected_tokens, int64_t skip_slot,
    tvm::ffi::Optional<tvm::ffi::TensorView> cache0, int64_t page0, int64_t bpt0, int64_t read0,
    tvm::ffi::Optional<tvm::ffi::TensorView> cache1, int64_t page1, int64_t bpt1, int64_t read1,
    tvm::ffi::Optional<tvm::ffi::TensorView> cache2, int64_t page2, int64_t bpt2, int64_t read2,
    tvm::ffi::Optional<tvm::ffi::TensorView> cache3, int64_t page3, int64_t bpt3, int64_t read3) {
  namespace detail = kv_canary_verify_detail;
  constexpr const char* kOp = "kv_canary.kv_canary_verify";
  // 1. Validate.
  kernels::check_ndim(kOp, "canary", canary, 2);
  kernels::check_device(kOp, "canary", canary, kDLCUDA);
  kernels::check_contiguous(kOp, "canary", canary);
  TVM_FFI_CHECK(kernels::is_dtype(canary.dtype(), kDLInt, 64) && canary.size(1) == 4, ValueError)
      << kOp << ": canary must be [S, 4] int64";
  kernels::check_ndim(kOp, "fail_bits", fail_bits, 1);
  kernels::check_contiguous(kOp, "fail_bits", fail_bits);
  kernels::check_same_device(kOp, "fail_bits", fail_bits, "canary", canary);
  TVM_FFI_CHECK(kernels::is_dtype(fail_bits.dtype(), kDLInt, 32), TypeError)
      << kOp << ": fail_bits must be int32";
  detail::Params p{};
  p.entries = fail_bits.size(0);
  p.slots = kv_canary_host::index_vector(kOp, "slots", slots, canary, p.entries);
  p.prev = kv_canary_host::index_vector(kOp, "prev_slots", prev_slots, canary, p.entries);
  p.positions = kv_canary_host::index_vector(kOp, "expected_positions", expected_positions,
                                             canary, p.entries);
  p.has_tokens = expected_tokens.has_value();
  if (p.has_tokens)
    p.tokens = kv_canary_host::index_vector(kOp, "expected_tokens", expected_tokens.value(),
                                            canary, p.entries);
  kv_canary_host::add_source(kOp, p.src, cache0, page0, bpt0, read0, canary);
  kv_canary_host::add_source(kOp, p.src, cache1, page1, bpt1, read1, canary);
  kv_canary_host::add_source(kOp, p.src, cache2, page2, bpt2, read2, canary);
  kv_canary_host::add_source(kOp, p.src, cache3, page3, bpt3, read3, canary);
  if (p.entries == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(canary);
  const kernels::Launch ctx(kOp, canary);
  // 4. Launch.
  p.fail_bits = kernels::data<int32_t>(fail_bits);
  p.canary = kernels::data<const int64_t>(canary);
  p.canary_rows = canary.size(0);
  p.skip_slot = skip_slot;
  p.group_log2 = p.src.count > 2 ? 2 : (p.src.count > 1 ? 1 : 0);
  const int64_t threads = p.entries << p.group_log2;
  if (kv_canary_detail::staged::eligible(p.src)) {
    constexpr int kBlock = detail::kStagedThreads;
    kernels::launch_with_smem<detail::verify_kernel<true>>(
        ctx, kernels::ceil_div(threads, kBlock), kBlock,
        kv_canary_detail::staged::block_bytes(kBlock), p);
  } else {
    kernels::launch(ctx, detail::verify_kernel<false>,
                    kernels::ceil_div(threads, detail::kThreads), detail::kThreads, p);
  }
}
