"""Argument checks for public ops. Each error names the op, the argument, the constraint and the
value received, and is raised before anything is launched."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def check_tensor(
    op: str,
    arg: str,
    t: object,
    *,
    dtypes: Sequence[torch.dtype] | None = None,
    ndim: int | Sequence[int] | None = None,
    device: torch.device | None = None,
    last_dim_contiguous: bool = False,
    contiguous: bool = False,
) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {arg} must be a torch.Tensor, got {type(t).__name__}")
    if dtypes is not None and t.dtype not in dtypes:
        allowed = ", ".join(_name(d) for d in dtypes)
        raise TypeError(f"{op}: {arg} must have dtype in ({allowed}), got {_name(t.dtype)}")
    if ndim is not None:
        allowed_ndim = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        if t.dim() not in allowed_ndim:
            raise ValueError(
                f"{op}: {arg} must have {' or '.join(map(str, allowed_ndim))} dims, "
                f"got shape {tuple(t.shape)}"
            )
    if device is not None and t.device != device:
        raise ValueError(f"{op}: {arg} is on {t.device}, expected {device} (like the input)")
    if contiguous and not t.is_contiguous():
        raise ValueError(f"{op}: {arg} must be contiguous, got strides {t.stride()}")
    if last_dim_contiguous and t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{op}: {arg} must have a contiguous last dim (stride 1), got strides {t.stride()}"
        )


def check_out(
    op: str,
    out: object,
    *,
    like: torch.Tensor,
    shape: Sequence[int] | None = None,
    dtype: torch.dtype | None = None,
    arg: str = "out",
) -> None:
    """``out`` must match the expected shape, dtype and device exactly."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"{op}: {arg} must be a torch.Tensor, got {type(out).__name__}")
    want_shape = tuple(like.shape if shape is None else shape)
    want_dtype = like.dtype if dtype is None else dtype
    if tuple(out.shape) != want_shape:
        raise ValueError(f"{op}: {arg} must have shape {want_shape}, got {tuple(out.shape)}")
    if out.dtype != want_dtype:
        raise TypeError(f"{op}: {arg} must have dtype {_name(want_dtype)}, got {_name(out.dtype)}")
    if out.device != like.device:
        raise ValueError(f"{op}: {arg} is on {out.device}, expected {like.device}")


def check_same_device(op: str, **tensors: torch.Tensor) -> None:
    devices = {name: t.device for name, t in tensors.items()}
    if len(set(devices.values())) > 1:
        listed = ", ".join(f"{n} on {d}" for n, d in devices.items())
        raise ValueError(f"{op}: all tensors must be on one device, got {listed}")


def is_row_view(t: torch.Tensor) -> bool:
    """Whether ``t`` is rows of a contiguous last dim whose leading dims collapse into one row
    stride: what ``RowView`` in kernels/pointwise.cuh indexes (contiguous tensors and row slices
    of wider buffers; transposed views and a strided last dim are not)."""
    if t.is_contiguous():
        return True
    shape, strides = t.shape, t.stride()
    if shape[-1] > 1 and strides[-1] != 1:
        return False
    expect = None
    for size, stride in zip(reversed(shape[:-1]), reversed(strides[:-1]), strict=True):
        if size == 1:
            continue
        if expect is not None and stride != expect:
            return False
        expect = stride * size
    return True


def last_dim_contiguous(t: torch.Tensor) -> bool:
    """Whether the last dim of ``t`` has stride 1 (or needs none)."""
    return t.is_contiguous() or t.dim() == 0 or t.shape[-1] <= 1 or t.stride(-1) == 1
