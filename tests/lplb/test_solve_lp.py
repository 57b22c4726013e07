"""lplb.solve_lp against optima found independently: hand-made LPs with known solutions, and a
brute-force float64 enumeration of every basis (vertex) for random feasible bounded problems;
scipy.optimize.linprog as a second oracle when scipy is importable. Also infeasible and unbounded
detection, redundant rows, the iteration limit, empty batches, bad input, opcheck, compile."""

from __future__ import annotations

import importlib.util
import itertools

import pytest
import torch

from kernels_lplb import solve_lp


def brute_force_optimum(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> float:
    """min c.x over the basic feasible solutions of Ax = b, x >= 0 (float64, small m and n)."""
    rows, cols = a.shape
    best = None
    for basis in itertools.combinations(range(cols), rows):
        sub = a[:, list(basis)]
        if abs(torch.linalg.det(sub).item()) < 1e-10:
            continue
        xb = torch.linalg.solve(sub, b)
        if (xb >= -1e-9).all():
            value = float((c[list(basis)] * xb).sum())
            best = value if best is None else min(best, value)
    assert best is not None, "the generated problem must be feasible"
    return best


def feasible_bounded(problems: int, rows: int, cols: int, seed: int):
    """A, b, c in float64: feasible (b = A x0, x0 > 0) and bounded (c = A^T y0 + s0, s0 > 0)."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(problems, rows, cols, generator=g, dtype=torch.float64)
    x0 = torch.rand(problems, cols, generator=g, dtype=torch.float64)
    y0 = torch.randn(problems, rows, generator=g, dtype=torch.float64)
    s0 = torch.rand(problems, cols, generator=g, dtype=torch.float64)
    b = (a @ x0[..., None])[..., 0]
    c = (a.transpose(1, 2) @ y0[..., None])[..., 0] + s0
    return a, b, c


def _check_feasible(x, a, b, tol=1e-4):
    x = x.double()
    residual = ((a.double() @ x[..., None])[..., 0] - b.double()).abs().amax(dim=-1)
    assert (residual <= tol * (1 + b.double().abs().amax(dim=-1))).all(), residual
    assert (x >= -1e-6).all()


@pytest.mark.parametrize(("rows", "cols"), [(1, 2), (2, 5), (3, 7), (4, 9)])
def test_random_problems_match_brute_force(rows, cols):
    a, b, c = feasible_bounded(12, rows, cols, seed=rows * 10 + cols)
    x, status = solve_lp(a.float(), b.float(), c.float())
    assert x.dtype == torch.float32 and status.dtype == torch.int32
    assert status.tolist() == [0] * 12
    _check_feasible(x, a, b)
    for p in range(12):
        want = brute_force_optimum(a[p], b[p], c[p])
        got = float((c[p] * x[p].double()).sum())
        assert abs(got - want) <= 1e-4 * (1 + abs(want)), (p, got, want)


@pytest.mark.skipif(importlib.util.find_spec("scipy") is None, reason="scipy is not installed")
def test_matches_scipy_linprog():
    from scipy.optimize import linprog

    a, b, c = feasible_bounded(6, 8, 30, seed=7)
    x, status = solve_lp(a.float(), b.float(), c.float())
    assert status.tolist() == [0] * 6
    for p in range(6):
        ref = linprog(c[p].numpy(), A_eq=a[p].numpy(), b_eq=b[p].numpy(), bounds=(0, None))
        got = float((c[p] * x[p].double()).sum())
        assert abs(got - ref.fun) <= 1e-4 * (1 + abs(ref.fun))


def test_hand_made_problems():
    # min x1 + 2 x2 + 3 x3, x1 + x2 + x3 = 1: x = (1, 0, 0), objective 1.
    # max x1 + 2 x2 with x1 <= 4, x2 <= 3, x1 + x2 <= 5 (slacks): x = (2, 3), objective -8.
    # Redundant rows: the same constraint twice (scaled): min 3x1 + x2 + 2x3 -> x2 = 1.
    a = torch.zeros(3, 3, 5)
    b = torch.zeros(3, 3)
    c = torch.zeros(3, 5)
    a[0, 0, :3] = 1.0
    b[0, 0] = 1.0
    c[0, :3] = torch.tensor([1.0, 2.0, 3.0])
    a[0, 1, 3] = a[0, 2, 4] = 1.0  # pad rows of problem 0: x4 = x5 = 0
    a[1] = torch.tensor([[1.0, 0, 1, 0, 0], [0, 1, 0, 1, 0], [1, 1, 0, 0, 1]])
    b[1] = torch.tensor([4.0, 3, 5])
    c[1] = torch.tensor([-1.0, -2, 0, 0, 0])
    a[2, 0, :3] = 1.0
    a[2, 1, :3] = 2.0
    a[2, 2, 3:] = 1.0
    b[2] = torch.tensor([1.0, 2.0, 0.0])
    c[2, :3] = torch.tensor([3.0, 1.0, 2.0])
    x, status = solve_lp(a, b, c)
    assert status.tolist() == [0, 0, 0]
    expected = torch.tensor(
        [[1.0, 0, 0, 0, 0], [2.0, 3, 2, 0, 0], [0.0, 1, 0, 0, 0]], dtype=torch.float32
    )
    assert torch.allclose(x, expected, atol=1e-4)


def test_infeasible_and_unbounded_are_detected():
    # x1 + x2 = -1 with x >= 0 is infeasible; min -x1 with x1 - x2 + x3 = 1 is unbounded.
    a = torch.tensor([[[1.0, 1.0, 0.0]], [[1.0, -1.0, 1.0]]])
    b = torch.tensor([[-1.0], [1.0]])
    c = torch.tensor([[1.0, 1.0, 1.0], [-1.0, 0.0, 0.0]])
    _, status = solve_lp(a, b, c)
    assert status.tolist() == [2, 2]


def test_iteration_limit_and_mixed_batch():
    a, b, c = feasible_bounded(3, 4, 9, seed=3)
    _, status = solve_lp(a.float(), b.float(), c.float(), max_iters=1)
    assert status.tolist() == [1, 1, 1]
    _, status = solve_lp(a.float(), b.float(), c.float(), max_iters=0)
    assert status.tolist() == [1, 1, 1]
    # A converged problem is frozen while its batch mates keep iterating.
    bad = torch.tensor([[[1.0, 1.0, 0.0, 0.0]]]).expand(1, 4, 4).clone()
    a2 = torch.cat([a[:1, :, :4].float(), bad])
    b2 = torch.cat(
        [(a[:1, :, :4] @ torch.ones(4, 1, dtype=torch.float64))[..., 0].float(), -torch.ones(1, 4)]
    )
    c2 = torch.ones(2, 4)
    x, status = solve_lp(a2, b2, c2)
    assert status.tolist() == [0, 2]
    _check_feasible(x[:1], a2[:1], b2[:1])


def test_empty_and_bad_input():
    x, status = solve_lp(torch.empty(0, 3, 5), torch.empty(0, 3), torch.empty(0, 5))
    assert x.shape == (0, 5) and status.shape == (0,)
    # No constraints: x = 0 is optimal iff c >= 0; no variables: feasible iff b == 0.
    x, status = solve_lp(
        torch.empty(2, 0, 3), torch.empty(2, 0), torch.tensor([[1.0, 2, 3], [1, -1, 0]])
    )
    assert status.tolist() == [0, 2] and not x.any()
    x, status = solve_lp(torch.empty(2, 2, 0), torch.tensor([[0.0, 0], [1, 0]]), torch.empty(2, 0))
    assert status.tolist() == [0, 2] and x.shape == (2, 0)
    a, b, c = torch.ones(2, 3, 5), torch.ones(2, 3), torch.ones(2, 5)
    with pytest.raises(ValueError, match=r"solve_lp: b must have shape \(2, 3\), got \(2, 4\)"):
        solve_lp(a, torch.ones(2, 4), c)
    with pytest.raises(ValueError, match=r"solve_lp: c must have shape \(2, 5\), got \(2, 4\)"):
        solve_lp(a, b, torch.ones(2, 4))
    with pytest.raises(ValueError, match=r"tol must be a float > 0, got 0"):
        solve_lp(a, b, c, tol=0)
    with pytest.raises(ValueError, match=r"max_iters must be an int >= 0, got -1"):
        solve_lp(a, b, c, max_iters=-1)
    with pytest.raises(
        TypeError, match=r"solve_lp: A must have dtype in \(float32, float64\), got int64"
    ):
        solve_lp(a.long(), b, c)


def test_opcheck_and_compile():
    from kernels_lplb.ops.solve_lp import SOLVE_LP

    a, b, c = (t.float() for t in feasible_bounded(2, 3, 6, seed=5))
    x, status = torch.empty(2, 6), torch.empty(2, dtype=torch.int32)
    torch.library.opcheck(SOLVE_LP.torch_op, (x, status, a, b, c, 50, 1e-6, None))
    compiled = torch.compile(solve_lp, fullgraph=True)
    got_x, got_status = compiled(a, b, c)
    want_x, want_status = solve_lp(a, b, c)
    assert torch.equal(got_x, want_x) and torch.equal(got_status, want_status)
