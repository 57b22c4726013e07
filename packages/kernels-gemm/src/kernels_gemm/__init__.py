"""kernels-gemm: small-M latency GEMMs and FP8 scaled matrix multiplication.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_gemm
    logits = kernels_gemm.dsv3_router_gemm(x, router_weight)  # fp32 [M, E]
"""

from kernels_gemm.version import __version__
from kernels_jit.registry import OpSpec, lazy_attributes, reference_op, register_group


def _op(name: str, description: str, dtypes: tuple[str, ...]) -> OpSpec:
    """An op of this group; for now its only backend is the pure-torch reference."""
    return reference_op(
        "gemm",
        name,
        description,
        dtypes=dtypes,
        reference="pure-torch reference (fp32 accumulation)",
    )


OPS = register_group(
    "gemm",
    [
        _op("dsv3_router_gemm", "router logits x @ w.T for small M, fp32 out", ("bfloat16",)),
        _op(
            "fp8_scaled_mm",
            "fp8 a @ b with per-token/per-channel or per-tensor scales and bias",
            ("float8_e4m3fn",),
        ),
    ],
)

__all__ = ["OPS", "__version__", "dsv3_router_gemm", "fp8_scaled_mm"]
__getattr__ = lazy_attributes(__name__, OPS)
