"""Argument checks shared by the quantization ops (beyond :mod:`kernels_jit.validation`)."""

from __future__ import annotations

import torch

from kernels_jit.validation import check_tensor

ACTIVATION_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def check_scale(op: str, arg: str, scale: object, like: torch.Tensor) -> None:
    """A static scale: one fp32 element on the device of the input."""
    check_tensor(op, arg, scale, dtypes=(torch.float32,), device=like.device)
    if scale.numel() != 1:
        raise ValueError(
            f"{op}: {arg} must hold exactly one fp32 value (shape [1]), got shape "
            f"{tuple(scale.shape)}"
        )
