"""Argument checks shared by the ops of the group. Each error names the op, the argument, what was
expected and what was received, and is raised before anything is launched.

Host cost: each tensor attribute read costs 50-200 ns of Python, and a full check of rmsnorm's
arguments is about 15 of them (measured 1.3-2 us on the CI host), more than the whole budget of
the public op over the raw function (1 us). The compiled CUDA functions check the same things
themselves (shapes, strides, devices, dtypes, sizes; ValueError/TypeError naming the op and the
argument). So on the CUDA fast path (a CUDA input, and no backend or the cuda one asked for)
Python checks only what dispatch needs (the input's type and dtype) and ``eps``; every other call
(CPU, a forced torch backend) gets the full checks here."""

from __future__ import annotations

import math

import torch

DTYPES = (torch.float32, torch.float16, torch.bfloat16)
_DTYPE_SET = frozenset(DTYPES)
_INF = float("inf")
_DTYPE_NAMES = "float32, float16, bfloat16"


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _tensor(op: str, arg: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {arg} must be a torch.Tensor, got {type(t).__name__}")
    return t


def rows(op: str, arg: str, t: object, *, min_dim: int = 1) -> torch.Tensor:
    """A float tensor [..., H] whose last dim is contiguous (its leading dims may be strided)."""
    t = _tensor(op, arg, t)
    if t.dtype not in DTYPES:
        raise TypeError(f"{op}: {arg} must have dtype in ({_DTYPE_NAMES}), got {_name(t.dtype)}")
    if t.dim() < min_dim:
        raise ValueError(
            f"{op}: {arg} must have at least {min_dim} dim(s), got shape {tuple(t.shape)}"
        )
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{op}: {arg} must have a contiguous last dim (stride 1), got strides {t.stride()}; "
            "pass .contiguous()"
        )
    return t


def like(op: str, arg: str, t: object, ref: torch.Tensor, ref_name: str = "input") -> None:
    """``t`` has the shape, dtype and device of ``ref`` and a contiguous last dim."""
    t = _tensor(op, arg, t)
    if t.shape != ref.shape:
        raise ValueError(
            f"{op}: {arg} must have the shape of {ref_name} {tuple(ref.shape)}, "
            f"got {tuple(t.shape)}"
        )
    if t.dtype != ref.dtype:
        raise TypeError(
            f"{op}: {arg} must have the dtype of {ref_name} ({_name(ref.dtype)}), "
            f"got {_name(t.dtype)}"
        )
    if t.device != ref.device:
        raise ValueError(f"{op}: {arg} is on {t.device}, {ref_name} on {ref.device}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{op}: {arg} must have a contiguous last dim (stride 1), got strides {t.stride()}"
        )


def param(op: str, arg: str, t: object, size: int, *, ref: torch.Tensor, ref_name: str) -> None:
    """A 1-D contiguous [size] tensor with the dtype and device of ``ref`` (a weight or bias)."""
    t = _tensor(op, arg, t)
    if t.dim() != 1 or t.shape[0] != size:
        raise ValueError(
            f"{op}: {arg} must have shape ({size},) (the last dim of {ref_name}), "
            f"got {tuple(t.shape)}"
        )
    if t.dtype != ref.dtype:
        raise TypeError(
            f"{op}: {arg} must have the dtype of {ref_name} ({_name(ref.dtype)}), "
            f"got {_name(t.dtype)}"
        )
    if t.device != ref.device:
        raise ValueError(f"{op}: {arg} is on {t.device}, {ref_name} on {ref.device}")
    if size > 1 and t.stride(0) != 1:
        raise ValueError(f"{op}: {arg} must be contiguous, got stride {t.stride(0)}")


def compiled_checks(backend: str | None, x: object) -> bool:
    """Whether this call takes the CUDA fast path, whose compiled function validates the rest."""
    return (
        (backend is None or backend == "cuda")
        and type(x) is torch.Tensor
        and x.is_cuda
        and x.dtype in _DTYPE_SET
    )


def eps_ok(value: object) -> bool:
    """The common case of :func:`eps`, without a call into the error path."""
    return type(value) is float and 0.0 <= value < _INF


def eps(op: str, value: object) -> float:
    """A finite float >= 0 (ints are accepted; bools and other types are not)."""
    if type(value) is float and 0.0 <= value < _INF:
        return value
    if type(value) is not float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{op}: eps must be a float, got {type(value).__name__} {value!r}")
        value = float(value)
    if not (value >= 0.0 and math.isfinite(value)):
        raise ValueError(f"{op}: eps must be a finite number >= 0, got {value!r}")
    return value


def pdl(op: str, enable_pdl: object) -> int:
    """``enable_pdl`` as the compiled functions take it: -1 auto (small grids, sm_90+), 0, 1."""
    if enable_pdl is None:
        return -1
    if enable_pdl is True or enable_pdl is False:
        return int(enable_pdl)
    if not isinstance(enable_pdl, bool):
        raise TypeError(f"{op}: enable_pdl must be a bool or None, got {enable_pdl!r}")
    return int(enable_pdl)
