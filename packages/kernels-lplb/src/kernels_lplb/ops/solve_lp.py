"""lplb.solve_lp: batched small dense linear programs by a primal-dual interior-point method.

Backends: the pure-torch reference only (float64 interior point).
"""

from __future__ import annotations

import torch

from kernels_jit.dispatch import Op
from kernels_jit.validation import check_tensor
from kernels_lplb import reference

OP_ID = "lplb.solve_lp"


def _solve_lp_torch(
    x: torch.Tensor,
    status: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    max_iters: int,
    tol: float,
) -> None:
    solution, flags = reference.solve_lp(a, b, c, max_iters=max_iters, tol=tol)
    x.copy_(solution)
    status.copy_(flags)


SOLVE_LP = Op(_solve_lp_torch, mutates=("x", "status"), device="a")
DTYPES = SOLVE_LP.dtypes


def solve_lp(
    A: torch.Tensor,  # noqa: N803
    b: torch.Tensor,
    c: torch.Tensor,
    *,
    max_iters: int = 50,
    tol: float = 1e-6,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Solve P independent problems ``min c^T x s.t. A x = b, x >= 0`` (one per block on the GPU).

    Primal-dual path following (Mehrotra predictor-corrector) on the normal equations, factored by
    Cholesky with a pivot floor, so redundant equality rows are allowed. Compare objectives and
    feasibility, not iterates: degenerate problems have many optimal x.

    Parameters
    ----------
    A : [P, m, n] float32 (float64 accepted). b : [P, m]. c : [P, n].
    max_iters : iteration limit (>= 0). tol : convergence tolerance (> 0).

    Returns
    -------
    x [P, n] float32 and status [P] int32: 0 converged (``|Ax - b|_inf <= tol (1 + |b|_inf)``,
    dual residual likewise, relative duality gap <= tol), 1 max_iters reached, 2 infeasible or
    unbounded detected.
    """
    check_tensor(OP_ID, "A", A, dtypes=DTYPES, ndim=3)
    problems, rows, cols = A.shape
    for name, t, shape in (("b", b, (problems, rows)), ("c", c, (problems, cols))):
        check_tensor(OP_ID, name, t, dtypes=DTYPES, ndim=2, device=A.device)
        if tuple(t.shape) != shape:
            raise ValueError(f"{OP_ID}: {name} must have shape {shape}, got {tuple(t.shape)}")
    if isinstance(max_iters, bool) or not isinstance(max_iters, int) or max_iters < 0:
        raise ValueError(f"{OP_ID}: max_iters must be an int >= 0, got {max_iters!r}")
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not tol > 0:
        raise ValueError(f"{OP_ID}: tol must be a float > 0, got {tol!r}")
    x = torch.empty(problems, cols, dtype=torch.float32, device=A.device)
    status = torch.empty(problems, dtype=torch.int32, device=A.device)
    if problems:
        SOLVE_LP.run(x, status, A, b, c, max_iters, float(tol), backend=backend)
    return x, status


def _solve_lp_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: feasible bounded problems built from a
    primal point x0 > 0 and a dual point (y0, s0 > 0)."""
    g = torch.Generator().manual_seed(0)
    cases = []
    for problems, rows, cols in ((4, 3, 7), (2, 6, 20)):
        a = torch.randn(problems, rows, cols, generator=g)
        x0 = torch.rand(problems, cols, generator=g)
        y0 = torch.randn(problems, rows, generator=g)
        s0 = torch.rand(problems, cols, generator=g)
        b = (a @ x0[..., None])[..., 0]
        c = (a.transpose(1, 2) @ y0[..., None])[..., 0] + s0
        cases.append(((a.to(device), b.to(device), c.to(device)), {}))
    return cases
