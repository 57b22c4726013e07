"""kernels-diffusion: kernels of diffusion transformers and UNets/VAEs: timestep embedding, adaLN
modulation, gated residuals and GroupNorm + SiLU.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_diffusion
    emb = kernels_diffusion.timestep_embedding(t, 256, flip_sin_to_cos=True, downscale_freq_shift=0)
"""

from kernels_diffusion.version import __version__
from kernels_jit.registry import OpSpec, lazy_attributes, reference_op, register_group

_FLOATS = ("float32", "float16", "bfloat16")


def _op(name: str, description: str) -> OpSpec:
    """An op of this group; for now its only backend is the pure-torch reference."""
    return reference_op(
        "diffusion",
        name,
        description,
        dtypes=_FLOATS,
        reference="pure-torch reference (fp32 math, rounded once)",
    )


OPS = register_group(
    "diffusion",
    [
        _op("timestep_embedding", "sinusoidal timestep embedding (diffusers formula, flip option)"),
        _op("residual_gate_add", "r + gate * x with per-sample or per-token gates"),
        _op("layernorm_scale_shift", "adaLN modulation LN(x) * (1 + scale) + shift"),
        _op(
            "group_norm_silu", "GroupNorm (fp32 statistics) followed by SiLU, NC* or channels-last"
        ),
    ],
)

__all__ = [
    "OPS",
    "__version__",
    "group_norm_silu",
    "layernorm_scale_shift",
    "residual_gate_add",
    "timestep_embedding",
]
__getattr__ = lazy_attributes(__name__, OPS)
