// gemm.dsv3_router_gemm, CUDA: router logits out = x @ w.T for M <= 16 tokens (DeepSeek-V3: E = 256
// experts, K = 7168), fp32 accumulation, fp32 (default) or bf16 out. The small-M engine
// (small_m_gemm.cuh): tensor-core MMAs fed by 16-byte weight loads; for E = 256 each CTA owns 8
// experts over a quarter of K, four CTAs of a cluster reduce through distributed shared memory
// (128 CTAs), so the 3.7 MB of weight streams once over every SM.
#pragma once

#include <kernels/version.h>
KERNELS_REQUIRE_HEADERS_API(2);

#include "small_m_gemm.cuh"

// out [M, E] float32 or bfloat16 (any strides); x [M, K] bf16, w [E, K] bf16, both with a
// contiguous last dim and 16-byte aligned rows; M <= 16, K % 8 == 0. enable_pdl: -1 auto, 0, 1;
// with PDL w is read before the previous kernel completes, so that kernel must not write it.
// ring_max_m, push, weight_first: the engine's switches (small_m_gemm.cuh), from the op file.
inline void dsv3_router_gemm(tvm::ffi::TensorView out, tvm::ffi::TensorView x,
                             tvm::ffi::TensorView w, int64_t enable_pdl,
                             int64_t ring_max_m, int64_t push, int64_t weight_first) {
  constexpr const char* kOp = "gemm.dsv3_router_gemm";
  // 1. Validate.
  kernels::check_ndim(kOp, "w", w, 2);
  kernels::check_last_dim_contiguous(kOp, "w", w);
  const bool fp32 = kernels::is_dtype(out.dtype(), kDLFloat, 32);
  TVM_FFI_CHECK(fp32 || kernels::is_dtype(out.dtype(), kDLBfloat, 16), TypeError)
      << kOp << ": out must be float32 or bfloat16";
  small_m_gemm::Params p{};
  if (!small_m_gemm::check_and_fill(kOp, out, x, "x", w, "w", w.size(0), w.size(1), w.stride(0),
                                    enable_pdl, p))
    return;
  const small_m_gemm::Switches sw =
      small_m_gemm::switches(kOp, ring_max_m, push, weight_first);
  // 2. Device guard, 3. the caller's stream.
  kernels::DeviceGuard guard(x);
  const kernels::Launch ctx(kOp, x, enable_pdl);
  // 4. Launch (checked).
  if (fp32) {
    small_m_gemm::launch<float>(ctx, p, sw);
  } else {
    small_m_gemm::launch<__nv_bfloat16>(ctx, p, sw);
  }
}
