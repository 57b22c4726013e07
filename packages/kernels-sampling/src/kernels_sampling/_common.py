"""Argument normalisation shared by the sampling ops: per-row parameters and the RNG seed/offset."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator

import torch

from kernels_jit import ModuleSpec
from kernels_jit.rng import seed_offset  # noqa: F401  (re-exported for the sampling ops)
from kernels_jit.validation import check_tensor

PROB_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)

# One module for the four filtering ops (csrc/filters.cuh): for small batches a cluster of CTAs
# per row over slices cached in shared memory, else a CTA of 1024 threads per row; radix
# threshold search on the fp32 bits for top-k / top-p. sampling_filters_path and
# sampling_force_path are test hooks (which path a shape takes; force one).
FILTERS_CUDA = ModuleSpec(
    name="filters",
    package="kernels_sampling",
    sources=("csrc/filters.cuh",),
    exports=(
        ("min_p_renorm_probs", "min_p_renorm_probs"),
        ("top_k_renorm_probs", "top_k_renorm_probs"),
        ("top_p_renorm_probs", "top_p_renorm_probs"),
        ("top_k_mask_logits", "top_k_mask_logits"),
        ("sampling_filters_path", "sampling_filters_path"),
        ("sampling_force_path", "sampling_force_path"),
    ),
    description="CUDA: top-k/top-p/min-p filters, cached clusters or a CTA per row, radix search",
)
# The CUDA kernels count a row's entries in int32 and index rows with gridDim.x.
CUDA_MAX_DIM = 2**31 - 1


def filters_cuda_eligible(x: torch.Tensor, param: torch.Tensor | None) -> str | None:
    """Why the filtering kernels cannot take ``x`` [B, V] and the per-row ``param``, or None."""
    if x.shape[0] > CUDA_MAX_DIM or x.shape[1] > CUDA_MAX_DIM:
        return "needs B and V < 2^31"
    if param is not None and not param.is_contiguous():
        return "needs a contiguous per-row parameter tensor"
    return None


def check_rows(op: str, arg: str, t: object, dtypes=PROB_DTYPES) -> None:
    """A [B, V] matrix whose last dim is contiguous."""
    check_tensor(op, arg, t, dtypes=dtypes, ndim=2, last_dim_contiguous=True)


def row_param(
    op: str,
    name: str,
    value: object,
    batch: int,
    device: torch.device,
    *,
    integral: bool,
) -> tuple[torch.Tensor | None, float | int]:
    """``(tensor or None, scalar)``: a per-row [batch] tensor, or one number for every row."""
    if isinstance(value, torch.Tensor):
        dtypes = INDEX_DTYPES if integral else (torch.float32,)
        check_tensor(op, name, value, dtypes=dtypes, ndim=1, device=device)
        if value.shape[0] != batch:
            raise ValueError(
                f"{op}: {name} must have shape ({batch},) (one value per row), "
                f"got {tuple(value.shape)}"
            )
        return value, 0
    kind = int if integral else (int, float)
    if isinstance(value, bool) or not isinstance(value, kind):
        what = "an int or an int32 tensor" if integral else "a float or a float32 tensor"
        raise TypeError(f"{op}: {name} must be {what}, got {type(value).__name__}")
    return None, value


def check_nan_flag(op: str, probs: torch.Tensor, check_nan: object) -> None:
    """``check_nan=True``: raise ValueError if any entry of ``probs`` is NaN (a host sync)."""
    if not isinstance(check_nan, bool):
        raise TypeError(f"{op}: check_nan must be a bool, got {type(check_nan).__name__}")
    if check_nan and probs.numel() and bool(torch.isnan(probs).any()):
        raise ValueError(f"{op}: probs contains NaN (found by check_nan=True)")


def check_top_p_scalar(op: str, value: float | int, tensor: torch.Tensor | None) -> None:
    """A scalar top_p must not be NaN (every other value is defined: <= 0 argmax set, >= 1 off).

    A per-row tensor is not inspected (no host sync): a NaN entry makes that row invalid.
    """
    if tensor is None and math.isnan(value):
        raise ValueError(f"{op}: top_p must not be NaN")


def check_min_p_scalar(op: str, value: float | int, tensor: torch.Tensor | None) -> None:
    """A scalar min_p must lie in [0, 1] (NaN is rejected); a per-row tensor is not inspected
    (no host sync): an entry that is NaN or outside [0, 1] makes that row invalid."""
    if tensor is None and not 0.0 <= value <= 1.0:
        raise ValueError(f"{op}: min_p must lie in [0, 1], got {value!r}")


@contextlib.contextmanager
def force_cuda_path(path: str) -> Iterator[None]:
    """Test hook: inside the block the CUDA filters and draws take one launch path.

    ``"cached"``: a cluster of CTAs per row over slices cached in shared memory (the small-batch
    path; rows longer than 16 cache slices still stream); ``"streamed"``: a CTA per row (or a
    small cluster) reading the row from global memory every pass; ``"auto"``: per batch size.
    """
    from kernels_jit.loader import CompiledFunction
    from kernels_sampling.ops.sampling_from_probs import SAMPLING_DRAW_CUDA

    code = {"auto": -1, "streamed": 0, "cached": 1}[path]
    hooks = [
        CompiledFunction(spec, "sampling_force_path") for spec in (FILTERS_CUDA, SAMPLING_DRAW_CUDA)
    ]
    for hook in hooks:
        hook(code)
    try:
        yield
    finally:
        for hook in hooks:
            hook(-1)
