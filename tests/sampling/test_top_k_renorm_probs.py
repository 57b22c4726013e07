"""sampling.top_k_renorm_probs and sampling.top_k_mask_logits against explicit float64 loops of
the value rule ``N_gt(p_i) < k``: random and odd shapes, ties, per-row k, half dtypes, empty."""

from __future__ import annotations

import pytest
import torch

from kernels_sampling import reference, top_k_mask_logits, top_k_renorm_probs
from shared.testing.compare import assert_close


def oracle_keep(row: list[float], k: int) -> list[bool]:
    if k <= 0 or k >= len(row):
        return [True] * len(row)
    return [sum(1 for q in row if q > p) < k for p in row]


def oracle_renorm(probs: torch.Tensor, ks: list[int]) -> torch.Tensor:
    out = torch.zeros(probs.shape, dtype=torch.float64)
    for b, row in enumerate(probs.double().tolist()):
        keep = oracle_keep(row, ks[b])
        total = sum(p for p, kept in zip(row, keep, strict=True) if kept)
        if total >= 1e-8:
            for i, kept in enumerate(keep):
                out[b, i] = row[i] / total if kept else 0.0
    return out


def _probs(b: int, v: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, v, generator=g) * 2).softmax(dim=1).to(dtype)


@pytest.mark.parametrize(("b", "v"), [(1, 1), (3, 7), (5, 333), (2, 1000)])
@pytest.mark.parametrize("k", [-1, 0, 1, 3, 50, 1000, 5000])
def test_scalar_k_matches_oracle(b, v, k):
    probs = _probs(b, v, seed=b * 1000 + v)
    got = top_k_renorm_probs(probs, k)
    assert_close(got, oracle_renorm(probs, [k] * b).float(), name=f"k={k}")
    assert_close(got, reference.top_k_renorm_probs(probs, k))


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
def test_per_row_k(dtype):
    probs = _probs(6, 129, seed=1)
    ks = [1, 2, 0, 129, 64, 200]
    got = top_k_renorm_probs(probs, torch.tensor(ks, dtype=dtype))
    assert_close(got, oracle_renorm(probs, ks).float())


def test_ties_are_kept_together_and_zero_rows_stay_zero():
    probs = torch.tensor([[0.3, 0.1, 0.3, 0.3], [0.0, 0.0, 0.0, 0.0], [0.4, 0.2, 0.2, 0.2]])
    got = top_k_renorm_probs(probs, torch.tensor([1, 2, 2], dtype=torch.int32))
    third = 1.0 / 3.0
    expected = torch.tensor([[third, 0, third, third], [0, 0, 0, 0], [0.4, 0.2, 0.2, 0.2]])
    assert_close(got, expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_dtypes_keep_dtype(dtype):
    probs = _probs(4, 257, seed=3, dtype=dtype)
    got = top_k_renorm_probs(probs, 20)
    assert got.dtype == dtype
    assert_close(got, oracle_renorm(probs.float(), [20] * 4).to(dtype))


def test_strided_rows():
    wide = _probs(4, 300, seed=4)
    probs = wide[:, :200]
    assert not probs.is_contiguous()
    assert_close(top_k_renorm_probs(probs, 10), oracle_renorm(probs, [10] * 4).float())


@pytest.mark.parametrize(("b", "v"), [(0, 10), (3, 0), (0, 0)])
def test_empty(b, v):
    assert top_k_renorm_probs(torch.empty(b, v), 3).shape == (b, v)
    assert top_k_mask_logits(torch.empty(b, v), 3).shape == (b, v)


@pytest.mark.parametrize(("b", "v"), [(3, 7), (4, 511)])
@pytest.mark.parametrize("k", [1, 5, 0])
def test_mask_logits_matches_oracle(b, v, k):
    g = torch.Generator().manual_seed(v)
    logits = torch.randn(b, v, generator=g)
    logits[0, :2] = float("-inf")
    expected = logits.clone()
    for r, row in enumerate(logits.double().tolist()):
        for i, kept in enumerate(oracle_keep(row, k)):
            if not kept:
                expected[r, i] = float("-inf")
    assert_close(top_k_mask_logits(logits, k), expected)


def test_mask_logits_half_and_ties():
    logits = torch.tensor([[1.0, 2.0, 2.0, 0.5]], dtype=torch.bfloat16)
    got = top_k_mask_logits(logits, 1)
    assert got.dtype == torch.bfloat16
    assert got.float().tolist() == [[float("-inf"), 2.0, 2.0, float("-inf")]]


def test_bad_input():
    probs = _probs(2, 8, seed=0)
    with pytest.raises(
        ValueError, match=r"top_k_renorm_probs: probs must have 2 dims, got shape \(8,\)"
    ):
        top_k_renorm_probs(probs[0], 2)
    with pytest.raises(
        TypeError, match=r"top_k_renorm_probs: probs must have dtype in .* got float64"
    ):
        top_k_renorm_probs(probs.double(), 2)
    with pytest.raises(
        ValueError, match=r"top_k must have shape \(2,\) \(one value per row\), got \(3,\)"
    ):
        top_k_renorm_probs(probs, torch.ones(3, dtype=torch.int32))
    with pytest.raises(TypeError, match=r"top_k must be an int or an int32 tensor, got float"):
        top_k_renorm_probs(probs, 2.5)
    with pytest.raises(TypeError, match=r"top_k must have dtype in \(int32, int64\), got float32"):
        top_k_renorm_probs(probs, torch.ones(2))
    with pytest.raises(TypeError, match=r"top_k_mask_logits: logits must be a torch.Tensor"):
        top_k_mask_logits([[1.0]], 1)


def test_opcheck():
    from kernels_sampling.ops.top_k_renorm_probs import TOP_K_RENORM_PROBS

    probs = _probs(3, 64, seed=5)
    ks = torch.tensor([1, 5, 64], dtype=torch.int32)
    out = torch.empty_like(probs)
    torch.library.opcheck(TOP_K_RENORM_PROBS.torch_op, (out, probs, ks, 0, None))
    torch.library.opcheck(TOP_K_RENORM_PROBS.torch_op, (out, probs, None, 7, None))


def test_torch_compile_fullgraph():
    probs = _probs(3, 100, seed=6)
    ks = torch.tensor([1, 5, 10], dtype=torch.int32)
    compiled = torch.compile(top_k_renorm_probs, fullgraph=True)
    assert_close(compiled(probs, ks), reference.top_k_renorm_probs(probs, ks))
