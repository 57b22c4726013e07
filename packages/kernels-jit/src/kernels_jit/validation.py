"""Argument checks for public ops. Each error names the op, the argument, the constraint and the
value received, and is raised before anything is launched.

Host cost: each tensor attribute read costs 50-200 ns of Python, and a full check of rmsnorm's
arguments is about 15 of them (1.3-2 us on the CI host), more than the whole budget of the public
op over the raw function (1 us). The compiled CUDA functions check the same things themselves
(shapes, strides, devices, dtypes, sizes; ValueError/TypeError naming the op and the argument,
through kernels/checks.h). So an op whose compiled backend validates everything takes the
:func:`compiled_path` shortcut: on a CUDA input with the fast backend, Python checks only what
dispatch needs (the input's type and dtype) and scalars such as ``eps``; every other call (CPU,
a forced torch backend) gets the full checks here.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence

import torch

_INF = float("inf")


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
    if last_dim_contiguous:
        _check_last_dim(op, arg, t)


def _check_last_dim(op: str, arg: str, t: torch.Tensor) -> None:
    """Raises unless :func:`last_dim_contiguous`."""
    if not last_dim_contiguous(t):
        raise ValueError(
            f"{op}: {arg} must have a contiguous last dim (stride 1), got strides {t.stride()}; "
            "pass .contiguous()"
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


def compiled_path(backend: str | None, x: object, dtypes: Collection[torch.dtype]) -> bool:
    """Whether this call takes the CUDA fast path, whose compiled function validates the rest."""
    return (
        (backend is None or backend == "cuda")
        and type(x) is torch.Tensor
        and x.is_cuda
        and x.dtype in dtypes
    )


def check_rows(
    op: str, arg: str, t: object, *, dtypes: Sequence[torch.dtype], min_dim: int = 1
) -> torch.Tensor:
    """A tensor [..., H] of one of ``dtypes`` whose last dim is contiguous (its leading dims may
    be strided)."""
    check_tensor(op, arg, t, dtypes=dtypes)
    assert isinstance(t, torch.Tensor)
    if t.dim() < min_dim:
        raise ValueError(
            f"{op}: {arg} must have at least {min_dim} dim(s), got shape {tuple(t.shape)}"
        )
    _check_last_dim(op, arg, t)
    return t


def check_like(op: str, arg: str, t: object, ref: torch.Tensor, ref_name: str = "input") -> None:
    """``t`` has the shape, dtype and device of ``ref`` and a contiguous last dim."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {arg} must be a torch.Tensor, got {type(t).__name__}")
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
    _check_last_dim(op, arg, t)


def check_param(
    op: str,
    arg: str,
    t: object,
    size: int,
    *,
    ref: torch.Tensor,
    ref_name: str = "input",
    fp32_ok: bool = False,
) -> None:
    """A 1-D contiguous [size] tensor on the device of ``ref`` with its dtype (or float32 where
    ``fp32_ok``): a weight or bias."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {arg} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 1 or t.shape[0] != size:
        raise ValueError(
            f"{op}: {arg} must have shape ({size},) (the last dim of {ref_name}), "
            f"got {tuple(t.shape)}"
        )
    if t.dtype != ref.dtype and not (fp32_ok and t.dtype == torch.float32):
        allowed = _name(ref.dtype) + (" or float32" if fp32_ok else "")
        raise TypeError(
            f"{op}: {arg} must have the dtype of {ref_name} ({allowed}), got {_name(t.dtype)}"
        )
    if t.device != ref.device:
        raise ValueError(f"{op}: {arg} is on {t.device}, {ref_name} on {ref.device}")
    if size > 1 and t.stride(0) != 1:
        raise ValueError(f"{op}: {arg} must be contiguous, got stride {t.stride(0)}")


def check_disjoint(op: str, a_name: str, a: torch.Tensor, b_name: str, b: torch.Tensor) -> None:
    """The memory spans of ``a`` and ``b`` do not overlap (an in-place op reading one while
    writing the other would compute garbage). Spans, as the compiled kernels check them: two
    interleaved views of one buffer count as overlapping."""
    if torch.compiler.is_compiling() or not a.numel() or not b.numel() or a.device != b.device:
        return
    a_lo, a_hi = _extent(a)
    b_lo, b_hi = _extent(b)
    if a_lo < b_hi and b_lo < a_hi:
        raise ValueError(f"{op}: {a_name} and {b_name} must not overlap in memory")


def _extent(t: torch.Tensor) -> tuple[int, int]:
    start = t.data_ptr()
    span = sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride(), strict=True))
    return start, start + (span + 1) * t.element_size()


def eps_ok(value: object) -> bool:
    """The common case of :func:`check_eps`, without a call into the error path."""
    return type(value) is float and 0.0 <= value < _INF


def check_eps(op: str, value: object) -> float:
    """``eps`` as the kernels take it: a finite float >= 0 (ints are accepted; bools and other
    types are not). The compiled kernels apply the same rule (kernels/checks.h)."""
    if type(value) is float and 0.0 <= value < _INF:
        return value
    if type(value) is not float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise TypeError(f"{op}: eps must be a float, got {type(value).__name__} {value!r}")
        value = float(value)
    if not (value >= 0.0 and math.isfinite(value)):
        raise ValueError(f"{op}: eps must be a finite number >= 0, got {value!r}")
    return value


def check_pdl(op: str, enable_pdl: object) -> int:
    """``enable_pdl`` as compiled backends take it: -1 auto (small grids on sm_90+), 0, 1."""
    if enable_pdl is None:
        return -1
    if enable_pdl is True or enable_pdl is False:
        return int(enable_pdl)
    raise TypeError(f"{op}: enable_pdl must be a bool or None, got {enable_pdl!r}")
