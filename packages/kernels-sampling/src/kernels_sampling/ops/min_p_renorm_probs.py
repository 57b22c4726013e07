"""sampling.min_p_renorm_probs: keep the tokens with ``p >= min_p * max(p)``, renormalise.

CUDA (csrc/filters.cuh): a CTA of 1024 threads per row, or for small batches a cluster of up to 8
CTAs over slices of the row, streamed from global memory (mostly L2); a max pass, a kept-sum pass
and the write pass, 16-byte packs. The pure-torch reference (fp32, sort based) is the fallback.
"""

from __future__ import annotations

import torch

from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_sampling import reference
from kernels_sampling._common import (
    FILTERS_CUDA,
    check_min_p_scalar,
    check_nan_flag,
    check_rows,
    filters_cuda_eligible,
    row_param,
)

OP_ID = "sampling.min_p_renorm_probs"


def _min_p_renorm_probs_torch(
    out: torch.Tensor, probs: torch.Tensor, min_p_arr: torch.Tensor | None, min_p_val: float
) -> None:
    out.copy_(reference.min_p_renorm_probs(probs, min_p_val if min_p_arr is None else min_p_arr))


_min_p_renorm_probs_cuda = CompiledFunction(FILTERS_CUDA, "min_p_renorm_probs")


def _min_p_renorm_probs_cuda_eligible(
    out: torch.Tensor, probs: torch.Tensor, min_p_arr: torch.Tensor | None, min_p_val: float
) -> str | None:
    return filters_cuda_eligible(probs, min_p_arr)


MIN_P_RENORM_PROBS = Op(_min_p_renorm_probs_torch, mutates=("out",), device="probs")


def min_p_renorm_probs(
    probs: torch.Tensor,
    min_p: float | torch.Tensor,
    *,
    check_nan: bool = False,
    backend: str | None = None,
) -> torch.Tensor:
    """Keep i iff ``p_i >= min_p * max(p)`` (fp32), zero the rest and renormalise.

    Invalid rows (no error, no host sync) become all NaN in the output, never a plausible
    distribution: a row holding a NaN, +/-inf or negative probability, a row whose per-row min_p
    is NaN or outside [0, 1], or whose kept fp32 sum overflows. Other rows are unaffected. An
    all-zero row (kept sum < 1e-8) stays zeros.

    Parameters
    ----------
    probs : [B, V] float32, float16 or bfloat16; the output keeps the dtype.
    min_p : float, or float32 [B] per row, in [0, 1]; 0 keeps the row, 1 keeps the argmax set.
        A float that is NaN or outside [0, 1] raises ValueError; such a tensor entry makes its row
        invalid (all NaN).
    check_nan : if True, raise ValueError when any entry of ``probs`` is NaN. Costs a
        device-to-host sync (not CUDA-graph / ``torch.compile(fullgraph=True)`` safe); off by
        default, when NaN rows give the invalid outcome above instead.
    backend : force a backend instead of the best eligible one.
    """
    check_rows(OP_ID, "probs", probs)
    check_nan_flag(OP_ID, probs, check_nan)
    arr, val = row_param(OP_ID, "min_p", min_p, probs.shape[0], probs.device, integral=False)
    check_min_p_scalar(OP_ID, val, arr)
    out = torch.empty_like(probs, memory_format=torch.contiguous_format)
    if probs.numel():
        MIN_P_RENORM_PROBS.run(out, probs, arr, float(val), backend=backend)
    return out


def _min_p_renorm_probs_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``."""
    g = torch.Generator().manual_seed(2)
    probs = (torch.randn(3, 129, generator=g) * 2).softmax(dim=1)
    mps = torch.tensor([0.0, 0.05, 1.0])
    return [
        ((probs.to(device), 0.1), {}),
        ((probs.to(device), mps.to(device)), {}),
        ((probs.to(device=device, dtype=torch.bfloat16), 0.2), {}),
        ((probs.to(device=device, dtype=torch.float16), 0.05), {}),
    ]
