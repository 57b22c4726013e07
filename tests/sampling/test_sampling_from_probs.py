"""sampling.sampling_from_probs and sampling.top_k_top_p_sampling_from_probs.

The draw is deterministic given (seed, offset, row): it is compared with a float64 inverse CDF
fed by a Python-int RNG oracle (rows whose threshold falls within rounding of a CDF boundary may
differ, < 1e-3 of rows), a chi-square test of the distribution, a support test (a zero-probability
or filtered token is never drawn) and reproducibility checks."""

from __future__ import annotations

import bisect
import itertools

import pytest
import torch

from kernels_sampling import reference, sampling_from_probs, top_k_top_p_sampling_from_probs
from shared.testing.compare import assert_close

MASK = (1 << 64) - 1


def _fmix(x: int) -> int:
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def _mix(x: int) -> int:
    return _fmix((x + 0x9E3779B97F4A7C15) & MASK)


def py_uniform(seed: int, offset: int, row: int, j: int) -> float:
    return (_mix(_mix(_mix(_mix(seed & MASK) ^ (offset & MASK)) ^ row) ^ j) >> 40) * 2.0**-24


def oracle_draw(row: list[float], u: float) -> tuple[int, bool, bool]:
    """(index, valid, near_boundary) by a float64 inverse CDF."""
    cdf = list(itertools.accumulate(row))
    total = cdf[-1] if cdf else 0.0
    if not total > 0:
        return 0, False, False
    t = u * total
    index = min(bisect.bisect_right(cdf, t), len(row) - 1)
    near = min(abs(c - t) for c in cdf) < 1e-5 * total
    return index, True, near


def _probs(b: int, v: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, v, generator=g) * 3).softmax(dim=1)


@pytest.mark.parametrize(("b", "v"), [(1, 1), (7, 13), (64, 1000), (3, 5000)])
@pytest.mark.parametrize(("seed", "offset"), [(0, 0), (1234, 56), (2**64 - 1, 2**40)])
def test_matches_float64_oracle(b, v, seed, offset):
    probs = _probs(b, v, seed=v)
    got, valid = sampling_from_probs(probs, seed=seed, offset=offset, return_valid=True)
    assert got.dtype == torch.int32 and valid.dtype == torch.bool
    assert valid.all()
    mismatched = 0
    for i, row in enumerate(probs.double().tolist()):
        index, _, near = oracle_draw(row, py_uniform(seed, offset, i, 0))
        if got[i].item() != index:
            assert near, f"row {i}: got {got[i].item()}, oracle {index} (not at a CDF boundary)"
            mismatched += 1
    assert mismatched <= max(1, b // 1000)


def test_chi_square_distribution_and_support():
    probs = torch.tensor([[0.05, 0.0, 0.15, 0.3, 0.0, 0.1, 0.25, 0.15]])
    n = 40_000
    draws = sampling_from_probs(probs, indices=torch.zeros(n, dtype=torch.int64), seed=99)
    assert draws.dtype == torch.int64
    counts = torch.bincount(draws, minlength=8).double()
    assert counts[1] == 0 and counts[4] == 0  # support: zero-probability tokens never drawn
    expected = probs[0].double() * n
    nz = expected > 0
    chi2 = (((counts[nz] - expected[nz]) ** 2) / expected[nz]).sum().item()
    assert chi2 < 22.5, chi2  # 5 degrees of freedom: P(chi2 > 22.5) ~ 4e-4


def test_reproducible_and_seed_sensitive():
    probs = _probs(32, 500, seed=1)
    a = sampling_from_probs(probs, seed=5, offset=1)
    assert torch.equal(a, sampling_from_probs(probs, seed=5, offset=1))
    assert not torch.equal(a, sampling_from_probs(probs, seed=5, offset=2))
    assert not torch.equal(a, sampling_from_probs(probs, seed=6, offset=1))
    per_row = sampling_from_probs(probs, seed=torch.full((32,), 5), offset=torch.tensor([1]))
    assert torch.equal(a, per_row)
    torch.manual_seed(0)
    x = sampling_from_probs(probs)
    torch.manual_seed(0)
    assert torch.equal(x, sampling_from_probs(probs))


def test_per_row_seed_is_batch_invariant():
    """A request's draw depends on its own (seed, offset, output row), not on its batch mates."""
    probs = _probs(8, 300, seed=2)
    seeds = torch.arange(100, 108, dtype=torch.int64)
    full = sampling_from_probs(probs, seed=seeds, offset=torch.full((8,), 17))
    first = sampling_from_probs(probs[:1], seed=seeds[:1], offset=17)
    assert full[0] == first[0]


def test_degenerate_rows():
    probs = torch.tensor([[0.0, 0.0, 0.0], [float("nan"), 0.5, 0.5], [0.0, 0.0, 2.0]])
    got, valid = sampling_from_probs(probs, seed=3, return_valid=True)
    assert got.tolist() == [0, 0, 2]
    assert valid.tolist() == [False, False, True]


def test_unnormalised_and_half_rows():
    probs = _probs(16, 257, seed=4)
    a = sampling_from_probs(probs, seed=8)
    assert torch.equal(a, sampling_from_probs(probs * 3.0, seed=8))  # scale-free up to rounding
    half = sampling_from_probs(probs.to(torch.bfloat16), seed=8)
    assert half.dtype == torch.int32


def test_indices_and_empty():
    probs = _probs(4, 10, seed=5)
    idx = torch.tensor([3, 3, 0], dtype=torch.int32)
    got = sampling_from_probs(probs, indices=idx, seed=1)
    assert got.dtype == torch.int32 and got.shape == (3,)
    expected = reference.sampling_from_probs(
        probs, indices=idx, seed=torch.tensor([1]), offset=torch.tensor([0])
    )
    assert_close(got, expected)
    assert sampling_from_probs(torch.empty(0, 10), seed=1).shape == (0,)
    empty_idx = torch.empty(0, dtype=torch.int64)
    assert sampling_from_probs(probs, indices=empty_idx, seed=1).dtype == torch.int64
    with pytest.raises(
        ValueError,
        match=r"sampling_from_probs: indices must lie in \[0, 4\), got values in \[0, 9\]",
    ):
        sampling_from_probs(probs, indices=torch.tensor([0, 9]), seed=1)


def test_bad_input():
    probs = _probs(4, 10, seed=6)
    with pytest.raises(ValueError, match=r"sampling_from_probs: offset=3 was given without a seed"):
        sampling_from_probs(probs, offset=3)
    with pytest.raises(ValueError, match=r"seed must have shape \(1,\) or \(4,\) .*got \(2,\)"):
        sampling_from_probs(probs, seed=torch.ones(2, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"seed must be an int or an int64 tensor, got float"):
        sampling_from_probs(probs, seed=1.5)
    with pytest.raises(TypeError, match=r"seed must have dtype in \(int64\), got int32"):
        sampling_from_probs(probs, seed=torch.ones(1, dtype=torch.int32))
    with pytest.raises(
        TypeError, match=r"indices must have dtype in \(int32, int64\), got float32"
    ):
        sampling_from_probs(probs, indices=torch.zeros(2), seed=1)


def test_opcheck():
    from kernels_sampling.ops.sampling_from_probs import SAMPLING_FROM_PROBS

    probs = _probs(4, 50, seed=7)
    samples = torch.empty(4, dtype=torch.int32)
    valid = torch.empty(4, dtype=torch.bool)
    seed, offset = torch.tensor([3]), torch.tensor([0])
    args = (samples, valid, probs, None, seed, offset, True, None)
    torch.library.opcheck(SAMPLING_FROM_PROBS.torch_op, args)


def test_torch_compile_fullgraph():
    probs = _probs(6, 100, seed=8)
    seed = torch.tensor([11])
    compiled = torch.compile(lambda p, s: sampling_from_probs(p, seed=s, offset=s), fullgraph=True)
    assert torch.equal(compiled(probs, seed), sampling_from_probs(probs, seed=11, offset=11))


def _oracle_kept(row: list[float], k: int, p: float, order: str) -> list[bool]:
    def top_k(r):
        return [True] * len(r) if k <= 0 or k >= len(r) else [sum(q > x for q in r) < k for x in r]

    def top_p(r):
        if p >= 1:
            return [True] * len(r)
        if p <= 0:
            return [x == max(r) for x in r]
        return [sum(q for q in r if q > x) < p for x in r]

    keep_k = top_k(row)
    if order == "joint":
        return [a and b for a, b in zip(keep_k, top_p(row), strict=True)]
    total = sum(x for x, kept in zip(row, keep_k, strict=True) if kept)
    renormed = [x / total if kept else 0.0 for x, kept in zip(row, keep_k, strict=True)]
    return [a and b for a, b in zip(keep_k, top_p(renormed), strict=True)]


@pytest.mark.parametrize("order", ["top_k_first", "joint"])
@pytest.mark.parametrize(("k", "p"), [(1, 0.9), (5, 0.5), (0, 0.3), (50, 1.0), (10, 0.0)])
def test_top_k_top_p_support_and_draw(order, k, p):
    probs = _probs(48, 64, seed=k + int(p * 10))
    got = top_k_top_p_sampling_from_probs(probs, k, p, filter_apply_order=order, seed=21)
    for i, row in enumerate(probs.double().tolist()):
        kept = _oracle_kept(row, k, p, order)
        assert kept[got[i].item()], f"row {i}: drew a filtered token"
    # Same u and weights = the kept probabilities: identical to sampling the masked rows.
    keep = reference.top_k_top_p_keep(probs, k, p, order)
    masked = torch.where(keep, probs, 0.0)
    assert torch.equal(got, sampling_from_probs(masked, seed=21))


def test_top_k_top_p_orders_differ_as_documented():
    probs = torch.tensor([[0.4, 0.3, 0.2, 0.1]])
    # top_k_first: top-2 renormalised is [4/7, 3/7]: S_gt(3/7) = 4/7 < 0.6 keeps both.
    # joint: S_gt(0.3) = 0.4 < 0.6 keeps both as well; with p = 0.45 they split.
    first = reference.top_k_top_p_keep(probs, 2, 0.45, "top_k_first")
    joint = reference.top_k_top_p_keep(probs, 2, 0.45, "joint")
    assert first.tolist() == [[True, False, False, False]]
    assert joint.tolist() == [[True, True, False, False]]


def test_top_k_top_p_per_row_with_indices():
    probs = _probs(3, 40, seed=12)
    ks = torch.tensor([1, 40, 3], dtype=torch.int32)
    ps = torch.tensor([1.0, 0.2, 0.9])
    idx = torch.tensor([2, 0, 2, 1])
    got = top_k_top_p_sampling_from_probs(probs, ks, ps, indices=idx, seed=4)
    assert got.dtype == torch.int64
    rows = probs.double().tolist()
    for i, r in enumerate(idx.tolist()):
        kept = _oracle_kept(rows[r], int(ks[r]), float(ps[r]), "top_k_first")
        assert kept[got[i].item()]
    with pytest.raises(ValueError, match=r"filter_apply_order must be one of .* got 'both'"):
        top_k_top_p_sampling_from_probs(probs, 1, 0.5, filter_apply_order="both", seed=1)
