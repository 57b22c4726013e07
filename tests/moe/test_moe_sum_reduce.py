"""moe.moe_sum_reduce against explicit float64 sums on every backend: k in {1, 2, 3, 4, 8, 9,
12}, odd H, weights (of any float dtype) and scaling, strided and misaligned x (the scalar path),
out=, poisoned outputs, empty input, bad arguments, opcheck, torch.compile and CUDA graphs."""

from __future__ import annotations

import pytest
import torch

from kernels_moe import moe_sum_reduce, reference
from shared.testing.compare import assert_close
from shared.testing.inputs import misaligned, poison, randn

BACKENDS = {"cpu": ("torch",), "cuda": ("cuda", "torch")}


def _device_params():
    return [
        pytest.param("cpu", id="cpu"),
        pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
    ]


def _expected(x, weights=None, scale=1.0) -> torch.Tensor:
    x = x.cpu()
    weights = None if weights is None else weights.cpu()
    tokens, k, hidden = x.shape
    out = torch.zeros(tokens, hidden, dtype=torch.float64)
    for t in range(tokens):
        for j in range(k):
            w = 1.0 if weights is None else float(weights[t, j])
            out[t] += w * x[t, j].double()
    return out * scale


SHAPES = (
    (1, 1, 8),
    (3, 2, 64),
    (5, 8, 129),
    (4, 9, 256),
    (2, 4, 2048),
    (3, 3, 40),
    (2, 12, 24),
    (1, 8, 7168),
)


@pytest.mark.parametrize("device", _device_params())
@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("weighted", (False, True))
def test_matches_float64(device, dtype, shape, weighted):
    x = randn(*shape, dtype=dtype, seed=shape[2], device=device)
    w = (
        torch.rand(shape[0], shape[1], generator=torch.Generator().manual_seed(1)).to(device)
        if weighted
        else None
    )
    expected = _expected(x, w, 2.5).to(dtype)
    for backend in BACKENDS[device]:
        out = poison(torch.empty(shape[0], shape[2], dtype=dtype, device=device))
        got = moe_sum_reduce(x, routed_scaling_factor=2.5, topk_weights=w, out=out, backend=backend)
        assert got is out and out.dtype == dtype and out.shape == (shape[0], shape[2])
        assert_close(out, expected, name=f"{backend} {shape}")


@pytest.mark.parametrize("device", _device_params())
@pytest.mark.parametrize("wdtype", (torch.float32, torch.bfloat16, torch.float16), ids=str)
def test_weights_of_another_dtype_and_strided(device, wdtype):
    x = randn(6, 8, 96, dtype=torch.bfloat16, seed=3, device=device)
    w = torch.rand(8, 6, generator=torch.Generator().manual_seed(2)).to(wdtype).to(device).t()
    for backend in BACKENDS[device]:
        out = moe_sum_reduce(x, topk_weights=w, routed_scaling_factor=0.5, backend=backend)
        assert_close(out, _expected(x, w.float(), 0.5).to(torch.bfloat16), name=backend)


@pytest.mark.parametrize("device", _device_params())
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_misaligned_and_row_strided(device, dtype):
    x = misaligned(randn(3, 4, 64, dtype=dtype, seed=4, device=device))  # scalar path
    for backend in BACKENDS[device]:
        assert_close(moe_sum_reduce(x, backend=backend), _expected(x).to(dtype), name=backend)
    base = randn(5, 6, 80, dtype=dtype, seed=5, device=device)
    x = base[:, 1:5, 8:72]  # k and row strides of a wider buffer, packs still aligned
    for backend in BACKENDS[device]:
        assert_close(moe_sum_reduce(x, backend=backend), _expected(x).to(dtype), name=backend)


@pytest.mark.parametrize("device", _device_params())
def test_strided_x_and_out_view(device):
    base = randn(6, 4, 200, dtype=torch.bfloat16, seed=2, device=device)
    x = base[:, :, 8:136]  # leading strides of a wider buffer, last dim contiguous
    for backend in BACKENDS[device]:
        wide = torch.zeros(6, 140, dtype=torch.bfloat16, device=device)
        out = wide[:, 6:134]
        assert moe_sum_reduce(x, out=out, backend=backend) is out
        assert_close(out, _expected(x).to(torch.bfloat16), name=backend)
        assert (wide[:, :6] == 0).all() and (wide[:, 134:] == 0).all()


@pytest.mark.parametrize("device", _device_params())
def test_empty(device):
    for backend in BACKENDS[device]:
        assert moe_sum_reduce(torch.empty(0, 8, 64, device=device), backend=backend).shape == (
            0,
            64,
        )
        out = moe_sum_reduce(torch.empty(3, 0, 16, device=device), backend=backend)
        assert out.shape == (3, 16) and (out == 0).all()


def test_bad_arguments():
    x = torch.randn(3, 2, 8)
    with pytest.raises(ValueError, match=r"moe_sum_reduce: x must have 3 dims, got shape \(3, 8\)"):
        moe_sum_reduce(torch.randn(3, 8))
    with pytest.raises(ValueError, match=r"topk_weights must have shape \(3, 2\) \[T, k\] like x"):
        moe_sum_reduce(x, topk_weights=torch.ones(3, 3))
    with pytest.raises(TypeError, match="out must have dtype float32, got bfloat16"):
        moe_sum_reduce(x, out=torch.empty(3, 8, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match="routed_scaling_factor must be a Python float"):
        moe_sum_reduce(x, routed_scaling_factor=None)


def test_opcheck():
    from kernels_moe.ops.moe_sum_reduce import MOE_SUM_REDUCE

    x = randn(4, 3, 32, dtype=torch.bfloat16)
    out = torch.empty(4, 32, dtype=torch.bfloat16)
    torch.library.opcheck(MOE_SUM_REDUCE.torch_op, (out, x, torch.rand(4, 3), 1.5, None))


def test_torch_compile_fullgraph_aot():
    x = randn(5, 8, 64, dtype=torch.bfloat16)
    w = torch.rand(5, 8)
    compiled = torch.compile(
        lambda a, b: moe_sum_reduce(a, topk_weights=b, routed_scaling_factor=2.5),
        fullgraph=True,
        backend="aot_eager",
    )
    assert_close(compiled(x, w), reference.moe_sum_reduce(x, 2.5, w))


@pytest.mark.gpu
def test_torch_compile_fullgraph_cuda():
    x = randn(5, 8, 64, dtype=torch.bfloat16, device="cuda")
    w = torch.rand(5, 8, device="cuda")
    compiled = torch.compile(
        lambda a, b: moe_sum_reduce(a, topk_weights=b, routed_scaling_factor=2.5) * 2,
        fullgraph=True,
    )
    assert_close(compiled(x, w), reference.moe_sum_reduce(x, 2.5, w) * 2)


@pytest.mark.gpu
def test_opcheck_cuda():
    from kernels_moe.ops.moe_sum_reduce import MOE_SUM_REDUCE

    x = randn(4, 3, 32, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(4, 32, dtype=torch.bfloat16, device="cuda")
    w = torch.rand(4, 3, device="cuda")
    torch.library.opcheck(MOE_SUM_REDUCE.torch_op, (out, x, w, 1.5, None))


@pytest.mark.gpu
def test_cuda_graph_capture():
    x = randn(64, 9, 2048, dtype=torch.bfloat16, device="cuda")
    out = torch.empty(64, 2048, dtype=torch.bfloat16, device="cuda")
    moe_sum_reduce(x, out=out, routed_scaling_factor=2.5)  # builds and loads before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        moe_sum_reduce(x, out=out, routed_scaling_factor=2.5)
    poison(out)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, reference.moe_sum_reduce(x, 2.5))


# x of at least 8 MiB takes plain loads and stores (kPlainMinBytes in moe_sum_reduce.cuh), less
# the evict-first ones: both policies, every compiled k (1, 2, 4, 8, 9) and a runtime one (3, 12),
# bitwise against the reference (fp32 products and sums in j order, one rounding).
@pytest.mark.gpu
@pytest.mark.parametrize("k", (1, 2, 3, 4, 8, 9, 12))
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("plain", (False, True), ids=("stream", "plain"))
@pytest.mark.parametrize("weighted", (False, True))
def test_cache_policies_exact(k, dtype, plain, weighted):
    hidden = 2048
    row_bytes = k * hidden * dtype.itemsize
    threshold = 8 << 20
    tokens = threshold // row_bytes + 3 if plain else max(1, threshold // row_bytes - 3)
    assert (tokens * row_bytes >= threshold) == plain
    x = randn(tokens, k, hidden, dtype=dtype, seed=k, device="cuda")
    w = torch.rand(tokens, k, device="cuda") if weighted else None
    out = poison(torch.empty(tokens, hidden, dtype=dtype, device="cuda"))
    moe_sum_reduce(x, routed_scaling_factor=2.5, topk_weights=w, out=out, backend="cuda")
    assert torch.equal(out, reference.moe_sum_reduce(x, 2.5, w))


# The kernel's flat index is 32-bit (FastDivmod): a launch covers fewer than 2^31 (token,
# column) items, larger inputs run in token chunks with x, out and the weights offset. Odd H
# (the scalar path, one item per element) reaches 2^31 items at 8.6 GB of x; the rows about the
# chunk boundary and the last ones are checked bitwise against the reference.
@pytest.mark.gpu
@pytest.mark.slow
def test_token_chunks_past_2_31_items():
    k, hidden = 2, 4095
    chunk = (2**31 - 1) // hidden  # tokens per launch (kernels::for_row_chunks)
    tokens = chunk + 5
    g = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(tokens, k, hidden, generator=g, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(tokens, k, generator=g, device="cuda")
    out = moe_sum_reduce(x, topk_weights=w, routed_scaling_factor=2.5, backend="cuda")
    for rows in (slice(0, 3), slice(chunk - 3, chunk + 3), slice(tokens - 3, tokens)):
        expected = reference.moe_sum_reduce(x[rows], 2.5, w[rows])
        assert torch.equal(out[rows], expected), rows
