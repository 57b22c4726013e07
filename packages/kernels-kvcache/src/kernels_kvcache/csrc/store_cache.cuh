// kvcache.store_cache, CUDA: k_cache[indices[i]] = conv(k[i]), v_cache[indices[i]] = conv(v[i])
// (token-major caches [S, W]), on the row-scatter engine of kv_write.cuh: K and V are the two
// parts of a token, G threads per token, 16-byte packs, fp8 caches with device-side scales.
// Negative indices and skip_index are skipped; an index >= S is skipped too (the torch reference
// raises ValueError; the kernel cannot without a host sync, and never forms its address).
#pragma once

#include "kv_write.cuh"

// k_cache [S, Wk], v_cache [S, Wv] (the dtype of k, or float8_e4m3fn; both kinds alike), k [N, Wk],
// v [N, Wv] (one float dtype), indices [N] int32/int64; last dims contiguous, row strides free.
// bulk_*: where the TMA bulk path runs (kv_write.cuh's BulkGate; the op module's _BULK_*).
inline void store_cache(tvm::ffi::TensorView k_cache, tvm::ffi::TensorView v_cache,
                        tvm::ffi::TensorView k, tvm::ffi::TensorView v,
                        tvm::ffi::TensorView indices,
                        tvm::ffi::Optional<tvm::ffi::TensorView> k_scale,
                        tvm::ffi::Optional<tvm::ffi::TensorView> v_scale, int64_t skip_index,
                        int64_t bulk_min_rows, int64_t bulk_max_rows,
                        int64_t bulk_min_run_bytes) {
  namespace kw = kv_write;
  constexpr const char* kOp = "kvcache.store_cache";
  // 1. Validate.
  kw::check_input(kOp, "k", k, k, 2);
  kw::check_input(kOp, "v", v, k, 2);
  kw::check_input(kOp, "k_cache", k_cache, k, 2);
  kw::check_input(kOp, "v_cache", v_cache, k, 2);
  kernels::check_same_dtype(kOp, "v", v, "k", k);
  const int64_t n = k.size(0);
  TVM_FFI_CHECK(v.size(0) == n, ValueError)
      << kOp << ": k and v must have the same number of rows N, got k " << kernels::shape_string(k)
      << " and v " << kernels::shape_string(v);
  TVM_FFI_CHECK(k_cache.size(1) == k.size(1) && v_cache.size(1) == v.size(1), ValueError)
      << kOp << ": cache rows must be as wide as the input rows, got k " << kernels::shape_string(k)
      << ", k_cache " << kernels::shape_string(k_cache) << ", v " << kernels::shape_string(v)
      << ", v_cache " << kernels::shape_string(v_cache);
  TVM_FFI_CHECK(k_cache.size(0) == v_cache.size(0), ValueError)
      << kOp << ": k_cache and v_cache must have the same number of slots S";
  const bool fp8 = kw::is_fp8(k_cache.dtype()) && !kw::is_fp8(k.dtype());
  for (const auto& [arg, cache] : {std::pair<const char*, const tvm::ffi::TensorView*>{
                                       "k_cache", &k_cache},
                                   {"v_cache", &v_cache}}) {
    const bool ok = fp8 ? kernels::is_dtype(cache->dtype(), kDLFloat8_e4m3fn, 8)
                        : cache->dtype() == k.dtype();
    TVM_FFI_CHECK(ok, TypeError)
        << kOp << ": " << arg << " must have the dtype of k (or float8_e4m3fn, for both caches)";
  }
  kw::check_slots(kOp, "indices", indices, k, n);
  const float* ks = kw::scale_ptr(kOp, "k_scale", k_scale, k);
  const float* vs = kw::scale_ptr(kOp, "v_scale", v_scale, k);
  if (n == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(k);
  const kernels::Launch ctx(kOp, k);
  // 4. Dispatch on dtype and launch.
  kw::PartSpec a, b;
  a.src = kernels::data<const void>(k);
  a.dst = kernels::data<void>(k_cache);
  a.src_tok = k.stride(0);
  a.dst_block = k_cache.stride(0);
  a.heads = 1;
  a.width = k.size(1);
  a.scale = ks;
  b.src = kernels::data<const void>(v);
  b.dst = kernels::data<void>(v_cache);
  b.src_tok = v.stride(0);
  b.dst_block = v_cache.stride(0);
  b.heads = 1;
  b.width = v.size(1);
  b.scale = vs;
  const kw::BulkGate gate{bulk_min_rows, bulk_max_rows, bulk_min_run_bytes};
  kw::dispatch(ctx, gate, k.dtype(), fp8, a, b, indices, n, k_cache.size(0), skip_index, 1);
}
