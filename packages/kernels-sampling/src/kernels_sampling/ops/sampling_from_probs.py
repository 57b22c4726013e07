"""sampling.sampling_from_probs: one seeded, reproducible draw per row (inverse CDF).

CUDA (csrc/sampling_draw.cuh): a CTA of 1024 threads per output row (the row read twice, mostly
from L2: the cached cluster shape of the filtered draw was slower here); pass 1 the row total (and
bad-row flag), pass 2 a block scan of 16-element tiles in vocabulary order that stops at the tile
crossing u * total. The pure-torch reference is the fallback.
"""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_tensor
from kernels_sampling import reference
from kernels_sampling._common import (
    CUDA_MAX_DIM,
    INDEX_DTYPES,
    check_nan_flag,
    check_rows,
    seed_offset,
)

OP_ID = "sampling.sampling_from_probs"


def _sampling_from_probs_torch(
    samples: torch.Tensor,
    valid: torch.Tensor,
    probs: torch.Tensor,
    indices: torch.Tensor | None,
    seed: torch.Tensor,
    offset: torch.Tensor,
    deterministic: bool,
) -> None:
    drawn, ok = reference.sampling_from_probs(
        probs, indices=indices, seed=seed, offset=offset, return_valid=True
    )
    samples.copy_(drawn)
    valid.copy_(ok)


SAMPLING_DRAW_CUDA = ModuleSpec(
    name="sampling_draw",
    package="kernels_sampling",
    sources=("csrc/sampling_draw.cuh",),
    exports=(
        ("sampling_from_probs", "sampling_from_probs"),
        ("top_k_top_p_sampling_from_probs", "top_k_top_p_sampling_from_probs"),
        ("sampling_draw_path", "sampling_draw_path"),
        ("sampling_force_path", "sampling_force_path"),
    ),
    description=(
        "CUDA: seeded inverse-CDF draws; the top-k/top-p filtered draw over a cluster of cached "
        "slices per row for small batches, a CTA per row otherwise"
    ),
)

_sampling_from_probs_cuda = CompiledFunction(SAMPLING_DRAW_CUDA, "sampling_from_probs")


def _sampling_from_probs_cuda_eligible(
    samples: torch.Tensor,
    valid: torch.Tensor,
    probs: torch.Tensor,
    indices: torch.Tensor | None,
    seed: torch.Tensor,
    offset: torch.Tensor,
    deterministic: bool,
) -> str | None:
    if samples.shape[0] > CUDA_MAX_DIM or probs.shape[1] > CUDA_MAX_DIM - 2**15:
        return "needs B' < 2^31 and V < 2^31 - 2^15"
    if indices is not None and not indices.is_contiguous():
        return "needs contiguous indices"
    if not (seed.is_contiguous() and offset.is_contiguous()):
        return "needs contiguous seed and offset tensors"
    return None


SAMPLING_FROM_PROBS = Op(_sampling_from_probs_torch, mutates=("samples", "valid"), device="probs")


def sampling_from_probs(
    probs: torch.Tensor,
    *,
    indices: torch.Tensor | None = None,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
    deterministic: bool = True,
    return_valid: bool = False,
    check_nan: bool = False,
    backend: str | None = None,
):
    """Sample one token per output row i: the smallest j with ``cumsum(p)_j > u * sum(p)``,
    ``u = U(seed, offset, i, 0)`` (the project RNG, bit-identical in every backend).

    Invalid rows (no error, no host sync) give sample 0 and ``valid = False`` (the FlashInfer
    degenerate-row contract, OPS.md section 6): a row holding a NaN, +/-inf or negative
    probability, and a row whose sum is 0 or overflows fp32. Sample 0 is a real token id, so
    callers that may see such rows must pass ``return_valid=True`` and substitute their own
    fallback where ``valid`` is False (``check_nan=True`` catches NaN only).

    Parameters
    ----------
    probs : [B, V] float32 (fp16/bf16 accepted, read in fp32); rows need not be normalised.
    indices : optional int32/int64 [B']; output i samples row ``indices[i]`` (rows may repeat) and
        the samples take the dtype of ``indices``.
    seed, offset : ints, or int64 tensors of shape [1] or [B'] (per output row; tensors are needed
        under CUDA graphs). ``seed=None`` draws a seed from torch's generator of the device.
    deterministic : accepted for FlashInfer compatibility; every backend is deterministic.
    return_valid : also return valid [B'] bool (False for the invalid rows above; sample 0).
    check_nan : if True, raise ValueError when any entry of ``probs`` is NaN (every row, not only
        those selected by ``indices``). Costs a device-to-host sync (not CUDA-graph /
        ``torch.compile(fullgraph=True)`` safe); off by default, when NaN rows give the invalid
        outcome above instead.

    Returns
    -------
    samples [B'] int32 (or the dtype of ``indices``), and ``valid`` when ``return_valid``.
    """
    check_rows(OP_ID, "probs", probs)
    check_nan_flag(OP_ID, probs, check_nan)
    rows = probs.shape[0]
    out_dtype = torch.int32
    if indices is not None:
        check_tensor(OP_ID, "indices", indices, dtypes=INDEX_DTYPES, ndim=1, device=probs.device)
        rows, out_dtype = indices.shape[0], indices.dtype
    if not isinstance(deterministic, bool):
        raise TypeError(
            f"{OP_ID}: deterministic must be a bool, got {type(deterministic).__name__}"
        )
    seed_t, offset_t = seed_offset(OP_ID, seed, offset, rows, probs.device)
    samples = torch.empty(rows, dtype=out_dtype, device=probs.device)
    valid = torch.empty(rows, dtype=torch.bool, device=probs.device)
    if rows:
        SAMPLING_FROM_PROBS.run(
            samples, valid, probs, indices, seed_t, offset_t, deterministic, backend=backend
        )
    return (samples, valid) if return_valid else samples


def _sampling_from_probs_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: seeds as ints and per-row tensors, indices."""
    g = torch.Generator().manual_seed(4)
    probs = (torch.randn(6, 1000, generator=g) * 2).softmax(dim=1).to(device)
    seeds = torch.arange(6, dtype=torch.int64, device=device) * 7919
    idx = torch.tensor([0, 0, 5, 3], dtype=torch.int64, device=device)
    return [
        ((probs,), {"seed": 42, "offset": 3}),
        ((probs,), {"seed": seeds, "offset": 0, "return_valid": True}),
        ((probs,), {"indices": idx, "seed": 1}),
        ((probs.to(torch.bfloat16),), {"seed": 2, "offset": 1}),
        ((probs.to(torch.float16),), {"seed": 3}),
    ]
