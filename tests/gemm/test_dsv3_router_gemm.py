"""gemm.dsv3_router_gemm against a float64 matmul: decode-sized and larger M, odd E and K, strided
weights, out=, bf16 out, empty input, bad arguments, opcheck and torch.compile."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels_gemm import dsv3_router_gemm, reference
from shared.testing.compare import assert_close
from shared.testing.inputs import randn, row_strided


def _expected(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Explicit dot products in float64."""
    out = torch.empty(x.shape[0], w.shape[0], dtype=torch.float64)
    for m in range(x.shape[0]):
        out[m] = (x[m].double().unsqueeze(0) * w.double()).sum(dim=1)
    return out


def _atol(k: int) -> float:
    # fp32 accumulation of K bf16 products of magnitude ~0.05: the rounding error grows like
    # sqrt(K) ulps of the partial sums.
    return 2e-6 * max(k, 1) ** 0.5


# M: 1 (decode), 16 (the fast-path limit), 17 and 64 (past it); E and K include DeepSeek-V3's
# 256 x 7168 and sizes that are not multiples of anything.
SHAPES = ((1, 256, 7168), (16, 256, 1024), (17, 384, 1024), (3, 7, 100), (64, 33, 129))


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_float64(shape):
    m, e, k = shape
    x = randn(m, k, dtype=torch.bfloat16, seed=k)
    w = randn(e, k, dtype=torch.bfloat16, seed=e, scale=0.05)
    out = dsv3_router_gemm(x, w)
    assert out.dtype == torch.float32 and out.shape == (m, e)
    assert_close(out, _expected(x, w).float(), atol=_atol(k))


@settings(max_examples=15, deadline=None)
@given(m=st.integers(0, 20), e=st.integers(1, 40), k=st.integers(1, 300), seed=st.integers(0, 999))
def test_random_shapes(m, e, k, seed):
    x = randn(m, k, dtype=torch.bfloat16, seed=seed)
    w = randn(e, k, dtype=torch.bfloat16, seed=seed + 1, scale=0.05)
    assert_close(dsv3_router_gemm(x, w), _expected(x, w).float(), atol=_atol(k))


def test_bf16_out_rounds_once():
    x = randn(4, 512, dtype=torch.bfloat16, seed=1)
    w = randn(9, 512, dtype=torch.bfloat16, seed=2, scale=0.05)
    out = dsv3_router_gemm(x, w, out_dtype=torch.bfloat16)
    assert_close(out, _expected(x, w).to(torch.bfloat16))


def test_strided_weight_and_out_view():
    x = row_strided(randn(5, 256, dtype=torch.bfloat16, seed=3), extra=16)
    w = row_strided(randn(12, 256, dtype=torch.bfloat16, seed=4, scale=0.05), extra=8)
    wide = torch.full((5, 20), -1.0)
    out = wide[:, 4:16]
    assert dsv3_router_gemm(x, w, out=out) is out
    assert_close(out, _expected(x, w).float(), atol=_atol(256))
    assert (wide[:, :4] == -1).all() and (wide[:, 16:] == -1).all()


def test_empty():
    w = randn(8, 64, dtype=torch.bfloat16)
    assert dsv3_router_gemm(torch.empty(0, 64, dtype=torch.bfloat16), w).shape == (0, 8)
    out = dsv3_router_gemm(torch.empty(3, 0, dtype=torch.bfloat16), torch.empty(2, 0).bfloat16())
    assert out.shape == (3, 2) and (out == 0).all()


def test_bad_arguments():
    x = torch.randn(2, 64).bfloat16()
    w = torch.randn(8, 64).bfloat16()
    with pytest.raises(
        TypeError, match=r"dsv3_router_gemm: x must have dtype in \(bfloat16\), got"
    ):
        dsv3_router_gemm(x.float(), w)
    with pytest.raises(ValueError, match=r"must share K, got x \(2, 64\) and w \(8, 32\)"):
        dsv3_router_gemm(x, w[:, :32])
    with pytest.raises(TypeError, match="out_dtype must be torch.float32 or torch.bfloat16"):
        dsv3_router_gemm(x, w, out_dtype=torch.float16)
    with pytest.raises(ValueError, match=r"out must have shape \(2, 8\), got \(8, 2\)"):
        dsv3_router_gemm(x, w, out=torch.empty(8, 2))
    with pytest.raises(ValueError, match="w must have a contiguous last dim"):
        dsv3_router_gemm(x, torch.randn(64, 8).bfloat16().t())


def test_opcheck():
    from kernels_gemm.ops.dsv3_router_gemm import DSV3_ROUTER_GEMM

    x = randn(3, 128, dtype=torch.bfloat16)
    w = randn(16, 128, dtype=torch.bfloat16)
    torch.library.opcheck(DSV3_ROUTER_GEMM.torch_op, (torch.empty(3, 16), x, w, None))


def test_torch_compile_fullgraph():
    """Inductor, so the custom op is traced, functionalised and lowered (about 5 s on CPU)."""
    x = randn(4, 256, dtype=torch.bfloat16)
    w = randn(32, 256, dtype=torch.bfloat16, scale=0.05)
    compiled = torch.compile(lambda a, b: dsv3_router_gemm(a, b).sigmoid(), fullgraph=True)
    assert_close(compiled(x, w), reference.dsv3_router_gemm(x, w).sigmoid())
