"""elementwise.gate_sigmoid_mul_add against a float64 oracle and its reference: with and without
routed, in place into routed, [K] and [1, K] weights, widths on and off the 16-byte path, row
strides, empty T, CUDA graphs, torch.compile and opcheck."""

from __future__ import annotations

import pytest
import torch

from kernels_elementwise import gate_sigmoid_mul_add, reference
from kernels_elementwise.ops.gate_sigmoid_mul_add import GATE_SIGMOID_MUL_ADD
from shared.testing.compare import assert_close
from shared.testing.inputs import FLOAT_DTYPES, misaligned, poison, randn


def oracle(h, w, shared, routed=None):
    logit = (h.double() * w.double().reshape(1, -1)).sum(-1, keepdim=True)
    out = shared.double() / (1.0 + torch.exp(-logit))
    if routed is not None:
        out = out + routed.double()
    return out.to(shared.dtype)


def make(tokens, k, hidden, dtype, device="cpu", seed=0):
    # w scaled so that h @ w spreads over the sigmoid's slope rather than saturating it.
    h = randn(tokens, k, dtype=dtype, device=device, seed=seed)
    w = randn(k, dtype=dtype, device=device, seed=seed + 1, scale=2.0 / max(k, 1) ** 0.5)
    shared = randn(tokens, hidden, dtype=dtype, device=device, seed=seed + 2)
    routed = randn(tokens, hidden, dtype=dtype, device=device, seed=seed + 3)
    return h, w, shared, routed


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_reference_matches_float64_oracle(dtype):
    h, w, shared, routed = make(17, 300, 64, dtype, seed=1)
    assert_close(reference.gate_sigmoid_mul_add(h, w, shared, routed), oracle(h, w, shared, routed))
    assert_close(reference.gate_sigmoid_mul_add(h, w, shared), oracle(h, w, shared))


def test_public_op_on_cpu_forms_and_in_place():
    h, w, shared, routed = make(6, 32, 16, torch.float32)
    assert_close(gate_sigmoid_mul_add(h, w, shared), oracle(h, w, shared))
    assert_close(
        gate_sigmoid_mul_add(h, w.reshape(1, -1), shared, routed), oracle(h, w, shared, routed)
    )
    expected = oracle(h, w, shared, routed)
    assert gate_sigmoid_mul_add(h, w, shared, routed, out=routed) is routed
    assert_close(routed, expected)
    assert gate_sigmoid_mul_add(torch.empty(0, 8), torch.ones(8), torch.empty(0, 4)).shape == (0, 4)


def test_bad_input_errors_name_op_argument_and_value():
    h, w, shared, routed = make(4, 8, 6, torch.float32)
    name = "gate_sigmoid_mul_add"
    with pytest.raises(
        ValueError,
        match=rf"{name}: h \[T, K\], w \[K\] and shared \[T, H\] "
        r"disagree: h \(4, 8\), w \(7,\)",
    ):
        gate_sigmoid_mul_add(h, w[:7], shared)
    with pytest.raises(ValueError, match=rf"{name}: w must be \[K\] or \[1, K\], got \(2, 8\)"):
        gate_sigmoid_mul_add(h, w.repeat(2, 1), shared)
    with pytest.raises(ValueError, match=rf"{name}: routed must have shared's shape \(4, 6\)"):
        gate_sigmoid_mul_add(h, w, shared, routed[:, :5])
    with pytest.raises(
        TypeError,
        match=rf"{name}: shared must have dtype in \(float32\), "
        r"got float16",
    ):
        gate_sigmoid_mul_add(h, w, shared.half())
    with pytest.raises(ValueError, match=rf"{name}: h must have 2 dims, got shape \(8,\)"):
        gate_sigmoid_mul_add(w, w, shared)
    with pytest.raises(ValueError, match=rf"{name}: out must have shape \(4, 6\), got \(4, 8\)"):
        gate_sigmoid_mul_add(h, w, shared, out=h)


def test_torch_compile_fullgraph_cpu():
    h, w, shared, routed = make(6, 32, 16, torch.float32)
    compiled = torch.compile(lambda *a: gate_sigmoid_mul_add(*a) * 2, fullgraph=True)
    assert_close(compiled(h, w, shared, routed), oracle(h, w, shared, routed) * 2)
    compiled = torch.compile(lambda *a: gate_sigmoid_mul_add(*a) * 2, fullgraph=True)
    assert_close(compiled(h, w, shared), oracle(h, w, shared) * 2)


def test_opcheck():
    h, w, shared, routed = make(6, 32, 16, torch.float32)
    out = torch.empty_like(shared)
    torch.library.opcheck(GATE_SIGMOID_MUL_ADD.torch_op, (out, h, w, shared, routed, None))
    torch.library.opcheck(GATE_SIGMOID_MUL_ADD.torch_op, (out, h, w, shared, None, None))


# --- GPU -----------------------------------------------------------------------------------------

# K: 7168 (DeepSeek/Qwen hidden), 2048, odd 127 (scalar path), 1; H likewise plus 24576.
WIDTHS = [(7168, 7168), (2048, 4096), (4096, 24576), (127, 5128), (1, 1), (7168, 127)]
TOKENS = (1, 7, 128, 1000)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize(("k", "hidden"), WIDTHS)
@pytest.mark.parametrize("tokens", TOKENS)
def test_cuda_matches_reference(tokens, k, hidden, dtype):
    h, w, shared, routed = make(tokens, k, hidden, dtype, "cuda", seed=tokens + k)
    for r in (routed, None):
        out = poison(torch.empty_like(shared))
        gate_sigmoid_mul_add(h, w, shared, r, out=out, backend="cuda")
        assert_close(
            out,
            reference.gate_sigmoid_mul_add(h, w, shared, r),
            name=f"T={tokens} K={k} H={hidden} routed={r is not None}",
        )


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
def test_cuda_in_place_strided_and_misaligned(dtype):
    h, w, shared, routed = make(65, 1024, 2048, dtype, "cuda", seed=2)
    expected = reference.gate_sigmoid_mul_add(h, w, shared, routed)
    assert gate_sigmoid_mul_add(h, w, shared, routed, out=routed, backend="cuda") is routed
    assert_close(routed, expected, name="in place")
    # Row-strided h (a slice of a wider activation buffer), with and without whole packs.
    for extra in (64, 3):
        wide = randn(65, 1024 + extra, dtype=dtype, device="cuda", seed=extra)
        hs = wide[:, extra:]
        out = poison(torch.empty_like(shared))
        gate_sigmoid_mul_add(hs, w, shared, out=out, backend="cuda")
        assert_close(out, reference.gate_sigmoid_mul_add(hs, w, shared), name=f"extra={extra}")
    wm = misaligned(w)
    assert_close(
        gate_sigmoid_mul_add(h, wm, shared, backend="cuda"),
        reference.gate_sigmoid_mul_add(h, wm, shared),
        name="misaligned w",
    )
    empty = torch.empty(0, 1024, dtype=dtype, device="cuda")
    assert gate_sigmoid_mul_add(empty, w, empty[:, :8], backend="cuda").shape == (0, 8)


@pytest.mark.gpu
def test_cuda_graph_capture():
    h, w, shared, routed = make(16, 7168, 7168, torch.bfloat16, "cuda")
    out = torch.empty_like(shared)
    gate_sigmoid_mul_add(h, w, shared, routed, out=out)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gate_sigmoid_mul_add(h, w, shared, routed, out=out)
    poison(out)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, reference.gate_sigmoid_mul_add(h, w, shared, routed))


@pytest.mark.gpu
def test_cuda_torch_compile_fullgraph():
    h, w, shared, routed = make(100, 1024, 512, torch.bfloat16, "cuda")
    compiled = torch.compile(lambda *a: gate_sigmoid_mul_add(*a) * 2, fullgraph=True)
    assert_close(
        compiled(h, w, shared, routed), reference.gate_sigmoid_mul_add(h, w, shared, routed) * 2
    )


@pytest.mark.gpu
def test_cuda_opcheck():
    h, w, shared, routed = make(16, 256, 128, torch.bfloat16, "cuda")
    out = torch.empty_like(shared)
    torch.library.opcheck(GATE_SIGMOID_MUL_ADD.torch_op, (out, h, w, shared, routed, None))
