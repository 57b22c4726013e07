"""activation.{silu_and_mul, gelu_and_mul, gelu_tanh_and_mul, relu2}: the references against
float64 oracles written from the formulas, the public ops' checks and layouts on CPU, the CUDA
source built for sm_90a, and (on the GPU) the CUDA backend against the reference at the widths
that break kernels, on hostile layouts, under CUDA graphs and torch.compile."""

from __future__ import annotations

import math

import pytest
import torch

import kernels_activation
from kernels_activation import reference
from kernels_activation.ops import activation
from kernels_jit.dispatch import clear_caches, explain
from kernels_jit.errors import KernelsFallbackWarning
from shared.testing.builds import compile_group_for_hopper
from shared.testing.compare import assert_close
from shared.testing.inputs import FLOAT_DTYPES, misaligned, poison, randn

GATED = ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul")
OPS = (*GATED, "relu2")


# --- float64 oracles, written from the definitions (no torch activation functions) ------------


def _silu64(g: torch.Tensor) -> torch.Tensor:
    return g / (1.0 + torch.exp(-g))


def _gelu64(g: torch.Tensor) -> torch.Tensor:
    erf = torch.tensor(
        [math.erf(v / math.sqrt(2.0)) for v in g.reshape(-1).tolist()], dtype=torch.float64
    ).reshape(g.shape)
    return 0.5 * g * (1.0 + erf)


def _gelu_tanh64(g: torch.Tensor) -> torch.Tensor:
    u = math.sqrt(2.0 / math.pi) * (g + 0.044715 * g**3)
    return 0.5 * g * (1.0 + torch.tanh(u))


_ACT64 = {"silu_and_mul": _silu64, "gelu_and_mul": _gelu64, "gelu_tanh_and_mul": _gelu_tanh64}


def oracle(name: str, x: torch.Tensor) -> torch.Tensor:
    x64 = x.double()
    if name == "relu2":
        return torch.where(x64 > 0, x64 * x64, torch.zeros_like(x64)).to(x.dtype)
    d = x.shape[-1] // 2
    return (_ACT64[name](x64[..., :d]) * x64[..., d:]).to(x.dtype)


def public(name: str):
    return getattr(kernels_activation, name)


def ref(name: str):
    return getattr(reference, name)


def _x(name: str, tokens: int, d: int, dtype, device, seed: int = 0, scale: float = 2.0):
    width = 2 * d if name in GATED else d
    return randn(tokens, width, dtype=dtype, device=device, seed=seed, scale=scale)


# --- CPU: references ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_reference_matches_float64_oracle(name, dtype):
    x = _x(name, 37, 129, dtype, "cpu", seed=3, scale=3.0)
    assert_close(ref(name)(x), oracle(name, x), name=name)


@pytest.mark.parametrize("name", GATED)
def test_reference_on_3d_input_and_extremes(name):
    x = torch.tensor([[-30.0, -5.0, 0.0, 5.0, 30.0, 1.0, -2.0, 3.0, 0.5, 4.0]]).reshape(1, 1, 10)
    assert_close(ref(name)(x), oracle(name, x), name=name)
    assert ref(name)(x).shape == (1, 1, 5)


def test_relu2_keeps_nan_and_zeroes_negatives():
    x = torch.tensor([-3.0, -0.0, 0.0, 2.0, float("nan"), float("inf")])
    out = reference.relu2(x)
    assert out[:4].tolist() == [0.0, 0.0, 0.0, 4.0]
    assert math.isnan(out[4]) and out[5] == float("inf")


# --- CPU: the public ops (torch backend) ----------------------------------------------------------


@pytest.mark.parametrize("name", OPS)
def test_public_op_on_cpu_allocates_and_writes_out(name):
    x = _x(name, 6, 40, torch.float32, "cpu")
    expected = ref(name)(x)
    assert_close(public(name)(x), expected)
    out = poison(torch.empty_like(expected))
    assert public(name)(x, out=out) is out
    assert_close(out, expected)


def test_relu2_in_place():
    x = randn(5, 33, seed=1)
    expected = reference.relu2(x)
    assert kernels_activation.relu2(x, out=x) is x
    assert_close(x, expected)


@pytest.mark.parametrize("name", GATED)
def test_empty_and_leading_dims(name):
    assert public(name)(torch.empty(0, 8)).shape == (0, 4)
    assert public(name)(torch.empty(3, 0)).shape == (3, 0)
    x = randn(2, 3, 16)
    assert_close(public(name)(x), ref(name)(x))


def test_bad_input_errors_name_op_argument_and_value():
    x = torch.ones(4, 6)
    with pytest.raises(ValueError, match=r"silu_and_mul: input must be \[\.\.\., 2d\].*\(4, 5\)"):
        kernels_activation.silu_and_mul(torch.ones(4, 5))
    with pytest.raises(ValueError, match=r"gelu_and_mul: input must be \[\.\.\., 2d\].*\(\)"):
        kernels_activation.gelu_and_mul(torch.tensor(1.0))
    with pytest.raises(TypeError, match=r"gelu_tanh_and_mul: input must have dtype in .*float64"):
        kernels_activation.gelu_tanh_and_mul(x.double())
    with pytest.raises(
        ValueError, match=r"silu_and_mul: out must have shape \(4, 3\), got \(4, 6\)"
    ):
        kernels_activation.silu_and_mul(x, out=torch.empty(4, 6))
    with pytest.raises(TypeError, match=r"relu2: out must have dtype float32, got bfloat16"):
        kernels_activation.relu2(x, out=torch.empty(4, 6, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="input must be a torch.Tensor"):
        kernels_activation.relu2([1.0])
    with pytest.raises(ValueError, match="backend 'cuda' cannot run here"):
        kernels_activation.silu_and_mul(x, backend="cuda")


def test_row_layout_eligibility():
    x = randn(4, 64)
    out = torch.empty(4, 32)
    assert activation._row_layout(out, x) is None
    assert activation._row_layout(out, randn(4, 80)[:, 8:72]) is None  # row slice of a buffer
    assert activation._row_layout(out, randn(2, 4, 80)[:, :, :64]) is None  # dims collapse
    assert activation._row_layout(out, randn(1, 4, 80)[:, :, :64]) is None  # size-1 dim ignored
    assert activation._row_layout(out, randn(64, 4).t()) is not None  # strided last dim
    assert activation._row_layout(out, randn(2, 5, 80)[:, :4, :64]) is not None  # 2 row strides


@pytest.mark.parametrize("name", OPS)
def test_torch_compile_fullgraph_cpu(name):
    x = _x(name, 8, 24, torch.float32, "cpu")
    compiled = torch.compile(lambda t: public(name)(t) * 2, fullgraph=True)
    assert_close(compiled(x), ref(name)(x) * 2)


@pytest.mark.parametrize("name", OPS)
def test_opcheck(name):
    op = getattr(activation, name.upper())
    x = _x(name, 4, 16, torch.float32, "cpu")
    out = torch.empty_like(ref(name)(x))
    torch.library.opcheck(op.torch_op, (out, x, None))


def test_cuda_source_compiles_for_sm90a():
    assert compile_group_for_hopper("activation") == ["activation_cuda"]


# --- GPU: the CUDA backend against the reference ---------------------------------------------

# d = 1 and 127: scalar path (d % 8 != 0 for 16-bit); 5128: packs with an odd pack count per row;
# 4096/7168/8192: the engine widths; 16384/24576: wide rows (24576 x 1000 x 2 = 49M inputs).
WIDTHS = (1, 127, 4096, 5128, 7168, 8192, 16384, 24576)
TOKENS = (1, 7, 128, 1000)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("d", WIDTHS)
@pytest.mark.parametrize("tokens", TOKENS)
@pytest.mark.parametrize("name", OPS)
def test_cuda_matches_reference(name, tokens, d, dtype):
    x = _x(name, tokens, d, dtype, "cuda", seed=tokens * 131 + d)
    expected = ref(name)(x)
    out = poison(torch.empty_like(expected))
    public(name)(x, out=out, backend="cuda")
    assert_close(out, expected, name=f"{name} T={tokens} d={d}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_cuda_extreme_values(name, dtype):
    """Large magnitudes: exp overflows to inf inside the activations; no NaN may appear."""
    negative = [-1e4, -200.0, -88.5, -30.0, -8.0, -1e-3, -0.5, 0.0]
    values = torch.tensor(negative + [-v for v in negative[:6]] + [0.5, 3.0])
    x = values.repeat(4, 4).to(dtype).cuda()  # [4, 64]
    expected = ref(name)(x)
    got = public(name)(x, backend="cuda")
    assert not got.isnan().any()
    assert_close(got, expected, name=name)


@pytest.mark.gpu
@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_cuda_row_strided_input_and_output(name, dtype):
    """Rows inside wider buffers (a fused projection's slice, an output view): row strides that
    keep 16-byte packs (+16 elements) and ones that do not (+3)."""
    for extra in (16, 3):
        x = _x(name, 33, 4096, dtype, "cuda", seed=extra)
        wide = poison(torch.empty(33, x.shape[1] + extra, dtype=dtype, device="cuda"))
        wide[:, : x.shape[1]] = x
        xs = wide[:, : x.shape[1]]
        expected = ref(name)(x)
        out_wide = poison(torch.empty(33, expected.shape[1] + extra, dtype=dtype, device="cuda"))
        out = out_wide[:, : expected.shape[1]]
        public(name)(xs, out=out, backend="cuda")
        assert_close(out, expected, name=f"{name} extra={extra}")
        assert out_wide[:, expected.shape[1] :].isnan().all(), "wrote outside the view"


@pytest.mark.gpu
@pytest.mark.parametrize("name", OPS)
def test_cuda_3d_and_non_collapsible_layouts(name):
    x = _x(name, 2 * 9, 256, torch.bfloat16, "cuda").reshape(2, 9, -1)
    assert_close(public(name)(x, backend="cuda"), ref(name)(x))
    # [2, 9, n] inside [2, 10, n + 8]: two distinct leading strides -> the torch backend.
    wide = torch.zeros(2, 10, x.shape[-1] + 8, dtype=x.dtype, device="cuda")
    wide[:, :9, : x.shape[-1]] = x
    view = wide[:, :9, : x.shape[-1]]
    assert "cuda: no, needs a contiguous last dim" in explain(f"activation.{name}", view)
    clear_caches()  # the warning comes once per op and reason
    with pytest.warns(KernelsFallbackWarning, match="needs a contiguous last dim"):
        assert_close(public(name)(view), ref(name)(x))


@pytest.mark.gpu
@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
def test_cuda_misaligned_pointers_take_the_scalar_path(name, dtype):
    x = misaligned(_x(name, 19, 1024, dtype, "cuda"))
    expected = ref(name)(x)
    out = misaligned(poison(torch.empty_like(expected)))
    public(name)(x, out=out, backend="cuda")
    assert_close(out, expected)


@pytest.mark.gpu
def test_cuda_relu2_in_place_tail_and_empty():
    for n in (1, 7, 4099, 1 << 20):
        x = randn(n, dtype=torch.bfloat16, device="cuda", seed=n, scale=3.0)
        expected = reference.relu2(x)
        assert kernels_activation.relu2(x, out=x, backend="cuda") is x
        assert_close(x, expected, name=f"n={n}")
    empty = torch.empty(0, 5, device="cuda")
    assert kernels_activation.relu2(empty, backend="cuda").shape == (0, 5)


@pytest.mark.gpu
@pytest.mark.parametrize("name", GATED)
def test_cuda_empty_tokens(name):
    x = torch.empty(0, 256, device="cuda", dtype=torch.bfloat16)
    assert public(name)(x, backend="cuda").shape == (0, 128)


@pytest.mark.gpu
@pytest.mark.parametrize("name", OPS)
def test_cuda_graph_capture(name):
    x = _x(name, 64, 4096, torch.bfloat16, "cuda")
    out = torch.empty_like(ref(name)(x))
    public(name)(x, out=out)  # builds and loads before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        public(name)(x, out=out)
    poison(out)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, ref(name)(x))


@pytest.mark.gpu
@pytest.mark.parametrize("name", OPS)
def test_cuda_torch_compile_fullgraph(name):
    x = _x(name, 100, 512, torch.bfloat16, "cuda")
    compiled = torch.compile(lambda t: public(name)(t) * 2, fullgraph=True)
    assert_close(compiled(x), ref(name)(x) * 2)


@pytest.mark.gpu
@pytest.mark.parametrize("name", OPS)
def test_cuda_opcheck(name):
    op = getattr(activation, name.upper())
    x = _x(name, 16, 128, torch.bfloat16, "cuda")
    out = torch.empty_like(ref(name)(x))
    torch.library.opcheck(op.torch_op, (out, x, None))


@pytest.mark.gpu
def test_cuda_default_backend_is_cuda():
    x = _x("silu_and_mul", 4, 64, torch.bfloat16, "cuda")
    assert "cuda: chosen" in explain("activation.silu_and_mul", x)
