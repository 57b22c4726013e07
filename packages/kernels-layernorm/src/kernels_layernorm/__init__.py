"""kernels-layernorm: RMSNorm, fused add + RMSNorm, the Gemma variants, per-head QK norm and
LayerNorm.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_layernorm
    y = kernels_layernorm.rmsnorm(x, weight)
    kernels_layernorm.fused_add_rmsnorm(x, residual, weight)  # both updated in place
"""

from kernels_jit.registry import Backend, OpSpec, lazy_attributes, register_group
from kernels_layernorm.version import __version__

# The op files are named apart from the ops (rms_norm.py holds rmsnorm and its siblings): importing
# a submodule binds its name on this package, which would shadow a lazily resolved op of the same
# name once a sibling op had imported it.

_FLOATS = ("float32", "float16", "bfloat16")
_CUDA = "CUDA C++ via kernels-jit: row in registers, 16-byte vectors when aligned, scalar otherwise"


def _op(name: str, module: str, description: str) -> OpSpec:
    return OpSpec(
        group="layernorm",
        name=name,
        public=f"kernels_layernorm.{module}:{name}",
        description=description,
        samples=f"kernels_layernorm.{module}:{name}_samples",
        dtypes=_FLOATS,
        backends=(
            Backend(
                "cuda",
                f"kernels_layernorm.{module}:_{name}_cuda",
                devices=("cuda",),
                dtypes=_FLOATS,
                description=_CUDA,
            ),
            Backend(
                "torch",
                f"kernels_layernorm.{module}:_{name}_torch",
                devices=("cpu", "cuda"),
                dtypes=_FLOATS,
                description="pure-torch reference (fp32 statistics, output rounded once)",
            ),
        ),
    )


OPS = register_group(
    "layernorm",
    [
        _op("rmsnorm", "rms_norm", "y = x * rsqrt(mean(x^2) + eps) * w over the last dim"),
        _op(
            "fused_add_rmsnorm",
            "rms_norm",
            "residual += x; x = rmsnorm(residual) * w, both in place",
        ),
        _op("gemma_rmsnorm", "rms_norm", "y = x * rsqrt(mean(x^2) + eps) * (1 + w)"),
        _op(
            "gemma_fused_add_rmsnorm",
            "rms_norm",
            "residual += x; x = rmsnorm(residual) * (1 + w), both in place",
        ),
        _op(
            "qk_rmsnorm",
            "qk_norm",
            "per-head RMSNorm of q [T, Hq, D] and k [T, Hk, D] in place (strided views allowed)",
        ),
        _op(
            "layernorm", "layer_norm", "y = (x - mean) * rsqrt(var + eps) * w + b over the last dim"
        ),
    ],
)

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
__getattr__ = lazy_attributes(__name__, OPS)
