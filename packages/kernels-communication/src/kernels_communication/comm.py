"""The per-process-group communicator that the all-reduce ops take as ``comm``.

``CustomAllReduce(group, device, max_size)`` sets up the CUDA IPC path once per tensor-parallel
group: every rank allocates one region (signal flags, a staging buffer of ``max_size`` bytes and
a tmp buffer of twice that), exchanges its ``cudaIpcMemHandle`` through ``group`` (any backend:
gloo or NCCL) and opens its peers'. Every decision is collective: the ranks gather what each of
them found (world size, device, peer access, a failed allocation or open) and all take the same
path, so no rank waits on a kernel that a peer never launches.

The custom path is off (``disabled``, with ``disabled_reason``) when the world size is not in
{2, 4, 6, 8}, the ranks span hosts, a pair of devices lacks peer access, or setting up failed on
any rank; every call then takes the contract's fallback, ``torch.distributed.all_reduce`` in
fp32 on ``group``. World size 1 needs no peers: the all-reduce is a copy.

CUDA graphs: a call captured in a graph takes a slot of a device pointer table; until
``register_graph_buffers()`` (collective, after capture) the slot points at the staging buffers
(the kernel copies x in), afterwards at x itself and its peers' mappings (no copy).

A barrier that waits longer than ``timeout_s`` for a peer (a rank raised or died
mid-collective) records the peer in a host-mapped error word, aborts this rank's communicator
and returns; the next call on it (or :meth:`CustomAllReduce.check`) raises
:class:`CommunicationError`.

No global state beyond a weak registry of live communicators by handle (a registered torch op
cannot take a Python object, so the ops carry the communicator's integer ``handle``).
"""

from __future__ import annotations

import ctypes
import itertools
import os
import socket
import weakref

import torch
import torch.distributed as dist

from kernels_jit import ModuleSpec
from kernels_jit.loader import CompiledFunction

ELIGIBLE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
CUSTOM_WORLD_SIZES = (2, 4, 6, 8)
DEFAULT_MAX_SIZE = 8 << 20
DEFAULT_MAX_BLOCKS = 36
DEFAULT_TIMEOUT_S = 30.0
MAX_RANKS = 8
SLOT_BYTES = 8 * MAX_RANKS  # one RankPtrs: an input pointer per rank
IPC_HANDLE_BYTES = 64
PHASES = ("start", "mid", "end")

COMM_CUDA = ModuleSpec(
    name="custom_all_reduce",
    package="kernels_communication",
    sources=("csrc/custom_all_reduce.cuh",),
    exports=(
        ("custom_all_reduce", "custom_all_reduce"),
        ("all_reduce_add_rmsnorm", "all_reduce_add_rmsnorm"),
        ("car_signal_bytes", "car_signal_bytes"),
        ("car_malloc", "car_malloc"),
        ("car_free", "car_free"),
        ("car_host_alloc", "car_host_alloc"),
        ("car_host_free", "car_host_free"),
        ("car_ipc_handle", "car_ipc_handle"),
        ("car_ipc_open", "car_ipc_open"),
        ("car_ipc_close", "car_ipc_close"),
        ("car_h2d", "car_h2d"),
        ("car_create", "car_create"),
        ("car_destroy", "car_destroy"),
    ),
    description="CUDA: one-shot/two-shot all-reduce over IPC buffers, fused add + RMSNorm",
)

_COMMS: weakref.WeakValueDictionary[int, CustomAllReduce] = weakref.WeakValueDictionary()
_IDS = itertools.count(1)


class CommunicationError(RuntimeError):
    """A collective could not complete (a peer left it); the communicator is aborted."""


def _fn(name: str):
    return CompiledFunction(COMM_CUDA, name).resolve()


def one_shot(world: int, nbytes: int) -> bool:
    """Whether the automatic choice takes the one-shot algorithm (vLLM's REDUCE_CASE split)."""
    if world == 2:
        return True
    return (world <= 4 and nbytes < 512 * 1024) or (world <= 8 and nbytes < 256 * 1024)


def decide(infos: list[dict]) -> str | None:
    """The joint verdict of every rank's local findings (the same on every rank): None when the
    custom path can run, else why not. Pure: tested on the CPU."""
    world = len(infos)
    if world not in CUSTOM_WORLD_SIZES:
        return f"world size {world} is not in {CUSTOM_WORLD_SIZES}"
    for rank, info in enumerate(infos):
        if info.get("reason"):
            return f"rank {rank}: {info['reason']}"
    if len({info["host"] for info in infos}) > 1:
        return "the ranks span more than one host"
    devices = [(info["visible"], info["device"]) for info in infos]
    if len(set(devices)) < world:
        return "two ranks share a device"
    if len({info["visible"] for info in infos}) == 1:
        for rank, info in enumerate(infos):
            missing = [
                peer for peer in range(world) if peer != rank and not info["peer_access"][peer]
            ]
            if missing:
                return f"rank {rank} has no peer access to ranks {missing}"
    return None


class CustomAllReduce:
    """A communicator for one tensor-parallel group, created once per group (collective).

    Parameters
    ----------
    group : the torch.distributed process group (None: the default group, if initialised).
    device : the CUDA device of this rank's tensors (None: the current CUDA device when the
        custom path is possible, else any device).
    max_size : the largest message in bytes for the custom path (default 8 MiB); larger ones
        take the torch.distributed fallback.
    timeout_s : how long a barrier waits for a peer before aborting (0: forever).
    max_blocks : CTAs per call (at most 64); every rank must use the same value.
    max_graph_inputs : pointer-table slots for calls captured in CUDA graphs.
    """

    def __init__(
        self,
        group: dist.ProcessGroup | None = None,
        device: torch.device | str | int | None = None,
        max_size: int = DEFAULT_MAX_SIZE,
        *,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        max_blocks: int = DEFAULT_MAX_BLOCKS,
        max_graph_inputs: int = 4096,
    ) -> None:
        if isinstance(max_size, bool) or not isinstance(max_size, int) or max_size <= 0:
            raise ValueError(f"CustomAllReduce: max_size must be a positive int, got {max_size!r}")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or timeout_s < 0:
            raise ValueError(f"CustomAllReduce: timeout_s must be a float >= 0, got {timeout_s!r}")
        if (
            isinstance(max_blocks, bool)
            or not isinstance(max_blocks, int)
            or not (1 <= max_blocks <= 64)
        ):
            raise ValueError(f"CustomAllReduce: max_blocks must be in [1, 64], got {max_blocks!r}")
        self._init_fields(max_size, timeout_s, max_blocks, max_graph_inputs)
        initialised = dist.is_available() and dist.is_initialized()
        if group is not None and not initialised:
            raise ValueError(
                "CustomAllReduce: a group was given but torch.distributed is not initialised"
            )
        self.group = group
        self.world_size = dist.get_world_size(group) if initialised else 1
        self.rank = dist.get_rank(group) if initialised else 0
        if isinstance(device, int):
            device = torch.device("cuda", device)
        self.device = None if device is None else torch.device(device)
        if self.world_size not in CUSTOM_WORLD_SIZES:
            self.disabled_reason = f"world size {self.world_size} is not in {CUSTOM_WORLD_SIZES}"
            return
        if self.device is None and torch.cuda.is_available():
            self.device = torch.device("cuda", torch.cuda.current_device())
        self.disabled_reason = self._set_up()

    def _init_fields(self, max_size, timeout_s, max_blocks, max_graph_inputs) -> None:
        self.max_size = max_size
        self.timeout_s = float(timeout_s)
        self.max_blocks = max_blocks
        self.max_graph_inputs = max(1, int(max_graph_inputs))
        self.algo = -1  # -1 automatic, 0 one-shot, 1 two-shot (tests and benchmarks)
        self.closed = False
        self.aborted: str | None = None
        self._state = 0
        self._region = 0
        self._slots = 0
        self._staging_slot = 0
        self._error_host = 0
        self._owned_regions: list[int] = []
        self._opened: dict[bytes, int] = {}
        self._pending: list[tuple[int, int]] = []
        self._next_slot = 1
        self._world1_states: dict[int, int] = {}
        self.handle = next(_IDS)
        _COMMS[self.handle] = self

    @property
    def disabled(self) -> bool:
        """Whether the custom IPC path is off (every call of world size > 1 falls back)."""
        return self.disabled_reason is not None

    # ---- set-up (collective) ------------------------------------------------------------

    def _all_gather(self, obj: object) -> list:
        gathered: list = [None] * self.world_size
        dist.all_gather_object(gathered, obj, group=self.group)
        return gathered

    def _local_info(self) -> dict:
        info: dict = {
            "host": socket.gethostname(),
            "visible": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "device": -1,
            "peer_access": [],
            "reason": None,
        }
        if self.device is None or self.device.type != "cuda":
            info["reason"] = f"the device is {self.device}, not CUDA"
            return info
        if self.max_size % 16:
            info["reason"] = "max_size is not a multiple of 16 bytes"
            return info
        index = self.device.index if self.device.index is not None else 0
        self.device = torch.device("cuda", index)
        info["device"] = index
        try:
            count = torch.cuda.device_count()
            info["peer_access"] = [
                i == index or torch.cuda.can_device_access_peer(index, i) for i in range(count)
            ]
        except Exception as exc:
            info["reason"] = f"peer access query failed: {exc}"
        return info

    def _set_up(self) -> str | None:
        infos = self._all_gather(self._local_info())
        # peer_access is indexed by device; re-index it by rank for decide()
        for info in infos:
            if not info.get("reason"):
                access = info["peer_access"]
                info["peer_access"] = [
                    0 <= other["device"] < len(access) and access[other["device"]]
                    for other in infos
                ]
        reason = decide(infos)
        if reason is not None:
            return reason
        # Local resources: the module (loaded before any kernel, so no rank spins while a peer
        # compiles), the region, its handle.
        local: dict = {"error": None, "handle": None}
        try:
            self._allocate()
            handle = torch.zeros(IPC_HANDLE_BYTES, dtype=torch.uint8)
            offset = _fn("car_ipc_handle")(self.device.index, self._region, handle)
            local["handle"] = (bytes(handle.tolist()), offset)
        except Exception as exc:
            local["error"] = f"{type(exc).__name__}: {exc}"
        gathered = self._all_gather(local)
        failed = [(r, g["error"]) for r, g in enumerate(gathered) if g["error"]]
        if failed:
            self._release()
            return f"set-up failed on rank {failed[0][0]}: {failed[0][1]}"
        bases: list[int] = []
        error = None
        try:
            for r, g in enumerate(gathered):
                if r == self.rank:
                    bases.append(self._region)
                else:
                    handle_bytes, offset = g["handle"]
                    bases.append(self._open(handle_bytes) + offset)
            self._create_state(bases)
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        verdicts = self._all_gather(error)
        failed = [(r, e) for r, e in enumerate(verdicts) if e]
        if failed:
            self._release()
            return f"opening peer buffers failed on rank {failed[0][0]}: {failed[0][1]}"
        return None

    def _layout(self) -> tuple[int, int, int]:
        """(signal bytes, staging offset, tmp offset) of a region."""
        signal = _fn("car_signal_bytes")()
        return signal, signal, signal + self.max_size

    def _region_bytes(self) -> int:
        _, _, tmp = self._layout()
        return tmp + 2 * self.max_size

    def _allocate(self) -> None:
        index = self.device.index
        self._region = _fn("car_malloc")(index, self._region_bytes())
        self._owned_regions.append(self._region)
        self._slots = _fn("car_malloc")(index, SLOT_BYTES * self.max_graph_inputs)
        self._error_host = _fn("car_host_alloc")(16)

    def _open(self, handle_bytes: bytes) -> int:
        base = self._opened.get(handle_bytes)
        if base is None:
            handle = torch.tensor(list(handle_bytes), dtype=torch.uint8)
            base = self._opened[handle_bytes] = _fn("car_ipc_open")(self.device.index, handle)
        return base

    def _create_state(self, bases: list[int]) -> None:
        """Builds the C++ state from every rank's region base and fills every slot with the
        staging pointers (the copy path)."""
        _, staging, tmp = self._layout()
        sigs = torch.tensor(bases, dtype=torch.int64)
        tmps = torch.tensor([b + tmp for b in bases], dtype=torch.int64)
        self._state = _fn("car_create")(
            self.device.index,
            self.rank,
            self.world_size,
            sigs,
            tmps,
            self._error_host,
            self.timeout_s,
            self.max_size,
        )
        self._staging_ptrs = [b + staging for b in bases]
        table = torch.zeros(self.max_graph_inputs, MAX_RANKS, dtype=torch.int64)
        table[:, : self.world_size] = torch.tensor(self._staging_ptrs, dtype=torch.int64)
        _fn("car_h2d")(self.device.index, self._slots, table)
        self._staging_slot = self._slots

    def _release(self) -> None:
        """Frees what this rank set up (after a failed set-up, or on close)."""
        index = None if self.device is None else self.device.index
        try:
            if self._state:
                _fn("car_destroy")(self._state)
            for base in self._opened.values():
                _fn("car_ipc_close")(index, base)
            for region in self._owned_regions:
                _fn("car_free")(index, region)
            if self._slots:
                _fn("car_free")(index, self._slots)
            if self._error_host:
                _fn("car_host_free")(self._error_host)
            for state in self._world1_states.values():
                _fn("car_destroy")(state)
        finally:
            self._state = self._region = self._slots = self._error_host = 0
            self._staging_slot = 0
            self._opened.clear()
            self._owned_regions.clear()
            self._world1_states.clear()

    # ---- per call -----------------------------------------------------------------------

    def check(self, sync: bool = False) -> None:
        """Raises :class:`CommunicationError` if a barrier of this rank timed out (``sync``:
        wait for the device first, so the last call is checked too)."""
        if self.aborted:
            raise CommunicationError(self.aborted)
        if not self._error_host:
            return
        if sync and self.device is not None:
            torch.cuda.synchronize(self.device)
        if ctypes.c_uint32.from_address(self._error_host).value:
            peer = ctypes.c_uint32.from_address(self._error_host + 4).value
            phase = ctypes.c_uint32.from_address(self._error_host + 8).value
            self.aborted = (
                f"communication: rank {self.rank} of {self.world_size} waited more than "
                f"{self.timeout_s} s for rank {peer} at the {PHASES[min(phase, 2)]} barrier: a "
                "peer left the collective (it raised, died or issued different calls); this "
                "communicator is aborted, create a new one"
            )
            raise CommunicationError(self.aborted)

    def slot(self, x: torch.Tensor) -> int:
        """The pointer-table slot of a call on x (a new graph slot while capturing)."""
        if not torch.cuda.is_current_stream_capturing():
            return self._staging_slot
        if self._next_slot >= self.max_graph_inputs:
            return self._staging_slot
        index = self._next_slot
        self._next_slot += 1
        self._pending.append((index, x.data_ptr()))
        return self._slots + index * SLOT_BYTES

    def world1_state(self, device_index: int) -> int:
        state = self._world1_states.get(device_index)
        if state is None:
            zeros = torch.zeros(1, dtype=torch.int64)
            state = _fn("car_create")(device_index, 0, 1, zeros, zeros, 0, 0.0, self.max_size)
            self._world1_states[device_index] = state
        return state

    def should_custom_ar(self, x: torch.Tensor) -> bool:
        """Whether ``x`` would take the custom IPC path (else the torch.distributed fallback)."""
        return self.ineligible(x) is None and self.world_size > 1

    def ineligible(self, x: torch.Tensor) -> str | None:
        """Why a call on x cannot take the custom path (None: it can)."""
        if self.closed:
            return "the communicator is closed"
        if self.world_size == 1:
            return None if x.is_cuda else "x is not on a CUDA device"
        if self.disabled:
            return f"the communicator is disabled ({self.disabled_reason})"
        if x.device != self.device:
            return "x is not on the communicator's device"
        if x.dtype not in ELIGIBLE_DTYPES:
            return "the dtype is not float32, float16 or bfloat16"
        if not x.is_contiguous():
            return "x is not contiguous"
        nbytes = x.numel() * x.element_size()
        if nbytes % 16 or x.data_ptr() % 16:
            return "x is not whole 16-byte packs at a 16-byte aligned address"
        if nbytes > self.max_size:
            return "the message exceeds max_size"
        return None

    # ---- CUDA graphs --------------------------------------------------------------------

    def register_graph_buffers(self) -> None:
        """Exchange the IPC handles of the inputs of calls captured since the last registration
        (collective: every rank calls it after the same captures). A rank that cannot share a
        buffer (expandable segments) leaves every rank's slots on the copy path."""
        if self.world_size == 1 or self.disabled or self.group is False:
            self._pending.clear()
            return
        meta: dict = {"error": None, "buffers": []}
        try:
            handle = torch.zeros(IPC_HANDLE_BYTES, dtype=torch.uint8)
            for _, ptr in self._pending:
                offset = _fn("car_ipc_handle")(self.device.index, ptr, handle)
                meta["buffers"].append((bytes(handle.tolist()), offset))
        except Exception as exc:
            meta["error"] = f"{type(exc).__name__}: {exc}"
        gathered = self._all_gather(meta)
        error = next((g["error"] for g in gathered if g["error"]), None)
        if error is None and len({len(g["buffers"]) for g in gathered}) != 1:
            error = "the ranks captured different numbers of calls"
        if error is None:
            for k, (index, ptr) in enumerate(self._pending):
                ptrs = []
                for r, g in enumerate(gathered):
                    handle_bytes, offset = g["buffers"][k]
                    ptrs.append(ptr if r == self.rank else self._open(handle_bytes) + offset)
                self.fill_slot(index, ptrs)
        self._pending.clear()
        if error is not None:
            import warnings

            warnings.warn(
                f"CustomAllReduce.register_graph_buffers: {error}; captured calls keep "
                "copying their inputs",
                RuntimeWarning,
                stacklevel=2,
            )

    def fill_slot(self, index: int, ptrs: list[int]) -> None:
        row = torch.zeros(MAX_RANKS, dtype=torch.int64)
        row[: len(ptrs)] = torch.tensor(ptrs, dtype=torch.int64)
        _fn("car_h2d")(self.device.index, self._slots + index * SLOT_BYTES, row)

    # ---- teardown -----------------------------------------------------------------------

    def close(self) -> None:
        """Frees the buffers (collective where the custom path is on: every rank's last reads
        of its peers' buffers finish before anyone frees)."""
        if self.closed:
            return
        self.closed = True
        _COMMS.pop(self.handle, None)
        if self._state or self._world1_states:
            if self.device is not None and self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            if self._state and self.group is not False and dist.is_initialized():
                dist.barrier(group=self.group)
            self._release()

    def __enter__(self) -> CustomAllReduce:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = f"disabled: {self.disabled_reason}" if self.disabled else "enabled"
        return (
            f"CustomAllReduce(rank={self.rank}, world_size={self.world_size}, "
            f"max_size={self.max_size}, {state})"
        )

    # ---- one process, several ranks (tests on one GPU) ----------------------------------

    @classmethod
    def loopback(
        cls,
        world: int,
        device: torch.device | str | int = "cuda",
        max_size: int = 1 << 20,
        *,
        timeout_s: float = 10.0,
        max_blocks: int = 8,
    ) -> list[CustomAllReduce]:
        """``world`` communicators of one process on one device, sharing their regions directly
        (no IPC): rank r's calls run on their own stream, concurrently with the others'. For
        testing the kernels' protocol on one GPU; every rank's grid must fit on the device at
        once (keep ``world * max_blocks`` small)."""
        if world not in CUSTOM_WORLD_SIZES:
            raise ValueError(f"loopback: world must be in {CUSTOM_WORLD_SIZES}, got {world}")
        comms = []
        for rank in range(world):
            c = cls.__new__(cls)
            c._init_fields(max_size, timeout_s, max_blocks, 256)
            c.group = False  # no process group: collectives are driven by the caller
            c.world_size, c.rank = world, rank
            c.device = torch.device(device) if not isinstance(device, int) else None
            if c.device is None or c.device.index is None:
                c.device = torch.device("cuda", device if isinstance(device, int) else 0)
            c._allocate()
            comms.append(c)
        bases = [c._region for c in comms]
        for c in comms:
            c._create_state(bases)
            c.disabled_reason = None
        return comms

    @staticmethod
    def loopback_register(comms: list[CustomAllReduce]) -> None:
        """register_graph_buffers for loopback communicators (every rank at once)."""
        counts = {len(c._pending) for c in comms}
        if len(counts) != 1:
            raise ValueError("loopback_register: the ranks captured different numbers of calls")
        for k in range(counts.pop()):
            ptrs = [c._pending[k][1] for c in comms]
            for c in comms:
                c.fill_slot(c._pending[k][0], ptrs)
        for c in comms:
            c._pending.clear()


def lookup(handle: int) -> CustomAllReduce:
    try:
        return _COMMS[handle]
    except KeyError:
        raise ValueError(f"communication: no live CustomAllReduce with handle {handle}") from None


def check_comm(op: str, comm: object, x: torch.Tensor) -> CustomAllReduce:
    if not isinstance(comm, CustomAllReduce):
        raise TypeError(f"{op}: comm must be a CustomAllReduce, got {type(comm).__name__}")
    if comm.device is not None and comm.world_size > 1 and x.device != comm.device:
        raise ValueError(f"{op}: x is on {x.device}, but comm serves {comm.device}")
    if comm.device is not None and comm.world_size == 1 and x.device.type != comm.device.type:
        raise ValueError(f"{op}: x is on {x.device}, but comm serves {comm.device}")
    if comm.closed:
        raise ValueError(f"{op}: comm was closed")
    comm.check()
    return comm
