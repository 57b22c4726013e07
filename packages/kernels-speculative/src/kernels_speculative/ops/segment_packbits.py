"""speculative.segment_packbits: pack each segment of a boolean mask into bytes (tree masks)."""

from __future__ import annotations

import torch

from kernels_jit.dispatch import Op
from kernels_jit.validation import check_same_device, check_tensor
from kernels_speculative import reference

OP_ID = "speculative.segment_packbits"
BITORDERS = ("little", "big")


def _segment_packbits_torch(
    y: torch.Tensor,
    x: torch.Tensor,
    input_indptr: torch.Tensor,
    output_indptr: torch.Tensor,
    bitorder: str,
) -> None:
    reference.segment_packbits_into(y, x, input_indptr, output_indptr, bitorder)


SEGMENT_PACKBITS = Op(_segment_packbits_torch, mutates=("y",), device="x")


def segment_packbits(
    x: torch.Tensor,
    input_indptr: torch.Tensor,
    *,
    output_indptr: torch.Tensor | None = None,
    bitorder: str = "little",
    out: torch.Tensor | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack segment b, ``x[input_indptr[b]:input_indptr[b+1]]``, into ``ceil(len/8)`` bytes at
    ``y[output_indptr[b]:output_indptr[b+1]]``; trailing bits of a segment's last byte are 0.

    **Host sync**: when ``output_indptr`` is None it is computed on the host, and when ``out`` is
    None the size of ``y`` is read from ``output_indptr[-1]``. Pass both to stay on the device.

    Parameters
    ----------
    x : bool [nnz].
    input_indptr : int32 (or int64) [B+1], non-decreasing.
    output_indptr : optional int32 [B+1] with ``out[b+1] - out[b] == ceil(len_b / 8)``.
    bitorder : "little" (element 8j+t is bit t, LSB first: FlashInfer/SGLang tree masks) or
        "big" (bit 7-t, numpy's default).
    out : optional uint8 [>= output_indptr[-1]] destination; bytes outside segments untouched.

    Returns
    -------
    (y uint8, output_indptr int32 [B+1])
    """
    check_tensor(OP_ID, "x", x, dtypes=(torch.bool,), ndim=1)
    check_tensor(OP_ID, "input_indptr", input_indptr, dtypes=(torch.int32, torch.int64), ndim=1)
    if input_indptr.shape[0] < 1:
        raise ValueError(f"{OP_ID}: input_indptr must have B+1 >= 1 entries, got shape (0,)")
    if bitorder not in BITORDERS:
        raise ValueError(f"{OP_ID}: bitorder must be one of {BITORDERS}, got {bitorder!r}")
    check_same_device(OP_ID, x=x, input_indptr=input_indptr)
    if output_indptr is None:
        lens = (input_indptr[1:] - input_indptr[:-1]).long()
        output_indptr = torch.zeros_like(input_indptr, dtype=torch.int32)
        output_indptr[1:] = torch.cumsum((lens + 7) // 8, 0)
    else:
        check_tensor(
            OP_ID, "output_indptr", output_indptr, dtypes=(torch.int32, torch.int64), ndim=1
        )
        if output_indptr.shape != input_indptr.shape:
            raise ValueError(
                f"{OP_ID}: output_indptr must have the shape of input_indptr "
                f"{tuple(input_indptr.shape)}, got {tuple(output_indptr.shape)}"
            )
        check_same_device(OP_ID, x=x, output_indptr=output_indptr)
    if out is None:
        out = torch.empty(int(output_indptr[-1]), dtype=torch.uint8, device=x.device)
    else:
        check_tensor(OP_ID, "out", out, dtypes=(torch.uint8,), ndim=1, device=x.device)
    if input_indptr.shape[0] > 1 and out.shape[0]:
        SEGMENT_PACKBITS.run(out, x, input_indptr, output_indptr, bitorder, backend=backend)
    return out, output_indptr


def _segment_packbits_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: odd segment lengths, empty segments."""
    g = torch.Generator().manual_seed(0)
    lens = torch.tensor([0, 1, 7, 8, 9, 33, 0, 64])
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32)
    indptr[1:] = lens.cumsum(0)
    x = torch.rand(int(lens.sum()), generator=g) < 0.5
    return [
        ((x.to(device), indptr.to(device)), {}),
        ((x.to(device), indptr.to(device)), {"bitorder": "big"}),
    ]
