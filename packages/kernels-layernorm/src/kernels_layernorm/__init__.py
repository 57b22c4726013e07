"""kernels-layernorm: RMSNorm, fused add + RMSNorm, the Gemma variants, per-head QK norm and
LayerNorm.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_layernorm
    y = kernels_layernorm.rmsnorm(x, weight)
    kernels_layernorm.fused_add_rmsnorm(x, residual, weight)  # both updated in place
"""

from kernels_jit.registry import FLOATS, lazy_ops, op, register_group
from kernels_layernorm.version import __version__

OPS = register_group(
    __name__,
    op("rmsnorm", "y = x * rsqrt(mean(x^2) + eps) * w over the last dim", "cuda",
       dtypes=FLOATS, file="rmsnorm"),
    op("gemma_rmsnorm", "y = x * rsqrt(mean(x^2) + eps) * (1 + w)", "cuda",
       dtypes=FLOATS, file="rmsnorm"),
    op("fused_add_rmsnorm", "residual += x; x = rmsnorm(residual) * w, both in place", "cuda",
       dtypes=FLOATS, file="rmsnorm"),
    op("gemma_fused_add_rmsnorm", "residual += x; x = rmsnorm(residual) * (1 + w), both in "
       "place", "cuda", dtypes=FLOATS, file="rmsnorm"),
    op("qk_rmsnorm", "per-head RMSNorm of q [T, Hq, D] and k [T, Hk, D] in place (strided "
       "views allowed)", "cuda", dtypes=FLOATS),
    op("layernorm", "y = (x - mean) * rsqrt(var + eps) * w + b over the last dim", "cuda",
       dtypes=FLOATS),
)  # fmt: skip

__all__ = [
    "OPS",
    "__version__",
    "fused_add_rmsnorm",
    "gemma_fused_add_rmsnorm",
    "gemma_rmsnorm",
    "layernorm",
    "qk_rmsnorm",
    "rmsnorm",
]
__getattr__ = lazy_ops(__name__, OPS)
