"""speculative.segment_packbits: pack each segment of a boolean mask into bytes (tree masks)."""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_same_device, check_tensor
from kernels_speculative import reference

OP_ID = "speculative.segment_packbits"
BITORDERS = ("little", "big")

SEGMENT_PACKBITS_CUDA = ModuleSpec(
    name="segment_packbits",
    package="kernels_speculative",
    sources=("csrc/segment_packbits.cuh", "csrc/speculative_common.cuh"),
    exports=(("segment_packbits", "segment_packbits"),),
    description="CUDA: 4 output bytes (two 16-byte loads) per thread, segments found per block",
)
_segment_packbits_cuda = CompiledFunction(SEGMENT_PACKBITS_CUDA, "segment_packbits")


def _segment_packbits_torch(
    y: torch.Tensor,
    x: torch.Tensor,
    input_indptr: torch.Tensor,
    output_indptr: torch.Tensor,
    bitorder: str,
) -> None:
    reference.segment_packbits_into(y, x, input_indptr, output_indptr, bitorder)


def _segment_packbits_cuda_eligible(
    y: torch.Tensor,
    x: torch.Tensor,
    input_indptr: torch.Tensor,
    output_indptr: torch.Tensor,
    bitorder: str,
) -> str | None:
    """The kernel indexes x and y as flat arrays (the pointers may be strided)."""
    return None if x.is_contiguous() and y.is_contiguous() else "needs contiguous x and y"


SEGMENT_PACKBITS = Op(_segment_packbits_torch, mutates=("y",), device="x")


def segment_packbits(
    x: torch.Tensor,
    input_indptr: torch.Tensor,
    *,
    output_indptr: torch.Tensor | None = None,
    bitorder: str = "little",
    out: torch.Tensor | None = None,
    validate: bool = False,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pack segment b, ``x[input_indptr[b]:input_indptr[b+1]]``, into ``ceil(len/8)`` bytes at
    ``y[output_indptr[b]:output_indptr[b+1]]``; trailing bits of a segment's last byte are 0.

    **Host sync** when ``out`` is None: the size of ``y`` is read from the pointers on the host.
    Pass ``out`` (and ``output_indptr``, else it is computed on the device) to stay on the device.

    Parameters
    ----------
    x : bool [nnz].
    input_indptr : int32 (or int64) [B+1], non-decreasing within ``[0, nnz]``.
    output_indptr : optional int32 (or int64) [B+1] with ``out[b+1] - out[b] == ceil(len_b / 8)``
        and ``out[0] >= 0`` (``== 0`` when ``out`` is None); default: back to back from 0.
    bitorder : "little" (element 8j+t is bit t, LSB first: FlashInfer/SGLang tree masks) or
        "big" (bit 7-t, numpy's default).
    out : optional uint8 [>= output_indptr[-1]] destination; bytes outside segments untouched.
    validate : with ``out`` given, check the pointer values before launching (a device-to-host
        sync on CUDA; skipped while torch.compile traces). Without ``out`` they are always
        checked: that path reads them on the host anyway.

    Returns
    -------
    (y uint8, output_indptr int32 [B+1], or the given output_indptr)

    Checks and their cost
    ---------------------
    Types, dtypes, shapes, devices and ``bitorder`` are always checked (no sync). The pointer
    values (ValueError naming the argument, the first bad index and its value):

    - ``out`` None: y's size comes from the pointers, so they are copied to the host once (B+1
      entries, the sync this path always paid for its last entry) and checked there, before y is
      allocated: a decreasing or out-of-range ``input_indptr`` or an inconsistent
      ``output_indptr`` never sizes an allocation, and y is at most ``nnz / 8 + B`` bytes.
    - ``out`` given: no host read unless ``validate=True``. The torch reference (the backend on
      CPU, and any CUDA fallback) still checks them all, as it reads them on
      the host anyway; a CUDA kernel treats them as preconditions and never faults: it reads only
      ``x[0:nnz]``, writes only ``out[0:len(out)]`` and skips a segment whose length is negative
      or whose bytes do not fit (output_indptr[b+1] - output_indptr[b] != ceil(len/8), or
      past len(out)), leaving its bytes untouched.
    """
    check_tensor(OP_ID, "x", x, dtypes=(torch.bool,), ndim=1)
    check_tensor(OP_ID, "input_indptr", input_indptr, dtypes=(torch.int32, torch.int64), ndim=1)
    if input_indptr.shape[0] < 1:
        raise ValueError(f"{OP_ID}: input_indptr must have B+1 >= 1 entries, got shape (0,)")
    if bitorder not in BITORDERS:
        raise ValueError(f"{OP_ID}: bitorder must be one of {BITORDERS}, got {bitorder!r}")
    if validate is not True and validate is not False:
        raise TypeError(
            f"{OP_ID}: validate must be a bool, got {type(validate).__name__} {validate!r}"
        )
    check_same_device(OP_ID, x=x, input_indptr=input_indptr)
    if output_indptr is not None:
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
        # The one host read this path needs (y's size) now covers both pointers, checked before
        # anything is allocated.
        _, host_out = reference.check_packbits_indptr(x.shape[0], input_indptr, output_indptr)
        if output_indptr is None:
            output_indptr = host_out.to(device=x.device, dtype=torch.int32)
        out = torch.empty(int(host_out[-1]), dtype=torch.uint8, device=x.device)
    else:
        check_tensor(OP_ID, "out", out, dtypes=(torch.uint8,), ndim=1, device=x.device)
        if validate and not torch.compiler.is_compiling():
            reference.check_packbits_indptr(x.shape[0], input_indptr, output_indptr, out.shape[0])
        if output_indptr is None:
            lens = (input_indptr[1:] - input_indptr[:-1]).long()
            output_indptr = torch.zeros_like(input_indptr, dtype=torch.int32)
            output_indptr[1:] = torch.cumsum((lens + 7) // 8, 0)
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
