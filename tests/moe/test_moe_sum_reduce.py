"""moe.moe_sum_reduce against explicit float64 sums: k in {1, 2, 8, 9}, odd H, weights and scaling,
strided x, out=, empty input, bad arguments, opcheck and torch.compile."""

from __future__ import annotations

import pytest
import torch

from kernels_moe import moe_sum_reduce, reference
from shared.testing.compare import assert_close
from shared.testing.inputs import randn


def _expected(x, weights=None, scale=1.0) -> torch.Tensor:
    tokens, k, hidden = x.shape
    out = torch.zeros(tokens, hidden, dtype=torch.float64)
    for t in range(tokens):
        for j in range(k):
            w = 1.0 if weights is None else float(weights[t, j])
            out[t] += w * x[t, j].double()
    return out * scale


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize("shape", ((1, 1, 8), (3, 2, 64), (5, 8, 129), (4, 9, 256)), ids=str)
@pytest.mark.parametrize("weighted", (False, True))
def test_matches_float64(dtype, shape, weighted):
    x = randn(*shape, dtype=dtype, seed=shape[2])
    w = (
        torch.rand(shape[0], shape[1], generator=torch.Generator().manual_seed(1))
        if weighted
        else None
    )
    out = moe_sum_reduce(x, routed_scaling_factor=2.5, topk_weights=w)
    assert out.dtype == dtype and out.shape == (shape[0], shape[2])
    assert_close(out, _expected(x, w, 2.5).to(dtype))


def test_strided_x_and_out_view():
    base = randn(6, 4, 200, dtype=torch.bfloat16, seed=2)
    x = base[:, :, 8:136]  # leading strides of a wider buffer, last dim contiguous
    wide = torch.zeros(6, 140, dtype=torch.bfloat16)
    out = wide[:, 6:134]
    assert moe_sum_reduce(x, out=out) is out
    assert_close(out, _expected(x).to(torch.bfloat16))
    assert (wide[:, :6] == 0).all()


def test_empty():
    assert moe_sum_reduce(torch.empty(0, 8, 64)).shape == (0, 64)
    out = moe_sum_reduce(torch.empty(3, 0, 16))
    assert out.shape == (3, 16) and (out == 0).all()


def test_bad_arguments():
    x = torch.randn(3, 2, 8)
    with pytest.raises(ValueError, match=r"moe_sum_reduce: x must have 3 dims, got shape \(3, 8\)"):
        moe_sum_reduce(torch.randn(3, 8))
    with pytest.raises(ValueError, match=r"topk_weights must have shape \(3, 2\) \[T, k\] like x"):
        moe_sum_reduce(x, topk_weights=torch.ones(3, 3))
    with pytest.raises(TypeError, match="out must have dtype float32, got bfloat16"):
        moe_sum_reduce(x, out=torch.empty(3, 8, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="routed_scaling_factor must be a Python float"):
        moe_sum_reduce(x, routed_scaling_factor=None)


def test_opcheck():
    from kernels_moe.ops.moe_sum_reduce import MOE_SUM_REDUCE

    x = randn(4, 3, 32, dtype=torch.bfloat16)
    out = torch.empty(4, 32, dtype=torch.bfloat16)
    torch.library.opcheck(MOE_SUM_REDUCE.torch_op, (out, x, torch.rand(4, 3), 1.5, None))


def test_torch_compile_fullgraph_aot():
    x = randn(5, 8, 64, dtype=torch.bfloat16)
    w = torch.rand(5, 8)
    compiled = torch.compile(
        lambda a, b: moe_sum_reduce(a, topk_weights=b, routed_scaling_factor=2.5),
        fullgraph=True,
        backend="aot_eager",
    )
    assert_close(compiled(x, w), reference.moe_sum_reduce(x, 2.5, w))
