"""quantization.hadamard_transform against an explicit float64 Sylvester matrix: powers of two and
padded widths, leading dims, scales, strided input, empty input, bad arguments, opcheck."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels_quantization import hadamard_transform, reference
from shared.testing.compare import assert_close
from shared.testing.inputs import randn, row_strided

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _sylvester(n: int) -> torch.Tensor:
    """H_N[i, j] = (-1)^popcount(i & j), built entry by entry."""
    return torch.tensor(
        [[(-1.0) ** bin(i & j).count("1") for j in range(n)] for i in range(n)],
        dtype=torch.float64,
    )


def _expected(x: torch.Tensor, scale: float) -> torch.Tensor:
    d = x.shape[-1]
    n = 1 << (d - 1).bit_length() if d > 1 else 1
    padded = torch.zeros(*x.shape[:-1], n, dtype=torch.float64)
    padded[..., :d] = x.double()
    return (scale * (padded @ _sylvester(n)))[..., :d]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", (1, 2, 3, 8, 12, 64, 100, 128, 257))
def test_matches_sylvester_matrix(dtype, d):
    x = randn(3, d, dtype=dtype, seed=d)
    n = reference.next_power_of_two(d)
    y = hadamard_transform(x, n**-0.5)
    assert y.dtype == dtype and y.shape == x.shape
    assert_close(y, _expected(x, n**-0.5).to(dtype))


@settings(max_examples=20, deadline=None)
@given(
    lead=st.lists(st.integers(1, 4), max_size=2),
    d=st.integers(1, 300),
    # |scale| >= 1e-3: tinier fp64 scales (6e-44 was drawn) turn fp32 outputs subnormal, and the
    # fp32 reference then loses relative precision against the fp64 oracle by construction.
    scale=st.one_of(st.just(0.0), st.floats(1e-3, 4), st.floats(-4, -1e-3)),
    seed=st.integers(0, 2**16),
)
def test_random_shapes_and_scales(lead, d, scale, seed):
    x = randn(*lead, d, seed=seed)
    assert_close(hadamard_transform(x, scale), _expected(x, scale).float(), atol=1e-4)


def test_orthonormal_is_an_involution():
    x = randn(4, 512, seed=1)
    once = hadamard_transform(x, 512**-0.5)
    assert_close(hadamard_transform(once, 512**-0.5), x, atol=1e-5)
    assert_close(once.norm(dim=-1), x.norm(dim=-1))


def test_strided_input_and_empty():
    x = row_strided(randn(5, 96, dtype=torch.bfloat16, seed=2), extra=32)
    assert_close(hadamard_transform(x), _expected(x, 1.0).to(torch.bfloat16))
    assert hadamard_transform(torch.empty(0, 128)).shape == (0, 128)


def test_largest_size_and_bad_arguments():
    x = randn(1, 32768, seed=3)
    assert_close(hadamard_transform(x[:, :20000], 1.0)[:, :4], _fwht_rows(x[:, :20000])[:, :4])
    with pytest.raises(ValueError, match=r"hadamard_transform: the last dim of x pads to 65536"):
        hadamard_transform(torch.zeros(1, 32769))
    with pytest.raises(TypeError, match="x must have dtype in .*got int32"):
        hadamard_transform(torch.ones(2, 4, dtype=torch.int32))
    with pytest.raises(TypeError, match="scale must be a Python float, got Tensor"):
        hadamard_transform(torch.ones(2, 4), torch.tensor(0.5))


def _fwht_rows(x: torch.Tensor) -> torch.Tensor:
    """The first few outputs of the padded transform: y_j = sum_i x_i (-1)^popcount(i & j)."""
    n = 32768
    i = torch.arange(n)
    out = []
    for j in range(4):
        bits = (torch.bitwise_and(i, j).unsqueeze(-1) >> torch.arange(15)) & 1
        signs = 1.0 - 2.0 * (bits.sum(-1) % 2)
        padded = torch.zeros(n, dtype=torch.float64)
        padded[: x.shape[-1]] = x[0].double()
        out.append((padded * signs.double()).sum())
    return torch.stack(out).float().reshape(1, 4)


def test_opcheck():
    from kernels_quantization.ops.hadamard_transform import HADAMARD_TRANSFORM

    x = randn(3, 24)
    torch.library.opcheck(HADAMARD_TRANSFORM.torch_op, (torch.empty_like(x), x, 0.25, None))
