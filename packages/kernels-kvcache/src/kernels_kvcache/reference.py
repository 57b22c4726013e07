"""Pure-torch references of the KV-cache writes: the correctness oracle and the fallback.

Each writes rows in place at slot indices. Negative slots (padding) are skipped; any other slot
outside the cache raises ValueError (OPS.md section 0). Data-dependent masking makes these
references synchronise with the device, so they cannot be captured in a CUDA graph: the compiled
backends can.
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0


def cvt_fp8(v: torch.Tensor) -> torch.Tensor:
    """``cvt_satfinite_rne``: clamp fp32 ``v`` to +-448, round to the nearest e4m3, ties to even."""
    return v.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def convert(x: torch.Tensor, dtype: torch.dtype, scale: torch.Tensor | None) -> torch.Tensor:
    """Rows as stored in a cache of ``dtype``: a copy when the dtypes match, ``cvt(x / scale)``
    (scale default 1) for an fp8 cache."""
    if dtype == FP8_DTYPE and x.dtype != FP8_DTYPE:
        v = x.float()
        if scale is not None:
            v = v / scale.float().reshape(())
        return cvt_fp8(v)
    return x.to(dtype)


def valid_slots(
    op: str, arg: str, slots: torch.Tensor, limit: int, skip_index: int | None = None
) -> torch.Tensor:
    """Boolean mask of the slots to write: >= 0 and != skip_index. Raises ValueError if any of
    them is >= ``limit``."""
    valid = slots >= 0
    if skip_index is not None:
        valid &= slots != skip_index
    kept = slots[valid]
    if kept.numel() and int(kept.max()) >= limit:
        raise ValueError(
            f"{op}: {arg} holds slot {int(kept.max())}, outside the cache of {limit} slots "
            f"(negative slots are skipped, others must be < {limit})"
        )
    return valid


def store_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    skip_index: int = -1,
) -> None:
    """``k_cache[indices[i]] = conv(k[i])`` and the same for v, skipping negative indices and
    ``indices == skip_index`` (k [N, W], k_cache [S, W])."""
    valid = valid_slots("kvcache.store_cache", "indices", indices, k_cache.shape[0], skip_index)
    slots = indices[valid].long()
    k_cache[slots] = convert(k[valid], k_cache.dtype, k_scale)
    v_cache[slots] = convert(v[valid], v_cache.dtype, v_scale)


def reshape_and_cache_flash(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """For ``slot = slot_mapping[i] >= 0``: ``key_cache[slot // bs, slot % bs] = conv(key[i])``
    (key [N, Hk, D], key_cache [NB, bs, Hk, D], any block and token strides); same for value.
    A uint8 cache is treated as the bytes of fp8 e4m3."""
    blocks, block_size = key_cache.shape[:2]
    valid = valid_slots(
        "kvcache.reshape_and_cache_flash", "slot_mapping", slot_mapping, blocks * block_size
    )
    slots = slot_mapping[valid].long()
    block, offset = slots // block_size, slots % block_size
    for src, cache, scale in ((key, key_cache, k_scale), (value, value_cache, v_scale)):
        target = cache.view(FP8_DTYPE) if cache.dtype == torch.uint8 else cache
        target[block, offset] = convert(src[valid], target.dtype, scale)


def set_mla_kv_buffer(
    kv_buffer: torch.Tensor,
    loc: torch.Tensor,
    k_nope: torch.Tensor,
    k_rope: torch.Tensor,
    scale: torch.Tensor | None = None,
) -> None:
    """``kv_buffer[loc[i]] = conv(concat(k_nope[i], k_rope[i]))`` for ``loc[i] >= 0``
    (kv_buffer [S, 1, Dn+Dr] or [S, Dn+Dr]; k_nope [N, (1,) Dn]; k_rope [N, (1,) Dr])."""
    rows = kv_buffer[:, 0] if kv_buffer.dim() == 3 else kv_buffer
    valid = valid_slots("kvcache.set_mla_kv_buffer", "loc", loc, rows.shape[0])
    n = loc.shape[0]
    packed = torch.cat((k_nope.reshape(n, -1), k_rope.reshape(n, -1)), dim=-1)
    rows[loc[valid].long()] = convert(packed[valid], rows.dtype, scale)
