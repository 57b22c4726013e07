"""Pure-torch references of the communication ops: the correctness oracle and the fallback.

The all-reduce accumulates in fp32 (half inputs are upcast before the collective) and rounds once,
so every rank receives the same bits; with no process group (or world size 1) it is the identity.
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def all_reduce_fp32(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """The sum of x over the ranks of ``group``, as a new fp32 tensor."""
    total = x.to(torch.float32, copy=True).contiguous()
    if dist.is_available() and dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(total, op=dist.ReduceOp.SUM, group=group)
    return total


def custom_all_reduce(x: torch.Tensor, group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Sum over ranks, in the dtype of x."""
    return all_reduce_fp32(x, group).to(x.dtype)


def all_reduce_add_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    group: dist.ProcessGroup | None = None,
) -> None:
    """In place: ``r = allreduce(x) + residual``; ``residual = r``;
    ``x = r * rsqrt(mean(r^2) + eps) * weight`` (fp32 r and statistics, each store rounded once)."""
    r = all_reduce_fp32(x, group) + residual.float()
    normed = r * torch.rsqrt(r.square().mean(dim=-1, keepdim=True) + eps) * weight.float()
    residual.copy_(r)
    x.copy_(normed)
