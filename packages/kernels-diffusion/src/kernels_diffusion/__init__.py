"""kernels-diffusion: kernels of diffusion transformers and UNets/VAEs: timestep embedding, adaLN
modulation, gated residuals and GroupNorm + SiLU.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_diffusion
    emb = kernels_diffusion.timestep_embedding(t, 256, flip_sin_to_cos=True, downscale_freq_shift=0)
"""

from kernels_diffusion.version import __version__
from kernels_jit.registry import FLOATS, lazy_ops, op, register_group

OPS = register_group(
    __name__,
    op("timestep_embedding", "sinusoidal timestep embedding (diffusers formula, flip option)",
       "cuda", dtypes=FLOATS),
    op("residual_gate_add", "r + gate * x with per-sample or per-token gates", "cuda",
       dtypes=FLOATS),
    op("layernorm_scale_shift", "adaLN modulation LN(x) * (1 + scale) + shift", "cuda",
       dtypes=FLOATS),
    op("group_norm_silu", "GroupNorm (fp32 statistics) followed by SiLU, NC* or channels-last",
       "cuda", dtypes=FLOATS),
)  # fmt: skip

__all__ = [
    "OPS",
    "__version__",
    "group_norm_silu",
    "layernorm_scale_shift",
    "residual_gate_add",
    "timestep_embedding",
]
__getattr__ = lazy_ops(__name__, OPS)
