"""sampling.top_k_mask_logits: set every logit outside the row's top-k values to -inf.

CUDA (csrc/filters.cuh): small batches: a cluster of up to 16 CTAs per row, each slice cached in
shared memory (one HBM read); larger batches: a CTA of 1024 threads per row; the k-th largest value
by a radix select over an order-preserving key of the fp32 bits (NaN largest, like torch.sort),
then the write pass. The pure-torch reference (fp32, sort based) is the fallback.
"""

from __future__ import annotations

import torch

from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_sampling import reference
from kernels_sampling._common import FILTERS_CUDA, check_rows, filters_cuda_eligible, row_param

OP_ID = "sampling.top_k_mask_logits"


def _top_k_mask_logits_torch(
    out: torch.Tensor, logits: torch.Tensor, top_k_arr: torch.Tensor | None, top_k_val: int
) -> None:
    out.copy_(reference.top_k_mask_logits(logits, top_k_val if top_k_arr is None else top_k_arr))


_top_k_mask_logits_cuda = CompiledFunction(FILTERS_CUDA, "top_k_mask_logits")


def _top_k_mask_logits_cuda_eligible(
    out: torch.Tensor, logits: torch.Tensor, top_k_arr: torch.Tensor | None, top_k_val: int
) -> str | None:
    return filters_cuda_eligible(logits, top_k_arr)


TOP_K_MASK_LOGITS = Op(_top_k_mask_logits_torch, mutates=("out",), device="logits")


def top_k_mask_logits(
    logits: torch.Tensor, top_k: int | torch.Tensor, *, backend: str | None = None
) -> torch.Tensor:
    """Logits kept by the top-k rule unchanged, the others -inf (ties kept together).

    Parameters
    ----------
    logits : [B, V] float32, float16 or bfloat16; the output keeps the dtype.
    top_k : int, or int32/int64 [B] per row; k <= 0 or k >= V keeps the whole row.
    backend : force a backend instead of the best eligible one.
    """
    check_rows(OP_ID, "logits", logits)
    arr, val = row_param(OP_ID, "top_k", top_k, logits.shape[0], logits.device, integral=True)
    out = torch.empty_like(logits, memory_format=torch.contiguous_format)
    if logits.numel():
        TOP_K_MASK_LOGITS.run(out, logits, arr, int(val), backend=backend)
    return out


def _top_k_mask_logits_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``."""
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 300, generator=g)
    ks = torch.tensor([1, 5, -1, 299], dtype=torch.int32)
    return [
        ((logits.to(device), 10), {}),
        ((logits.to(device), ks.to(device)), {}),
        ((logits.to(device=device, dtype=torch.float16), 50), {}),
        ((logits.to(device=device, dtype=torch.bfloat16), 7), {}),
    ]
