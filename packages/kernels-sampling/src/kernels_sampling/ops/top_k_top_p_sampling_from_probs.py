"""sampling.top_k_top_p_sampling_from_probs: seeded sampling among the top-k and top-p tokens.

CUDA (csrc/sampling_draw.cuh): small batches: a cluster of up to 16 CTAs per output row, each slice
cached in shared memory; larger batches: a CTA of 1024 threads per row; the top-k threshold and the
top-p threshold by the radix selects of csrc/filters.cuh (top_k_first: top-p's mass target scaled
by the top-k kept sum), then the draw of sampling_from_probs over the kept values. Kept sets agree
with the reference except where a top-p boundary falls within fp32 rounding. The pure-torch
reference is the fallback.
"""

from __future__ import annotations

import torch

from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_tensor
from kernels_sampling import reference
from kernels_sampling._common import (
    INDEX_DTYPES,
    check_nan_flag,
    check_rows,
    check_top_p_scalar,
    filters_cuda_eligible,
    row_param,
    seed_offset,
)
from kernels_sampling.ops.sampling_from_probs import (
    SAMPLING_DRAW_CUDA,
    _sampling_from_probs_cuda_eligible,
)

OP_ID = "sampling.top_k_top_p_sampling_from_probs"
FILTER_ORDERS = ("top_k_first", "joint")


def _top_k_top_p_sampling_from_probs_torch(
    samples: torch.Tensor,
    valid: torch.Tensor,
    probs: torch.Tensor,
    top_k_arr: torch.Tensor | None,
    top_k_val: int,
    top_p_arr: torch.Tensor | None,
    top_p_val: float,
    indices: torch.Tensor | None,
    filter_apply_order: str,
    seed: torch.Tensor,
    offset: torch.Tensor,
    deterministic: bool,
) -> None:
    drawn, ok = reference.top_k_top_p_sampling_from_probs(
        probs,
        top_k_val if top_k_arr is None else top_k_arr,
        top_p_val if top_p_arr is None else top_p_arr,
        indices=indices,
        filter_apply_order=filter_apply_order,
        seed=seed,
        offset=offset,
        return_valid=True,
    )
    samples.copy_(drawn)
    valid.copy_(ok)


_top_k_top_p_sampling_from_probs_cuda = CompiledFunction(
    SAMPLING_DRAW_CUDA, "top_k_top_p_sampling_from_probs"
)


def _top_k_top_p_sampling_from_probs_cuda_eligible(
    samples: torch.Tensor,
    valid: torch.Tensor,
    probs: torch.Tensor,
    top_k_arr: torch.Tensor | None,
    top_k_val: int,
    top_p_arr: torch.Tensor | None,
    top_p_val: float,
    indices: torch.Tensor | None,
    filter_apply_order: str,
    seed: torch.Tensor,
    offset: torch.Tensor,
    deterministic: bool,
) -> str | None:
    return (
        filters_cuda_eligible(probs, top_k_arr)
        or filters_cuda_eligible(probs, top_p_arr)
        or _sampling_from_probs_cuda_eligible(
            samples, valid, probs, indices, seed, offset, deterministic
        )
    )


TOP_K_TOP_P_SAMPLING_FROM_PROBS = Op(
    _top_k_top_p_sampling_from_probs_torch, mutates=("samples", "valid"), device="probs"
)


def top_k_top_p_sampling_from_probs(
    probs: torch.Tensor,
    top_k: int | torch.Tensor,
    top_p: float | torch.Tensor,
    *,
    indices: torch.Tensor | None = None,
    filter_apply_order: str = "top_k_first",
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
    deterministic: bool = True,
    return_valid: bool = False,
    check_nan: bool = False,
    backend: str | None = None,
):
    """Sample among the tokens kept by top-k and top-p, weighted by their original probabilities.

    ``filter_apply_order="top_k_first"`` (FlashInfer's default) applies top-p to the top-k row after
    renormalising it; ``"joint"`` (what SGLang passes) keeps i iff both rules hold on the original
    row. The draw is the one of :func:`sampling_from_probs` with ``u = U(seed, offset, i, 0)``.

    Invalid rows (no error, no host sync) give sample 0 and ``valid = False`` (the FlashInfer
    degenerate-row contract, OPS.md section 6): a row holding a NaN, +/-inf or negative
    probability (judged over the whole row, before filtering), a row whose per-row top_p is NaN,
    and a row whose kept sum is 0 or overflows fp32. Sample 0 is a real token id, so callers that
    may see such rows must pass ``return_valid=True`` and substitute their own fallback where
    ``valid`` is False (``check_nan=True`` catches NaN only).

    Parameters
    ----------
    probs : [B, V] float32 (fp16/bf16 accepted, read in fp32).
    top_k : int, or int32/int64 [B] per probs row (k <= 0 or k >= V: off).
    top_p : float, or float32 [B] per probs row (>= 1: off; <= 0: the argmax set). A NaN float
        raises ValueError; a NaN tensor entry makes its row invalid.
    indices : optional int32/int64 [B']; output i samples ``probs[indices[i]]`` with its k and p.
    seed, offset, deterministic, return_valid, check_nan : as :func:`sampling_from_probs`.
    """
    check_rows(OP_ID, "probs", probs)
    check_nan_flag(OP_ID, probs, check_nan)
    batch = probs.shape[0]
    karr, kval = row_param(OP_ID, "top_k", top_k, batch, probs.device, integral=True)
    parr, pval = row_param(OP_ID, "top_p", top_p, batch, probs.device, integral=False)
    check_top_p_scalar(OP_ID, pval, parr)
    if filter_apply_order not in FILTER_ORDERS:
        raise ValueError(
            f"{OP_ID}: filter_apply_order must be one of {FILTER_ORDERS}, "
            f"got {filter_apply_order!r}"
        )
    if not isinstance(deterministic, bool):
        raise TypeError(
            f"{OP_ID}: deterministic must be a bool, got {type(deterministic).__name__}"
        )
    rows, out_dtype = batch, torch.int32
    if indices is not None:
        check_tensor(OP_ID, "indices", indices, dtypes=INDEX_DTYPES, ndim=1, device=probs.device)
        rows, out_dtype = indices.shape[0], indices.dtype
    seed_t, offset_t = seed_offset(OP_ID, seed, offset, rows, probs.device)
    samples = torch.empty(rows, dtype=out_dtype, device=probs.device)
    valid = torch.empty(rows, dtype=torch.bool, device=probs.device)
    if rows:
        TOP_K_TOP_P_SAMPLING_FROM_PROBS.run(
            samples,
            valid,
            probs,
            karr,
            int(kval),
            parr,
            float(pval),
            indices,
            filter_apply_order,
            seed_t,
            offset_t,
            deterministic,
            backend=backend,
        )
    return (samples, valid) if return_valid else samples


def _top_k_top_p_sampling_from_probs_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: both filter orders, per-row parameters."""
    g = torch.Generator().manual_seed(5)
    probs = (torch.randn(4, 500, generator=g) * 2).softmax(dim=1).to(device)
    ks = torch.tensor([1, 20, 0, 50], dtype=torch.int32, device=device)
    ps = torch.tensor([0.5, 0.9, 0.95, 1.0], device=device)
    return [
        ((probs, 20, 0.9), {"seed": 7}),
        ((probs, ks, ps), {"seed": 8, "filter_apply_order": "joint"}),
        ((probs.to(torch.bfloat16), 5, 0.8), {"seed": 9}),
        ((probs.to(torch.float16), ks, 0.7), {"seed": 10, "filter_apply_order": "joint"}),
    ]
