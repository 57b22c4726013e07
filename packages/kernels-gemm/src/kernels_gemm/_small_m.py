"""What the small-M GEMM engine (csrc/small_m_gemm.cuh) accepts, shared by its two ops."""

from __future__ import annotations

import torch

MAX_ROWS = 16  # the CUDA kernel's M: one tensor-core tile of rows


def rows_fit(t: torch.Tensor, k: int) -> bool:
    """16-byte rows of bf16: an aligned start and (past one row) a row stride % 8 == 0."""
    return k == 0 or (t.data_ptr() % 16 == 0 and (t.shape[0] <= 1 or t.stride(0) % 8 == 0))
