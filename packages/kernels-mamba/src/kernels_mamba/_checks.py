"""Argument checks shared by the Mamba ops."""

from __future__ import annotations

import torch

from kernels_jit.validation import check_tensor

FLOATS = (torch.float32, torch.float16, torch.bfloat16)
INDEX = (torch.int32, torch.int64)
ACTIVATIONS = (None, "silu", "swish")


def check_vector(op: str, name: str, t: object, length: int, device, dtypes=INDEX) -> None:
    """An optional 1-D tensor of ``length`` entries."""
    if t is None:
        return
    check_tensor(op, name, t, dtypes=dtypes, ndim=1, device=device)
    if t.shape[0] != length:
        raise ValueError(f"{op}: {name} must have {length} entries, got {t.shape[0]}")


def check_shape(op: str, name: str, t: object, shape: tuple[int, ...], device, dtypes=FLOATS):
    check_tensor(op, name, t, dtypes=dtypes, ndim=len(shape), device=device)
    if tuple(t.shape) != shape:
        raise ValueError(f"{op}: {name} must have shape {shape}, got {tuple(t.shape)}")


def check_conv_weight(op: str, weight: object, bias: object, dim: int, device) -> int:
    """weight [D, W] with W in {2, 3, 4}, bias [D] or None; returns W."""
    check_tensor(op, "weight", weight, dtypes=FLOATS, ndim=2, device=device)
    if weight.shape[0] != dim or weight.shape[1] not in (2, 3, 4):
        raise ValueError(
            f"{op}: weight must have shape [D, W] = [{dim}, 2..4], got {tuple(weight.shape)}"
        )
    if bias is not None:
        check_shape(op, "bias", bias, (dim,), device)
    return weight.shape[1]


def check_activation(op: str, activation: object) -> None:
    if activation not in ACTIVATIONS:
        raise ValueError(f"{op}: activation must be one of {ACTIVATIONS}, got {activation!r}")


def check_int(op: str, name: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{op}: {name} must be an int, got {type(value).__name__}")
    return value
