"""quantization.hadamard_transform against an explicit float64 Sylvester matrix: powers of two and
padded widths, leading dims, scales, strided input, empty input, bad arguments, opcheck; the CUDA
backend against the reference for every dtype and log2 N (both kernels, vector and scalar paths),
row-strided, misaligned and 3-D views, in place, empty input, CUDA graphs, torch.compile, its
sm_90a build and a compute-sanitizer memcheck run."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels_jit.errors import KernelsFallbackWarning
from kernels_quantization import hadamard_transform, reference
from kernels_quantization.ops.hadamard_transform import HADAMARD_TRANSFORM
from shared.testing.builds import compile_group_for_hopper, run_memcheck
from shared.testing.compare import assert_close
from shared.testing.inputs import misaligned, poison, randn, row_strided

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


def _device_params():
    return [
        pytest.param("cpu", id="cpu"),
        pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
    ]


@pytest.mark.parametrize("device", _device_params())
def test_opcheck(device):
    x = randn(3, 24, device=device)
    torch.library.opcheck(HADAMARD_TRANSFORM.torch_op, (torch.empty_like(x), x, 0.25, None))
    y = randn(2, 4096, dtype=torch.bfloat16, device=device)
    torch.library.opcheck(HADAMARD_TRANSFORM.torch_op, (torch.empty_like(y), y, 1 / 64, None))


def test_cuda_source_compiles_for_sm90a():
    assert "hadamard_transform_cuda" in compile_group_for_hopper("quantization")


# --- the CUDA backend ----------------------------------------------------------------------------

# Every log2 N (warp kernel up to 2048, block kernel from 4096), plus padded widths on the vector
# path (24, 1000, 5000: D % 8 == 0) and on the scalar path (3, 100, 4097).
CUDA_WIDTHS = (*(1 << k for k in range(16)), 3, 24, 100, 1000, 4097, 5000)


def _cuda(out: torch.Tensor, x: torch.Tensor, scale: float) -> torch.Tensor:
    """The CUDA backend into a poisoned ``out``, failing on any fall-back to torch."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", KernelsFallbackWarning)
        HADAMARD_TRANSFORM(poison(out), x, scale, backend="cuda")
    return out


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", CUDA_WIDTHS)
@pytest.mark.parametrize("tokens", (1, 7, 33))
def test_cuda_matches_reference(dtype, d, tokens):
    x = randn(tokens, d, dtype=dtype, device="cuda", seed=d + tokens)
    scale = reference.next_power_of_two(d) ** -0.5
    expected = reference.hadamard_transform(x, scale)
    assert_close(_cuda(torch.empty_like(x), x, scale), expected, name=f"d={d} T={tokens}")
    assert_close(hadamard_transform(x, scale), expected, name=f"public d={d} T={tokens}")


@pytest.mark.gpu
@pytest.mark.parametrize("d", (8, 128, 2048, 4096, 32768))
def test_cuda_unnormalised_and_negative_scales(d):
    x = randn(5, d, device="cuda", seed=d)
    for scale in (1.0, -0.5, 0.0):
        assert_close(
            _cuda(torch.empty_like(x), x, scale),
            reference.hadamard_transform(x, scale),
            atol=1e-4 * d**0.5,
        )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("d", (8, 100, 128, 1000, 2048, 4096, 5000, 16384))
def test_cuda_strided_misaligned_and_3d_views(dtype, d):
    scale = reference.next_power_of_two(d) ** -0.5
    base = randn(6, d, dtype=dtype, device="cuda", seed=d)
    views = {
        "row_strided": row_strided(base, extra=8),  # the vector path when d % 8 == 0
        "odd_stride": row_strided(base, extra=3),  # rows not 16-byte aligned: the scalar path
        "misaligned": misaligned(base),
        "3d": base.view(2, 3, d),
        "3d_sliced": randn(4, 3, d, dtype=dtype, device="cuda")[1:3],  # collapses: one stride
    }
    for name, x in views.items():
        out = torch.empty(x.shape, dtype=dtype, device="cuda")
        assert_close(_cuda(out, x, scale), reference.hadamard_transform(x, scale), name=name)
    # out may be a row-strided view too
    out = row_strided(torch.empty_like(base), extra=16)
    assert_close(_cuda(out, base, scale), reference.hadamard_transform(base, scale))


@pytest.mark.gpu
def test_cuda_non_collapsible_view_falls_back():
    x = randn(3, 4, 256, device="cuda")[:, :2]  # leading dims need two strides
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KernelsFallbackWarning)
        y = hadamard_transform(x, 1 / 16)
    assert_close(y, reference.hadamard_transform(x, 1 / 16))


@pytest.mark.gpu
@pytest.mark.parametrize("d", (16, 4096))
def test_cuda_in_place_and_empty(d):
    x = randn(9, d, dtype=torch.bfloat16, device="cuda")
    expected = reference.hadamard_transform(x, d**-0.5)
    HADAMARD_TRANSFORM(x, x, d**-0.5, backend="cuda")
    assert_close(x, expected)
    assert hadamard_transform(torch.empty(0, d, device="cuda")).shape == (0, d)
    out = torch.empty(0, d, device="cuda")
    HADAMARD_TRANSFORM(out, torch.empty(0, d, device="cuda"), 1.0, backend="cuda")
    assert hadamard_transform(torch.empty(3, 0, device="cuda")).shape == (3, 0)


@pytest.mark.gpu
def test_compiled_kernel_rejects_bad_input_itself():
    """A direct call of the raw function, past the Python checks, fails cleanly in C++."""
    from kernels_jit import load_module
    from kernels_quantization.ops.hadamard_transform import HADAMARD_TRANSFORM_CUDA

    raw = load_module(HADAMARD_TRANSFORM_CUDA).hadamard_transform
    x = torch.zeros(2, 64, device="cuda")
    with pytest.raises(ValueError, match="same shape"):
        raw(torch.empty(2, 32, device="cuda"), x, 1.0)
    with pytest.raises(TypeError, match="same dtype"):
        raw(torch.empty(2, 64, device="cuda", dtype=torch.bfloat16), x, 1.0)
    with pytest.raises(TypeError, match="unsupported dtype"):
        raw(x.double(), x.double(), 1.0)
    with pytest.raises(ValueError, match="pads to more than 32768"):
        big = torch.zeros(1, 32769, device="cuda")
        raw(big, big, 1.0)
    with pytest.raises(ValueError, match="contiguous last dim"):
        raw(torch.empty(64, 2, device="cuda").t(), torch.zeros(64, 2, device="cuda").t(), 1.0)
    with pytest.raises(ValueError, match="must not overlap"):
        wide = torch.zeros(2, 72, device="cuda")
        raw(wide[:, 8:], wide[:, :64], 1.0)
    with pytest.raises(ValueError, match="wrong device type"):
        raw(torch.empty(2, 64), torch.zeros(2, 64), 1.0)


@pytest.mark.gpu
def test_cuda_strided_last_dim_is_an_error():
    x = torch.zeros(64, 8, device="cuda").t()
    with pytest.raises(ValueError, match="contiguous last dim"):
        hadamard_transform(x)


@pytest.mark.gpu
@pytest.mark.parametrize("device", ("cuda",))
def test_torch_compile_fullgraph(device):
    x = randn(5, 4096, dtype=torch.bfloat16, device=device)
    compiled = torch.compile(lambda t: hadamard_transform(t, 1 / 64) * 2, fullgraph=True)
    assert_close(compiled(x), reference.hadamard_transform(x, 1 / 64) * 2)


@pytest.mark.gpu
@pytest.mark.parametrize("d", (128, 4096, 16384))
def test_cuda_graph_capture(d):
    x = randn(16, d, dtype=torch.bfloat16, device="cuda")
    out = torch.empty_like(x)
    HADAMARD_TRANSFORM(out, x, d**-0.5, backend="cuda")  # builds and loads before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        HADAMARD_TRANSFORM(out, x, d**-0.5, backend="cuda")
        y = hadamard_transform(x, d**-0.5)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, reference.hadamard_transform(x, d**-0.5))
    assert_close(y, reference.hadamard_transform(x, d**-0.5))


# One call per kernel path: every log2 N of both kernels, vector and scalar, fp32 and bf16,
# partial last blocks of the warp kernel (T not a multiple of its rows per block), strided,
# misaligned and in-place calls.
_MEMCHECK_SCRIPT = """
import torch
from kernels_quantization import hadamard_transform
from kernels_quantization.ops.hadamard_transform import HADAMARD_TRANSFORM
for dtype in (torch.bfloat16, torch.float32):
    for k in range(16):
        for d in {1 << k, (1 << k) - 1 if k > 1 else 1, (1 << k) - 8 if k > 3 else 1}:
            for t in (1, 7, 130):
                x = torch.randn(t, d, device="cuda").to(dtype)
                hadamard_transform(x, backend="cuda")
                if k >= 4 and t > 1:
                    wide = torch.randn(t, d + 8, device="cuda").to(dtype)
                    hadamard_transform(wide[:, 1:d + 1], backend="cuda")
                    hadamard_transform(wide[:, :d], backend="cuda")
                    HADAMARD_TRANSFORM(x, x, 1.0, backend="cuda")
torch.cuda.synchronize()
print("done")
"""


@pytest.mark.gpu
@pytest.mark.slow
def test_memcheck_every_kernel_path():
    run_memcheck("quantization", _MEMCHECK_SCRIPT)
