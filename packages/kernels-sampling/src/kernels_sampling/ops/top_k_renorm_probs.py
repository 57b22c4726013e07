"""sampling.top_k_renorm_probs: keep each row's top-k values (ties kept together), renormalise.

CUDA (csrc/filters.cuh): small batches: a cluster of up to 16 CTAs per row, each slice cached in
shared memory (one HBM read); larger batches: a CTA of 1024 threads per row; the k-th largest value
by a radix select (3 passes of 11/11/10 bits over the fp32 bits, shared-memory histograms; the last
pass also gives the exact kept sum), then the write pass. Sorting-free. The pure-torch reference
(fp32, sort based) is the fallback.
"""

from __future__ import annotations

import torch

from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_sampling import reference
from kernels_sampling._common import (
    FILTERS_CUDA,
    check_nan_flag,
    check_rows,
    filters_cuda_eligible,
    row_param,
)

OP_ID = "sampling.top_k_renorm_probs"


def _top_k_renorm_probs_torch(
    out: torch.Tensor, probs: torch.Tensor, top_k_arr: torch.Tensor | None, top_k_val: int
) -> None:
    out.copy_(reference.top_k_renorm_probs(probs, top_k_val if top_k_arr is None else top_k_arr))


_top_k_renorm_probs_cuda = CompiledFunction(FILTERS_CUDA, "top_k_renorm_probs")


def _top_k_renorm_probs_cuda_eligible(
    out: torch.Tensor, probs: torch.Tensor, top_k_arr: torch.Tensor | None, top_k_val: int
) -> str | None:
    return filters_cuda_eligible(probs, top_k_arr)


TOP_K_RENORM_PROBS = Op(_top_k_renorm_probs_torch, mutates=("out",), device="probs")


def top_k_renorm_probs(
    probs: torch.Tensor,
    top_k: int | torch.Tensor,
    *,
    check_nan: bool = False,
    backend: str | None = None,
) -> torch.Tensor:
    """Zero all but each row's top-k probabilities and divide the kept by their sum.

    Token i is kept iff fewer than k values of its row are strictly greater (``p_i >=`` the k-th
    largest), so tied values are kept together; a kept sum below 1e-8 gives a zero row.

    Invalid rows (no error, no host sync) become all NaN in the output, never a plausible
    distribution: a row holding a NaN, +/-inf or negative probability (judged over the whole
    row), or whose kept fp32 sum overflows. Other rows are unaffected.

    Parameters
    ----------
    probs : [B, V] float32, float16 or bfloat16; the output keeps the dtype.
    top_k : int, or int32/int64 [B] per row; k <= 0 or k >= V keeps the whole row.
    check_nan : if True, raise ValueError when any entry of ``probs`` is NaN. Costs a
        device-to-host sync (not CUDA-graph / ``torch.compile(fullgraph=True)`` safe); off by
        default, when NaN rows give the invalid outcome above instead.
    backend : force a backend instead of the best eligible one.
    """
    check_rows(OP_ID, "probs", probs)
    check_nan_flag(OP_ID, probs, check_nan)
    arr, val = row_param(OP_ID, "top_k", top_k, probs.shape[0], probs.device, integral=True)
    out = torch.empty_like(probs, memory_format=torch.contiguous_format)
    if probs.numel():
        TOP_K_RENORM_PROBS.run(out, probs, arr, int(val), backend=backend)
    return out


def _top_k_renorm_probs_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: scalar and per-row k, odd vocab, half dtype."""
    g = torch.Generator().manual_seed(0)
    probs = torch.rand(5, 333, generator=g).softmax(dim=1)
    ks = torch.tensor([1, 7, 0, 333, 50], dtype=torch.int32)
    return [
        ((probs.to(device), 20), {}),
        ((probs.to(device), ks.to(device)), {}),
        ((probs.to(device=device, dtype=torch.bfloat16), 3), {}),
        ((probs.to(device=device, dtype=torch.float16), 9), {}),
    ]
