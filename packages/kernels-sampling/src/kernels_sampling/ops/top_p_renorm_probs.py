"""sampling.top_p_renorm_probs: keep the tokens whose strictly-greater mass is below top_p.

CUDA (csrc/filters.cuh): small batches: a cluster of up to 16 CTAs per row, each slice cached in
shared memory (one HBM read); larger batches: a CTA of 1024 threads per row; the threshold value by
radix passes that accumulate mass per bin (the lowest bin whose strictly-greater mass < top_p),
then the write pass. Sorting-free. The pure-torch reference (fp32, sort based) is the fallback.
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
    check_top_p_scalar,
    filters_cuda_eligible,
    row_param,
)

OP_ID = "sampling.top_p_renorm_probs"


def _top_p_renorm_probs_torch(
    out: torch.Tensor, probs: torch.Tensor, top_p_arr: torch.Tensor | None, top_p_val: float
) -> None:
    out.copy_(reference.top_p_renorm_probs(probs, top_p_val if top_p_arr is None else top_p_arr))


_top_p_renorm_probs_cuda = CompiledFunction(FILTERS_CUDA, "top_p_renorm_probs")


def _top_p_renorm_probs_cuda_eligible(
    out: torch.Tensor, probs: torch.Tensor, top_p_arr: torch.Tensor | None, top_p_val: float
) -> str | None:
    return filters_cuda_eligible(probs, top_p_arr)


TOP_P_RENORM_PROBS = Op(_top_p_renorm_probs_torch, mutates=("out",), device="probs")


def top_p_renorm_probs(
    probs: torch.Tensor,
    top_p: float | torch.Tensor,
    *,
    check_nan: bool = False,
    backend: str | None = None,
) -> torch.Tensor:
    """Nucleus filter: keep i iff ``sum{p_j : p_j > p_i} < top_p``, then renormalise.

    Invalid rows (no error, no host sync) become all NaN in the output, never a plausible
    distribution: a row holding a NaN, +/-inf or negative probability (judged over the whole
    row), a row whose per-row top_p is NaN, or whose kept fp32 sum overflows. Other rows are
    unaffected. An all-zero row (kept sum < 1e-8) stays zeros.

    Parameters
    ----------
    probs : [B, V] float32, float16 or bfloat16 (rows summing to 1); the output keeps the dtype.
    top_p : float, or float32 [B] per row; >= 1 keeps the row, <= 0 keeps only the argmax set.
        A NaN float raises ValueError; a NaN tensor entry makes its row invalid (all NaN).
    check_nan : if True, raise ValueError when any entry of ``probs`` is NaN. Costs a
        device-to-host sync (not CUDA-graph / ``torch.compile(fullgraph=True)`` safe); off by
        default, when NaN rows give the invalid outcome above instead.
    backend : force a backend instead of the best eligible one.
    """
    check_rows(OP_ID, "probs", probs)
    check_nan_flag(OP_ID, probs, check_nan)
    arr, val = row_param(OP_ID, "top_p", top_p, probs.shape[0], probs.device, integral=False)
    check_top_p_scalar(OP_ID, val, arr)
    out = torch.empty_like(probs, memory_format=torch.contiguous_format)
    if probs.numel():
        TOP_P_RENORM_PROBS.run(out, probs, arr, float(val), backend=backend)
    return out


def _top_p_renorm_probs_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: scalar and per-row p, odd vocab, half dtype."""
    g = torch.Generator().manual_seed(1)
    probs = (torch.randn(4, 257, generator=g) * 3).softmax(dim=1)
    ps = torch.tensor([0.1, 0.5, 0.95, 1.0])
    return [
        ((probs.to(device), 0.9), {}),
        ((probs.to(device), ps.to(device)), {}),
        ((probs.to(device=device, dtype=torch.float16), 0.5), {}),
        ((probs.to(device=device, dtype=torch.bfloat16), 0.8), {}),
    ]
