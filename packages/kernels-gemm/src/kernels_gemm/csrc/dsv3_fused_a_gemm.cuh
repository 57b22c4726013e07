// gemm.dsv3_fused_a_gemm, CUDA: DeepSeek-V3's fused q_a/kv_a projection out = a @ b for M <= 16
// tokens, b [K, N] column-major (the transpose view of a row-major [N, K] weight; K = 7168,
// N = 2112), fp32 accumulation, bf16 out. The small-M engine (small_m_gemm.cuh): for N = 2112
// each of 132 CTAs owns 16 whole output columns over all of K (no split, no workspace), streaming
// its 229 KB of weight with 16-byte loads into tensor-core MMAs (gemm_kernel by default; the ring
// kernel, cp.async through a 192 KB shared-memory ring, where the op file's _RING_MAX_M says).
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include "small_m_gemm.cuh"

// out [M, N] bf16 (any strides); a [M, K] bf16 with a contiguous last dim; b [K, N] bf16 with
// stride 1 along K (column-major); 16-byte aligned rows, M <= 16, K % 8 == 0. enable_pdl: -1 auto,
// 0, 1; with PDL b is read before the previous kernel completes, so that kernel must not write it.
// ring_max_m, push, weight_first: the engine's switches (small_m_gemm.cuh), from the op file.
inline void dsv3_fused_a_gemm(tvm::ffi::TensorView out, tvm::ffi::TensorView a,
                              tvm::ffi::TensorView b, int64_t enable_pdl,
                              int64_t ring_max_m, int64_t push, int64_t weight_first) {
  constexpr const char* kOp = "gemm.dsv3_fused_a_gemm";
  // 1. Validate.
  kernels::check_ndim(kOp, "b", b, 2);
  TVM_FFI_CHECK(b.size(0) <= 1 || b.stride(0) == 1, ValueError)
      << kOp << ": b [K, N] must be column-major (stride 1 along K; pass w.t() of a row-major "
      << "[N, K] weight), got strides [" << b.stride(0) << ", " << b.stride(1) << "]";
  TVM_FFI_CHECK(kernels::is_dtype(out.dtype(), kDLBfloat, 16), TypeError)
      << kOp << ": out must be bfloat16";
  small_m_gemm::Params p{};
  if (!small_m_gemm::check_and_fill(kOp, out, a, "a", b, "b", b.size(1), b.size(0), b.stride(1),
                                    enable_pdl, p))
    return;
  const small_m_gemm::Switches sw =
      small_m_gemm::switches(kOp, ring_max_m, push, weight_first);
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(a);
  const kernels::Launch ctx(kOp, a, enable_pdl);
  // 4. Launch (checked).
  small_m_gemm::launch<__nv_bfloat16>(ctx, p, sw);
}
