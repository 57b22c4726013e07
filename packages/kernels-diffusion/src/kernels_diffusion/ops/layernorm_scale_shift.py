"""diffusion.layernorm_scale_shift: adaLN modulation ``LN(x) * (1 + scale) + shift``.

Backends: the pure-torch reference only (fp32 math, rounded once).
"""

from __future__ import annotations

import torch

from kernels_diffusion import reference
from kernels_diffusion._checks import FLOATS, check_float, check_modulation
from kernels_jit.dispatch import Op
from kernels_jit.validation import check_tensor

OP_ID = "diffusion.layernorm_scale_shift"


def _layernorm_scale_shift_torch(
    out: torch.Tensor,
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> None:
    out.copy_(reference.layernorm_scale_shift(x, scale, shift, weight, bias, eps))


LAYERNORM_SCALE_SHIFT = Op(_layernorm_scale_shift_torch, mutates=("out",), device="x")


def layernorm_scale_shift(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    *,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-6,
    backend: str | None = None,
) -> torch.Tensor:
    """``LN(x) * (1 + scale) + shift`` with LN over H (fp32 mean and biased variance), affine
    only when weight/bias are given (DiT and Flux use none); rounded once to the dtype of x.

    Parameters
    ----------
    x : [B, L, H] float32, float16 or bfloat16.
    scale, shift : [B, H] or [B, 1, H] (per sample) or [B, L, H] (per token).
    weight, bias : optional [H].
    eps : added to the variance.
    """
    check_tensor(OP_ID, "x", x, dtypes=FLOATS, ndim=3)
    check_modulation(OP_ID, "scale", scale, x)
    check_modulation(OP_ID, "shift", shift, x)
    for name, v in (("weight", weight), ("bias", bias)):
        if v is not None:
            check_tensor(OP_ID, name, v, dtypes=FLOATS, ndim=1, device=x.device)
            if v.shape[0] != x.shape[2]:
                raise ValueError(
                    f"{OP_ID}: {name} must have H = {x.shape[2]} entries, got {v.shape[0]}"
                )
    eps = check_float(OP_ID, "eps", eps)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if x.numel():
        LAYERNORM_SCALE_SHIFT.run(out, x, scale, shift, weight, bias, eps, backend=backend)
    return out


def _layernorm_scale_shift_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: with and without affine, each layout."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 7, 96, generator=g).to(torch.bfloat16).to(device)
    scale = (torch.randn(2, 96, generator=g) * 0.1).to(device)
    shift = torch.randn(2, 1, 96, generator=g).to(device)
    weight, bias = torch.randn(96, generator=g).to(device), torch.randn(96, generator=g).to(device)
    return [
        ((x, scale, shift), {}),
        ((x.float(), scale, shift), {"weight": weight, "bias": bias, "eps": 1e-5}),
    ]
