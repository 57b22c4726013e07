"""communication.all_reduce_add_rmsnorm: all-reduce fused with the residual add and RMSNorm.

Backends: the torch reference only: torch.distributed.all_reduce in fp32 (the identity
without a group).
"""

from __future__ import annotations

import torch

from kernels_communication import reference
from kernels_communication.comm import ELIGIBLE_DTYPES, CustomAllReduce, check_comm, lookup
from kernels_jit.dispatch import Op
from kernels_jit.validation import check_tensor

OP_ID = "communication.all_reduce_add_rmsnorm"


def _all_reduce_add_rmsnorm_torch(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, comm_handle: int
) -> None:
    reference.all_reduce_add_rmsnorm(x, residual, weight, eps, lookup(comm_handle).group)


ALL_REDUCE_ADD_RMSNORM = Op(_all_reduce_add_rmsnorm_torch, mutates=("x", "residual"), device="x")


def all_reduce_add_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    comm: CustomAllReduce,
    *,
    backend: str | None = None,
) -> None:
    """In place: ``r = allreduce(x) + residual``; ``residual = r``;
    ``x = r * rsqrt(mean(r^2) + eps) * weight``, with r and the statistics in fp32 (as
    fused_add_rmsnorm). Collective: every rank of ``comm``'s group must call it.

    Parameters
    ----------
    x : [T, H] float32, float16 or bfloat16, this rank's partial sum; receives the normed output.
    residual : [T, H], same dtype; receives r.
    weight : [H].
    eps : added to the mean square.
    comm : the group's :class:`CustomAllReduce`.
    """
    check_tensor(OP_ID, "x", x, dtypes=ALL_REDUCE_ADD_RMSNORM.dtypes, ndim=2)
    check_tensor(OP_ID, "residual", residual, dtypes=(x.dtype,), ndim=2, device=x.device)
    if residual.shape != x.shape:
        raise ValueError(
            f"{OP_ID}: residual must have the shape of x {tuple(x.shape)}, "
            f"got {tuple(residual.shape)}"
        )
    check_tensor(OP_ID, "weight", weight, dtypes=ELIGIBLE_DTYPES, ndim=1, device=x.device)
    if weight.shape[0] != x.shape[1]:
        raise ValueError(
            f"{OP_ID}: weight must have H = {x.shape[1]} entries, got {weight.shape[0]}"
        )
    if isinstance(eps, bool) or not isinstance(eps, (int, float)):
        raise TypeError(f"{OP_ID}: eps must be a float, got {type(eps).__name__}")
    comm = check_comm(OP_ID, comm, x)
    if x.numel():
        ALL_REDUCE_ADD_RMSNORM.run(x, residual, weight, float(eps), comm.handle, backend=backend)


def _all_reduce_add_rmsnorm_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check`` (single process: add + RMSNorm)."""
    from kernels_communication.ops.custom_all_reduce import sample_comm

    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 256, generator=g).to(torch.bfloat16).to(device)
    residual = torch.randn(5, 256, generator=g).to(torch.bfloat16).to(device)
    weight = torch.randn(256, generator=g).to(device)
    return [((x, residual, weight, 1e-6, sample_comm()), {})]
