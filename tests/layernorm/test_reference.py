"""The torch references of the layernorm group against independent float64 oracles (CPU).

The oracles below are written from the formulas, in float64, without the references' fp32
arithmetic; each reference must match its oracle rounded once to the dtype.
"""

from __future__ import annotations

import pytest
import torch

from kernels_layernorm import reference
from shared.testing.compare import assert_close
from shared.testing.inputs import FLOAT_DTYPES, randn

# 1: a single element (the mean square is x^2); 127: odd; 4096/7168: model sizes.
HIDDEN = (1, 127, 4096, 7168)


def _oracle_rms(x: torch.Tensor, w: torch.Tensor, eps: float, offset: float = 0.0) -> torch.Tensor:
    xd = x.double()
    ms = (xd * xd).sum(-1, keepdim=True) / x.shape[-1]
    return (xd / torch.sqrt(ms + eps) * (w.double() + offset)).to(x.dtype)


def _oracle_layernorm(x, w, b, eps):
    xd = x.double()
    n = x.shape[-1]
    mean = xd.sum(-1, keepdim=True) / n
    var = ((xd - mean) ** 2).sum(-1, keepdim=True) / n
    y = (xd - mean) / torch.sqrt(var + eps) * w.double()
    if b is not None:
        y = y + b.double()
    return y.to(x.dtype)


def _weight(h: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    return (1.0 + 0.25 * randn(h, seed=seed)).to(dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("gemma", (False, True), ids=("rms", "gemma"))
def test_rmsnorm_matches_float64(dtype, hidden, gemma):
    x = randn(9, hidden, dtype=dtype, seed=hidden)
    w = _weight(hidden, dtype, seed=1)
    fn = reference.gemma_rmsnorm if gemma else reference.rmsnorm
    got = fn(x, w, 1e-6)
    assert got.dtype == dtype and got.shape == x.shape
    assert_close(got, _oracle_rms(x, w, 1e-6, offset=1.0 if gemma else 0.0))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("gemma", (False, True), ids=("rms", "gemma"))
def test_fused_add_rmsnorm_matches_float64(dtype, hidden, gemma):
    x = randn(9, hidden, dtype=dtype, seed=hidden)
    r = randn(9, hidden, dtype=dtype, seed=hidden + 1, scale=4.0)
    w = _weight(hidden, dtype, seed=2)
    fn = reference.gemma_fused_add_rmsnorm if gemma else reference.fused_add_rmsnorm
    y, s = fn(x, r, w, 1e-6)
    # The residual stream keeps the dtype: the exact sum, rounded once.
    s_oracle = (x.double() + r.double()).to(dtype)
    assert torch.equal(s, s_oracle)
    # ... and the normalisation reads that rounded sum.
    assert_close(y, _oracle_rms(s_oracle, w, 1e-6, offset=1.0 if gemma else 0.0))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_fused_equals_unfused(dtype):
    """The documented rounding: fused == ``residual = x + residual; rmsnorm(residual)``."""
    x = randn(5, 256, dtype=dtype, seed=3)
    r = randn(5, 256, dtype=dtype, seed=4)
    w = _weight(256, dtype, seed=5)
    y, s = reference.fused_add_rmsnorm(x, r, w)
    assert torch.equal(s, x + r)
    assert torch.equal(y, reference.rmsnorm(x + r, w))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("head_dim", (64, 128, 60))
def test_qk_rmsnorm_matches_float64(dtype, head_dim):
    q = randn(6, 8, head_dim, dtype=dtype, seed=6)
    k = randn(6, 2, head_dim, dtype=dtype, seed=7, scale=3.0)
    qw, kw = _weight(head_dim, dtype, 8), _weight(head_dim, dtype, 9)
    q_out, k_out = reference.qk_rmsnorm(q, k, qw, kw, 1e-6)
    assert_close(q_out, _oracle_rms(q, qw, 1e-6))
    assert_close(k_out, _oracle_rms(k, kw, 1e-6))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("hidden", HIDDEN)
@pytest.mark.parametrize("with_bias", (True, False), ids=("bias", "nobias"))
def test_layernorm_matches_float64(dtype, hidden, with_bias):
    # An offset mean exercises the centring (E[x^2] - mean^2 would cancel).
    x = (randn(9, hidden, seed=hidden) + 3.0).to(dtype)
    w = _weight(hidden, dtype, seed=10)
    b = (0.5 * randn(hidden, seed=11)).to(dtype) if with_bias else None
    got = reference.layernorm(x, w, b, 1e-5)
    assert got.dtype == dtype
    assert_close(got, _oracle_layernorm(x, w, b, 1e-5))


def test_layernorm_matches_torch_functional():
    x = randn(4, 96, seed=12)
    w, b = _weight(96, torch.float32, 13), randn(96, seed=14)
    expected = torch.nn.functional.layer_norm(x, (96,), w, b, 1e-5)
    assert_close(reference.layernorm(x, w, b, 1e-5), expected)


def test_rmsnorm_matches_torch_functional():
    x = randn(4, 96, seed=15)
    w = _weight(96, torch.float32, 16)
    expected = torch.nn.functional.rms_norm(x, (96,), w, 1e-6)
    assert_close(reference.rmsnorm(x, w, 1e-6), expected)


def test_constant_rows():
    """A constant row: rmsnorm gives sign * w (up to eps); layernorm gives the bias exactly."""
    x = torch.full((3, 64), 2.0)
    w = _weight(64, torch.float32, 17)
    assert_close(reference.rmsnorm(x, w, 0.0), w.expand(3, 64).contiguous())
    b = randn(64, seed=18)
    assert torch.equal(reference.layernorm(x, w, b, 1e-5), b.expand(3, 64))


def test_leading_dims_and_strides():
    """References work on [..., H] of any layout (they are the fallback for every layout)."""
    x = randn(2, 3, 5, 40, seed=19)[:, :, ::2, :32]
    w = _weight(32, torch.float32, 20)
    assert_close(reference.rmsnorm(x, w), _oracle_rms(x, w, 1e-6))
    assert_close(reference.layernorm(x, w, None), _oracle_layernorm(x, w, None, 1e-5))


def test_large_values_do_not_overflow_in_half():
    """fp16 x of 6e4: x^2 overflows fp16 but not the fp32 statistics."""
    x = torch.full((2, 16), 6.0e4, dtype=torch.float16)
    w = torch.ones(16, dtype=torch.float16)
    assert_close(reference.rmsnorm(x, w), torch.ones(2, 16, dtype=torch.float16))
