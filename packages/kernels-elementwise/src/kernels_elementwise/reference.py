"""Pure-torch references of the elementwise ops: the correctness oracle and the fallback."""

from __future__ import annotations

import torch


def add_constant(x: torch.Tensor, constant: float) -> torch.Tensor:
    """x + constant, in the dtype of x (fp16/bf16 computed in fp32, rounded once; int32 wraps)."""
    if x.dtype == torch.int32:
        return x + int(constant)
    return (x.float() + constant).to(x.dtype)


def softcap(x: torch.Tensor, cap: float, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    """cap * tanh(x / cap), computed in fp32, in ``out_dtype`` (default: x's dtype)."""
    return (torch.tanh(x.float() / cap) * cap).to(out_dtype or x.dtype)


def sigmoid_mul(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(gate) in x's shape and dtype. x [T, H, D] or [T, H * D]; gate [T, H, D] or
    [T, H, 1] (one gate per head, broadcast over D), or x's shape."""
    x32 = x.float()
    if x.dim() == 2 and gate.dim() == 3:
        x32 = x32.reshape(gate.shape[0], gate.shape[1], -1)
    return (x32 * torch.sigmoid(gate.float())).reshape(x.shape).to(x.dtype)


def gate_sigmoid_mul_add(
    h: torch.Tensor, w: torch.Tensor, shared: torch.Tensor, routed: torch.Tensor | None = None
) -> torch.Tensor:
    """sigmoid(h @ w)[:, None] * shared (+ routed), in shared's dtype. h [T, K], w [K] (or the
    [1, K] weight of a one-output linear), shared and routed [T, H]."""
    gate = torch.sigmoid(h.float() @ w.float().reshape(-1))
    out = gate[:, None] * shared.float()
    if routed is not None:
        out = out + routed.float()
    return out.to(shared.dtype)


def _rms(v: torch.Tensor, eps: float) -> torch.Tensor:
    return v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)


def fused_dual_residual_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight1: torch.Tensor,
    weight2: torch.Tensor,
    eps: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, mid) with mid = residual + rms(x) * weight1 and out = rms(mid) * weight2.

    mid is computed in fp32 and rounded once to x's dtype: it is the new residual stream, so the
    second norm reads the rounded mid, exactly what a separate rmsnorm of the stored mid computes.
    """
    mid = (residual.float() + _rms(x.float(), eps) * weight1.float()).to(x.dtype)
    out = (_rms(mid.float(), eps) * weight2.float()).to(x.dtype)
    return out, mid
