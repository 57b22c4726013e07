"""Argument checks shared by the KV-cache writes (beyond :mod:`kernels_jit.validation`)."""

from __future__ import annotations

import torch

from kernels_jit.validation import check_tensor

SLOT_DTYPES = (torch.int32, torch.int64)
FP8 = torch.float8_e4m3fn


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_cache_dtype(op: str, arg: str, cache: torch.Tensor, rows: torch.Tensor) -> None:
    """A cache stores rows as they are (same dtype) or as fp8 e4m3 (converted with a scale)."""
    if cache.dtype not in (rows.dtype, FP8):
        raise TypeError(
            f"{op}: {arg} must have the dtype of its input rows ({_name(rows.dtype)}) or "
            f"float8_e4m3fn, got {_name(cache.dtype)}"
        )


def check_scale(op: str, arg: str, scale: object, like: torch.Tensor) -> None:
    """An fp8 scale: one fp32 element on the device of the rows."""
    if scale is None:
        return
    check_tensor(op, arg, scale, dtypes=(torch.float32,), device=like.device)
    if scale.numel() != 1:
        raise ValueError(
            f"{op}: {arg} must hold exactly one fp32 value (shape [1]), got shape "
            f"{tuple(scale.shape)}"
        )


def check_slots(op: str, arg: str, slots: object, rows: int, like: torch.Tensor) -> None:
    """Slot indices: int32/int64 [N], one per input row, on the device of the rows."""
    check_tensor(op, arg, slots, dtypes=SLOT_DTYPES, ndim=1, device=like.device)
    if slots.shape[0] != rows:
        raise ValueError(
            f"{op}: {arg} must have one slot per input row ({rows}), got shape {tuple(slots.shape)}"
        )
