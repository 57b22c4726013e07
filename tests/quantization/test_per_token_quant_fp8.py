"""quantization.per_token_quant_fp8 against a float64 oracle that decodes every e4m3 value by hand:
odd widths, row-strided input, out=, all-zero and saturating rows, empty input, bad arguments,
opcheck and torch.compile."""

from __future__ import annotations

import pytest
import torch

from kernels_quantization import per_token_quant_fp8, reference
from shared.testing.compare import assert_close
from shared.testing.inputs import randn, row_strided

# opcheck's test_schema compares tensors with torch.allclose, which has no fp8 kernel in torch
# 2.13 ("mul_cpu_reduced_float" not implemented for 'Float8_e4m3fn'); the int8 path of
# per_token_group_quant_8bit runs the full opcheck.
NO_SCHEMA = ("test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# 1 and 7 rows: decode batches; widths around a 16-byte vector (7, 8, 9 halves) and odd sizes.
SHAPES = ((1, 1), (1, 128), (7, 9), (13, 333), (4, 4096))


def _expected(x: torch.Tensor, oracle) -> tuple[torch.Tensor, torch.Tensor]:
    x64 = x.double()
    s = oracle.round_fp32(x64.abs().amax(dim=1, keepdim=True).clamp(min=1e-10) / 448.0)
    q = oracle.e4m3(oracle.round_fp32(x64 / s))
    return q, s


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_float64_oracle(dtype, shape, oracle):
    x = randn(*shape, dtype=dtype, seed=shape[1], scale=7.0)
    q, s = per_token_quant_fp8(x)
    q_ref, s_ref = _expected(x, oracle)
    assert q.dtype == torch.float8_e4m3fn and s.dtype == torch.float32
    assert s.shape == (shape[0], 1)
    torch.testing.assert_close(s.double(), s_ref, rtol=0, atol=0)
    torch.testing.assert_close(q.double(), q_ref, rtol=0, atol=0)


def test_reference_is_what_the_op_returns():
    x = randn(9, 200, dtype=torch.bfloat16, seed=3)
    q, s = per_token_quant_fp8(x)
    q_ref, s_ref = reference.per_token_quant_fp8(x)
    assert_close(s, s_ref)
    assert_close(q.float(), q_ref.float())


def test_row_strided_input_and_strided_out(oracle):
    x = row_strided(randn(6, 96, dtype=torch.float16, seed=1), extra=40)
    assert not x.is_contiguous()
    wide = torch.zeros(6, 128, dtype=torch.float8_e4m3fn)
    out = wide[:, 16:112]
    q, s = per_token_quant_fp8(x, out=out)
    assert q is out
    q_ref, s_ref = _expected(x, oracle)
    torch.testing.assert_close(out.double(), q_ref, rtol=0, atol=0)
    torch.testing.assert_close(s.double(), s_ref, rtol=0, atol=0)
    assert wide[:, :16].float().abs().sum() == 0  # untouched outside the view


def test_zero_row_gives_floor_scale_and_zero_q():
    x = torch.zeros(2, 64)
    x[1, 3] = -896.0  # absmax 896: s = 2, q = -448 exactly
    q, s = per_token_quant_fp8(x)
    assert s[0, 0].item() == pytest.approx(1e-10 / 448, rel=1e-6)
    assert not q.float().isnan().any()
    assert q[0].float().abs().sum() == 0
    assert s[1, 0].item() == 2.0 and q[1, 3].float().item() == -448.0


def test_empty_inputs():
    q, s = per_token_quant_fp8(torch.empty(0, 128, dtype=torch.bfloat16))
    assert q.shape == (0, 128) and s.shape == (0, 1)
    q, s = per_token_quant_fp8(torch.empty(3, 0))
    assert q.shape == (3, 0) and s.shape == (3, 1)


def test_bad_arguments():
    x = torch.randn(4, 64)
    with pytest.raises(TypeError, match=r"per_token_quant_fp8: x must have dtype in .*got float64"):
        per_token_quant_fp8(x.double())
    with pytest.raises(ValueError, match=r"per_token_quant_fp8: x must have 2 dims, got shape"):
        per_token_quant_fp8(torch.randn(2, 3, 64))
    with pytest.raises(ValueError, match="x must have a contiguous last dim"):
        per_token_quant_fp8(torch.randn(64, 4).t())
    with pytest.raises(TypeError, match="out must have dtype float8_e4m3fn, got float32"):
        per_token_quant_fp8(x, out=torch.empty(4, 64))
    with pytest.raises(ValueError, match=r"out must have shape \(4, 64\), got \(4, 32\)"):
        per_token_quant_fp8(x, out=torch.empty(4, 32, dtype=torch.float8_e4m3fn))


def test_opcheck():
    from kernels_quantization.ops.per_token_quant_fp8 import PER_TOKEN_QUANT_FP8

    x = randn(5, 64, dtype=torch.bfloat16)
    q = torch.empty(5, 64, dtype=torch.float8_e4m3fn)
    s = torch.empty(5, 1)
    torch.library.opcheck(PER_TOKEN_QUANT_FP8.torch_op, (q, s, x, None), test_utils=NO_SCHEMA)


def test_torch_compile_fullgraph():
    """Inductor, so the custom op is traced, functionalised and lowered (about 5 s on CPU)."""
    x = randn(8, 96, dtype=torch.bfloat16)
    compiled = torch.compile(lambda t: per_token_quant_fp8(t * 2), fullgraph=True)
    q, s = compiled(x)
    q_ref, s_ref = reference.per_token_quant_fp8(x * 2)
    assert_close(s, s_ref)
    assert_close(q.float(), q_ref.float())


# ---------------------------------------------------------------------------------------------
# The CUDA backend against the reference (GPU): bit-exact q and s, outputs poisoned first.

GPU = pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)
# Register kernels of 1/2/4/8 vectors per thread (few and many rows), the vector loop kernel
# (rows past 4096 vectors), the scalar loop kernel (widths not in whole vectors).
GPU_SHAPES = (
    (1, 8),
    (3, 24),
    (1, 7168),
    (16, 7168),
    (300, 7168),
    (5, 1024),
    (7, 9),
    (13, 333),
    (2, 32776),
    (1, 65536),
)


def _fp8_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(
        actual.float().cpu(), expected.float().cpu(), rtol=0, atol=0, equal_nan=True
    )


def _run_both(x: torch.Tensor, out: torch.Tensor | None = None):
    q_ref, s_ref = reference.per_token_quant_fp8(x)
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device) if out is None else out
    q.view(torch.uint8).fill_(0x7F)  # poison: NaN codes
    q, s = per_token_quant_fp8(x, out=q, backend="cuda")
    _fp8_equal(q, q_ref)
    torch.testing.assert_close(s.cpu(), s_ref.cpu(), rtol=0, atol=0, equal_nan=True)
    return q, s


@pytest.mark.parametrize("device", (GPU,))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
def test_cuda_matches_reference(device, dtype, shape):
    _run_both(randn(*shape, dtype=dtype, device=device, seed=shape[1], scale=5.0))


@pytest.mark.parametrize("device", (GPU,))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_strided_misaligned_and_out_views(device, dtype):
    base = randn(9, 7168 + 24, dtype=dtype, device=device, seed=4)
    _run_both(base[:, :7168])  # row-strided, aligned: the vector kernels
    _run_both(base[:, 1:7169])  # misaligned rows: the scalar loop kernel
    wide = torch.empty(9, 7168 + 64, dtype=torch.float8_e4m3fn, device=device)
    _run_both(base[:, 8:7176], out=wide[:, 16:7184])
    _run_both(base[:, 8:7176], out=wide[:, 3:7171])  # misaligned out: scalar path


@pytest.mark.parametrize("device", (GPU,))
def test_cuda_edge_values(device):
    x = randn(4, 512, device=device, seed=2)
    x[0] = 0.0  # floor scale, q = 0
    x[1, 7] = float("nan")  # NaN propagates through the row, as in the reference
    x[2, 9] = float("inf")
    x[3, 5] = 3e38
    _run_both(x)
    _run_both(x.to(torch.bfloat16))


@pytest.mark.parametrize("device", (GPU,))
def test_cuda_graph_capture(device):
    x = randn(64, 7168, dtype=torch.bfloat16, device=device, seed=5)
    q, s = per_token_quant_fp8(x)  # build and warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, s = per_token_quant_fp8(x)
    x.copy_(randn(64, 7168, dtype=torch.bfloat16, device=device, seed=6))
    graph.replay()
    torch.cuda.synchronize()
    q_ref, s_ref = reference.per_token_quant_fp8(x)
    _fp8_equal(q, q_ref)
    torch.testing.assert_close(s, s_ref, rtol=0, atol=0)


@pytest.mark.parametrize("device", (GPU,))
def test_cuda_torch_compile_fullgraph(device):
    x = randn(8, 7168, dtype=torch.bfloat16, device=device)
    compiled = torch.compile(lambda t: per_token_quant_fp8(t * 2), fullgraph=True)
    q, s = compiled(x)
    q_ref, s_ref = reference.per_token_quant_fp8(x * 2)
    _fp8_equal(q, q_ref)
    torch.testing.assert_close(s, s_ref, rtol=0, atol=0)
