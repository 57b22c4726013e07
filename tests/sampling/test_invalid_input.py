"""Bad input to the sampling ops has a defined, loud outcome (never a plausible result).

- A row holding a NaN, +/-inf or negative probability (or whose kept fp32 sum overflows) is
  invalid: the renorm ops write an all-NaN row, the sampling ops return sample 0 / valid False.
- Per-row ``top_p`` NaN and per-row ``min_p`` NaN or outside [0, 1] make their row invalid the
  same way; as scalars they are ValueErrors.
- An all-zero row keeps its degenerate outcome (renorm: zeros; sampling: 0 / valid False).
- ``check_nan=True`` raises a ValueError naming the op and ``probs`` when any entry is NaN.
- Valid rows of the same batch are bit-identical to a batch without the bad rows.
"""

from __future__ import annotations

import pytest
import torch

from kernels_sampling import (
    min_p_renorm_probs,
    sampling_from_probs,
    top_k_renorm_probs,
    top_k_top_p_sampling_from_probs,
    top_p_renorm_probs,
)

NAN, INF = float("nan"), float("inf")
V = 16

# Rows 0-4 are bad, row 5 is all zero, rows 6-7 are valid.
BAD_ROWS = {
    "nan": (0, NAN),
    "+inf": (3, INF),
    "-inf": (7, -INF),
    "negative": (11, -1e-3),
    "overflow": (None, 3e38),  # every entry finite, fp32 sum overflows
}


def _batch(dtype=torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """(probs with bad rows, the same probs with every bad/zero row replaced by a valid one)."""
    g = torch.Generator().manual_seed(0)
    clean = (torch.randn(8, V, generator=g) * 2).softmax(dim=1)
    probs = clean.clone()
    for row, (col, value) in enumerate(BAD_ROWS.values()):
        if col is None:
            probs[row] = value
        else:
            probs[row, col] = value
    probs[5] = 0.0
    return probs.to(dtype), clean.to(dtype)


N_BAD = len(BAD_ROWS)
VALID = slice(N_BAD + 1, None)

RENORM_OPS = [
    pytest.param(top_k_renorm_probs, 3, id="top_k"),
    pytest.param(top_p_renorm_probs, 0.7, id="top_p"),
    pytest.param(min_p_renorm_probs, 0.2, id="min_p"),
]


@pytest.mark.parametrize(("op", "param"), RENORM_OPS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_renorm_bad_rows_become_nan(op, param, dtype):
    probs, clean = _batch(dtype)  # float16: the 3e38 row rounds to +inf, still a bad row
    got = op(probs, param)
    assert got.dtype == dtype
    assert got[:N_BAD].isnan().all()
    assert torch.equal(got[5], torch.zeros(V, dtype=dtype))  # all-zero row: zeros, not NaN
    assert not got[VALID].isnan().any()
    assert torch.equal(got[VALID], op(clean, param)[VALID])


@pytest.mark.parametrize(
    ("op", "name", "bad"),
    [
        (top_p_renorm_probs, "top_p", NAN),
        (min_p_renorm_probs, "min_p", NAN),
        (min_p_renorm_probs, "min_p", 1.5),
        (min_p_renorm_probs, "min_p", -0.1),
    ],
)
def test_renorm_bad_per_row_param(op, name, bad):
    _, clean = _batch()
    params = torch.full((8,), 0.5)
    params[2] = bad
    got = op(clean, params)
    assert got[2].isnan().all()
    others = [i for i in range(8) if i != 2]
    assert torch.equal(got[others], op(clean, torch.full((8,), 0.5))[others])


@pytest.mark.parametrize(
    ("op", "name", "bad"),
    [
        (top_p_renorm_probs, "top_p", NAN),
        (min_p_renorm_probs, "min_p", NAN),
        (min_p_renorm_probs, "min_p", 1.5),
        (min_p_renorm_probs, "min_p", -0.1),
    ],
)
def test_renorm_bad_scalar_param_raises(op, name, bad):
    _, clean = _batch()
    with pytest.raises(ValueError, match=rf"sampling\.{op.__name__}: {name} must"):
        op(clean, bad)


def test_renorm_defined_params_still_accepted():
    """OPS.md defines top_p <= 0 (argmax set), top_p >= 1 (off) and min_p in [0, 1]."""
    _, clean = _batch()
    for p in (-1.0, 0.0, 1.0, 2.0, INF, -INF):
        assert not top_p_renorm_probs(clean, p).isnan().any()
    for m in (0.0, 1.0, 0, 1):
        assert not min_p_renorm_probs(clean, m).isnan().any()


def test_sampling_bad_rows_are_invalid():
    probs, clean = _batch()
    got, valid = sampling_from_probs(probs, seed=9, offset=2, return_valid=True)
    assert valid.tolist() == [False] * (N_BAD + 1) + [True] * 2
    assert got[: N_BAD + 1].tolist() == [0] * (N_BAD + 1)
    ref, ref_valid = sampling_from_probs(clean, seed=9, offset=2, return_valid=True)
    assert torch.equal(got[VALID], ref[VALID]) and ref_valid.all()


def test_sampling_bad_rows_through_indices():
    probs, _ = _batch()
    idx = torch.tensor([6, 0, 7, 1, 6], dtype=torch.int64)
    got, valid = sampling_from_probs(probs, indices=idx, seed=1, return_valid=True)
    assert valid.tolist() == [True, False, True, False, True]
    assert got[1] == 0 and got[3] == 0


@pytest.mark.parametrize("order", ["top_k_first", "joint"])
def test_top_k_top_p_bad_rows_are_invalid(order):
    probs, clean = _batch()
    # Token 11 of row 3 is the negative entry: top_k=1 filters it out, the row is still invalid.
    got, valid = top_k_top_p_sampling_from_probs(
        probs, 1, 0.9, filter_apply_order=order, seed=5, return_valid=True
    )
    assert valid.tolist() == [False] * (N_BAD + 1) + [True] * 2
    assert got[: N_BAD + 1].tolist() == [0] * (N_BAD + 1)
    ref = top_k_top_p_sampling_from_probs(clean, 1, 0.9, filter_apply_order=order, seed=5)
    assert torch.equal(got[VALID], ref[VALID])


def test_top_k_top_p_nan_top_p():
    _, clean = _batch()
    ps = torch.full((8,), 0.8)
    ps[4] = NAN
    got, valid = top_k_top_p_sampling_from_probs(clean, 5, ps, seed=3, return_valid=True)
    assert valid.tolist() == [i != 4 for i in range(8)] and got[4] == 0
    ref = top_k_top_p_sampling_from_probs(clean, 5, torch.full((8,), 0.8), seed=3)
    others = [i for i in range(8) if i != 4]
    assert torch.equal(got[others], ref[others])
    with pytest.raises(
        ValueError, match=r"sampling\.top_k_top_p_sampling_from_probs: top_p must not be NaN"
    ):
        top_k_top_p_sampling_from_probs(clean, 5, NAN, seed=3)


def _top_k(p, **kw):
    return top_k_renorm_probs(p, 3, **kw)


def _top_p(p, **kw):
    return top_p_renorm_probs(p, 0.5, **kw)


def _min_p(p, **kw):
    return min_p_renorm_probs(p, 0.1, **kw)


def _sample(p, **kw):
    return sampling_from_probs(p, seed=1, **kw)


def _top_k_top_p(p, **kw):
    return top_k_top_p_sampling_from_probs(p, 3, 0.5, seed=1, **kw)


ALL_PROB_OPS = [
    (_top_k, "top_k_renorm_probs"),
    (_top_p, "top_p_renorm_probs"),
    (_min_p, "min_p_renorm_probs"),
    (_sample, "sampling_from_probs"),
    (_top_k_top_p, "top_k_top_p_sampling_from_probs"),
]


@pytest.mark.parametrize(("call", "name"), ALL_PROB_OPS, ids=[n for _, n in ALL_PROB_OPS])
def test_check_nan(call, name):
    probs, clean = _batch()
    with pytest.raises(ValueError, match=rf"sampling\.{name}: probs contains NaN"):
        call(probs, check_nan=True)
    assert torch.equal(call(clean, check_nan=True), call(clean))  # clean input: same result
    assert call(probs[1:], check_nan=True).shape[0] == 7  # inf / negative: not NaN, no raise
    with pytest.raises(TypeError, match=rf"{name}: check_nan must be a bool, got int"):
        call(clean, check_nan=1)
