"""Pure-torch references of the diffusion ops: the correctness oracle and the fallback.

Every reference reads its inputs, computes in fp32 and rounds once to the output dtype.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def timestep_embedding(
    t: torch.Tensor,
    dim: int,
    flip_sin_to_cos: bool = False,
    downscale_freq_shift: float = 1.0,
    scale: float = 1.0,
    max_period: float = 10000.0,
    out_dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Sinusoidal embedding [N, dim]: ``f_i = exp(-ln(max_period) * i / (half - shift))``,
    ``a = scale * (t * f)``, ``[sin a, cos a]`` (``[cos a, sin a]`` if flip), a zero column
    appended for odd dim. fp32 in the order of diffusers' ``get_timestep_embedding``."""
    half = dim // 2
    exponent = -math.log(max_period) * torch.arange(half, dtype=torch.float32, device=t.device)
    freqs = torch.exp(exponent / (half - downscale_freq_shift))
    angles = scale * (t.float()[:, None] * freqs[None, :])
    sin, cos = torch.sin(angles), torch.cos(angles)
    emb = torch.cat([cos, sin] if flip_sin_to_cos else [sin, cos], dim=-1)
    if dim % 2:
        emb = F.pad(emb, (0, 1))
    return emb.to(out_dtype)


def _per_token(v: torch.Tensor) -> torch.Tensor:
    """[B, H] -> [B, 1, H]; [B, 1, H] and [B, L, H] unchanged (broadcast over L)."""
    return v[:, None, :] if v.dim() == 2 else v


def residual_gate_add(r: torch.Tensor, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """``r + gate * x`` in fp32, rounded once to the dtype of r (adaLN-zero residual)."""
    return (r.float() + _per_token(gate).float() * x.float()).to(r.dtype)


def layernorm_scale_shift(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-6,
) -> torch.Tensor:
    """``LN(x) * (1 + scale) + shift`` (adaLN modulation); LN over H with fp32 statistics and
    biased variance, affine only when weight/bias are given."""
    xf = x.float()
    mean = xf.mean(dim=-1, keepdim=True)
    var = (xf - mean).square().mean(dim=-1, keepdim=True)
    y = (xf - mean) * torch.rsqrt(var + eps)
    if weight is not None:
        y = y * weight.float()
    if bias is not None:
        y = y + bias.float()
    y = y * (1.0 + _per_token(scale).float()) + _per_token(shift).float()
    return y.to(x.dtype)


def group_norm_silu(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float = 1e-5,
    channels_last: bool = False,
) -> torch.Tensor:
    """``silu(GroupNorm(x))`` with fp32 statistics (biased variance) over C/G channels x spatial
    per sample and group; x is [N, C, *spatial], or [N, *spatial, C] with channels_last."""
    xc = x.movedim(-1, 1) if channels_last else x
    y = F.silu(F.group_norm(xc.float(), num_groups, weight.float(), bias.float(), eps))
    if channels_last:
        y = y.movedim(1, -1)
    return y.to(x.dtype)
