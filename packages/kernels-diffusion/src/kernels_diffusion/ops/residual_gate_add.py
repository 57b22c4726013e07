"""diffusion.residual_gate_add: ``r + gate * x``, the gated residual of adaLN-zero blocks.

Backends: the pure-torch reference only (fp32 math, rounded once).
"""

from __future__ import annotations

import torch

from kernels_diffusion import reference
from kernels_diffusion._checks import FLOATS, check_modulation
from kernels_jit.dispatch import Op
from kernels_jit.validation import check_out, check_tensor

OP_ID = "diffusion.residual_gate_add"


def _residual_gate_add_torch(
    out: torch.Tensor, r: torch.Tensor, x: torch.Tensor, gate: torch.Tensor
) -> None:
    out.copy_(reference.residual_gate_add(r, x, gate))


RESIDUAL_GATE_ADD = Op(_residual_gate_add_torch, mutates=("out",), device="r")


def residual_gate_add(
    r: torch.Tensor,
    x: torch.Tensor,
    gate: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """``r + gate * x`` in fp32, rounded once to the dtype of r.

    Parameters
    ----------
    r : [B, L, H] float32, float16 or bfloat16 (the residual stream).
    x : [B, L, H] (the block output), any of those dtypes.
    gate : [B, H] or [B, 1, H] (per sample) or [B, L, H] (per token).
    out : optional destination like r; may be r itself (in place).
    """
    check_tensor(OP_ID, "r", r, dtypes=FLOATS, ndim=3)
    check_tensor(OP_ID, "x", x, dtypes=FLOATS, ndim=3, device=r.device)
    if x.shape != r.shape:
        raise ValueError(
            f"{OP_ID}: x must have the shape of r {tuple(r.shape)}, got {tuple(x.shape)}"
        )
    check_modulation(OP_ID, "gate", gate, r)
    if out is None:
        out = torch.empty_like(r, memory_format=torch.contiguous_format)
    else:
        check_out(OP_ID, out, like=r)
    if r.numel():
        RESIDUAL_GATE_ADD.run(out, r, x, gate, backend=backend)
    return out


def _residual_gate_add_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: each gate layout, bf16 with an fp32 gate."""
    g = torch.Generator().manual_seed(0)
    r = torch.randn(2, 9, 40, generator=g).to(torch.bfloat16)
    x = torch.randn(2, 9, 40, generator=g).to(torch.bfloat16)
    return [
        ((r.to(device), x.to(device), torch.randn(2, 40, generator=g).to(device)), {}),
        ((r.to(device), x.to(device), torch.randn(2, 1, 40, generator=g).to(device)), {}),
        ((r.float().to(device), x.float().to(device), torch.randn(2, 9, 40).to(device)), {}),
    ]
