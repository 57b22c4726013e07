"""sampling.top_p_renorm_probs and sampling.min_p_renorm_probs against explicit float64 loops of
``S_gt(p_i) < top_p`` and ``p_i >= min_p * max(p)``. fp32 sums may decide differently from the
float64 oracle only when ``S_gt`` lies within rounding of top_p; such entries are checked to be
at such a boundary instead of compared."""

from __future__ import annotations

import pytest
import torch

from kernels_sampling import min_p_renorm_probs, reference, top_p_renorm_probs
from shared.testing.compare import assert_close


def _probs(b: int, v: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, v, generator=g) * 2).softmax(dim=1).to(dtype)


def oracle_top_p(probs: torch.Tensor, ps: list[float]):
    """(keep, ambiguous) bool [B, V] from float64 loops."""
    keep = torch.zeros(probs.shape, dtype=torch.bool)
    ambiguous = torch.zeros(probs.shape, dtype=torch.bool)
    for b, row in enumerate(probs.double().tolist()):
        top = max(row) if row else 0.0
        for i, p in enumerate(row):
            s_gt = sum(q for q in row if q > p)
            if ps[b] >= 1:
                keep[b, i] = True
            elif ps[b] <= 0:
                keep[b, i] = p == top
            else:
                keep[b, i] = s_gt < ps[b]
                ambiguous[b, i] = abs(s_gt - ps[b]) < 1e-5
    return keep, ambiguous


def _check_renorm(got: torch.Tensor, probs: torch.Tensor, keep: torch.Tensor, ambiguous=None):
    got_keep = got.float() > 0
    decided = ~ambiguous if ambiguous is not None else torch.ones_like(keep)
    assert torch.equal(got_keep[decided], (keep & (probs > 0))[decided])
    kept = torch.where(got_keep, probs.double(), 0.0)
    expected = kept / kept.sum(dim=1, keepdim=True)
    assert_close(got, expected.to(got.dtype))


@pytest.mark.parametrize(("b", "v"), [(1, 1), (3, 7), (5, 333), (2, 2000)])
@pytest.mark.parametrize("p", [-0.5, 0.0, 0.1, 0.5, 0.9, 0.999, 1.0, 2.0])
def test_top_p_matches_oracle(b, v, p):
    probs = _probs(b, v, seed=b + v)
    keep, ambiguous = oracle_top_p(probs, [p] * b)
    got = top_p_renorm_probs(probs, p)
    _check_renorm(got, probs, keep, ambiguous)
    assert_close(got, reference.top_p_renorm_probs(probs, p))


def test_top_p_per_row_and_ties():
    probs = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.5, 0.2, 0.2, 0.1], [0.5, 0.2, 0.2, 0.1]])
    got = top_p_renorm_probs(probs, torch.tensor([0.1, 0.6, 0.0]))
    # Row 0: every value has S_gt = 0 < 0.1 (all kept); row 1: S_gt(0.2) = 0.5 < 0.6 keeps both
    # 0.2s, S_gt(0.1) = 0.9; row 2: top_p <= 0 keeps the argmax set.
    expected = torch.tensor([[0.25] * 4, [5 / 9, 2 / 9, 2 / 9, 0.0], [1.0, 0.0, 0.0, 0.0]])
    assert_close(got, expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_top_p_half(dtype):
    probs = _probs(3, 100, seed=9, dtype=dtype)
    got = top_p_renorm_probs(probs, 0.7)
    assert got.dtype == dtype
    keep, ambiguous = oracle_top_p(probs.float(), [0.7] * 3)
    _check_renorm(got, probs.float(), keep, ambiguous)


def oracle_min_p(probs: torch.Tensor, mps: list[float]) -> torch.Tensor:
    keep = torch.zeros(probs.shape, dtype=torch.bool)
    for b, row in enumerate(probs.tolist()):
        for i, p in enumerate(row):
            keep[b, i] = p >= mps[b] * max(row)
    return keep


@pytest.mark.parametrize(("b", "v"), [(1, 1), (4, 33), (3, 1000)])
@pytest.mark.parametrize("mp", [0.0, 0.05, 0.3, 1.0])
def test_min_p_matches_oracle(b, v, mp):
    probs = _probs(b, v, seed=7 * v)
    got = min_p_renorm_probs(probs, mp)
    _check_renorm(got, probs, oracle_min_p(probs, [mp] * b))
    assert_close(got, reference.min_p_renorm_probs(probs, mp))


def test_min_p_per_row():
    probs = _probs(3, 50, seed=11)
    mps = [0.0, 0.5, 0.9]
    got = min_p_renorm_probs(probs, torch.tensor(mps))
    _check_renorm(got, probs, oracle_min_p(probs, mps))


@pytest.mark.parametrize(("b", "v"), [(0, 5), (2, 0)])
def test_empty(b, v):
    assert top_p_renorm_probs(torch.empty(b, v), 0.5).shape == (b, v)
    assert min_p_renorm_probs(torch.empty(b, v), 0.5).shape == (b, v)


def test_bad_input():
    probs = _probs(2, 8, seed=0)
    with pytest.raises(TypeError, match=r"top_p_renorm_probs: top_p must be a float or a float32"):
        top_p_renorm_probs(probs, "0.5")
    with pytest.raises(TypeError, match=r"min_p must have dtype in \(float32\), got float64"):
        min_p_renorm_probs(probs, torch.ones(2, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"min_p_renorm_probs: min_p must have shape \(2,\)"):
        min_p_renorm_probs(probs, torch.ones(4))
