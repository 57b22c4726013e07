"""kv_canary.kv_canary_write: record a hash-chained canary for every KV slot just written.

CUDA (csrc/kv_canary_write.cuh): the chains (a thread per request, cheap) then the KV hashes in
parallel (one thread per entry and source, 16-byte loads): one launch for N <= 128 entries, two
above (the chains go through an int64 workspace [N] allocated here). Bit for bit with the
pure-torch reference (uint64 emulated on int64), which remains the CPU backend.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_same_device, check_tensor
from kernels_kv_canary import reference
from kernels_kv_canary.sources import KVSource, normalize

OP_ID = "kv_canary.kv_canary_write"
INDEX = (torch.int32, torch.int64)
_SMALL_ENTRIES = 128  # csrc/kv_canary_write.cuh kSmallEntries: one launch, no workspace

KV_CANARY_WRITE_CUDA = ModuleSpec(
    name="kv_canary_write",
    package="kernels_kv_canary",
    sources=("csrc/kv_canary_write.cuh", "csrc/kv_canary_common.cuh"),
    exports=(("kv_canary_write", "kv_canary_write"),),
    description="CUDA: chains per request, then one thread per (entry, source) hashing KV bytes",
)
_write_raw = CompiledFunction(KV_CANARY_WRITE_CUDA, "kv_canary_write")


def _kv_canary_write_torch(
    canary: torch.Tensor,
    kv_caches: list[torch.Tensor],
    page_sizes: list[int],
    bytes_per_token: list[int],
    read_bytes: list[int],
    slots: torch.Tensor,
    token_ids: torch.Tensor,
    positions: torch.Tensor,
    req_indptr: torch.Tensor,
    seed_slots: torch.Tensor,
) -> None:
    sources = [
        KVSource(*s) for s in zip(kv_caches, page_sizes, bytes_per_token, read_bytes, strict=True)
    ]
    reference.kv_canary_write(canary, sources, slots, token_ids, positions, req_indptr, seed_slots)


def _kv_canary_write_cuda(
    canary: torch.Tensor,
    kv_caches: list[torch.Tensor],
    page_sizes: list[int],
    bytes_per_token: list[int],
    read_bytes: list[int],
    slots: torch.Tensor,
    token_ids: torch.Tensor,
    positions: torch.Tensor,
    req_indptr: torch.Tensor,
    seed_slots: torch.Tensor,
) -> None:
    from kernels_kv_canary.ops.kv_canary_verify import source_args

    entries = slots.shape[0]
    workspace = torch.empty(
        entries if entries > _SMALL_ENTRIES else 0, dtype=torch.int64, device=canary.device
    )
    _write_raw(
        canary,
        workspace,
        slots,
        token_ids,
        positions,
        req_indptr,
        seed_slots,
        *source_args(kv_caches, page_sizes, bytes_per_token, read_bytes),
    )


def _kv_canary_write_cuda_eligible(
    canary: torch.Tensor,
    kv_caches: list[torch.Tensor],
    *args: object,
) -> str | None:
    """The kernels index the canary rows and the caches as flat memory."""
    if not canary.is_contiguous():
        return "needs a contiguous canary"
    if not all(c.is_contiguous() for c in kv_caches):
        return "needs contiguous kv_sources caches"
    return None


KV_CANARY_WRITE = Op(_kv_canary_write_torch, mutates=("canary",), device="canary")


def check_canary(op: str, canary: object) -> None:
    check_tensor(op, "canary", canary, dtypes=(torch.int64,), ndim=2)
    if canary.shape[1] != 4:
        raise ValueError(
            f"{op}: canary must be [S, 4] int64 (token, position, prev_hash, kv_hash), "
            f"got shape {tuple(canary.shape)}"
        )


def check_entries(op: str, length: int, device, **vectors: torch.Tensor | None) -> None:
    for name, t in vectors.items():
        if t is None:
            continue
        check_tensor(op, name, t, dtypes=INDEX, ndim=1, device=device)
        if t.shape[0] != length:
            raise ValueError(
                f"{op}: {name} must have N = {length} entries like slots, got {t.shape[0]}"
            )


def kv_canary_write(
    canary: torch.Tensor,
    kv_sources: Sequence[KVSource],
    slots: torch.Tensor,
    token_ids: torch.Tensor,
    positions: torch.Tensor,
    req_indptr: torch.Tensor,
    seed_slots: torch.Tensor,
    *,
    backend: str | None = None,
) -> None:
    """Write each written slot's canary ``(token, position, prev_hash, kv_hash)``, in place.

    Per request r, ``run`` starts at ``slot_hash(seed_slots[r])`` (the slot of the token before the
    request's first written one, -1 for none: ANCHOR); each entry with slot >= 0 records
    ``(token, position, run, kv_hash(slot))`` and advances ``run = mix3(run, token, position)``.
    Call it after the KV write of the same tokens. Requests are independent; entries of a request
    are chained in order.

    Parameters
    ----------
    canary : [S, 4] int64, updated in place.
    kv_sources : up to 4 :class:`KVSource` (cache, page_size, bytes_per_token, read_bytes).
    slots : [N] int64 KV slots (negative: skipped, chain not advanced).
    token_ids, positions : [N] int32/int64.
    req_indptr : [R+1] int32, entries of request r are ``[req_indptr[r], req_indptr[r+1])``.
    seed_slots : [R] int64.
    """
    check_canary(OP_ID, canary)
    device = canary.device
    sources = normalize(OP_ID, kv_sources, device)
    check_tensor(OP_ID, "slots", slots, dtypes=INDEX, ndim=1, device=device)
    check_entries(OP_ID, slots.shape[0], device, token_ids=token_ids, positions=positions)
    check_tensor(OP_ID, "req_indptr", req_indptr, dtypes=INDEX, ndim=1, device=device)
    if req_indptr.shape[0] < 1:
        raise ValueError(f"{OP_ID}: req_indptr must have R+1 >= 1 entries, got 0")
    check_entries(OP_ID, req_indptr.shape[0] - 1, device, seed_slots=seed_slots)
    check_same_device(OP_ID, canary=canary, slots=slots)
    if slots.shape[0] and req_indptr.shape[0] > 1:
        KV_CANARY_WRITE.run(
            canary,
            [s.cache for s in sources],
            [s.page_size for s in sources],
            [s.bytes_per_token for s in sources],
            [s.read_bytes for s in sources],
            slots,
            token_ids,
            positions,
            req_indptr,
            seed_slots,
            backend=backend,
        )


def example_sources(pages: int = 8, page_size: int = 4, device="cpu", seed: int = 0):
    """A paged bf16 K/V pair and an fp8 MLA-like cache read partially: three KV sources."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(pages, page_size, 2, 8, generator=g).to(torch.bfloat16).to(device)
    v = torch.randn(pages, page_size, 2, 8, generator=g).to(torch.bfloat16).to(device)
    mla = torch.randn(pages * page_size, 1, 20, generator=g).to(torch.float8_e4m3fn).to(device)
    per_token = 2 * 8 * 2
    return [
        KVSource(k, page_size, per_token, per_token),
        KVSource(v, page_size, per_token, per_token),
        KVSource(mla, 1, 20, 13),
    ]


def _kv_canary_write_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: two requests, one continuing a chain. The
    sources are plain 4-tuples (accepted like KVSource) so that generic argument cloning works."""
    sources = [tuple(s) for s in example_sources(device=device)]
    canary = torch.zeros(32, 4, dtype=torch.int64, device=device)
    slots = torch.tensor([4, 5, 6, -1, 9, 20, 21], dtype=torch.int64, device=device)
    tokens = torch.arange(100, 107, device=device)
    positions = torch.tensor([0, 1, 2, 3, 7, 8, 9], device=device)
    indptr = torch.tensor([0, 4, 7], dtype=torch.int32, device=device)
    seeds = torch.tensor([-1, 3], dtype=torch.int64, device=device)
    return [((canary, sources, slots, tokens, positions, indptr, seeds), {})]
