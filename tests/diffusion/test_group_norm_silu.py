"""diffusion.group_norm_silu against a float64 oracle written with explicit group reshapes (not
F.group_norm): group counts, spatial ranks and sizes incl. 1, channels-last inputs, half dtypes,
empty batches, bad input, opcheck."""

from __future__ import annotations

import pytest
import torch

from kernels_diffusion import group_norm_silu
from shared.testing.compare import assert_close


def oracle(x, groups, weight, bias, eps=1e-5):
    """x [N, C, *spatial] in float64."""
    n, c = x.shape[:2]
    xd = x.double().reshape(n, groups, -1)
    mean = xd.mean(-1, keepdim=True)
    var = ((xd - mean) ** 2).mean(-1, keepdim=True)
    y = ((xd - mean) / torch.sqrt(var + eps)).reshape(x.shape)
    shape = (1, c) + (1,) * (x.dim() - 2)
    y = y * weight.double().reshape(shape) + bias.double().reshape(shape)
    return (y * torch.sigmoid(y)).to(x.dtype)


def _inputs(shape, channels, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, generator=g) * 2 + 0.5).to(dtype)
    weight = torch.randn(channels, generator=g)
    bias = torch.randn(channels, generator=g)
    return x, weight, bias


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    ("shape", "groups"),
    [((1, 4, 1), 2), ((2, 32, 5, 7), 32), ((2, 64, 3, 3), 8), ((1, 12, 2, 3, 4), 3), ((3, 6), 6)],
)
def test_matches_oracle(dtype, shape, groups):
    x, weight, bias = _inputs(shape, shape[1], seed=sum(shape), dtype=dtype)
    got = group_norm_silu(x, groups, weight, bias)
    assert got.shape == x.shape and got.dtype == dtype
    assert_close(got, oracle(x, groups, weight, bias))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_channels_last(dtype):
    x, weight, bias = _inputs((2, 4, 5, 64), 64, seed=1, dtype=dtype)
    got = group_norm_silu(x, 16, weight, bias, 1e-6, channels_last=True)
    assert got.shape == x.shape
    expected = oracle(x.movedim(-1, 1), 16, weight, bias, eps=1e-6).movedim(1, -1)
    assert_close(got, expected)


def test_empty_and_bad_input():
    x, weight, bias = _inputs((0, 8, 4), 8, seed=2)
    assert group_norm_silu(x, 4, weight, bias).shape == (0, 8, 4)
    x, weight, bias = _inputs((2, 8, 4), 8, seed=3)
    with pytest.raises(ValueError, match=r"num_groups must be >= 1 and divide C = 8, got 3"):
        group_norm_silu(x, 3, weight, bias)
    with pytest.raises(ValueError, match=r"group_norm_silu: bias must have C = 8 entries, got 4"):
        group_norm_silu(x, 4, weight, bias[:4])
    with pytest.raises(ValueError, match=r"weight must have C = 4 entries, got 8"):
        group_norm_silu(x, 4, weight, bias, channels_last=True)
    with pytest.raises(ValueError, match=r"x must have >= 2 dims \[N, C, ...\], got shape \(8,\)"):
        group_norm_silu(x[0, :, 0], 4, weight, bias)


def test_opcheck():
    from kernels_diffusion.ops.group_norm_silu import GROUP_NORM_SILU

    x, weight, bias = _inputs((2, 8, 3, 3), 8, seed=4)
    out = torch.empty_like(x)
    torch.library.opcheck(GROUP_NORM_SILU.torch_op, (out, x, 4, weight, bias, 1e-5, False, None))
