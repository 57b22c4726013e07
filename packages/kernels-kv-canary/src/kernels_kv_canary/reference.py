"""Pure-torch, byte-exact references of the KV canary ops (OPS.md section 15).

Each slot's canary row is ``(token, position, prev_hash, kv_hash)`` in int64; the hashes are uint64
bit patterns. ``fmix`` is the splitmix64 finalizer, ``mix3(a, b, c) = fmix(fmix(fmix(a) ^ b) ^ c)``,
``slot_hash(s) = mix3(prev_hash[s], token[s], position[s])`` and ``slot_hash(-1) = ANCHOR``.
uint64 arithmetic is emulated with int64 (wrapping multiply, masked shifts): kernels must match
these bit for bit.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernels_jit.rng import fmix, to_int64
from kernels_kv_canary.sources import KVSource, byte_rows

ANCHOR_SEED = 0xC0FFEE1234567890
TOKEN, POSITION, PREV_HASH, KV_HASH = range(4)
CHAIN_BIT, POSITION_BIT, KV_BIT, TOKEN_BIT = 1, 2, 4, 8


def anchor(device: torch.device | str = "cpu") -> torch.Tensor:
    """``ANCHOR = fmix(0xC0FFEE1234567890)`` as an int64 scalar tensor."""
    return fmix(torch.tensor(to_int64(ANCHOR_SEED), dtype=torch.int64, device=device))


def mix3(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return fmix(fmix(fmix(a) ^ b) ^ c)


def slot_hash(canary: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """``mix3(prev_hash[s], token[s], position[s])`` per slot, ANCHOR where the slot is negative."""
    rows = canary[slots.clamp(min=0)]
    hashed = mix3(rows[:, PREV_HASH], rows[:, TOKEN], rows[:, POSITION])
    return torch.where(slots >= 0, hashed, anchor(canary.device))


def kv_hash(kv_sources: Sequence[KVSource], slots: torch.Tensor) -> torch.Tensor:
    """Per slot: fold each source's ``read_bytes`` bytes as little-endian 8-byte words
    (zero-padded) with ``h = fmix(h ^ w)`` from 0, then ``acc = fmix(acc ^ h)`` over the sources
    from 0. Words are assembled from bytes with shifts, so the host's byte order never matters."""
    slots = slots.long()
    acc = torch.zeros(slots.shape, dtype=torch.int64, device=slots.device)
    for source in kv_sources:
        flat = byte_rows(source.cache).reshape(-1)
        row_bytes = flat.numel() // max(source.cache.shape[0], 1)
        base = (slots // source.page_size) * row_bytes + (
            slots % source.page_size
        ) * source.bytes_per_token
        words = (source.read_bytes + 7) // 8
        offsets = torch.arange(words * 8, device=slots.device)
        index = base[:, None] + offsets
        data = flat[index.clamp(max=max(flat.numel() - 1, 0))].long() if flat.numel() else index * 0
        data = torch.where(offsets < source.read_bytes, data, 0).reshape(-1, words, 8)
        shifts = torch.arange(0, 64, 8, device=slots.device)
        word = torch.zeros(data.shape[:2], dtype=torch.int64, device=slots.device)
        for k in range(8):
            word = word | (data[..., k] << shifts[k])
        h = torch.zeros_like(acc)
        for i in range(words):
            h = fmix(h ^ word[:, i])
        acc = fmix(acc ^ h)
    return acc


def _check_slots(
    op: str, canary: torch.Tensor, kv_sources: Sequence[KVSource], slots: torch.Tensor
):
    live = slots[slots >= 0]
    if not live.numel():
        return
    top = int(live.max())
    if top >= canary.shape[0]:
        raise ValueError(f"kv_canary.{op}: slots must be < S = {canary.shape[0]}, got {top}")
    for i, source in enumerate(kv_sources):
        if top // source.page_size >= source.cache.shape[0]:
            raise ValueError(
                f"kv_canary.{op}: slot {top} is page {top // source.page_size}, but "
                f"kv_sources[{i}] has {source.cache.shape[0]} pages"
            )


def kv_canary_write(
    canary: torch.Tensor,
    kv_sources: Sequence[KVSource],
    slots: torch.Tensor,
    token_ids: torch.Tensor,
    positions: torch.Tensor,
    req_indptr: torch.Tensor,
    seed_slots: torch.Tensor,
) -> None:
    """In place, per request r: ``run = slot_hash(seed_slots[r])``; for its entries in order with
    slot >= 0: ``canary[slot] = (token, position, run, kv_hash(slot))``, then
    ``run = mix3(run, token, position)``. All previous hashes are read before any write."""
    slots, tokens, pos = slots.long(), token_ids.long(), positions.long()
    indptr = req_indptr.long()
    entries = slots.shape[0]
    lens = indptr[1:] - indptr[:-1]
    if lens.numel() and (int(lens.min()) < 0 or int(indptr[0]) < 0 or int(indptr[-1]) > entries):
        raise ValueError(
            f"kv_canary.kv_canary_write: req_indptr must be non-decreasing within [0, {entries}], "
            f"got {indptr.tolist()[:16]}"
        )
    _check_slots("kv_canary_write", canary, kv_sources, slots)
    _check_slots("kv_canary_write", canary, kv_sources, seed_slots.long())
    run = slot_hash(canary, seed_slots.long())
    prev = torch.zeros(entries, dtype=torch.int64, device=slots.device)
    in_request = torch.zeros(entries, dtype=torch.bool, device=slots.device)
    longest = int(lens.max()) if lens.numel() else 0
    for t in range(longest):
        requests = torch.nonzero(lens > t).flatten()
        entry = indptr[requests] + t
        prev[entry] = run[requests]
        in_request[entry] = True
        advanced = mix3(run[requests], tokens[entry], pos[entry])
        run[requests] = torch.where(slots[entry] >= 0, advanced, run[requests])
    write = in_request & (slots >= 0)
    rows = torch.stack([tokens, pos, prev, kv_hash(kv_sources, slots.clamp(min=0))], dim=1)
    canary[slots[write]] = rows[write]


def kv_canary_verify(
    canary: torch.Tensor,
    kv_sources: Sequence[KVSource],
    slots: torch.Tensor,
    prev_slots: torch.Tensor,
    expected_positions: torch.Tensor,
    expected_tokens: torch.Tensor | None = None,
    skip_slot: int = -1,
) -> torch.Tensor:
    """fail_bits int32 [N]: 1 chain (``prev_hash[s] != slot_hash(prev_slots[i])``, checked when
    prev_slots[i] >= 0), 2 position, 4 kv bytes, 8 token (when expected_tokens[i] != -1); 0 for
    clean entries and for slots < 0 or == skip_slot."""
    slots, prev_slots = slots.long(), prev_slots.long()
    _check_slots("kv_canary_verify", canary, kv_sources, slots)
    _check_slots("kv_canary_verify", canary, kv_sources, prev_slots)
    rows = canary[slots.clamp(min=0)]
    zero = torch.zeros(slots.shape, dtype=torch.int64, device=slots.device)
    chain = (prev_slots >= 0) & (rows[:, PREV_HASH] != slot_hash(canary, prev_slots))
    position = rows[:, POSITION] != expected_positions.long()
    kv = rows[:, KV_HASH] != kv_hash(kv_sources, slots.clamp(min=0))
    bits = (
        torch.where(chain, CHAIN_BIT, zero)
        | torch.where(position, POSITION_BIT, zero)
        | torch.where(kv, KV_BIT, zero)
    )
    if expected_tokens is not None:
        want = expected_tokens.long()
        bits = bits | torch.where((want != -1) & (rows[:, TOKEN] != want), TOKEN_BIT, zero)
    checked = (slots >= 0) & (slots != skip_slot)
    return torch.where(checked, bits, 0).to(torch.int32)
