"""elementwise.softcap against a float64 oracle and its reference: every dtype, fp32 output from
half inputs, in place, row slices of wider buffers, tails and misaligned views, empty input, CUDA
graphs, torch.compile and opcheck."""

from __future__ import annotations

import math

import pytest
import torch

from kernels_elementwise import reference, softcap
from kernels_elementwise.ops.softcap import SOFTCAP
from shared.testing.compare import assert_close
from shared.testing.inputs import FLOAT_DTYPES, misaligned, poison, randn

CAPS = (30.0, 50.0, 2.5)


def oracle(x: torch.Tensor, cap: float, dtype: torch.dtype) -> torch.Tensor:
    x64 = x.double()
    e = torch.exp(2.0 * x64 / cap)
    tanh = torch.where(x64.abs() > 20 * abs(cap), torch.sign(x64), (e - 1.0) / (e + 1.0))
    return (cap * tanh).to(dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("cap", CAPS)
def test_reference_matches_float64_oracle(dtype, cap):
    x = randn(33, 257, dtype=dtype, seed=5, scale=40.0)
    assert_close(reference.softcap(x, cap), oracle(x, cap, dtype))
    assert_close(reference.softcap(x, cap, torch.float32), oracle(x, cap, torch.float32))


def test_public_op_on_cpu_out_dtype_and_in_place():
    x = randn(8, 100, dtype=torch.bfloat16, scale=40.0)
    assert_close(softcap(x, 30.0), reference.softcap(x, 30.0))
    out32 = softcap(x, 30.0, out_dtype=torch.float32)
    assert out32.dtype == torch.float32
    assert_close(out32, reference.softcap(x, 30.0, torch.float32))
    expected = reference.softcap(x, 30.0)
    assert softcap(x, 30.0, out=x) is x
    assert_close(x, expected)
    assert softcap(torch.empty(0, 4), 1.0).shape == (0, 4)


def test_bad_input_errors_name_op_argument_and_value():
    x = torch.ones(4, 4)
    with pytest.raises(ValueError, match=r"softcap: cap must be finite and non-zero, got 0.0"):
        softcap(x, 0.0)
    with pytest.raises(ValueError, match=r"softcap: cap must be finite and non-zero, got inf"):
        softcap(x, math.inf)
    with pytest.raises(
        TypeError, match=r"softcap: out_dtype must be x's dtype .* got torch.float16"
    ):
        softcap(x.bfloat16(), 1.0, out_dtype=torch.float16)
    with pytest.raises(TypeError, match=r"softcap: out must have dtype float32, got bfloat16"):
        softcap(x.bfloat16(), 1.0, out_dtype=torch.float32, out=torch.empty(4, 4).bfloat16())
    with pytest.raises(ValueError, match=r"softcap: out must have shape \(4, 4\), got \(4, 5\)"):
        softcap(x, 1.0, out=torch.empty(4, 5))
    with pytest.raises(TypeError, match=r"softcap: x must have dtype in .*got int32"):
        softcap(x.int(), 1.0)


def test_torch_compile_fullgraph_cpu():
    x = randn(16, 64, scale=40.0)
    compiled = torch.compile(lambda t: softcap(t, 30.0) + 1, fullgraph=True)
    assert_close(compiled(x), reference.softcap(x, 30.0) + 1)


def test_opcheck():
    x = randn(8, 64, scale=40.0)
    torch.library.opcheck(SOFTCAP.torch_op, (torch.empty_like(x), x, 30.0, None))


# --- GPU -----------------------------------------------------------------------------------------

# 1 and 7: below one pack; 127/1003: tails; 4096..24576: engine widths and wide rows.
WIDTHS = (1, 7, 127, 1003, 4096, 5128, 16384, 24576)
TOKENS = (1, 7, 128, 1000)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("tokens", TOKENS)
def test_cuda_matches_reference(tokens, width, dtype):
    x = randn(tokens, width, dtype=dtype, device="cuda", seed=tokens + width, scale=40.0)
    for cap in CAPS:
        out = poison(torch.empty_like(x))
        softcap(x, cap, out=out, backend="cuda")
        assert_close(out, reference.softcap(x, cap), name=f"T={tokens} n={width} cap={cap}")
    out32 = poison(torch.empty_like(x, dtype=torch.float32))
    softcap(x, 30.0, out=out32, backend="cuda")
    assert_close(out32, reference.softcap(x, 30.0, torch.float32), name="fp32 out")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_cuda_extremes_and_signs(dtype):
    x = torch.tensor([-1e4, -300.0, -30.0, -1.0, -1e-3, -0.0, 0.0, 1e-3, 1.0, 30.0, 300.0, 1e4])
    x = x.repeat(8).to(dtype).cuda()
    got = softcap(x, 30.0, backend="cuda")
    assert not got.isnan().any()
    assert_close(got, reference.softcap(x, 30.0))
    assert got.abs().max().item() <= 30.0


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_cuda_in_place_row_slices(dtype):
    """Logits rows inside a wider buffer, updated in place (row stride keeps packs or not)."""
    for extra in (16, 5):
        wide = randn(37, 1000 + extra, dtype=dtype, device="cuda", seed=extra, scale=40.0)
        logits = wide[:, :1000]
        expected = reference.softcap(logits, 30.0)
        untouched = wide[:, 1000:].clone()
        assert softcap(logits, 30.0, out=logits, backend="cuda") is logits
        assert_close(logits, expected, name=f"extra={extra}")
        assert torch.equal(wide[:, 1000:], untouched), "wrote outside the view"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
def test_cuda_misaligned_and_3d(dtype):
    x = misaligned(randn(9, 4096, dtype=dtype, device="cuda", scale=40.0))
    assert_close(softcap(x, 30.0, backend="cuda"), reference.softcap(x, 30.0))
    x3 = randn(3, 5, 200, dtype=dtype, device="cuda", scale=40.0)
    assert_close(softcap(x3, 30.0, backend="cuda"), reference.softcap(x3, 30.0))
    assert softcap(torch.empty(0, 8, device="cuda", dtype=dtype), 1.0, backend="cuda").numel() == 0


@pytest.mark.gpu
def test_cuda_graph_capture():
    x = randn(64, 4096, dtype=torch.bfloat16, device="cuda", scale=40.0)
    out = torch.empty_like(x)
    softcap(x, 30.0, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        softcap(x, 30.0, out=out)
    poison(out)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, reference.softcap(x, 30.0))


@pytest.mark.gpu
def test_cuda_torch_compile_fullgraph():
    x = randn(100, 512, dtype=torch.bfloat16, device="cuda", scale=40.0)
    compiled = torch.compile(
        lambda t: softcap(t, 30.0, out_dtype=torch.float32) * 2, fullgraph=True
    )
    assert_close(compiled(x), reference.softcap(x, 30.0, torch.float32) * 2)


@pytest.mark.gpu
def test_cuda_opcheck():
    x = randn(16, 128, dtype=torch.bfloat16, device="cuda", scale=40.0)
    torch.library.opcheck(SOFTCAP.torch_op, (torch.empty_like(x), x, 30.0, None))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
def test_cuda_small_arguments_round_once(dtype):
    """Near |x| = 1e-4, cap * tanh(x / cap) ~ x: the fp32 result rounded once to fp16/bf16 is
    within an ulp of the float64 oracle (a tanh through exp lost up to 4 bf16 ulps there); fp32
    output carries fp32 arithmetic's own few-ulp error."""
    x = (
        torch.logspace(-8, 0, 4099, device="cuda")
        * torch.tensor([1.0, -1.0], device="cuda")[torch.arange(4099, device="cuda") % 2]
    )
    x = x.to(dtype)
    for cap in CAPS:
        got = softcap(x, cap, backend="cuda")
        want = oracle(x, cap, dtype)
        ulps = (got.double() - want.double()).abs() / want.double().abs().clamp_min(1e-30)
        eps = torch.finfo(dtype).eps
        assert float(ulps.max()) <= eps, f"cap={cap}: {float(ulps.max()) / eps:.2f} ulps"
