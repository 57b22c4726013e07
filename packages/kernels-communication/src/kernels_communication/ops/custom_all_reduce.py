"""communication.custom_all_reduce: single-node all-reduce with a torch.distributed fallback.

Backends: ``cuda`` (the communicator's one-shot/two-shot IPC kernel; world size 1: a copy) and
the torch reference, torch.distributed.all_reduce in fp32 (the identity without a group), which
is also the contract's fallback for calls the custom path cannot take (disabled communicator,
message over max_size, non-contiguous or unaligned x).
"""

from __future__ import annotations

import torch

from kernels_communication import reference
from kernels_communication.comm import COMM_CUDA, CustomAllReduce, check_comm, lookup
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_out, check_tensor

OP_ID = "communication.custom_all_reduce"


def _custom_all_reduce_torch(out: torch.Tensor, x: torch.Tensor, comm_handle: int) -> None:
    out.copy_(reference.custom_all_reduce(x, lookup(comm_handle).group))


_kernel = CompiledFunction(COMM_CUDA, "custom_all_reduce")


def _custom_all_reduce_cuda(out: torch.Tensor, x: torch.Tensor, comm_handle: int) -> None:
    comm = lookup(comm_handle)
    if comm.world_size == 1:
        out.copy_(x)
        return
    comm.check()
    _kernel(out, x, comm._state, comm.slot(x), comm.algo, comm.max_blocks)


def _custom_all_reduce_cuda_eligible(
    out: torch.Tensor, x: torch.Tensor, comm_handle: int
) -> str | None:
    comm = lookup(comm_handle)
    reason = comm.ineligible(x)
    if reason is None and comm.world_size > 1 and (not out.is_contiguous() or out.data_ptr() % 16):
        return "out is not contiguous and 16-byte aligned"
    return reason


CUSTOM_ALL_REDUCE = Op(_custom_all_reduce_torch, mutates=("out",), device="x")


def custom_all_reduce(
    x: torch.Tensor,
    comm: CustomAllReduce,
    *,
    out: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """The sum of x over the ranks of ``comm``'s group (out of place), accumulated in fp32 and
    rounded once, bit-identical on every rank. Messages the custom path cannot take fall back to
    torch.distributed; callers never branch. Collective: every rank must call it.

    Parameters
    ----------
    x : any shape, float32, float16 or bfloat16.
    comm : the group's :class:`CustomAllReduce`.
    out : optional destination like x (must not alias x).
    """
    check_tensor(OP_ID, "x", x, dtypes=CUSTOM_ALL_REDUCE.dtypes)
    comm = check_comm(OP_ID, comm, x)
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    else:
        check_out(OP_ID, out, like=x)
    if x.numel():
        CUSTOM_ALL_REDUCE.run(out, x, comm.handle, backend=backend)
    return out


_SAMPLE_COMMS: dict[str, CustomAllReduce] = {}


def sample_comm() -> CustomAllReduce:
    """One communicator on the default group, kept alive for the samples of both ops."""
    if "default" not in _SAMPLE_COMMS:
        _SAMPLE_COMMS["default"] = CustomAllReduce()
    return _SAMPLE_COMMS["default"]


def _custom_all_reduce_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check`` (single process: the identity)."""
    g = torch.Generator().manual_seed(0)
    comm = sample_comm()
    return [
        ((torch.randn(4, 1024, generator=g).to(torch.bfloat16).to(device), comm), {}),
        ((torch.randn(2, 512, generator=g).to(torch.float16).to(device), comm), {}),
        ((torch.randn(3, 333, generator=g).to(device), comm), {}),
    ]
