"""lplb.lplb_dispatch: balance MoE tokens over redundant expert replicas (LP shares + dispatch).

CUDA (csrc/lplb_dispatch.cuh): one CTA checks the layout, counts the tokens, builds and solves
the LP in shared memory (the interior point of csrc/ipm.cuh) and writes the shares; then a thread
per token slot draws its replica with the project RNG. Two launches, no host synchronisation.
Given ``shares`` (the log2phy_prob of an earlier call), only the draw runs: one launch, which
also copies the shares to log2phy_prob. The pure-torch reference (its LP by the float64 interior
point) is the fallback.
"""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.rng import to_int64
from kernels_jit.validation import check_same_device, check_tensor
from kernels_lplb import reference
from kernels_lplb.ops.solve_lp import SMEM_LIMIT, normal_matrix_bytes

OP_ID = "lplb.lplb_dispatch"


def _lplb_dispatch_torch(
    phys_ids: torch.Tensor,
    log2phy_prob: torch.Tensor,
    topk_ids: torch.Tensor,
    phy2log: torch.Tensor,
    log2phy: torch.Tensor,
    num_gpus: int,
    counts: torch.Tensor | None,
    shares: torch.Tensor | None,
    seed: int,
) -> None:
    ids, prob = reference.lplb_dispatch(
        topk_ids, phy2log, log2phy, num_gpus, counts, seed, shares=shares
    )
    phys_ids.copy_(ids)
    log2phy_prob.copy_(prob)


LPLB_DISPATCH_CUDA = ModuleSpec(
    name="lplb_dispatch",
    package="kernels_lplb",
    sources=("csrc/lplb_dispatch.cuh",),
    exports=(("lplb_dispatch", "lplb_dispatch"),),
    description="CUDA: LP replica shares in one CTA (fp64 interior point), then the seeded draw "
    "(the draw alone when shares are given)",
)

_lplb_dispatch_cuda = CompiledFunction(LPLB_DISPATCH_CUDA, "lplb_dispatch")


def shares_smem_bytes(experts: int, physical: int, num_gpus: int) -> int:
    """Shared memory of the CUDA shares kernel (csrc/lplb_dispatch.cuh ``SharesLayout``): the LP
    of a valid layout is at most (Pe - L + G) x (2 (Pe - L) + G + 2)."""
    extra = max(physical - experts, 0)
    rows, cols = extra + num_gpus, 2 * extra + num_gpus + 2
    odd = cols if cols % 2 else cols + 1
    lp = normal_matrix_bytes(rows, cols) + num_gpus * 8 + rows * odd * 4 + rows * 4
    return lp + experts * 20 + physical * 8 + cols * 4 + 16


def _lplb_dispatch_cuda_eligible(
    phys_ids: torch.Tensor,
    log2phy_prob: torch.Tensor,
    topk_ids: torch.Tensor,
    phy2log: torch.Tensor,
    log2phy: torch.Tensor,
    num_gpus: int,
    counts: torch.Tensor | None,
    shares: torch.Tensor | None,
    seed: int,
) -> str | None:
    given = (t for t in (counts, shares) if t is not None)
    tensors = (topk_ids, phy2log, log2phy, *given)
    if not all(t.is_contiguous() for t in tensors):
        return "needs contiguous topk_ids, phy2log, log2phy, counts and shares"
    experts, max_copies = log2phy.shape
    physical = phy2log.shape[0]
    if max(experts, physical, max_copies) >= 2**20 or topk_ids.numel() >= 2**31:
        return "needs L, Pe, Cmax < 2^20 and T k < 2^31"
    if shares is not None:  # no LP: no shared memory
        return None
    need = shares_smem_bytes(experts, physical, num_gpus)
    if need > SMEM_LIMIT:
        return (
            f"L = {experts}, Pe = {physical}, G = {num_gpus}: the LP needs {need} bytes of shared "
            "memory > 227 KB (Pe - L + G <= ~150)"
        )
    return None


LPLB_DISPATCH = Op(_lplb_dispatch_torch, mutates=("phys_ids", "log2phy_prob"), device="topk_ids")
INDEX = LPLB_DISPATCH.dtypes


def lplb_dispatch(
    topk_ids: torch.Tensor,
    phy2log: torch.Tensor,
    log2phy: torch.Tensor,
    num_gpus: int,
    *,
    counts: torch.Tensor | None = None,
    shares: torch.Tensor | None = None,
    seed: int = 0,
    validate: bool = False,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Map each token slot's logical expert to one of its physical replicas so that GPU loads
    balance (SGLang's LPLB).

    The layout: physical slot p holds logical expert ``phy2log[p]`` and sits on GPU
    ``p // (Pe/G)``; ``log2phy`` is the exact inverse of ``phy2log`` (row l lists, in any order
    and -1 padded, every slot p with ``phy2log[p] == l``, each slot once), and every logical
    expert has at least one slot.

    1. Load ``t = counts / sum(counts)`` (default counts: bincount of topk_ids).
    2. An LP (solved with :func:`solve_lp`) splits each replicated expert's load over its copies
       to minimise the largest GPU load. The copies of expert l and the single-copy load of each
       GPU come from ``phy2log``; ``log2phy``'s row order numbers the LP variables and the
       dispatch columns.
    3. ``log2phy_prob[l, c]`` = share of copy ``log2phy[l, c]`` (0 for -1 entries; equal split if
       the LP does not converge).
    4. Slot (t, j) of logical l picks copy c with probability proportional to its share, by inverse
       CDF with ``u = U(seed, 0, t, j)``: reproducible on every rank. l < 0 gives -1.

    With ``shares`` given, steps 1-3 are skipped: the draw (step 4) runs on them. An engine that
    balances once per step passes the log2phy_prob of one call as ``shares`` to the others
    (layers, micro-batches) and pays the draw only (on CUDA a single launch instead of the LP's
    CTA and the draw).

    Parameters
    ----------
    topk_ids : [T, k] int32/int64 logical expert ids (negative: no expert).
    phy2log : [Pe] int32/int64 logical id of each physical slot.
    log2phy : [L, Cmax] int32/int64 physical slots of each logical expert, -1 padded.
    num_gpus : G, dividing Pe.
    counts : optional [L] global token counts (after the engine's expert-parallel all-reduce),
        int32, int64 or float32. Only the LP reads them: passing both counts and shares is a
        ValueError (rather than silently ignoring counts).
    shares : optional precomputed log2phy_prob [L, Cmax] float32, contiguous, on topk_ids' device
        (the second output of an earlier call, or ``reference.replica_shares``): finite, >= 0 and
        0 where log2phy is -1. The ids are bit for bit the reference's draw on these shares.
    seed : int seed of the dispatch draw.
    validate : check the values of topk_ids (< L), the layout rules above and the values of
        shares before launching (ValueError naming the first violation). This reads them on the
        host: a device-to-host sync on CUDA, so not for CUDA graphs; skipped while torch.compile
        traces.

    Checks and their cost
    ---------------------
    Types, dtypes, shapes, devices and ``num_gpus`` are always checked (no sync). The torch
    reference (CPU, and the CUDA fallback) always checks the values too. The CUDA kernels check
    the layout on the device without a sync: a layout that breaks the rules (passed without
    ``validate=True``) gives ``log2phy_prob`` all NaN and ``phys_ids`` all -1, never a fault; an
    id >= L gives -1 for that slot. With ``shares`` the CUDA path launches the draw only, so it
    does not check the layout on the device (the check lives in the LP's CTA; the draw reads only
    topk_ids, log2phy and shares, and stays in bounds whatever they hold): a broken layout gives
    whatever ids log2phy lists, and a slot whose expert's shares sum to NaN gets -1. Use
    ``validate=True`` (or the reference) to have the layout and shares checked.

    Returns
    -------
    phys_ids [T, k] int32 and log2phy_prob [L, Cmax] float32 (with ``shares``: a new tensor equal
    to them, never ``shares`` itself, so writing to one does not change the other).
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
    if shares is not None:
        check_tensor(
            OP_ID,
            "shares",
            shares,
            dtypes=(torch.float32,),
            ndim=2,
            device=topk_ids.device,
            contiguous=True,
        )
        if shares.shape != log2phy.shape:
            raise ValueError(
                f"{OP_ID}: shares must have the shape of log2phy [L, Cmax] = "
                f"{list(log2phy.shape)}, got {list(shares.shape)}"
            )
        if counts is not None:
            raise ValueError(f"{OP_ID}: {reference.COUNTS_AND_SHARES}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"{OP_ID}: seed must be an int, got {type(seed).__name__}")
    if not isinstance(validate, bool):
        raise TypeError(f"{OP_ID}: validate must be a bool, got {type(validate).__name__}")
    seed = to_int64(seed)
    if validate and not torch.compiler.is_compiling():
        if topk_ids.numel() and int(topk_ids.max()) >= experts:
            raise ValueError(
                f"{OP_ID}: topk_ids must be < L = {experts} (or negative), "
                f"got {int(topk_ids.max())}"
            )
        reference.check_layout(OP_ID, phy2log, log2phy)
        if shares is not None:
            reference.check_shares(OP_ID, log2phy, shares)
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
            shares,
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
    """Small random calls for ``kernels-ops check``: 16 logical experts, 8 replicas, 4 GPUs; the
    LP and the draw, and the draw alone on given shares."""
    g = torch.Generator().manual_seed(1)
    phy2log, log2phy = replicated_layout(16, 8, 4)
    topk = torch.randint(0, 16, (64, 4), generator=g, dtype=torch.int32)
    counts = torch.randint(1, 100, (16,), generator=g)
    shares, _ = reference.replica_shares(phy2log, log2phy, 4, counts)
    samples = []
    for dtype in (torch.int32, torch.int64):
        args = (topk.to(dtype).to(device), phy2log.to(device), log2phy.to(device), 4)
        samples.append((args, {"seed": 5}))
        samples.append((args, {"seed": 5, "shares": shares.to(device)}))
    return samples
