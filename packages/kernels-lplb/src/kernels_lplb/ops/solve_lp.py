"""lplb.solve_lp: batched small dense linear programs by a primal-dual interior-point method.

CUDA (csrc/solve_lp.cuh on csrc/ipm.cuh): one CTA of 256 threads per problem runs the reference's
Mehrotra predictor-corrector step for step in fp64 arithmetic, with the normal matrix, the vectors
and (when it fits) A in shared memory. The pure-torch reference (float64) is the fallback.
"""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
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


SOLVE_LP_CUDA = ModuleSpec(
    name="solve_lp",
    package="kernels_lplb",
    sources=("csrc/solve_lp.cuh",),
    exports=(("solve_lp", "solve_lp"),),
    description="CUDA: batched dense LPs, a CTA per problem (fp64 interior point in shared memory)",
)

_solve_lp_cuda = CompiledFunction(SOLVE_LP_CUDA, "solve_lp")

# The opt-in shared memory per block of Hopper (H100/H200): 227 KB.
SMEM_LIMIT = 227 * 1024
_THREADS, _VECTORS_N, _VECTORS_M, _REDUCE = 256, 10, 7, 16


def _odd(n: int) -> int:
    return n if n % 2 else n + 1


def normal_matrix_bytes(rows: int, cols: int) -> int:
    """Shared memory of the CUDA kernel without A: the fp64 normal matrix m x (m|1), 10 vectors
    of n and 7 of m doubles, the reduction scratch (csrc/ipm.cuh ``work_bytes``)."""
    return (
        rows * _odd(rows) + _VECTORS_N * cols + _VECTORS_M * rows + _THREADS // 32 * _REDUCE
    ) * 8


def _solve_lp_cuda_eligible(
    x: torch.Tensor,
    status: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    c: torch.Tensor,
    max_iters: int,
    tol: float,
) -> str | None:
    if not (a.dtype == b.dtype == c.dtype):
        return "needs A, b and c of one dtype"
    if not (a.is_contiguous() and b.is_contiguous() and c.is_contiguous()):
        return "needs contiguous A, b and c"
    rows, cols = a.shape[1], a.shape[2]
    if rows >= 2**20 or cols >= 2**20 or a.shape[0] >= 2**31 or max_iters >= 2**30:
        return "needs P < 2^31, m and n < 2^20, max_iters < 2^30"
    if normal_matrix_bytes(rows, cols) > SMEM_LIMIT:
        return (
            f"m = {rows}, n = {cols}: the fp64 normal matrix and vectors need "
            f"{normal_matrix_bytes(rows, cols)} bytes of shared memory > 227 KB (m <= ~160)"
        )
    return None


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
    feasibility, not iterates: degenerate problems have many optimal x. Every backend runs the
    same iterations in fp64 arithmetic; the CUDA backend solves one problem per CTA with the
    normal matrix in shared memory (m up to about 160; larger m runs on the reference).

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
    for (problems, rows, cols), dtype in (((4, 3, 7), torch.float32), ((2, 6, 20), torch.float64)):
        a = torch.randn(problems, rows, cols, generator=g)
        x0 = torch.rand(problems, cols, generator=g)
        y0 = torch.randn(problems, rows, generator=g)
        s0 = torch.rand(problems, cols, generator=g)
        b = (a @ x0[..., None])[..., 0]
        c = (a.transpose(1, 2) @ y0[..., None])[..., 0] + s0
        cases.append(((a.to(dtype).to(device), b.to(dtype).to(device), c.to(dtype).to(device)), {}))
    return cases
