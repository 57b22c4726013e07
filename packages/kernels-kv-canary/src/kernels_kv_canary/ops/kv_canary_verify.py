"""kv_canary.kv_canary_verify: report each slot whose KV bytes, position, token or chain changed.

CUDA (csrc/kv_canary_verify.cuh): 1, 2 or 4 threads per entry (one per source), each folding
one source's bytes of the slot with 16-byte loads; bit for bit with the pure-torch reference
(uint64 emulated on int64), which remains the CPU backend.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_tensor
from kernels_kv_canary import reference
from kernels_kv_canary.ops.kv_canary_write import INDEX, check_canary, check_entries
from kernels_kv_canary.sources import KVSource, byte_rows, normalize

OP_ID = "kv_canary.kv_canary_verify"

KV_CANARY_VERIFY_CUDA = ModuleSpec(
    name="kv_canary_verify",
    package="kernels_kv_canary",
    sources=("csrc/kv_canary_verify.cuh", "csrc/kv_canary_common.cuh"),
    exports=(("kv_canary_verify", "kv_canary_verify"),),
    description="CUDA: one thread per (entry, source), 16-byte loads, warp-shuffle combine",
)
_verify_raw = CompiledFunction(KV_CANARY_VERIFY_CUDA, "kv_canary_verify")


def source_args(
    kv_caches: list[torch.Tensor],
    page_sizes: list[int],
    bytes_per_token: list[int],
    read_bytes: list[int],
) -> list:
    """The 4 (cache or None, page_size, bytes_per_token, read_bytes) groups of the C++ entries;
    caches go as byte views (the kernels read bytes; fp8 dtypes need not cross DLPack)."""
    args: list = []
    for k in range(4):
        if k < len(kv_caches):
            cache = kv_caches[k]
            if cache.numel() == 0:
                cache = torch.empty(cache.shape[0], 1, dtype=torch.uint8, device=cache.device)
            elif cache.dtype != torch.uint8:
                cache = byte_rows(cache)
            args += [cache, page_sizes[k], bytes_per_token[k], read_bytes[k]]
        else:
            args += [None, 1, 1, 0]
    return args


def _kv_canary_verify_torch(
    fail_bits: torch.Tensor,
    canary: torch.Tensor,
    kv_caches: list[torch.Tensor],
    page_sizes: list[int],
    bytes_per_token: list[int],
    read_bytes: list[int],
    slots: torch.Tensor,
    prev_slots: torch.Tensor,
    expected_positions: torch.Tensor,
    expected_tokens: torch.Tensor | None,
    skip_slot: int,
) -> None:
    sources = [
        KVSource(*s) for s in zip(kv_caches, page_sizes, bytes_per_token, read_bytes, strict=True)
    ]
    fail_bits.copy_(
        reference.kv_canary_verify(
            canary, sources, slots, prev_slots, expected_positions, expected_tokens, skip_slot
        )
    )


def _kv_canary_verify_cuda(
    fail_bits: torch.Tensor,
    canary: torch.Tensor,
    kv_caches: list[torch.Tensor],
    page_sizes: list[int],
    bytes_per_token: list[int],
    read_bytes: list[int],
    slots: torch.Tensor,
    prev_slots: torch.Tensor,
    expected_positions: torch.Tensor,
    expected_tokens: torch.Tensor | None,
    skip_slot: int,
) -> None:
    _verify_raw(
        fail_bits,
        canary,
        slots,
        prev_slots,
        expected_positions,
        expected_tokens,
        skip_slot,
        *source_args(kv_caches, page_sizes, bytes_per_token, read_bytes),
    )


def _kv_canary_verify_cuda_eligible(
    fail_bits: torch.Tensor,
    canary: torch.Tensor,
    kv_caches: list[torch.Tensor],
    *args: object,
) -> str | None:
    """The kernel indexes the canary rows and the caches as flat memory."""
    if not canary.is_contiguous():
        return "needs a contiguous canary"
    if not all(c.is_contiguous() for c in kv_caches):
        return "needs contiguous kv_sources caches"
    return None


KV_CANARY_VERIFY = Op(_kv_canary_verify_torch, mutates=("fail_bits",), device="canary")


def kv_canary_verify(
    canary: torch.Tensor,
    kv_sources: Sequence[KVSource],
    slots: torch.Tensor,
    prev_slots: torch.Tensor,
    expected_positions: torch.Tensor,
    expected_tokens: torch.Tensor | None = None,
    *,
    skip_slot: int = -1,
    backend: str | None = None,
) -> torch.Tensor:
    """Check the canaries of ``slots``: fail_bits [N] int32, 0 for a clean entry, else a sum of
    1 chain (``prev_hash[s] != slot_hash(prev_slots[i])``, checked when prev_slots[i] >= 0),
    2 position mismatch, 4 KV bytes changed, 8 token mismatch (when expected_tokens[i] != -1).
    Every failing entry is reported; slots < 0 or == skip_slot give 0.

    Parameters
    ----------
    canary : [S, 4] int64 (kv_canary_write's rows).
    kv_sources : the :class:`KVSource` list given to kv_canary_write.
    slots, prev_slots : [N] int64 (prev_slots -1: chain start, not checked).
    expected_positions : [N] int32/int64. expected_tokens : [N] or None.
    skip_slot : a padding slot never checked (SGLang passes 0).
    """
    check_canary(OP_ID, canary)
    device = canary.device
    sources = normalize(OP_ID, kv_sources, device)
    check_tensor(OP_ID, "slots", slots, dtypes=INDEX, ndim=1, device=device)
    check_entries(
        OP_ID,
        slots.shape[0],
        device,
        prev_slots=prev_slots,
        expected_positions=expected_positions,
        expected_tokens=expected_tokens,
    )
    if isinstance(skip_slot, bool) or not isinstance(skip_slot, int):
        raise TypeError(f"{OP_ID}: skip_slot must be an int, got {type(skip_slot).__name__}")
    fail_bits = torch.zeros(slots.shape[0], dtype=torch.int32, device=device)
    if slots.shape[0]:
        KV_CANARY_VERIFY.run(
            fail_bits,
            canary,
            [s.cache for s in sources],
            [s.page_size for s in sources],
            [s.bytes_per_token for s in sources],
            [s.read_bytes for s in sources],
            slots,
            prev_slots,
            expected_positions,
            expected_tokens,
            skip_slot,
            backend=backend,
        )
    return fail_bits


def _kv_canary_verify_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: verify what the write sample recorded, with
    one corrupted KV byte and one wrong position."""
    from kernels_kv_canary.ops.kv_canary_write import _kv_canary_write_samples, kv_canary_write

    ((args, _),) = _kv_canary_write_samples(device)
    canary, sources, slots, tokens, positions, _, _ = args
    kv_canary_write(*args)
    sources[0][0].view(torch.uint8).view(-1)[5 * 32 + 3] ^= 1
    prev = torch.tensor([-1, 4, 5, -1, 3, 9, 20], dtype=torch.int64, device=device)
    wrong = positions.clone()
    wrong[2] += 1
    return [((canary, sources, slots, prev, wrong, tokens), {})]
