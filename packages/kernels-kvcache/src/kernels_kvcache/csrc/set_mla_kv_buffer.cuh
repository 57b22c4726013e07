// kvcache.set_mla_kv_buffer, CUDA: kv_buffer[loc[i]] = conv(concat(k_nope[i], k_rope[i])) (the
// packed MLA latent row, DeepSeek 512 + 64), on the row-scatter engine of kv_write.cuh: nope and
// rope are the two parts of a token, written to columns [0, Dn) and [Dn, Dn + Dr) of its row, so
// one pass reads each input once and writes the row once (1152-byte bf16 rows: 72 packs). Negative
// loc is skipped; loc >= S is skipped too (the torch reference raises ValueError).
#pragma once

#include "kv_write.cuh"

// kv_buffer [S, 1, Dn+Dr] or [S, Dn+Dr] (the dtype of k_nope, or float8_e4m3fn), loc [N]
// int32/int64, k_nope [N, (1,) Dn], k_rope [N, (1,) Dr] (one float dtype); last dims contiguous,
// row strides free. bulk_*: where the TMA bulk path runs (kv_write.cuh's BulkGate; the op
// module's _BULK_*).
inline void set_mla_kv_buffer(tvm::ffi::TensorView kv_buffer, tvm::ffi::TensorView loc,
                              tvm::ffi::TensorView k_nope, tvm::ffi::TensorView k_rope,
                              tvm::ffi::Optional<tvm::ffi::TensorView> scale,
                              int64_t bulk_min_rows, int64_t bulk_max_rows,
                              int64_t bulk_min_run_bytes) {
  namespace kw = kv_write;
  constexpr const char* kOp = "kvcache.set_mla_kv_buffer";
  // 1. Validate.
  for (const auto& [arg, t] : {std::pair<const char*, const tvm::ffi::TensorView*>{"k_nope", &k_nope},
                               {"k_rope", &k_rope},
                               {"kv_buffer", &kv_buffer}}) {
    TVM_FFI_CHECK(t->ndim() == 2 || (t->ndim() == 3 && t->size(1) == 1), ValueError)
        << kOp << ": " << arg << " must be [rows, D] or [rows, 1, D], got shape "
        << kernels::shape_string(*t);
    kw::check_input(kOp, arg, *t, k_nope, t->ndim());
  }
  kernels::check_same_dtype(kOp, "k_rope", k_rope, "k_nope", k_nope);
  const int64_t n = k_nope.size(0);
  const int64_t dn = k_nope.size(k_nope.ndim() - 1), dr = k_rope.size(k_rope.ndim() - 1);
  TVM_FFI_CHECK(k_rope.size(0) == n, ValueError)
      << kOp << ": k_rope must have N = " << n << " rows like k_nope, got shape "
      << kernels::shape_string(k_rope);
  TVM_FFI_CHECK(kv_buffer.size(kv_buffer.ndim() - 1) == dn + dr, ValueError)
      << kOp << ": kv_buffer rows must hold Dn + Dr = " << dn << " + " << dr << " values, got shape "
      << kernels::shape_string(kv_buffer);
  const bool fp8 = kernels::is_dtype(kv_buffer.dtype(), kDLFloat8_e4m3fn, 8);
  TVM_FFI_CHECK(fp8 || kv_buffer.dtype() == k_nope.dtype(), TypeError)
      << kOp << ": kv_buffer must have the dtype of its input rows or float8_e4m3fn";
  kw::check_slots(kOp, "loc", loc, k_nope, n);
  const float* s = kw::scale_ptr(kOp, "scale", scale, k_nope);
  if (n == 0 || kv_buffer.size(0) == 0) return;
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(k_nope);
  const kernels::Launch ctx(kOp, k_nope);
  // 4. Dispatch on dtype and launch.
  const int64_t elem = kw::elem_bytes(kv_buffer.dtype());
  kw::PartSpec a, b;
  a.src = kernels::data<const void>(k_nope);
  a.dst = kernels::data<void>(kv_buffer);
  a.src_tok = k_nope.stride(0);
  a.dst_block = kv_buffer.stride(0);
  a.heads = dn ? 1 : 0;
  a.width = dn;
  a.scale = s;
  b.src = kernels::data<const void>(k_rope);
  b.dst = kernels::data<char>(kv_buffer) + dn * elem;
  b.src_tok = k_rope.stride(0);
  b.dst_block = kv_buffer.stride(0);
  b.heads = dr ? 1 : 0;
  b.width = dr;
  b.scale = s;
  const kw::BulkGate gate{bulk_min_rows, bulk_max_rows, bulk_min_run_bytes};
  kw::dispatch(ctx, gate, k_nope.dtype(), fp8, a, b, loc, n, kv_buffer.size(0), -1, 1);
}
