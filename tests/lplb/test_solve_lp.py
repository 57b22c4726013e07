"""lplb.solve_lp against optima found independently: hand-made LPs with known solutions, and a
brute-force float64 enumeration of every basis (vertex) for random feasible bounded problems;
scipy.optimize.linprog as a second oracle when scipy is importable. Also infeasible and unbounded
detection, redundant rows, the iteration limit, empty batches, bad input, opcheck, compile.

The CUDA backend (one CTA per problem, the reference's iterations in fp64) runs the same tests on
the GPU and is compared with the reference: statuses equal, x to 1e-4 relative on random
(non-degenerate) problems, objectives only on the degenerate load-balancing LPs; P = 1..132,
odd sizes, both dtypes, poisoned outputs, the global-memory A path, CUDA graphs, compile."""

from __future__ import annotations

import importlib.util
import itertools
import warnings

import pytest
import torch

from kernels_lplb import solve_lp
from kernels_lplb.ops import solve_lp as solve_lp_module
from shared.testing.devices import GPU
from shared.testing.inputs import poison

DEVICES = [pytest.param("cpu", id="cpu"), GPU]


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


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("rows", "cols"), [(1, 2), (2, 5), (3, 7), (4, 9)])
def test_random_problems_match_brute_force(rows, cols, device):
    a, b, c = feasible_bounded(12, rows, cols, seed=rows * 10 + cols)
    x, status = solve_lp(a.float().to(device), b.float().to(device), c.float().to(device))
    x, status = x.cpu(), status.cpu()
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


@pytest.mark.parametrize("device", DEVICES)
def test_hand_made_problems(device):
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
    x, status = solve_lp(a.to(device), b.to(device), c.to(device))
    x, status = x.cpu(), status.cpu()
    assert status.tolist() == [0, 0, 0]
    expected = torch.tensor(
        [[1.0, 0, 0, 0, 0], [2.0, 3, 2, 0, 0], [0.0, 1, 0, 0, 0]], dtype=torch.float32
    )
    assert torch.allclose(x, expected, atol=1e-4)


@pytest.mark.parametrize("device", DEVICES)
def test_infeasible_and_unbounded_are_detected(device):
    # x1 + x2 = -1 with x >= 0 is infeasible; min -x1 with x1 - x2 + x3 = 1 is unbounded;
    # x1 + x2 = 1, x1 + x2 = 2 (inconsistent rows) is infeasible.
    a = torch.tensor(
        [
            [[1.0, 1.0, 0.0], [0.0, 0.0, 0.0]],
            [[1.0, -1.0, 1.0], [0.0, 0.0, 0.0]],
            [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]],
        ]
    )
    b = torch.tensor([[-1.0, 0.0], [1.0, 0.0], [1.0, 2.0]])
    c = torch.tensor([[1.0, 1.0, 1.0], [-1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    _, status = solve_lp(a.to(device), b.to(device), c.to(device))
    assert status.tolist() == [2, 2, 2]


@pytest.mark.parametrize("device", DEVICES)
def test_iteration_limit_and_mixed_batch(device):
    a, b, c = feasible_bounded(3, 4, 9, seed=3)
    a, b, c = a.to(device), b.to(device), c.to(device)
    _, status = solve_lp(a.float(), b.float(), c.float(), max_iters=1)
    assert status.tolist() == [1, 1, 1]
    _, status = solve_lp(a.float(), b.float(), c.float(), max_iters=0)
    assert status.tolist() == [1, 1, 1]
    # A converged problem is frozen while its batch mates keep iterating.
    bad = torch.tensor([[[1.0, 1.0, 0.0, 0.0]]], device=device).expand(1, 4, 4).clone()
    a2 = torch.cat([a[:1, :, :4].float(), bad])
    b2 = torch.cat(
        [
            (a[:1, :, :4] @ torch.ones(4, 1, dtype=torch.float64, device=device))[..., 0].float(),
            -torch.ones(1, 4, device=device),
        ]
    )
    c2 = torch.ones(2, 4, device=device)
    x, status = solve_lp(a2, b2, c2)
    assert status.tolist() == [0, 2]
    _check_feasible(x[:1].cpu(), a2[:1].cpu(), b2[:1].cpu())


@pytest.mark.parametrize("device", DEVICES)
def test_empty_and_bad_input(device):
    e = {"device": device}
    x, status = solve_lp(torch.empty(0, 3, 5, **e), torch.empty(0, 3, **e), torch.empty(0, 5, **e))
    assert x.shape == (0, 5) and status.shape == (0,)
    # No constraints: x = 0 is optimal iff c >= 0; no variables: feasible iff b == 0.
    x, status = solve_lp(
        torch.empty(2, 0, 3, **e),
        torch.empty(2, 0, **e),
        torch.tensor([[1.0, 2, 3], [1, -1, 0]], **e),
    )
    assert status.tolist() == [0, 2] and not x.any()
    x, status = solve_lp(
        torch.empty(2, 2, 0, **e), torch.tensor([[0.0, 0], [1, 0]], **e), torch.empty(2, 0, **e)
    )
    assert status.tolist() == [0, 2] and x.shape == (2, 0)
    a, b, c = torch.ones(2, 3, 5, **e), torch.ones(2, 3, **e), torch.ones(2, 5, **e)
    with pytest.raises(ValueError, match=r"solve_lp: b must have shape \(2, 3\), got \(2, 4\)"):
        solve_lp(a, torch.ones(2, 4, **e), c)
    with pytest.raises(ValueError, match=r"solve_lp: c must have shape \(2, 5\), got \(2, 4\)"):
        solve_lp(a, b, torch.ones(2, 4, **e))
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


def balancing_lps(problems: int, experts: int, copies_extra: int, gpus: int, seed: int):
    """The load-balancing LPs lplb_dispatch builds (degenerate: many optimal x), as A, b, c:
    one layout, random loads per problem."""
    from kernels_lplb.ops.lplb_dispatch import replicated_layout

    out = []
    phy2log, log2phy = replicated_layout(experts, copies_extra, gpus, seed=seed)
    for p in range(problems):  # one layout (one LP shape), loads varying per problem
        g = torch.Generator().manual_seed(seed + p)
        counts = torch.randint(1, 1000, (experts,), generator=g)
        captured: dict = {}

        def capture(a, b, c, captured=captured, **kwargs):
            captured["abc"] = (a, b, c)
            return torch.zeros(a.shape[0], a.shape[2]), torch.ones(a.shape[0], dtype=torch.int32)

        from kernels_lplb import reference

        original = reference.solve_lp
        reference.solve_lp = capture
        try:
            reference.replica_shares(phy2log, log2phy, gpus, counts)
        finally:
            reference.solve_lp = original
        out.append(captured["abc"])
    a = torch.cat([t[0] for t in out])
    b = torch.cat([t[1] for t in out])
    c = torch.cat([t[2] for t in out])
    return a, b, c


def _objective(x, c):
    return (x.double() * c.double()).sum(dim=-1)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.float32, torch.float64), ids=str)
@pytest.mark.parametrize(
    ("problems", "rows", "cols"),
    [(1, 1, 1), (1, 3, 7), (7, 13, 29), (33, 40, 74), (132, 5, 11), (2, 64, 129), (3, 97, 300)],
)
def test_cuda_matches_reference_random(problems, rows, cols, dtype):
    a, b, c = (t.to(dtype) for t in feasible_bounded(problems, rows, cols, seed=problems + rows))
    want_x, want_status = solve_lp(a, b, c, backend="torch")
    x = poison(torch.empty(problems, cols, device="cuda"))
    status = poison(torch.empty(problems, dtype=torch.int32, device="cuda"))
    solve_lp_module._solve_lp_cuda(x, status, a.cuda(), b.cuda(), c.cuda(), 50, 1e-6)
    assert torch.equal(status.cpu(), want_status)
    assert (want_status == 0).all()
    got = x.cpu().double()
    scale = 1 + want_x.double().abs().amax(dim=-1, keepdim=True)
    assert ((got - want_x.double()).abs() <= 1e-4 * scale).all()
    obj, want_obj = _objective(got, c), _objective(want_x, c)
    assert ((obj - want_obj).abs() <= 1e-5 * (1 + want_obj.abs())).all()
    _check_feasible(got, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("problems", "experts", "extra", "gpus"), [(1, 256, 32, 8), (8, 64, 16, 8), (132, 32, 8, 4)]
)
def test_cuda_matches_reference_balancing_lps(problems, experts, extra, gpus):
    a, b, c = balancing_lps(problems, experts, extra, gpus, seed=problems)
    want_x, want_status = solve_lp(a, b, c, backend="torch")
    x, status = solve_lp(a.cuda(), b.cuda(), c.cuda(), backend="cuda")
    assert torch.equal(status.cpu(), want_status) and (want_status == 0).all()
    obj, want_obj = _objective(x.cpu(), c), _objective(want_x, c)
    assert ((obj - want_obj).abs() <= 1e-5 * (1 + want_obj.abs())).all()
    _check_feasible(x.cpu(), a, b)


@pytest.mark.gpu
def test_cuda_global_memory_a_and_statuses():
    # m = 150, n = 300 fp32: A (180 KB) does not fit beside the normal matrix (215 KB); it is read
    # from global memory. A feasible and an infeasible problem.
    a, b, c = feasible_bounded(2, 150, 300, seed=11)
    b[1] = -b[1].abs() - 1
    a[1] = a[1].abs()  # A >= 0, b < 0: infeasible
    a, b, c = a.float(), b.float(), c.float()
    want_x, want_status = solve_lp(a, b, c, backend="torch")
    x, status = solve_lp(a.cuda(), b.cuda(), c.cuda(), backend="cuda")
    assert want_status.tolist() == [0, 2]
    assert torch.equal(status.cpu(), want_status)
    obj, want_obj = _objective(x.cpu()[:1], c[:1]), _objective(want_x[:1], c[:1])
    assert ((obj - want_obj).abs() <= 1e-5 * (1 + want_obj.abs())).all()
    _, status = solve_lp(a.cuda(), b.cuda(), c.cuda(), max_iters=2, backend="cuda")
    assert status.tolist() == [1, 1]


def test_cuda_eligibility_reasons():
    e = solve_lp_module._solve_lp_cuda_eligible
    a, b, c = torch.ones(2, 3, 5), torch.ones(2, 3), torch.ones(2, 5)
    x, s = torch.empty(2, 5), torch.empty(2, dtype=torch.int32)
    assert e(x, s, a, b, c, 50, 1e-6) is None
    assert e(x, s, a, b.double(), c, 50, 1e-6) == "needs A, b and c of one dtype"
    assert e(x, s, a.transpose(1, 2).contiguous().transpose(1, 2), b, c, 50, 1e-6) is not None
    big = torch.ones(1, 170, 200)
    reason = e(torch.empty(1, 200), s[:1], big, torch.ones(1, 170), torch.ones(1, 200), 50, 1e-6)
    assert "normal matrix" in reason and "227 KB" in reason


@pytest.mark.gpu
def test_cuda_fallbacks_match_reference():
    a, b, c = feasible_bounded(3, 4, 9, seed=9)
    want_x, want_status = solve_lp(a.float(), b.float(), c.float())
    close = {"atol": 1e-4, "rtol": 1e-4}
    with warnings.catch_warnings():  # mixed dtypes and a transposed A run on the reference
        warnings.simplefilter("ignore")
        x, status = solve_lp(a.float().cuda(), b.cuda(), c.float().cuda())
        assert torch.equal(status.cpu(), want_status) and torch.allclose(x.cpu(), want_x, **close)
        at = a.float().transpose(1, 2).contiguous().transpose(1, 2).cuda()
        x, status = solve_lp(at, b.float().cuda(), c.float().cuda())
        assert torch.equal(status.cpu(), want_status) and torch.allclose(x.cpu(), want_x, **close)


@pytest.mark.gpu
def test_cuda_raw_entry_rejects_bad_arguments():
    a, b, c = (t.float().cuda() for t in feasible_bounded(2, 3, 5, seed=1))
    x, s = torch.empty(2, 5, device="cuda"), torch.empty(2, dtype=torch.int32, device="cuda")
    f = solve_lp_module._solve_lp_cuda
    with pytest.raises(ValueError, match="b must have shape"):
        f(x, s, a, b[:, :2].contiguous(), c, 50, 1e-6)
    with pytest.raises(TypeError, match="must have the same dtype"):
        f(x, s, a, b.double(), c, 50, 1e-6)
    with pytest.raises(ValueError, match="tol must be"):
        f(x, s, a, b, c, 50, 0.0)
    with pytest.raises(ValueError, match="must be contiguous"):
        f(x, s, a.transpose(1, 2).contiguous().transpose(1, 2), b, c, 50, 1e-6)
    big = torch.ones(1, 200, 10, device="cuda")
    with pytest.raises(ValueError, match="shared memory"):
        f(x[:1, :1].expand(1, 10).contiguous(), s[:1], big, torch.ones(1, 200, device="cuda"),
          torch.ones(1, 10, device="cuda"), 50, 1e-6)  # fmt: skip


@pytest.mark.gpu
def test_cuda_graph_and_compile():
    a, b, c = (t.float().cuda() for t in feasible_bounded(8, 40, 74, seed=4))
    want_x, want_status = solve_lp(a, b, c)  # builds and loads before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        x, status = solve_lp(a, b, c)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(x, want_x) and torch.equal(status, want_status)
    compiled = torch.compile(solve_lp, fullgraph=True)
    got_x, got_status = compiled(a, b, c)
    assert torch.equal(got_x, want_x) and torch.equal(got_status, want_status)


@pytest.mark.gpu
def test_cuda_is_deterministic():
    a, b, c = (t.float().cuda() for t in balancing_lps(4, 64, 16, 8, seed=3))
    first = solve_lp(a, b, c)
    for _ in range(3):
        again = solve_lp(a, b, c)
        assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
