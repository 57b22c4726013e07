"""Pure-torch references of the activation ops: the correctness oracle and the fallback.

Every op computes in fp32 and rounds once to the input's dtype (the CUDA kernels do the same,
so bf16/fp16 results agree up to one-ulp ties).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _halves(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    d = x.shape[-1] // 2
    x32 = x.float()
    return x32[..., :d], x32[..., d:]


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """silu(x[..., :d]) * x[..., d:] for x [..., 2d]."""
    gate, up = _halves(x)
    return (F.silu(gate) * up).to(x.dtype)


def gelu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """gelu(x[..., :d]) * x[..., d:] with GELU's exact erf form, 0.5 g (1 + erf(g / sqrt 2))."""
    gate, up = _halves(x)
    return (F.gelu(gate, approximate="none") * up).to(x.dtype)


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    """gelu(x[..., :d]) * x[..., d:] with GELU's tanh approximation."""
    gate, up = _halves(x)
    return (F.gelu(gate, approximate="tanh") * up).to(x.dtype)


def relu2(x: torch.Tensor) -> torch.Tensor:
    """relu(x)^2 (squared ReLU, as in Nemotron and Primer)."""
    r = torch.relu(x.float())
    return (r * r).to(x.dtype)
