"""communication.all_reduce_add_rmsnorm: all-reduce fused with the residual add and RMSNorm.

Backends: ``cuda``, one kernel per call: the one-shot (or row-split two-shot) all-reduce over the
communicator's IPC buffers, summed in fp32 in rank order (the sum custom_all_reduce rounds), plus
the residual, stored once, and RMSNorm of that fp32 row (world size 1: add + RMSNorm); and the
torch reference (fp32 torch.distributed.all_reduce, then the same fp32 add and norm), the
fallback for calls the kernel cannot take.
"""

from __future__ import annotations

import torch

from kernels_communication import reference
from kernels_communication.comm import (
    COMM_CUDA,
    ELIGIBLE_DTYPES,
    CustomAllReduce,
    check_comm,
    lookup,
)
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_tensor

OP_ID = "communication.all_reduce_add_rmsnorm"


def _all_reduce_add_rmsnorm_torch(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, comm_handle: int
) -> None:
    reference.all_reduce_add_rmsnorm(x, residual, weight, eps, lookup(comm_handle).group)


_kernel = CompiledFunction(COMM_CUDA, "all_reduce_add_rmsnorm")
FUSED_MAX_PACKS = 4 * 512  # 16-byte packs per row the kernel keeps in registers


def _all_reduce_add_rmsnorm_cuda(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, comm_handle: int
) -> None:
    comm = lookup(comm_handle)
    if comm.world_size == 1:
        _kernel(x, residual, weight, eps, comm.world1_state(x.get_device()), 0, -1, 1)
        return
    comm.check()
    # x is overwritten in place: it always goes through the staging buffer, never registered.
    _kernel(x, residual, weight, eps, comm._state, comm._staging_slot, comm.algo, comm.max_blocks)


def _all_reduce_add_rmsnorm_cuda_eligible(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float, comm_handle: int
) -> str | None:
    comm = lookup(comm_handle)
    if comm.world_size == 1:
        if not x.is_cuda:
            return "x is not on a CUDA device"
    else:
        reason = comm.ineligible(x)
        if reason is not None:
            return reason
    if not (x.is_contiguous() and residual.is_contiguous() and weight.is_contiguous()):
        return "needs contiguous x, residual and weight"
    if weight.dtype != x.dtype:
        return "needs weight in the dtype of x"
    row = x.shape[1] * x.element_size()
    if row % 16 or row // 16 > FUSED_MAX_PACKS:
        return "needs rows of whole 16-byte packs, at most 32 KiB"
    if (x.data_ptr() | residual.data_ptr() | weight.data_ptr()) % 16:
        return "needs 16-byte aligned x, residual and weight"
    return None


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
    comm = sample_comm()
    samples = []
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        x = torch.randn(5, 256, generator=g).to(dtype).to(device)
        residual = torch.randn(5, 256, generator=g).to(dtype).to(device)
        weight = torch.randn(256, generator=g).to(dtype).to(device)
        samples.append(((x, residual, weight, 1e-6, comm), {}))
    return samples
