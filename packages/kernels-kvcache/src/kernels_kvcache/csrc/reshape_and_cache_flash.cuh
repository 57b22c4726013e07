// kvcache.reshape_and_cache_flash, CUDA: key_cache[slot // bs, slot % bs] = conv(key[i]) and the
// same for value (vLLM's paged FlashAttention layout), on the row-scatter engine of kv_write.cuh:
// K and V are the two parts of a token, each Hk heads of D elements, every stride honoured (NHD
// caches, HND caches seen as permuted [NB, bs, Hk, D] views, K/V halves of one tensor). Negative
// slots are skipped; a slot >= NB * bs is skipped too (the torch reference raises ValueError).
#pragma once

#include <string>

#include "kv_write.cuh"

// key_cache [NB, bs, Hk, D], value_cache [NB, bs, Hk, Dv] (the input dtype for "auto";
// float8_e4m3fn or uint8 for "fp8"/"fp8_e4m3"), key [N, Hk, D], value [N, Hk, Dv], slot_mapping
// [N] int32/int64; last dims contiguous, other strides free. bulk_*: where the TMA bulk path runs
// (kv_write.cuh's BulkGate; the op module's _BULK_*).
inline void reshape_and_cache_flash(tvm::ffi::TensorView key_cache,
                                    tvm::ffi::TensorView value_cache, tvm::ffi::TensorView key,
                                    tvm::ffi::TensorView value, tvm::ffi::TensorView slot_mapping,
                                    tvm::ffi::String kv_cache_dtype,
                                    tvm::ffi::Optional<tvm::ffi::TensorView> k_scale,
                                    tvm::ffi::Optional<tvm::ffi::TensorView> v_scale,
                                    int64_t bulk_min_rows, int64_t bulk_max_rows,
                                    int64_t bulk_min_run_bytes) {
  namespace kw = kv_write;
  constexpr const char* kOp = "kvcache.reshape_and_cache_flash";
  // 1. Validate.
  const std::string kind(kv_cache_dtype.data(), kv_cache_dtype.size());
  TVM_FFI_CHECK(kind == "auto" || kind == "fp8" || kind == "fp8_e4m3", ValueError)
      << kOp << ": kv_cache_dtype must be one of ('auto', 'fp8', 'fp8_e4m3'), got '" << kind
      << "'";
  kw::check_input(kOp, "key", key, key, 3);
  kw::check_input(kOp, "value", value, key, 3);
  kw::check_input(kOp, "key_cache", key_cache, key, 4);
  kw::check_input(kOp, "value_cache", value_cache, key, 4);
  kernels::check_same_dtype(kOp, "value", value, "key", key);
  const int64_t n = key.size(0);
  TVM_FFI_CHECK(value.size(0) == n && value.size(1) == key.size(1), ValueError)
      << kOp << ": key [N, Hk, D] and value [N, Hk, Dv] must share N and Hk, got key "
      << kernels::shape_string(key) << " and value " << kernels::shape_string(value);
  for (const auto& [arg, cache, rows] :
       {std::tuple<const char*, const tvm::ffi::TensorView*, const tvm::ffi::TensorView*>{
            "key_cache", &key_cache, &key},
        {"value_cache", &value_cache, &value}}) {
    TVM_FFI_CHECK(cache->size(2) == rows->size(1) && cache->size(3) == rows->size(2), ValueError)
        << kOp << ": " << arg << " [num_blocks, block_size, Hk, D] must match the input's [Hk, D], "
        << "got shape " << kernels::shape_string(*cache);
    const bool ok = kind == "auto" ? cache->dtype() == key.dtype() : kw::is_fp8(cache->dtype());
    TVM_FFI_CHECK(ok, TypeError)
        << kOp << ": " << arg << " must have the input dtype for kv_cache_dtype='auto', "
        << "float8_e4m3fn (or uint8) for 'fp8'";
  }
  TVM_FFI_CHECK(key_cache.size(0) == value_cache.size(0) &&
                    key_cache.size(1) == value_cache.size(1),
                ValueError)
      << kOp << ": key_cache and value_cache must share [num_blocks, block_size]";
  kw::check_slots(kOp, "slot_mapping", slot_mapping, key, n);
  const float* ks = kw::scale_ptr(kOp, "k_scale", k_scale, key);
  const float* vs = kw::scale_ptr(kOp, "v_scale", v_scale, key);
  const int64_t blocks = key_cache.size(0), block_size = key_cache.size(1);
  if (n == 0 || blocks == 0 || block_size == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(key);
  const kernels::Launch ctx(kOp, key);
  // 4. Dispatch on dtype and launch.
  const auto part = [](const tvm::ffi::TensorView& src, const tvm::ffi::TensorView& cache,
                       const float* scale) {
    kw::PartSpec s;
    s.src = kernels::data<const void>(src);
    s.dst = kernels::data<void>(cache);
    s.src_tok = src.stride(0);
    s.src_head = src.stride(1);
    s.dst_block = cache.stride(0);
    s.dst_tok = cache.stride(1);
    s.dst_head = cache.stride(2);
    s.heads = src.size(1);
    s.width = src.size(2);
    s.scale = scale;
    return s;
  };
  const bool fp8 = kind != "auto";
  const kw::BulkGate gate{bulk_min_rows, bulk_max_rows, bulk_min_run_bytes};
  kw::dispatch(ctx, gate, key.dtype(), fp8, part(key, key_cache, ks),
               part(value, value_cache, vs), slot_mapping, n, blocks * block_size, -1, block_size);
}
