"""layernorm against its reference: hidden sizes on every kernel path (see test_rmsnorm.py),
with and without bias, rows with a large common offset (the variance must not cancel), every
dtype, strided and misaligned layouts, empty input, CUDA graphs, torch.compile, opcheck, and
argument errors."""

from __future__ import annotations

import pytest
import torch

from kernels_layernorm import layernorm, reference
from shared.testing.compare import assert_close
from shared.testing.inputs import FLOAT_DTYPES, misaligned, poison, row_strided

BACKENDS = {"cpu": ("torch",), "cuda": ("cuda", "torch")}
GPU_HIDDEN = (1, 8, 32, 127, 128, 1024, 2048, 4096, 5128, 7168, 8192, 16384, 24576)
LONG_HIDDEN = (32768, 32776, 65536)
TOKENS = (1, 7, 64, 128, 1000)
DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)]


def _rand(*shape, dtype=torch.float32, device="cpu", seed=0, scale=1.0, offset=0.0):
    g = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(*shape, generator=g, device=device) * scale + offset).to(dtype)


def _params():
    cases = [
        pytest.param("cpu", dtype, t, h, id=f"cpu-{str(dtype)[6:]}-{t}x{h}")
        for dtype in FLOAT_DTYPES
        for t, h in ((7, 127), (3, 4096))
    ]
    shapes = [(t, h) for h in GPU_HIDDEN for t in TOKENS]
    shapes += [(t, h) for h in LONG_HIDDEN for t in (1, 7, 128)]
    # The late-load kernel is chosen per launch (rowwise::late_loads_pay): 16-bit rows of 7168 or
    # 8192 take it past one wave of the kernel holding its operands (528 rows on 132 SMs: the
    # 1000-row cases, bf16 only) and past two (2900 rows: fp16 too, on DRAM of >= 3800 GB/s).
    shapes += [(2900, h) for h in (7168, 8192)]
    cases += [
        pytest.param(
            "cuda", dtype, t, h, id=f"cuda-{str(dtype)[6:]}-{t}x{h}", marks=pytest.mark.gpu
        )
        for dtype in FLOAT_DTYPES
        for t, h in shapes
    ]
    return cases


@pytest.mark.parametrize("with_bias", (True, False), ids=("bias", "nobias"))
@pytest.mark.parametrize(("device", "dtype", "tokens", "hidden"), _params())
def test_matches_reference(device, dtype, tokens, hidden, with_bias):
    # Offset 4 with spread 1: E[x^2] - mean^2 would lose most of the variance's bits in fp32.
    x = _rand(tokens, hidden, dtype=dtype, device=device, seed=hidden + tokens, offset=4.0)
    w = _rand(hidden, dtype=dtype, device=device, seed=1, scale=0.25, offset=1.0)
    b = _rand(hidden, dtype=dtype, device=device, seed=2, scale=0.5) if with_bias else None
    expected = reference.layernorm(x, w, b, 1e-5)
    for backend in BACKENDS[device]:
        out = poison(torch.empty_like(x))
        assert layernorm(x, w, b, 1e-5, out=out, backend=backend) is out
        assert_close(out, expected, name=f"{backend} {tokens}x{hidden}")
    assert_close(layernorm(x, w, b), expected, name="default backend, out allocated")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("hidden", (127, 2048, 5128))
def test_layouts(device, dtype, hidden):
    x = _rand(33, hidden, dtype=dtype, device=device, seed=3)
    w = _rand(hidden, dtype=dtype, device=device, seed=4, offset=1.0)
    b = _rand(hidden, dtype=dtype, device=device, seed=5)
    expected = reference.layernorm(x, w, b)
    for backend in BACKENDS[device]:
        wide = torch.full((33, hidden + 8), 7777.0, dtype=dtype, device=device)
        out = poison(wide[:, :hidden])
        layernorm(row_strided(x), w, b, out=out, backend=backend)
        assert_close(out, expected, name=f"{backend} row-strided")
        assert bool((wide[:, hidden:] == torch.tensor(7777.0, dtype=dtype)).all())
        assert_close(
            layernorm(misaligned(x), misaligned(w), misaligned(b), backend=backend),
            expected,
            name=f"{backend} misaligned",
        )
        x3 = x.view(3, 11, hidden)
        assert_close(layernorm(x3, w, b, backend=backend), expected.view(3, 11, hidden))
        inplace = x.clone()
        layernorm(inplace, w, b, out=inplace, backend=backend)
        assert_close(inplace, expected, name=f"{backend} in place")


@pytest.mark.parametrize("device", DEVICES)
def test_constant_rows_give_the_bias(device):
    x = torch.full((4, 256), 3.0, device=device, dtype=torch.bfloat16)
    w = torch.ones(256, device=device, dtype=torch.bfloat16)
    b = _rand(256, dtype=torch.bfloat16, device=device, seed=6)
    for backend in BACKENDS[device]:
        assert torch.equal(layernorm(x, w, b, backend=backend), b.expand(4, 256))


@pytest.mark.parametrize("device", DEVICES)
def test_empty_input(device):
    x = torch.empty(0, 64, device=device)
    assert layernorm(x, torch.ones(64, device=device)).shape == (0, 64)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", (1, 16, 4096))
def test_cuda_graph_capture(tokens):
    x = _rand(tokens, 4096, dtype=torch.bfloat16, device="cuda", seed=7)
    w = _rand(4096, dtype=torch.bfloat16, device="cuda", seed=8, offset=1.0)
    b = _rand(4096, dtype=torch.bfloat16, device="cuda", seed=9)
    out = torch.empty_like(x)
    layernorm(x, w, b, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        layernorm(x, w, b, out=out)
        layernorm(x, w, None, out=x)
    x0 = x.clone()
    poison(out)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, reference.layernorm(x0, w, b))
    assert_close(x, reference.layernorm(x0, w, None))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x = _rand(9, 512, dtype=dtype, device=device, seed=10)
    w = _rand(512, dtype=dtype, device=device, seed=11, offset=1.0)
    b = _rand(512, dtype=dtype, device=device, seed=12)
    compiled = torch.compile(lambda t: layernorm(t, w, b) + layernorm(t, w), fullgraph=True)
    expected = reference.layernorm(x, w, b) + reference.layernorm(x, w)
    assert_close(compiled(x), expected)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    from kernels_layernorm.ops.layernorm import LAYERNORM

    x = _rand(8, 256, device=device, seed=13)
    w, b = torch.ones(256, device=device), _rand(256, device=device, seed=14)
    torch.library.opcheck(LAYERNORM.torch_op, (torch.empty_like(x), x, w, b, 1e-5, None))
    torch.library.opcheck(LAYERNORM.torch_op, (torch.empty_like(x), x, w, None, 1e-5, None))


def test_bad_input_errors():
    x, w = torch.randn(4, 64), torch.ones(64)
    op = "layernorm.layernorm"
    with pytest.raises(TypeError, match=rf"{op}: input must have dtype in .*got float64"):
        layernorm(x.double(), w.double())
    with pytest.raises(ValueError, match=r"bias must have shape \(64,\)"):
        layernorm(x, w, torch.zeros(65))
    with pytest.raises(TypeError, match=r"bias must have the dtype of input"):
        layernorm(x, w, torch.zeros(64, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="bias must be a torch.Tensor"):
        layernorm(x, w, 0.0)
    with pytest.raises(ValueError, match=r"weight must have shape \(64,\)"):
        layernorm(x, torch.ones(8, 8))
    with pytest.raises(TypeError, match="eps must be a float"):
        layernorm(x, w, None, "1e-5")
    with pytest.raises(ValueError, match="out must have the shape of input"):
        layernorm(x, w, out=torch.empty(64, 4))


@pytest.mark.gpu
def test_bad_input_errors_on_gpu():
    x, w = torch.randn(4, 64, device="cuda"), torch.ones(64, device="cuda")
    with pytest.raises(ValueError, match=r"layernorm.layernorm: bias must have shape \[64\]"):
        layernorm(x, w, torch.zeros(65, device="cuda"))
    with pytest.raises(ValueError, match="bias and input must be on the same device"):
        layernorm(x, w, torch.zeros(64))
    with pytest.raises(TypeError, match="bias and weight must have the same dtype"):
        layernorm(x, w, torch.zeros(64, device="cuda", dtype=torch.float16))


def test_compiled_function_validates_its_arguments():
    from kernels_jit import load_module
    from kernels_layernorm.ops.layernorm import LAYERNORM_CUDA
    from shared.testing.builds import cuda_arch

    with cuda_arch():
        raw = load_module(LAYERNORM_CUDA).layernorm
    x, w = torch.randn(4, 64), torch.ones(64)
    with pytest.raises(ValueError, match=r"bias must have shape \[64\]"):
        raw(torch.empty_like(x), x, w, torch.ones(3), 1e-5, -1)
    with pytest.raises(ValueError, match="eps must be a finite number"):
        raw(torch.empty_like(x), x, w, None, float("inf"), -1)
    with pytest.raises(ValueError, match="wrong device type"):  # a None bias is accepted
        raw(torch.empty_like(x), x, w, None, 1e-5, -1)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize("hidden", (127, 4096, 16400, 32768))
def test_fp32_weight_and_bias_with_half_input(device, dtype, hidden):
    """FlashInfer's callers pass fp32 norm parameters with fp16/bf16 activations."""
    if device == "cpu" and hidden > 4096:
        pytest.skip("the CPU reference is the same code at every width")
    x = _rand(5, hidden, dtype=dtype, device=device, seed=hidden, offset=2.0)
    w = _rand(hidden, device=device, seed=3, scale=0.25, offset=1.0)
    b = _rand(hidden, device=device, seed=4, scale=0.5)
    expected = reference.layernorm(x, w, b, 1e-5)
    for backend in BACKENDS[device]:
        for bias in (b, None):
            out = poison(torch.empty_like(x))
            layernorm(x, w, bias, 1e-5, out=out, backend=backend)
            assert_close(out, reference.layernorm(x, w, bias, 1e-5), name=f"{backend} {hidden}")
    assert_close(layernorm(x, w, b), expected)
    with pytest.raises(TypeError, match="bias must have the dtype of weight|bias and weight"):
        layernorm(x, w, b.to(dtype))
