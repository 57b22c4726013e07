"""Pure-torch references of the layernorm group: the correctness oracle and the fallback.

Every reference computes its statistics and the normalisation in fp32 and rounds the output to
the input dtype once, as the CUDA kernels do. They are functional (return new tensors); the torch
backends of the in-place ops copy the results back.
"""

from __future__ import annotations

import torch


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x * rsqrt(mean(x^2, -1) + eps) * weight``."""
    xf = x.float()
    rstd = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    return (xf * rstd * weight.float()).to(x.dtype)


def gemma_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x * rsqrt(mean(x^2, -1) + eps) * (1 + weight)`` (Gemma stores the weight minus one)."""
    xf = x.float()
    rstd = torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps)
    return (xf * rstd * (weight.float() + 1.0)).to(x.dtype)


def residual_sum(x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
    """``x + residual`` in fp32, rounded once to the dtype: the value the fused ops store into
    ``residual`` and then normalise."""
    return (x.float() + residual.float()).to(x.dtype)


def fused_add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = x + residual`` (rounded to the dtype); returns ``(rmsnorm(s) * weight, s)``.

    The normalisation reads the rounded ``s``, so the fused op equals the unfused
    ``residual = x + residual; x = rmsnorm(residual, weight)``.
    """
    s = residual_sum(x, residual)
    return rmsnorm(s, weight, eps), s


def gemma_fused_add_rmsnorm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`fused_add_rmsnorm` with the Gemma weight ``1 + weight``."""
    s = residual_sum(x, residual)
    return gemma_rmsnorm(s, weight, eps), s


def qk_rmsnorm(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RMSNorm of every head of q [T, Hq, D] and k [T, Hk, D] over D."""
    return rmsnorm(q, q_weight, eps), rmsnorm(k, k_weight, eps)


def layernorm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
) -> torch.Tensor:
    """``(x - mean) * rsqrt(var + eps) * weight + bias`` over the last dim (biased variance)."""
    xf = x.float()
    centered = xf - xf.mean(-1, keepdim=True)
    rstd = torch.rsqrt(centered.square().mean(-1, keepdim=True) + eps)
    y = centered * rstd * weight.float()
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype)
