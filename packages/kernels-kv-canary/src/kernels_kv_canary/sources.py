"""The KV sources a canary hashes: caches viewed as byte rows."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from kernels_jit.validation import check_tensor

MAX_SOURCES = 4


class KVSource(NamedTuple):
    """One KV cache as uint8 rows: slot s is row ``s // page_size`` at byte offset
    ``(s % page_size) * bytes_per_token``; the hash reads ``read_bytes`` bytes there.

    ``cache`` is any contiguous tensor whose first dim counts rows (pages), e.g. a paged
    ``[num_pages, page_size, H, D]`` K cache (``bytes_per_token = H * D * itemsize``) or an MLA
    latent cache of which only the first ``read_bytes`` bytes of each token matter.
    """

    cache: torch.Tensor
    page_size: int
    bytes_per_token: int
    read_bytes: int


def byte_rows(cache: torch.Tensor) -> torch.Tensor:
    """[rows, row_bytes] uint8 view of a contiguous cache (no copy)."""
    flat = cache.reshape(cache.shape[0], -1)
    return flat.view(torch.uint8) if flat.dtype != torch.uint8 else flat


def normalize(op: str, kv_sources: object, device: torch.device) -> list[KVSource]:
    """Validate ``kv_sources`` (KVSource or 4-tuples); every slot row must fit its cache row."""
    if isinstance(kv_sources, KVSource) or not isinstance(kv_sources, Sequence):
        raise TypeError(
            f"{op}: kv_sources must be a list of KVSource(cache, page_size, bytes_per_token, "
            f"read_bytes), got {type(kv_sources).__name__}"
        )
    if len(kv_sources) > MAX_SOURCES:
        raise ValueError(f"{op}: at most {MAX_SOURCES} kv_sources, got {len(kv_sources)}")
    out = []
    for i, item in enumerate(kv_sources):
        if not isinstance(item, Sequence) or len(item) != 4:
            raise TypeError(
                f"{op}: kv_sources[{i}] must be a KVSource(cache, page_size, bytes_per_token, "
                f"read_bytes), got {item!r:.80}"
            )
        source = KVSource(*item)
        check_tensor(op, f"kv_sources[{i}].cache", source.cache, device=device, contiguous=True)
        if source.cache.dim() < 1:
            raise ValueError(f"{op}: kv_sources[{i}].cache must have a row dim, got a scalar")
        for name in ("page_size", "bytes_per_token", "read_bytes"):
            value = getattr(source, name)
            low = 0 if name == "read_bytes" else 1
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(
                    f"{op}: kv_sources[{i}].{name} must be an int >= {low}, got {value!r}"
                )
        row_bytes = (
            source.cache[0].numel() * source.cache.element_size() if source.cache.shape[0] else 0
        )
        need = (source.page_size - 1) * source.bytes_per_token + source.read_bytes
        if source.cache.shape[0] and need > row_bytes:
            raise ValueError(
                f"{op}: kv_sources[{i}] reads up to byte {need} of a row, but its rows have "
                f"{row_bytes} bytes ((page_size - 1) * bytes_per_token + read_bytes must fit)"
            )
        out.append(source)
    return out
