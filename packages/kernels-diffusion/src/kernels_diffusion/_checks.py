"""Argument checks shared by the diffusion ops."""

from __future__ import annotations

import torch

from kernels_jit.validation import check_tensor

FLOATS = (torch.float32, torch.float16, torch.bfloat16)


def check_modulation(op: str, name: str, v: object, x: torch.Tensor) -> None:
    """A per-sample [B, H] / [B, 1, H] or per-token [B, L, H] modulation tensor for x [B, L, H]."""
    check_tensor(op, name, v, dtypes=FLOATS, ndim=(2, 3), device=x.device)
    batch, length, hidden = x.shape
    allowed = ((batch, hidden), (batch, 1, hidden), (batch, length, hidden))
    if tuple(v.shape) not in allowed:
        raise ValueError(
            f"{op}: {name} must have shape [B, H], [B, 1, H] or [B, L, H] = "
            f"{' or '.join(map(str, allowed))}, got {tuple(v.shape)}"
        )


def check_float(op: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{op}: {name} must be a float, got {type(value).__name__}")
    return float(value)
