"""diffusion.residual_gate_add and diffusion.layernorm_scale_shift against float64 oracles: every
gate/scale/shift layout, odd hidden sizes, half dtypes with fp32 modulation, optional affine,
in place (out aliasing r), empty input, bad input, opcheck."""

from __future__ import annotations

import pytest
import torch

from kernels_diffusion import layernorm_scale_shift, residual_gate_add
from shared.testing.compare import assert_close

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _t(*shape, seed, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def _layouts(b, l, h):
    return [(b, h), (b, 1, h), (b, l, h)]


def _expand(v: torch.Tensor, length: int) -> torch.Tensor:
    v = v.double()
    return (v[:, None, :] if v.dim() == 2 else v).expand(v.shape[0], length, v.shape[-1])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("b", "l", "h"), [(1, 1, 1), (2, 5, 33), (3, 17, 256)])
@pytest.mark.parametrize("layout", [0, 1, 2])
def test_residual_gate_add(dtype, b, l, h, layout):
    r, x = _t(b, l, h, seed=1, dtype=dtype), _t(b, l, h, seed=2, dtype=dtype)
    gate = _t(*_layouts(b, l, h)[layout], seed=3)
    expected = (r.double() + _expand(gate, l) * x.double()).to(dtype)
    assert_close(residual_gate_add(r, x, gate), expected)


def test_residual_gate_add_in_place_and_out():
    r, x, gate = _t(2, 4, 8, seed=4), _t(2, 4, 8, seed=5), _t(2, 8, seed=6)
    expected = (r.double() + _expand(gate, 4) * x.double()).float()
    out = torch.empty(2, 4, 8)
    assert residual_gate_add(r, x, gate, out=out) is out
    assert residual_gate_add(r, x, gate, out=r) is r
    assert_close(r, expected)
    assert_close(out, expected)


def oracle_ln(x, scale, shift, weight=None, bias=None, eps=1e-6):
    xd = x.double()
    h = xd.shape[-1]
    mean = xd.sum(-1, keepdim=True) / h
    var = ((xd - mean) ** 2).sum(-1, keepdim=True) / h
    y = (xd - mean) / torch.sqrt(var + eps)
    if weight is not None:
        y = y * weight.double()
    if bias is not None:
        y = y + bias.double()
    length = x.shape[1]
    return (y * (1 + _expand(scale, length)) + _expand(shift, length)).to(x.dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("b", "l", "h"), [(1, 1, 2), (2, 7, 65), (2, 16, 1024)])
@pytest.mark.parametrize("affine", [False, True])
def test_layernorm_scale_shift(dtype, b, l, h, affine):
    x = _t(b, l, h, seed=7, dtype=dtype, scale=3.0) + 1
    for i, (s_layout, t_layout) in enumerate([(0, 1), (1, 2), (2, 0)]):
        scale = _t(*_layouts(b, l, h)[s_layout], seed=8 + i, scale=0.2)
        shift = _t(*_layouts(b, l, h)[t_layout], seed=9 + i)
        kwargs = {}
        if affine:
            kwargs = {"weight": _t(h, seed=10), "bias": _t(h, seed=11)}
        got = layernorm_scale_shift(x, scale, shift, **kwargs)
        assert got.dtype == dtype
        assert_close(got, oracle_ln(x, scale, shift, **kwargs))


def test_layernorm_constant_rows_and_eps():
    x = torch.full((1, 2, 16), 3.0)
    scale, shift = torch.zeros(1, 16), torch.full((1, 16), 0.5)
    assert_close(layernorm_scale_shift(x, scale, shift, eps=1e-5), torch.full((1, 2, 16), 0.5))


def test_empty():
    e = torch.empty(2, 0, 8)
    assert residual_gate_add(e, e, torch.ones(2, 8)).shape == (2, 0, 8)
    assert layernorm_scale_shift(e, torch.ones(2, 8), torch.ones(2, 8)).shape == (2, 0, 8)


def test_bad_input():
    x = _t(2, 3, 8, seed=12)
    with pytest.raises(
        ValueError,
        match=r"residual_gate_add: gate must have shape \[B, H\], \[B, 1, H\] or \[B, L, H\]",
    ):
        residual_gate_add(x, x, torch.ones(2, 3, 7))
    with pytest.raises(
        ValueError, match=r"residual_gate_add: x must have the shape of r \(2, 3, 8\)"
    ):
        residual_gate_add(x, x[:, :2], torch.ones(2, 8))
    with pytest.raises(TypeError, match=r"out must have dtype float32, got bfloat16"):
        residual_gate_add(x, x, torch.ones(2, 8), out=x.bfloat16())
    with pytest.raises(
        ValueError, match=r"layernorm_scale_shift: weight must have H = 8 entries, got 4"
    ):
        layernorm_scale_shift(x, torch.ones(2, 8), torch.ones(2, 8), weight=torch.ones(4))
    with pytest.raises(ValueError, match=r"layernorm_scale_shift: shift must have shape"):
        layernorm_scale_shift(x, torch.ones(2, 8), torch.ones(1, 8))
    with pytest.raises(TypeError, match=r"layernorm_scale_shift: x must have dtype in"):
        layernorm_scale_shift(x.double(), torch.ones(2, 8), torch.ones(2, 8))


def test_opcheck():
    from kernels_diffusion.ops.layernorm_scale_shift import LAYERNORM_SCALE_SHIFT
    from kernels_diffusion.ops.residual_gate_add import RESIDUAL_GATE_ADD

    x, scale, shift = _t(2, 3, 8, seed=13), _t(2, 8, seed=14), _t(2, 3, 8, seed=15)
    out = torch.empty_like(x)
    torch.library.opcheck(RESIDUAL_GATE_ADD.torch_op, (out, x, x, scale, None))
    torch.library.opcheck(
        LAYERNORM_SCALE_SHIFT.torch_op, (out, x, scale, shift, torch.ones(8), None, 1e-6, None)
    )
