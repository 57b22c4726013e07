"""lplb.lplb_dispatch: balance MoE tokens over redundant expert replicas (LP shares + dispatch).

Backends: the pure-torch reference only (its LPs by the float64 interior point).
"""

from __future__ import annotations

import torch

from kernels_jit.dispatch import Op
from kernels_jit.validation import check_same_device, check_tensor
from kernels_lplb import reference

OP_ID = "lplb.lplb_dispatch"


def _lplb_dispatch_torch(
    phys_ids: torch.Tensor,
    log2phy_prob: torch.Tensor,
    topk_ids: torch.Tensor,
    phy2log: torch.Tensor,
    log2phy: torch.Tensor,
    num_gpus: int,
    counts: torch.Tensor | None,
    seed: int,
) -> None:
    ids, prob = reference.lplb_dispatch(topk_ids, phy2log, log2phy, num_gpus, counts, seed)
    phys_ids.copy_(ids)
    log2phy_prob.copy_(prob)


LPLB_DISPATCH = Op(_lplb_dispatch_torch, mutates=("phys_ids", "log2phy_prob"), device="topk_ids")
INDEX = LPLB_DISPATCH.dtypes


def lplb_dispatch(
    topk_ids: torch.Tensor,
    phy2log: torch.Tensor,
    log2phy: torch.Tensor,
    num_gpus: int,
    *,
    counts: torch.Tensor | None = None,
    seed: int = 0,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Map each token slot's logical expert to one of its physical replicas so that GPU loads
    balance (SGLang's LPLB).

    1. Load ``t = counts / sum(counts)`` (default counts: bincount of topk_ids).
    2. An LP (solved with :func:`solve_lp`) splits each replicated expert's load over its copies
       to minimise the largest GPU load; GPU g owns physical experts ``[g Pe/G, (g+1) Pe/G)``.
    3. ``log2phy_prob[l, c]`` = share of copy ``log2phy[l, c]`` (0 for -1 entries; equal split if
       the LP does not converge).
    4. Slot (t, j) of logical l picks copy c with probability proportional to its share, by inverse
       CDF with ``u = U(seed, 0, t, j)``: reproducible on every rank. l < 0 gives -1.

    Parameters
    ----------
    topk_ids : [T, k] int32 logical expert ids (negative: no expert).
    phy2log : [Pe] int32 logical id of each physical expert.
    log2phy : [L, Cmax] int32 physical ids of each logical expert, -1 padded (column 0 valid).
    num_gpus : G, dividing Pe.
    counts : optional [L] global token counts (after the engine's expert-parallel all-reduce).
    seed : int seed of the dispatch draw.

    Returns
    -------
    phys_ids [T, k] int32 and log2phy_prob [L, Cmax] float32.
    """
    check_tensor(OP_ID, "topk_ids", topk_ids, dtypes=INDEX, ndim=2)
    check_tensor(OP_ID, "phy2log", phy2log, dtypes=INDEX, ndim=1)
    check_tensor(OP_ID, "log2phy", log2phy, dtypes=INDEX, ndim=2)
    check_same_device(OP_ID, topk_ids=topk_ids, phy2log=phy2log, log2phy=log2phy)
    experts, max_copies = log2phy.shape
    if isinstance(num_gpus, bool) or not isinstance(num_gpus, int):
        raise TypeError(f"{OP_ID}: num_gpus must be an int, got {type(num_gpus).__name__}")
    if num_gpus < 1 or phy2log.shape[0] % num_gpus:
        raise ValueError(
            f"{OP_ID}: num_gpus must be >= 1 and divide Pe = {phy2log.shape[0]}, got {num_gpus}"
        )
    if max_copies < 1:
        raise ValueError(f"{OP_ID}: log2phy must have Cmax >= 1 columns, got shape {(experts, 0)}")
    if counts is not None:
        check_tensor(
            OP_ID,
            "counts",
            counts,
            dtypes=(torch.int32, torch.int64, torch.float32),
            ndim=1,
            device=topk_ids.device,
        )
        if counts.shape[0] != experts:
            raise ValueError(
                f"{OP_ID}: counts must have L = {experts} entries, got {counts.shape[0]}"
            )
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"{OP_ID}: seed must be an int, got {type(seed).__name__}")
    phys_ids = torch.empty(topk_ids.shape, dtype=torch.int32, device=topk_ids.device)
    log2phy_prob = torch.empty(experts, max_copies, dtype=torch.float32, device=topk_ids.device)
    if experts:
        LPLB_DISPATCH.run(
            phys_ids,
            log2phy_prob,
            topk_ids,
            phy2log,
            log2phy,
            num_gpus,
            counts,
            seed,
            backend=backend,
        )
    return phys_ids, log2phy_prob


def replicated_layout(experts: int, extra: int, num_gpus: int, seed: int = 0):
    """(phy2log, log2phy): every logical expert once, plus ``extra`` replicas of random experts,
    shuffled over ``num_gpus`` GPUs (a small EPLB-like placement for examples and tests)."""
    g = torch.Generator().manual_seed(seed)
    logical = torch.cat([torch.arange(experts), torch.randint(0, experts, (extra,), generator=g)])
    phy2log = logical[torch.randperm(logical.numel(), generator=g)].to(torch.int32)
    width = int(torch.bincount(phy2log.long(), minlength=experts).max())
    log2phy = torch.full((experts, width), -1, dtype=torch.int32)
    fill = [0] * experts
    for p, l in enumerate(phy2log.tolist()):
        log2phy[l, fill[l]] = p
        fill[l] += 1
    return phy2log, log2phy


def _lplb_dispatch_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: 16 logical experts, 8 replicas, 4 GPUs."""
    g = torch.Generator().manual_seed(1)
    phy2log, log2phy = replicated_layout(16, 8, 4)
    topk = torch.randint(0, 16, (64, 4), generator=g, dtype=torch.int32)
    args = (topk.to(device), phy2log.to(device), log2phy.to(device), 4)
    return [(args, {"seed": 5})]
