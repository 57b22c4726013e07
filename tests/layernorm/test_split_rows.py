"""The row engine's split rows (rowwise.cuh, headers API 8): at decode, rows of at least 896
16-byte vectors (7168 bf16) whose CTAs fit one per SM are split over a thread-block cluster of 2
or 4 CTAs, which exchange their partial statistics through distributed shared memory in rank
order.

GPU only. Every register-kernel op of this group (rmsnorm, gemma_rmsnorm, fused_add_rmsnorm,
gemma_fused_add_rmsnorm, layernorm with and without bias, fp32 weights) on decode shapes against
its reference, and run-to-run bitwise determinism. Shapes on the H200 (132 SMs), bf16/fp16
(fp32: half the elements per vector):
  1, 7, 33 rows    split in 4 from 8192 values (1024 vectors), in 2 at 7168-8191
  34, 64 rows      split in 2 from 7168 up to 16384 values (a slice of at most 1024 vectors)
  4096, 4104       not split in bf16/fp16 (under 896 vectors); split in fp32
  100 rows         not split (the CTAs would not fit one per SM): the unsplit kernels beside them
  4104, 8200       a last slice shorter than the others, a partial last column of threads
  16392, 32768     split in 4 only (34 and 64 rows: the unsplit register kernel)
"""

from __future__ import annotations

import pytest
import torch

from kernels_layernorm import (
    fused_add_rmsnorm,
    gemma_fused_add_rmsnorm,
    gemma_rmsnorm,
    layernorm,
    reference,
    rmsnorm,
)
from shared.testing.compare import assert_close
from shared.testing.inputs import FLOAT_DTYPES, poison, randn

pytestmark = pytest.mark.gpu

TOKENS = (1, 7, 33, 34, 64, 100)
HIDDEN = (4096, 4104, 7168, 8192, 8200, 16392, 32768)
NORMS = {
    "rmsnorm": (rmsnorm, reference.rmsnorm),
    "gemma_rmsnorm": (gemma_rmsnorm, reference.gemma_rmsnorm),
}
FUSED = {
    "fused_add_rmsnorm": (fused_add_rmsnorm, reference.fused_add_rmsnorm),
    "gemma_fused_add_rmsnorm": (gemma_fused_add_rmsnorm, reference.gemma_fused_add_rmsnorm),
}
SHAPES = [
    pytest.param(dtype, t, h, id=f"{str(dtype)[6:]}-{t}x{h}")
    for dtype in FLOAT_DTYPES
    for h in HIDDEN
    for t in TOKENS
]


def _weight(hidden, dtype, seed=100):
    return (1.0 + 0.25 * randn(hidden, seed=seed)).to(dtype=dtype, device="cuda")


@pytest.mark.parametrize("name", sorted(NORMS))
@pytest.mark.parametrize(("dtype", "tokens", "hidden"), SHAPES)
def test_norm(name, dtype, tokens, hidden):
    op, ref = NORMS[name]
    x = randn(tokens, hidden, dtype=dtype, device="cuda", seed=hidden + tokens)
    w = _weight(hidden, dtype)
    first = op(x, w, 1e-6, out=poison(torch.empty_like(x)), backend="cuda")
    assert_close(first, ref(x, w, 1e-6), name=f"{name} {tokens}x{hidden}")
    again = op(x, w, 1e-6, out=poison(torch.empty_like(x)), backend="cuda")
    assert torch.equal(first, again), f"{name} {tokens}x{hidden}: not deterministic"


@pytest.mark.parametrize("name", sorted(FUSED))
@pytest.mark.parametrize(("dtype", "tokens", "hidden"), SHAPES)
def test_fused(name, dtype, tokens, hidden):
    op, ref = FUSED[name]
    x0 = randn(tokens, hidden, dtype=dtype, device="cuda", seed=hidden + tokens)
    r0 = randn(tokens, hidden, dtype=dtype, device="cuda", seed=hidden + tokens + 1, scale=3.0)
    w = _weight(hidden, dtype)
    y_expected, s_expected = ref(x0, r0, w, 1e-6)
    results = []
    for _ in range(2):
        x, r = x0.clone(), r0.clone()
        op(x, r, w, 1e-6, backend="cuda")
        assert torch.equal(r, s_expected), f"{name} {tokens}x{hidden}: residual differs"
        assert_close(x, y_expected, name=f"{name} {tokens}x{hidden}")
        results.append(x)
    assert torch.equal(*results), f"{name} {tokens}x{hidden}: not deterministic"


@pytest.mark.parametrize("with_bias", (True, False), ids=("bias", "nobias"))
@pytest.mark.parametrize(("dtype", "tokens", "hidden"), SHAPES)
def test_layernorm(dtype, tokens, hidden, with_bias):
    # Offset 4 with spread 1: the centred second statistic must see the split row's full mean.
    x = (randn(tokens, hidden, seed=hidden + tokens) + 4.0).to(dtype=dtype, device="cuda")
    w = _weight(hidden, dtype, seed=1)
    b = randn(hidden, dtype=dtype, device="cuda", seed=2, scale=0.5) if with_bias else None
    first = layernorm(x, w, b, 1e-5, out=poison(torch.empty_like(x)), backend="cuda")
    assert_close(first, reference.layernorm(x, w, b, 1e-5), name=f"{tokens}x{hidden}")
    again = layernorm(x, w, b, 1e-5, out=poison(torch.empty_like(x)), backend="cuda")
    assert torch.equal(first, again), f"layernorm {tokens}x{hidden}: not deterministic"


@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize(("tokens", "hidden"), ((1, 8192), (7, 4104), (64, 7168), (100, 4096)))
def test_layernorm_fp32_weights(dtype, tokens, hidden):
    x = randn(tokens, hidden, dtype=dtype, device="cuda", seed=3)
    w = _weight(hidden, torch.float32, seed=4)
    b = randn(hidden, device="cuda", seed=5, scale=0.5)
    first = layernorm(x, w, b, 1e-5, backend="cuda")
    assert_close(first, reference.layernorm(x, w, b, 1e-5), name=f"{tokens}x{hidden}")
    assert torch.equal(first, layernorm(x, w, b, 1e-5, backend="cuda"))


@pytest.mark.parametrize("enable_pdl", (False, True))
@pytest.mark.parametrize("tokens", (1, 64))
def test_cuda_graph_and_pdl(tokens, enable_pdl):
    """The decode benchmark's setting: fused_add_rmsnorm replayed in a CUDA graph, PDL on/off."""
    x0 = randn(tokens, 7168, dtype=torch.bfloat16, device="cuda", seed=7)
    r0 = randn(tokens, 7168, dtype=torch.bfloat16, device="cuda", seed=8)
    w = _weight(7168, torch.bfloat16)
    y_expected, s_expected = reference.fused_add_rmsnorm(x0, r0, w, 1e-6)
    x, r = x0.clone(), r0.clone()
    fused_add_rmsnorm(x, r, w, 1e-6, enable_pdl=enable_pdl)  # build and warm up outside
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused_add_rmsnorm(x, r, w, 1e-6, enable_pdl=enable_pdl)
    for _ in range(3):
        x.copy_(x0)
        r.copy_(r0)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(r, s_expected)
        assert_close(x, y_expected, name=f"graph {tokens}x7168")
