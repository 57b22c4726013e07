"""kernels-gemm: small-M latency GEMMs and FP8 scaled matrix multiplication.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_gemm
    logits = kernels_gemm.dsv3_router_gemm(x, router_weight)  # fp32 [M, E]
"""

from kernels_gemm.version import __version__
from kernels_jit.registry import lazy_ops, op, register_group

OPS = register_group(
    __name__,
    op("dsv3_router_gemm", "router logits x @ w.T for small M, fp32 out", "cuda",
       dtypes=("bfloat16",), min_sm=90),
    op("dsv3_fused_a_gemm", "DeepSeek-V3 fused q_a/kv_a projection a @ b for small M, bf16 out",
       "cuda", dtypes=("bfloat16",), min_sm=90),
    op("fp8_scaled_mm", "fp8 a @ b with per-token/per-channel or per-tensor scales and bias",
       "cuda", dtypes=("float8_e4m3fn",), min_sm=90),
    op("fp8_blockwise_mm", "fp8 a @ b with 1x128 activation and 128x128 weight block scales",
       "cuda", dtypes=("float8_e4m3fn",), min_sm=90),
)  # fmt: skip

__all__ = [
    "OPS",
    "__version__",
    "dsv3_fused_a_gemm",
    "dsv3_router_gemm",
    "fp8_blockwise_mm",
    "fp8_scaled_mm",
]
__getattr__ = lazy_ops(__name__, OPS)
