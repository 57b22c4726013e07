"""Pure-torch references of the lplb ops: the correctness oracle and the fallback.

``solve_lp`` is a batched primal-dual path-following interior-point method (Mehrotra
predictor-corrector) in float64 on the normal equations ``A diag(x/s) A^T dy = r``, factored by a
Cholesky whose pivots below 1e-12 of the largest diagonal entry are treated as dependent rows
(replaced by 1e64, LIPSOL's rule), so redundant equality constraints are harmless.
"""

from __future__ import annotations

import math

import torch

from kernels_jit.rng import to_int64, uniform

CONVERGED, MAX_ITERS, INFEASIBLE_OR_UNBOUNDED = 0, 1, 2
PIVOT_FLOOR = 1e-12
DEPENDENT_PIVOT = 1e64
STEP_FRACTION = 0.99
BLOWUP = 1e10
RAY_SIZE = 1e4
COUNTS_AND_SHARES = (
    "counts and shares are exclusive: counts only feed the LP, which given shares replace"
)


def cholesky_floored(m: torch.Tensor, dependent: torch.Tensor | None = None) -> torch.Tensor:
    """Lower Cholesky factor of symmetric PSD [P, k, k] (float64); dependent rows (pivot <= 1e-12
    of the largest diagonal entry) get pivot 1e64, and ``dependent`` (bool [P], if given) is set
    where a problem has one."""
    k = m.shape[1]
    factor = torch.zeros_like(m)
    floor = PIVOT_FLOOR * m.diagonal(dim1=1, dim2=2).amax(dim=1).clamp(min=1e-300)
    for j in range(k):
        row = factor[:, j, :j]
        pivot = m[:, j, j] - (row * row).sum(dim=1)
        floored = pivot <= floor
        if dependent is not None:
            dependent |= floored
        pivot = torch.where(floored, DEPENDENT_PIVOT, pivot)
        factor[:, j, j] = pivot.sqrt()
        if j + 1 < k:
            below = m[:, j + 1 :, j] - (factor[:, j + 1 :, :j] @ row[:, :, None]).squeeze(-1)
            factor[:, j + 1 :, j] = below / factor[:, j, j, None]
    return factor


def _solve(factor: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """x with ``L L^T x = rhs`` for rhs [P, k]."""
    z = torch.linalg.solve_triangular(factor, rhs[:, :, None], upper=False)
    return torch.linalg.solve_triangular(factor.transpose(1, 2), z, upper=True)[:, :, 0]


def _max_step(v: torch.Tensor, dv: torch.Tensor) -> torch.Tensor:
    """The largest alpha in [0, 1] with v + alpha dv >= 0, per problem."""
    ratio = torch.where(dv < 0, -v / dv, torch.inf)
    return ratio.amin(dim=1).clamp(max=1.0)


def _newton(a, factor, d, s, rb, rc, rxs):
    """(dx, dy, ds) of the Newton system with complementarity right-hand side rxs."""
    rhs = -rb - (a @ (rxs / s + d * rc)[:, :, None])[:, :, 0]
    dy = _solve(factor, rhs)
    aty = (a.transpose(1, 2) @ dy[:, :, None])[:, :, 0]
    ds = -rc - aty
    dx = rxs / s + d * (rc + aty)
    return dx, dy, ds


def solve_lp(
    a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, *, max_iters: int = 50, tol: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """``min c^T x s.t. A x = b, x >= 0`` for P independent problems.

    Returns (x fp32 [P, n], status int32 [P]): 0 converged (``|Ax-b|_inf <= tol (1+|b|_inf)``,
    ``|A^T y + s - c|_inf <= tol (1+|c|_inf)``, ``|c^T x - b^T y| <= tol (1+|c^T x|)``), 1 max_iters
    reached, 2 infeasible or unbounded detected (iterates diverge, or a Farkas/unboundedness ray
    appears: ``A^T y <= 0, b^T y > 0`` or ``A x = 0, x >= 0, c^T x < 0`` within tol; or ``A x = b``
    itself is inconsistent: rows found dependent by the pivot floor and the least-norm start
    misses b by more than ``sqrt(tol) (1 + |b|_inf)``).
    """
    a, b, c = a.double(), b.double(), c.double()
    problems, rows, cols = a.shape
    device = a.device
    at = a.transpose(1, 2)
    status = torch.full((problems,), MAX_ITERS, dtype=torch.int32, device=device)
    if cols == 0 or rows == 0:
        # No variables: feasible iff b == 0. No constraints: x = 0 is optimal iff c >= 0.
        x = torch.zeros(problems, cols, dtype=torch.float32, device=device)
        ok = (b == 0).all(dim=1) & (c >= 0).all(dim=1)
        status = torch.where(ok, CONVERGED, INFEASIBLE_OR_UNBOUNDED).to(torch.int32)
        return x, status

    # Mehrotra's starting point: least-norm x and least-squares (y, s), shifted to the interior.
    dependent = torch.zeros(problems, dtype=torch.bool, device=device)
    factor = cholesky_floored(a @ at, dependent)
    x = (at @ _solve(factor, b)[:, :, None])[:, :, 0]
    b_norm, c_norm = b.abs().amax(dim=1), c.abs().amax(dim=1)
    # Dependent rows are dropped by the floor: if b is not in the range of A, Ax = b has no
    # solution at all, and the interior point would only stall (status 1): report it.
    miss = ((a @ x[:, :, None])[:, :, 0] - b).abs().amax(dim=1)
    inconsistent = dependent & ~(miss <= math.sqrt(tol) * (1 + b_norm))
    y = _solve(factor, (a @ c[:, :, None])[:, :, 0])
    s = c - (at @ y[:, :, None])[:, :, 0]
    x = x + (-1.5 * x.amin(dim=1, keepdim=True)).clamp(min=0)
    s = s + (-1.5 * s.amin(dim=1, keepdim=True)).clamp(min=0)
    xs = (x * s).sum(dim=1, keepdim=True)
    x = x + 0.5 * xs / s.sum(dim=1, keepdim=True).clamp(min=1e-300)
    s = s + 0.5 * xs / x.sum(dim=1, keepdim=True).clamp(min=1e-300)
    scale = 1.0 + torch.maximum(b_norm, c_norm)[:, None]
    x = torch.where(x > 1e-8 * scale, x, scale)
    s = torch.where(s > 1e-8 * scale, s, scale)

    status[inconsistent] = INFEASIBLE_OR_UNBOUNDED
    active = ~inconsistent
    for iteration in range(max_iters + 1):
        rb = (a @ x[:, :, None])[:, :, 0] - b
        rc = (at @ y[:, :, None])[:, :, 0] + s - c
        cx, by = (c * x).sum(dim=1), (b * y).sum(dim=1)
        primal_ok = rb.abs().amax(dim=1) <= tol * (1 + b_norm)
        dual_ok = rc.abs().amax(dim=1) <= tol * (1 + c_norm)
        gap_ok = (cx - by).abs() <= tol * (1 + cx.abs())
        done = active & primal_ok & dual_ok & gap_ok & (x.amin(dim=1) >= -tol)
        status[done] = CONVERGED
        active &= ~done

        # A certificate only counts once the iterates diverge along it: early iterates of a
        # feasible problem can satisfy the sign conditions by accident.
        y_big = y.abs().amax(dim=1) > RAY_SIZE * scale[:, 0]
        x_big = x.abs().amax(dim=1) > RAY_SIZE * scale[:, 0]
        aty = (at @ y[:, :, None])[:, :, 0]
        farkas = y_big & (by > 0) & ((aty / by[:, None]).amax(dim=1) <= tol) & ~primal_ok
        ax = (a @ x[:, :, None])[:, :, 0]
        ray = x_big & (cx < 0) & (ax.abs().amax(dim=1) <= tol * cx.abs()) & ~dual_ok
        size = torch.stack([x.abs().amax(1), s.abs().amax(1), y.abs().amax(1)])
        blown = ~torch.isfinite(size).all(dim=0) | (size.amax(dim=0) > BLOWUP * scale[:, 0])
        failed = active & (farkas | ray | blown)
        status[failed] = INFEASIBLE_OR_UNBOUNDED
        active &= ~failed
        if iteration == max_iters or not bool(active.any()):
            break

        mu = (x * s).sum(dim=1, keepdim=True) / cols
        d = x / s
        factor = cholesky_floored(a @ (d[:, :, None] * at))
        dx, dy, ds = _newton(a, factor, d, s, rb, rc, -x * s)
        alpha_p, alpha_d = _max_step(x, dx)[:, None], _max_step(s, ds)[:, None]
        mu_aff = ((x + alpha_p * dx) * (s + alpha_d * ds)).sum(dim=1, keepdim=True) / cols
        sigma = (mu_aff / mu).clamp(max=1.0) ** 3
        rxs = -x * s - dx * ds + sigma * mu
        dx, dy, ds = _newton(a, factor, d, s, rb, rc, rxs)
        alpha_p = STEP_FRACTION * _max_step(x, dx)[:, None]
        alpha_d = STEP_FRACTION * _max_step(s, ds)[:, None]
        keep = active[:, None]
        x = torch.where(keep, x + alpha_p * dx, x)
        y = torch.where(keep, y + alpha_d * dy, y)
        s = torch.where(keep, s + alpha_d * ds, s)
    return x.to(torch.float32), status


def check_layout(op: str, phy2log: torch.Tensor, log2phy: torch.Tensor) -> None:
    """ValueError unless ``log2phy`` is exactly the inverse of ``phy2log`` (reads both on the host).

    ``phy2log[p]`` in ``[0, L)`` is the logical expert of physical slot p; row l of ``log2phy``
    lists, in any order and -1 padded, every physical slot p with ``phy2log[p] == l``, each once;
    every logical expert has at least one slot.
    """
    experts = log2phy.shape[0]
    physical = phy2log.shape[0]
    p2l = phy2log.long().cpu()
    l2p = log2phy.long().cpu()
    if physical and (int(p2l.min()) < 0 or int(p2l.max()) >= experts):
        bad = int(torch.nonzero((p2l < 0) | (p2l >= experts))[0, 0])
        raise ValueError(
            f"{op}: phy2log must hold logical ids in [0, L = {experts}), got phy2log[{bad}] = "
            f"{int(p2l[bad])}"
        )
    if l2p.numel() and (int(l2p.min()) < -1 or int(l2p.max()) >= physical):
        raise ValueError(
            f"{op}: log2phy must hold physical ids in [0, {physical}) or -1, got values in "
            f"[{int(l2p.min())}, {int(l2p.max())}]"
        )
    valid = l2p >= 0
    rows = torch.arange(experts)[:, None].expand_as(l2p)[valid]
    slots = l2p[valid]
    seen = torch.bincount(slots, minlength=physical)
    if physical and not bool((seen == 1).all()):
        p = int(torch.nonzero(seen != 1)[0, 0])
        raise ValueError(
            f"{op}: log2phy must list every physical slot exactly once (it is the inverse of "
            f"phy2log), but slot {p} appears {int(seen[p])} times"
        )
    wrong = p2l[slots] != rows
    if bool(wrong.any()):
        k = int(torch.nonzero(wrong)[0, 0])
        raise ValueError(
            f"{op}: log2phy and phy2log disagree: log2phy[{int(rows[k])}] lists physical slot "
            f"{int(slots[k])}, but phy2log[{int(slots[k])}] = {int(p2l[slots[k]])}"
        )
    copies = valid.sum(dim=1)
    if experts and not bool((copies >= 1).all()):
        l = int(torch.nonzero(copies == 0)[0, 0])
        raise ValueError(f"{op}: logical expert {l} has no physical slot (log2phy[{l}] is all -1)")


def replica_shares(
    phy2log: torch.Tensor, log2phy: torch.Tensor, num_gpus: int, counts: torch.Tensor
) -> tuple[torch.Tensor, int]:
    """(log2phy_prob fp32 [L, Cmax], LP status): each physical copy's share of the total load.

    The layout must pass :func:`check_layout`. Physical slot p holds logical expert
    ``phy2log[p]`` and sits on GPU ``p // (Pe/G)``; the copies of expert l are the slots with
    ``phy2log[p] == l`` (listed in ``log2phy[l]``, whose order numbers the LP variables). The LP
    has a variable per copy of every replicated logical expert, a slack per GPU, the max load M and
    an artificial z whose column is ``b - A 1`` (so x = 1 is interior); rows: the copies of each
    replicated expert sum to its load ``t_l``, and each GPU's load plus its slack equals M;
    objective ``M + 1000 z``. A single copy carries its expert's whole load. If the LP does not
    converge, the copies of an expert split its load equally.
    """
    experts = log2phy.shape[0]
    physical = phy2log.shape[0]
    per_gpu = physical // num_gpus
    device = log2phy.device
    valid = log2phy >= 0
    p2l = phy2log.long().cpu()
    copies = torch.bincount(p2l, minlength=experts)  # slots per logical expert, from phy2log
    total = counts.double().sum()
    load = counts.double() / total if total > 0 else torch.zeros(experts, dtype=torch.float64)
    load = load.float().cpu()
    owner = log2phy.clamp(min=0).long()
    share = torch.zeros(physical, dtype=torch.float32)
    single_slot = copies[p2l] == 1  # physical slots of single-copy experts
    share[single_slot] = load[p2l[single_slot]]

    replicated = torch.nonzero(copies >= 2).flatten().tolist()
    status = CONVERGED
    if replicated and total > 0:
        variables = [(l, p) for l in replicated for p in log2phy[l].tolist() if p >= 0]
        nvar = len(variables)
        rows, cols = len(replicated) + num_gpus, nvar + num_gpus + 2
        a = torch.zeros(rows, cols, dtype=torch.float32)
        b = torch.zeros(rows, dtype=torch.float32)
        single_load = torch.zeros(num_gpus, dtype=torch.float64)
        gpu_of_slot = torch.arange(physical) // per_gpu
        single_load.index_add_(0, gpu_of_slot[single_slot], load[p2l[single_slot]].double())
        row_of = {l: r for r, l in enumerate(replicated)}
        for v, (l, p) in enumerate(variables):
            a[row_of[l], v] = 1.0
            a[len(replicated) + p // per_gpu, v] = 1.0
        for g in range(num_gpus):
            a[len(replicated) + g, nvar + g] = 1.0
            a[len(replicated) + g, nvar + num_gpus] = -1.0
        b[: len(replicated)] = load[replicated]
        b[len(replicated) :] = -single_load.float()
        a[:, -1] = b - a[:, :-1].sum(dim=1)
        c = torch.zeros(cols, dtype=torch.float32)
        c[nvar + num_gpus], c[-1] = 1.0, 1000.0
        x, st = solve_lp(a[None], b[None], c[None])
        status = int(st[0])
        index = torch.tensor([p for _, p in variables], dtype=torch.long)
        if status == CONVERGED:
            share[index] = x[0, :nvar].clamp(min=0)
    if status != CONVERGED:
        equal = load / copies.clamp(min=1).float()
        share = equal[p2l]
    prob = torch.where(valid, share.to(device)[owner], 0.0)
    return prob, status


def dispatch_draw(
    topk_ids: torch.Tensor, log2phy: torch.Tensor, prob: torch.Tensor, seed: int
) -> torch.Tensor:
    """phys_ids int32 [T, k]: slot (t, j) of logical expert l = topk_ids[t, j] picks copy c of
    ``log2phy[l]``: the smallest c with ``cdf_c > u * cdf_last``, ``cdf = cumsum(prob[l])`` in
    fp32 left to right, ``u = U(seed, 0, t, j)`` (``log2phy[l, 0]`` when ``cdf_last <= 0``; the
    last positive-weight copy if rounding leaves none; -1 for l < 0)."""
    ids = topk_ids.long()
    tokens, k = ids.shape
    logical = ids.clamp(min=0)
    weights = prob[logical]
    # A fill, not a host-to-device copy: the draw alone can be captured in a CUDA graph.
    seed_t = torch.full((1,), to_int64(seed), dtype=torch.int64, device=ids.device)
    slot_row = torch.arange(tokens, device=ids.device)[:, None]
    slot_col = torch.arange(k, device=ids.device)[None, :]
    u = uniform(seed_t, torch.zeros_like(seed_t), slot_row, slot_col)
    cdf = weights.cumsum(dim=-1)
    total = cdf[..., -1]
    pick = (cdf <= (u * total)[..., None]).sum(dim=-1)
    last_positive = (weights.shape[-1] - 1) - (weights > 0).flip(-1).to(torch.int8).argmax(dim=-1)
    pick = torch.where(pick >= weights.shape[-1], last_positive, pick)
    pick = torch.where(total > 0, pick, 0)
    phys = log2phy.long()[logical, pick]
    return torch.where(ids < 0, -1, phys).to(torch.int32)


def check_shares(op: str, log2phy: torch.Tensor, shares: torch.Tensor) -> None:
    """ValueError unless the given shares [L, Cmax] are finite, >= 0, and 0 where ``log2phy`` is
    -1 (reads them on the host): what the draw needs to pick only listed copies, and the same ids
    on every backend."""
    s = shares.detach().cpu()
    if not bool(torch.isfinite(s).all()):
        bad = int((~torch.isfinite(s)).sum())
        raise ValueError(f"{op}: shares must be finite, got {bad} NaN/inf entries")
    if bool((s < 0).any()):
        raise ValueError(f"{op}: shares must be >= 0, got a minimum of {float(s.min())}")
    padded = log2phy.cpu() < 0
    if bool((s[padded] != 0).any()):
        l, c = (int(i) for i in torch.nonzero(padded & (s != 0))[0])
        raise ValueError(
            f"{op}: shares must be 0 where log2phy is -1, got shares[{l}, {c}] = {float(s[l, c])}"
        )


def lplb_dispatch(
    topk_ids: torch.Tensor,
    phy2log: torch.Tensor,
    log2phy: torch.Tensor,
    num_gpus: int,
    counts: torch.Tensor | None = None,
    seed: int = 0,
    shares: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(phys_ids int32 [T, k], log2phy_prob fp32 [L, Cmax]): the layout checked
    (:func:`check_layout`), replica shares from the LP (:func:`replica_shares`), then the seeded
    draw (:func:`dispatch_draw`). Given ``shares`` (a previous log2phy_prob, checked by
    :func:`check_shares`; exclusive with ``counts``), no LP: the draw on them, and a copy of them
    as log2phy_prob."""
    op = "lplb.lplb_dispatch"
    experts = log2phy.shape[0]
    ids = topk_ids.long()
    if ids.numel() and int(ids.max()) >= experts:
        raise ValueError(
            f"{op}: topk_ids must be < L = {experts} (or negative), got {int(ids.max())}"
        )
    check_layout(op, phy2log, log2phy)
    if shares is not None:
        if counts is not None:
            raise ValueError(f"{op}: {COUNTS_AND_SHARES}")
        check_shares(op, log2phy, shares)
        prob = shares.float().clone()
    else:
        if counts is None:
            counts = torch.bincount(ids[ids >= 0], minlength=experts)
        prob, _ = replica_shares(phy2log, log2phy, num_gpus, counts)
    return dispatch_draw(ids, log2phy, prob, seed), prob
