"""Pure-torch references of the elementwise ops: the correctness oracle and the fallback."""

from __future__ import annotations

import torch


def add_constant(x: torch.Tensor, constant: float) -> torch.Tensor:
    """x + constant, in the dtype of x (fp16/bf16 computed in fp32, rounded once; int32 wraps)."""
    if x.dtype == torch.int32:
        return x + int(constant)
    return (x.float() + constant).to(x.dtype)
