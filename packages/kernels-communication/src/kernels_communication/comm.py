"""The per-process-group communicator that the all-reduce ops take as ``comm``."""

from __future__ import annotations

import itertools
import weakref

import torch
import torch.distributed as dist

ELIGIBLE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CUSTOM_WORLD_SIZES = (2, 4, 6, 8)
DEFAULT_MAX_SIZE = 8 << 20

_COMMS: weakref.WeakValueDictionary[int, CustomAllReduce] = weakref.WeakValueDictionary()
_IDS = itertools.count(1)


class CustomAllReduce:
    """A communicator for one tensor-parallel group, created once per group.

    The ops take it as ``comm``; a registered torch op cannot take a Python object, so each
    communicator is registered under an integer ``handle`` that the op carries instead.

    The CUDA IPC one-shot/two-shot kernels (shared buffers of ``max_size`` plus signal flags,
    exchanged through ``group``) are not built yet, so every communicator is ``disabled`` and every
    call takes the contract's fallback: ``torch.distributed.all_reduce`` on ``group`` (the identity
    when no process group is initialised or the world size is 1).

    Parameters
    ----------
    group : the torch.distributed process group (None: the default group, if initialised).
    device : the device of the tensors this communicator reduces (None: any).
    max_size : the largest message in bytes for the custom path (default 8 MiB).
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        device: torch.device | str | None = None,
        max_size: int = DEFAULT_MAX_SIZE,
    ) -> None:
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size <= 0:
            raise ValueError(f"CustomAllReduce: max_size must be a positive int, got {max_size!r}")
        self.group = group
        self.device = None if device is None else torch.device(device)
        self.max_size = max_size
        initialised = dist.is_available() and dist.is_initialized()
        if group is not None and not initialised:
            raise ValueError(
                "CustomAllReduce: a group was given but torch.distributed is not initialised"
            )
        self.world_size = dist.get_world_size(group) if initialised else 1
        self.rank = dist.get_rank(group) if initialised else 0
        if self.world_size not in CUSTOM_WORLD_SIZES:
            self.disabled_reason = f"world size {self.world_size} is not in {CUSTOM_WORLD_SIZES}"
        else:
            self.disabled_reason = (
                "the CUDA IPC kernels are not built yet (torch.distributed fallback)"
            )
        self.disabled = True
        self.closed = False
        self.handle = next(_IDS)
        _COMMS[self.handle] = self

    def should_custom_ar(self, x: torch.Tensor) -> bool:
        """Whether ``x`` would take the custom IPC path (else the torch.distributed fallback)."""
        return (
            not self.disabled
            and x.dtype in ELIGIBLE_DTYPES
            and x.is_contiguous()
            and x.numel() * x.element_size() % 16 == 0
            and x.numel() * x.element_size() <= self.max_size
        )

    def register_graph_buffers(self) -> None:
        """Exchange the IPC handles of buffers captured in CUDA graphs (collective; nothing to do
        while the communicator is disabled)."""

    def close(self) -> None:
        self.closed = True
        _COMMS.pop(self.handle, None)

    def __repr__(self) -> str:
        state = f"disabled: {self.disabled_reason}" if self.disabled else "enabled"
        return (
            f"CustomAllReduce(rank={self.rank}, world_size={self.world_size}, "
            f"max_size={self.max_size}, {state})"
        )


def lookup(handle: int) -> CustomAllReduce:
    try:
        return _COMMS[handle]
    except KeyError:
        raise ValueError(f"communication: no live CustomAllReduce with handle {handle}") from None


def check_comm(op: str, comm: object, x: torch.Tensor) -> CustomAllReduce:
    if not isinstance(comm, CustomAllReduce):
        raise TypeError(f"{op}: comm must be a CustomAllReduce, got {type(comm).__name__}")
    if comm.device is not None and x.device != comm.device:
        raise ValueError(f"{op}: x is on {x.device}, but comm serves {comm.device}")
    if comm.closed:
        raise ValueError(f"{op}: comm was closed")
    return comm
