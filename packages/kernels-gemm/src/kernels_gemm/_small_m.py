"""What the small-M GEMM engine (csrc/small_m_gemm.cuh) accepts, shared by its two ops."""

from __future__ import annotations

import torch

MAX_ROWS = 16  # the CUDA kernel's M: one tensor-core tile of rows


def rows_fit(t: torch.Tensor, k: int) -> bool:
    """16-byte rows of bf16: an aligned start and (past one row) a row stride % 8 == 0."""
    return k == 0 or (t.data_ptr() % 16 == 0 and (t.shape[0] <= 1 or t.stride(0) % 8 == 0))


def cuda_refusal(x: torch.Tensor, w: torch.Tensor, misaligned: str) -> str | None:
    """Why the CUDA kernel cannot take activations ``x`` [M, K] against the weight rows ``w``
    [N, K] (both contiguous along K), or None: M <= 16 (one tile of rows; cuBLAS wins past it),
    K % 8 == 0 and 16-byte aligned rows (else ``misaligned``). Malformed arguments get None:
    the kernel rejects them."""
    if x.dim() != 2 or w.dim() != 2:
        return None
    if x.shape[1] > 1 and (x.stride(1) != 1 or w.stride(1) != 1):
        return None
    if x.shape[0] > MAX_ROWS:
        return f"M = {x.shape[0]} > {MAX_ROWS} rows (cuBLAS territory)"
    k = x.shape[1]
    if k % 8:
        return f"K = {k} is not a multiple of 8 (16-byte rows)"
    if not (rows_fit(x, k) and rows_fit(w, k)):
        return misaligned
    return None
