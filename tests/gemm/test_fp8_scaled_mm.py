"""gemm.fp8_scaled_mm against float64 sums: per-token x per-channel and per-tensor scales, bias,
bf16 and fp16 out, odd M, N, K, strided operands, empty input, bad arguments, opcheck, compile."""

from __future__ import annotations

import pytest
import torch

from kernels_gemm import fp8_scaled_mm, reference
from shared.testing.compare import assert_close

FP8 = torch.float8_e4m3fn
# opcheck's test_schema compares the inputs before and after with torch.allclose, which has no fp8
# kernel in torch 2.13; the other opcheck tests run.
NO_SCHEMA = ("test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic")


def _operands(m: int, n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) * 16).to(FP8)
    w = (torch.randn(n, k, generator=g) * 16).to(FP8)
    sa = torch.rand(m, 1, generator=g) * 0.01 + 1e-3
    sb = torch.rand(n, generator=g) * 0.01 + 1e-3
    bias = torch.randn(n, generator=g)
    return a, w.t(), sa, sb, bias


def _expected(a, b, sa, sb, bias) -> torch.Tensor:
    """out[m, n] = sum_k a[m, k] b[k, n] * sa[m] * sb[n] + bias[n], by loops over m in float64."""
    m, n = a.shape[0], b.shape[1]
    sa = sa.double().reshape(-1).expand(m) if sa.numel() == 1 else sa.double().reshape(m)
    sb = sb.double().reshape(-1).expand(n) if sb.numel() == 1 else sb.double().reshape(n)
    out = torch.empty(m, n, dtype=torch.float64)
    for i in range(m):
        out[i] = (a[i].double().unsqueeze(1) * b.double()).sum(dim=0) * sa[i] * sb
    if bias is not None:
        out += bias.double()
    return out


SHAPES = ((1, 64, 128), (7, 48, 96), (33, 17, 13), (16, 256, 512))


@pytest.mark.parametrize("out_dtype", (torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("per_tensor", (False, True), ids=("per-token", "per-tensor"))
@pytest.mark.parametrize("with_bias", (False, True), ids=("", "bias"))
def test_matches_float64(out_dtype, shape, per_tensor, with_bias):
    a, b, sa, sb, bias = _operands(*shape, seed=sum(shape))
    if per_tensor:
        sa, sb = sa[:1, 0].clone(), sb[:1].clone()
    bias = bias.to(out_dtype) if with_bias else None
    out = fp8_scaled_mm(a, b, sa, sb, out_dtype, bias)
    assert out.dtype == out_dtype and out.shape == (shape[0], shape[1])
    assert_close(out, _expected(a, b, sa, sb, bias).to(out_dtype))


def test_scale_b_row_vector_and_row_strided_a():
    a, b, sa, sb, _ = _operands(6, 40, 64, seed=1)
    wide = torch.zeros(6, 96, dtype=FP8)
    wide[:, 8:72] = a
    a_view = wide[:, 8:72]
    out = fp8_scaled_mm(a_view, b, sa, sb.reshape(1, -1))
    assert_close(out, _expected(a, b, sa, sb, None).to(torch.bfloat16))


def test_empty():
    a, b, sa, sb, _ = _operands(0, 8, 32, seed=2)
    assert fp8_scaled_mm(a, b, sa, sb).shape == (0, 8)
    a, b, sa, sb, _ = _operands(3, 8, 0, seed=3)
    assert (fp8_scaled_mm(a, b, sa, sb) == 0).all()


def test_bad_arguments():
    a, b, sa, sb, bias = _operands(4, 8, 32, seed=4)
    with pytest.raises(ValueError, match=r"fp8_scaled_mm: b \[K, N\] must be column-major"):
        fp8_scaled_mm(a, b.contiguous(), sa, sb)
    with pytest.raises(ValueError, match=r"a \[M, K\] must be row-major"):
        fp8_scaled_mm(a.t().contiguous().t(), b, sa, sb)
    with pytest.raises(ValueError, match=r"scale_a must have shape \[4, 1\] or \[1\], got \[4\]"):
        fp8_scaled_mm(a, b, sa.reshape(-1), sb)
    with pytest.raises(ValueError, match=r"scale_b must have shape \[8\] or \[1, 8\] or \[1\]"):
        fp8_scaled_mm(a, b, sa, sb[:3])
    with pytest.raises(TypeError, match="a must have dtype in .*got bfloat16"):
        fp8_scaled_mm(a.bfloat16(), b, sa, sb)
    with pytest.raises(TypeError, match="bias must have dtype in .*got float32"):
        fp8_scaled_mm(a, b, sa, sb, torch.bfloat16, bias)
    with pytest.raises(TypeError, match="out_dtype must be torch.bfloat16 or torch.float16"):
        fp8_scaled_mm(a, b, sa, sb, torch.float32)
    with pytest.raises(ValueError, match=r"must share K, got a \(4, 32\) and b \(16, 8\)"):
        fp8_scaled_mm(a, b[:16], sa, sb)


def test_opcheck():
    from kernels_gemm.ops.fp8_scaled_mm import FP8_SCALED_MM

    a, b, sa, sb, bias = _operands(5, 24, 48, seed=5)
    out = torch.empty(5, 24, dtype=torch.bfloat16)
    torch.library.opcheck(
        FP8_SCALED_MM.torch_op, (out, a, b, sa, sb, bias.bfloat16(), None), test_utils=NO_SCHEMA
    )
    torch.library.opcheck(
        FP8_SCALED_MM.torch_op, (out, a, b, sa, sb, None, None), test_utils=NO_SCHEMA
    )


def test_torch_compile_fullgraph_aot():
    a, b, sa, sb, _ = _operands(8, 32, 64, seed=6)
    compiled = torch.compile(fp8_scaled_mm, fullgraph=True, backend="aot_eager")
    assert_close(compiled(a, b, sa, sb), reference.fp8_scaled_mm(a, b, sa, sb))
