"""diffusion.timestep_embedding against a float64 math-module oracle of diffusers' formula: both
layouts, shifts, odd dims, scales, integer timesteps, output dtypes, bad input, compile."""

from __future__ import annotations

import math

import pytest
import torch

from kernels_diffusion import reference, timestep_embedding
from shared.testing.compare import assert_close


def oracle(t, dim, flip=False, shift=1.0, scale=1.0, max_period=10000.0):
    half = dim // 2
    out = torch.zeros(len(t), dim, dtype=torch.float64)
    for n, tn in enumerate(t):
        for i in range(half):
            a = scale * tn * math.exp(-math.log(max_period) * i / (half - shift))
            first, second = (math.cos(a), math.sin(a)) if flip else (math.sin(a), math.cos(a))
            out[n, i], out[n, half + i] = first, second
    return out


@pytest.mark.parametrize("dim", [1, 5, 8, 127, 256])
@pytest.mark.parametrize(("flip", "shift"), [(False, 1.0), (True, 0.0), (True, 0.5)])
def test_matches_float64_oracle(dim, flip, shift):
    t = torch.tensor([0.0, 1.0, 17.5, 999.0])
    got = timestep_embedding(t, dim, flip_sin_to_cos=flip, downscale_freq_shift=shift)
    assert got.shape == (4, dim) and got.dtype == torch.float32
    # fp32 angles up to 999 carry ~6e-5 absolute error, which sin/cos pass on.
    assert_close(got, oracle(t.tolist(), dim, flip, shift).float(), atol=2e-4, rtol=0)
    if dim % 2:
        assert not got[:, -1].any()


def test_scale_max_period_and_integer_timesteps():
    t = torch.tensor([3, 250, 800], dtype=torch.int64)
    got = timestep_embedding(t, 64, scale=0.001, max_period=500.0)
    assert_close(got, oracle([3, 250, 800], 64, scale=0.001, max_period=500.0).float())


@pytest.mark.parametrize("out_dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_output_rounds_once(out_dtype):
    t = torch.rand(33) * 100
    got = timestep_embedding(t, 160, out_dtype=out_dtype)
    assert got.dtype == out_dtype
    assert_close(got, reference.timestep_embedding(t, 160).to(out_dtype))


def test_empty_and_bad_input():
    assert timestep_embedding(torch.empty(0), 32).shape == (0, 32)
    with pytest.raises(ValueError, match=r"timestep_embedding: dim must be >= 1, got 0"):
        timestep_embedding(torch.ones(2), 0)
    with pytest.raises(
        ValueError, match=r"dim // 2 - downscale_freq_shift must not be 0 .* dim = 2"
    ):
        timestep_embedding(torch.ones(2), 2)
    with pytest.raises(ValueError, match=r"t must have 1 dims, got shape \(2, 1\)"):
        timestep_embedding(torch.ones(2, 1), 8)
    with pytest.raises(TypeError, match=r"out_dtype must be float32, float16 or bfloat16"):
        timestep_embedding(torch.ones(2), 8, out_dtype=torch.float64)


def test_opcheck_and_compile():
    from kernels_diffusion.ops.timestep_embedding import TIMESTEP_EMBEDDING

    t = torch.rand(5) * 1000
    out = torch.empty(5, 33)
    torch.library.opcheck(TIMESTEP_EMBEDDING.torch_op, (out, t, 33, True, 0.0, 1.0, 10000.0, None))
    compiled = torch.compile(
        lambda t: timestep_embedding(t, 33, flip_sin_to_cos=True, downscale_freq_shift=0.0),
        fullgraph=True,
    )
    assert torch.equal(compiled(t), reference.timestep_embedding(t, 33, True, 0.0))
