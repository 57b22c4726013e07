"""Argument checks shared by the memory ops."""

from __future__ import annotations

import torch

from kernels_jit.validation import check_tensor

INDEX_DTYPES = (torch.int32, torch.int64)


def check_index_vector(op: str, name: str, t: object, length: int | None, device) -> None:
    """A 1-D int32/int64 tensor on ``device``, of ``length`` entries when given."""
    check_tensor(op, name, t, dtypes=INDEX_DTYPES, ndim=1, device=device)
    if length is not None and t.shape[0] != length:
        raise ValueError(
            f"{op}: {name} must have {length} entries (one per request), got {t.shape[0]}"
        )


def check_page_size(op: str, page_size: object) -> None:
    if isinstance(page_size, bool) or not isinstance(page_size, int):
        raise TypeError(f"{op}: page_size must be an int, got {type(page_size).__name__}")
    if page_size < 1:
        raise ValueError(f"{op}: page_size must be >= 1, got {page_size}")
