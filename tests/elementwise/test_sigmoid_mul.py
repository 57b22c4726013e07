"""elementwise.sigmoid_mul against a float64 oracle and its reference: full and per-head gates,
strided gate views of a fused projection, 2-D x, odd head dims (scalar path), misaligned and
row-strided operands, empty T, CUDA graphs, torch.compile and opcheck."""

from __future__ import annotations

import pytest
import torch

from kernels_elementwise import reference, sigmoid_mul
from kernels_elementwise.ops.sigmoid_mul import SIGMOID_MUL
from shared.testing.compare import assert_close
from shared.testing.inputs import FLOAT_DTYPES, misaligned, poison, randn


def oracle(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    x64, g64 = x.double(), gate.double()
    if x.dim() == 2 and gate.dim() == 3:
        x64 = x64.reshape(gate.shape[0], gate.shape[1], -1)
    return (x64 / (1.0 + torch.exp(-g64))).reshape(x.shape).to(x.dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("per_head", (False, True))
def test_reference_matches_float64_oracle(dtype, per_head):
    x = randn(9, 4, 40, dtype=dtype, seed=1, scale=3.0)
    gate = randn(9, 4, 1 if per_head else 40, dtype=dtype, seed=2, scale=3.0)
    assert_close(reference.sigmoid_mul(x, gate), oracle(x, gate))
    x2 = x.reshape(9, 160)
    assert_close(reference.sigmoid_mul(x2, gate), oracle(x2, gate))


def test_public_op_on_cpu_forms_and_in_place():
    x = randn(5, 3, 16, scale=3.0)
    strided = randn(5, 3, 32, seed=3)[..., 16:]
    for gate in (randn(5, 3, 16, seed=1), randn(5, 3, 1, seed=2), strided):
        assert_close(sigmoid_mul(x, gate), oracle(x, gate))
        assert_close(sigmoid_mul(x.reshape(5, 48), gate), oracle(x.reshape(5, 48), gate))
    flat = randn(5, 48, seed=4)
    assert_close(sigmoid_mul(x.reshape(5, 48), flat), oracle(x.reshape(5, 48), flat))
    gate = randn(5, 3, 16, seed=5)
    expected = oracle(x, gate)
    assert sigmoid_mul(x, gate, out=x) is x
    assert_close(x, expected)
    assert sigmoid_mul(torch.empty(0, 3, 16), torch.empty(0, 3, 1)).shape == (0, 3, 16)


def test_bad_input_errors_name_op_argument_and_value():
    x = torch.ones(4, 2, 8)
    with pytest.raises(
        ValueError,
        match=r"sigmoid_mul: gate must be \[T, H, D\] or \[T, H, 1\].*"
        r"x \(4, 2, 8\) and gate \(4, 2, 3\)",
    ):
        sigmoid_mul(x, torch.ones(4, 2, 3))
    with pytest.raises(ValueError, match=r"x \(4, 15\) and gate \(4, 2, 1\)"):
        sigmoid_mul(torch.ones(4, 15), torch.ones(4, 2, 1))
    with pytest.raises(
        TypeError,
        match=r"sigmoid_mul: gate must have dtype in \(float32\), "
        r"got bfloat16",
    ):
        sigmoid_mul(x, torch.ones(4, 2, 8, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"sigmoid_mul: x must have 2 or 3 dims, got shape \(8,\)"):
        sigmoid_mul(torch.ones(8), torch.ones(8))
    with pytest.raises(ValueError, match=r"sigmoid_mul: out must have shape \(4, 2, 8\)"):
        sigmoid_mul(x, x, out=torch.empty(4, 16))


def test_torch_compile_fullgraph_cpu():
    x, gate = randn(6, 4, 32, seed=1), randn(6, 4, 1, seed=2)
    compiled = torch.compile(lambda a, b: sigmoid_mul(a, b) + 1, fullgraph=True)
    assert_close(compiled(x, gate), oracle(x, gate) + 1)


def test_opcheck():
    x, gate = randn(6, 4, 32, seed=1), randn(6, 4, 32, seed=2)
    torch.library.opcheck(SIGMOID_MUL.torch_op, (torch.empty_like(x), x, gate, None))


# --- GPU -----------------------------------------------------------------------------------------

# D = 128 (the engines' head dim), 64, and odd ones for the scalar path; H = 1, 7, 32.
SHAPES = [(h, d) for h in (1, 7, 32) for d in (1, 37, 64, 128)]
TOKENS = (1, 7, 128, 1000)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize(("heads", "d"), SHAPES)
@pytest.mark.parametrize("tokens", TOKENS)
def test_cuda_matches_reference(tokens, heads, d, dtype):
    x = randn(tokens, heads, d, dtype=dtype, device="cuda", seed=tokens + d, scale=3.0)
    fused = randn(tokens, heads, 2 * d, dtype=dtype, device="cuda", seed=heads, scale=3.0)
    gates = {
        "full": randn(tokens, heads, d, dtype=dtype, device="cuda", seed=d, scale=3.0),
        "per_head": randn(tokens, heads, 1, dtype=dtype, device="cuda", seed=7, scale=3.0),
        "strided_view": fused[..., d:],
    }
    for label, gate in gates.items():
        for xin in (x, x.reshape(tokens, heads * d)):
            out = poison(torch.empty_like(xin))
            sigmoid_mul(xin, gate, out=out, backend="cuda")
            assert_close(
                out,
                reference.sigmoid_mul(xin, gate),
                name=f"{label} x{tuple(xin.shape)} gate{tuple(gate.shape)}",
            )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_cuda_engine_shapes(dtype):
    """Prefill shapes with the engine head dim, x from a strided attention output view."""
    for tokens, heads in ((8192, 32), (1000, 64)):
        x = randn(tokens, heads, 128, dtype=dtype, device="cuda", seed=heads, scale=3.0)
        q_gate = randn(tokens, heads, 256, dtype=dtype, device="cuda", seed=tokens, scale=3.0)
        gate = q_gate[..., 128:]
        out = poison(torch.empty_like(x))
        sigmoid_mul(x, gate, out=out, backend="cuda")
        assert_close(out, reference.sigmoid_mul(x, gate))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
def test_cuda_misaligned_strided_and_in_place(dtype):
    x = misaligned(randn(33, 4, 128, dtype=dtype, device="cuda", scale=3.0))
    gate = randn(33, 4, 128, dtype=dtype, device="cuda", seed=3, scale=3.0)
    assert_close(sigmoid_mul(x, gate, backend="cuda"), reference.sigmoid_mul(x, gate))
    # Token and head strides that are not whole packs: [33, 4, 128] inside [33, 5, 131].
    wide = randn(33, 5, 131, dtype=dtype, device="cuda", seed=4, scale=3.0)
    xs = wide[:, :4, :128]
    expected = reference.sigmoid_mul(xs, gate)
    assert sigmoid_mul(xs, gate, out=xs, backend="cuda") is xs
    assert_close(xs, expected)
    empty = torch.empty(0, 4, 128, dtype=dtype, device="cuda")
    assert sigmoid_mul(empty, empty[..., :1], backend="cuda").shape == (0, 4, 128)


@pytest.mark.gpu
def test_cuda_graph_capture():
    x = randn(64, 32, 128, dtype=torch.bfloat16, device="cuda", scale=3.0)
    gate = randn(64, 32, 256, dtype=torch.bfloat16, device="cuda", seed=1, scale=3.0)[..., 128:]
    out = torch.empty_like(x)
    sigmoid_mul(x, gate, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        sigmoid_mul(x, gate, out=out)
    poison(out)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, reference.sigmoid_mul(x, gate))


@pytest.mark.gpu
def test_cuda_torch_compile_fullgraph():
    x = randn(100, 8, 128, dtype=torch.bfloat16, device="cuda", scale=3.0)
    gate = randn(100, 8, 1, dtype=torch.bfloat16, device="cuda", seed=1, scale=3.0)
    compiled = torch.compile(lambda a, b: sigmoid_mul(a, b) * 2, fullgraph=True)
    assert_close(compiled(x, gate), reference.sigmoid_mul(x, gate) * 2)


@pytest.mark.gpu
def test_cuda_opcheck():
    x = randn(16, 4, 128, dtype=torch.bfloat16, device="cuda", scale=3.0)
    gate = randn(16, 4, 128, dtype=torch.bfloat16, device="cuda", seed=1, scale=3.0)
    torch.library.opcheck(SIGMOID_MUL.torch_op, (torch.empty_like(x), x, gate, None))
