"""Layout checks shared by the op files: which tensors the CUDA kernels can index directly.

The kernels read rows of a contiguous last dim whose leading dims collapse to one row stride
(``RowView`` in kernels/pointwise.cuh): contiguous tensors and row slices of wider buffers.
Other layouts (transposed views, a strided last dim) go to the torch backend.
"""

from __future__ import annotations

import torch


def rows(t: torch.Tensor) -> bool:
    """Whether ``t`` is rows of a contiguous last dim with a single row stride."""
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
    return t.is_contiguous() or t.dim() == 0 or t.shape[-1] <= 1 or t.stride(-1) == 1
