"""diffusion.timestep_embedding: sinusoidal embedding of diffusion timesteps (diffusers).

Backends: CUDA (one thread per 16-byte pack of frequencies, accurate sincosf) and the
pure-torch reference (fp32 math, rounded once).
"""

from __future__ import annotations

import torch

from kernels_diffusion import reference
from kernels_diffusion._checks import FLOATS, check_float
from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_tensor

OP_ID = "diffusion.timestep_embedding"
T_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.int64)

TIMESTEP_EMBEDDING_CUDA = ModuleSpec(
    name="timestep_embedding",
    package="kernels_diffusion",
    sources=("csrc/timestep_embedding.cuh",),
    exports=(("timestep_embedding", "timestep_embedding"),),
    description="CUDA: sinusoidal timestep embedding, 16-byte stores, sincosf-exact sin/cos",
)

_timestep_embedding_cuda = CompiledFunction(TIMESTEP_EMBEDDING_CUDA, "timestep_embedding")


def _timestep_embedding_torch(
    out: torch.Tensor,
    t: torch.Tensor,
    dim: int,
    flip_sin_to_cos: bool,
    downscale_freq_shift: float,
    scale: float,
    max_period: float,
) -> None:
    out.copy_(
        reference.timestep_embedding(
            t, dim, flip_sin_to_cos, downscale_freq_shift, scale, max_period, out.dtype
        )
    )


def _timestep_embedding_cuda_eligible(
    out: torch.Tensor,
    t: torch.Tensor,
    dim: int,
    flip_sin_to_cos: bool,
    downscale_freq_shift: float,
    scale: float,
    max_period: float,
) -> str | None:
    if t.dtype not in T_DTYPES:
        return "needs t of float32, float16, bfloat16, float64, int32 or int64"
    if out.dim() == 2 and out.shape[1] > 1 and out.stride(1) != 1:
        return "needs a contiguous last dim of out"
    return None


# Dispatch keys on out (its dtype is the op's: t may be an integer tensor).
TIMESTEP_EMBEDDING = Op(_timestep_embedding_torch, mutates=("out",), device="out")


def timestep_embedding(
    t: torch.Tensor,
    dim: int,
    *,
    flip_sin_to_cos: bool = False,
    downscale_freq_shift: float = 1.0,
    scale: float = 1.0,
    max_period: float = 10000.0,
    out_dtype: torch.dtype = torch.float32,
    backend: str | None = None,
) -> torch.Tensor:
    """``[sin a, cos a]`` with ``a = scale * t * exp(-ln(max_period) * i / (dim // 2 - shift))``.

    ``flip_sin_to_cos`` gives ``[cos a, sin a]``; an odd dim appends one zero column. Computed in
    fp32. GLIDE/DiT use ``flip_sin_to_cos=True, downscale_freq_shift=0``; the defaults match
    diffusers' ``get_timestep_embedding``.

    Parameters
    ----------
    t : [N] timesteps (float or integer dtype; read in fp32).
    dim : embedding width, >= 1.
    out_dtype : float32 (default), float16 or bfloat16.

    Returns
    -------
    [N, dim] in out_dtype.
    """
    check_tensor(OP_ID, "t", t, dtypes=T_DTYPES, ndim=1)
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{OP_ID}: dim must be an int, got {type(dim).__name__}")
    if dim < 1:
        raise ValueError(f"{OP_ID}: dim must be >= 1, got {dim}")
    shift = check_float(OP_ID, "downscale_freq_shift", downscale_freq_shift)
    scale = check_float(OP_ID, "scale", scale)
    max_period = check_float(OP_ID, "max_period", max_period)
    if dim // 2 and dim // 2 == shift:
        raise ValueError(
            f"{OP_ID}: dim // 2 - downscale_freq_shift must not be 0 (it divides the exponent), "
            f"got dim = {dim} and downscale_freq_shift = {shift}"
        )
    if max_period <= 0:
        raise ValueError(f"{OP_ID}: max_period must be > 0, got {max_period}")
    if out_dtype not in FLOATS:
        raise TypeError(f"{OP_ID}: out_dtype must be float32, float16 or bfloat16, got {out_dtype}")
    out = torch.empty(t.shape[0], dim, dtype=out_dtype, device=t.device)
    if out.numel():
        TIMESTEP_EMBEDDING.run(
            out, t, dim, bool(flip_sin_to_cos), shift, scale, max_period, backend=backend
        )
    return out


def _timestep_embedding_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: every output dtype, both layouts, an odd
    dim, integer timesteps."""
    g = torch.Generator().manual_seed(0)
    t = torch.rand(7, generator=g) * 1000
    return [
        ((t.to(device), 256), {}),
        ((t.to(device), 321), {"flip_sin_to_cos": True, "downscale_freq_shift": 0.0}),
        ((t.to(device), 64), {"scale": 1000.0, "out_dtype": torch.bfloat16}),
        ((t.long().to(device), 160), {"out_dtype": torch.float16}),
    ]
