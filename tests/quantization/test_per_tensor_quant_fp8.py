"""quantization.per_tensor_quant_fp8 against a float64 oracle: dynamic and static scales, any
shape, saturation, the all-zero edge, empty input, bad arguments, opcheck."""

from __future__ import annotations

import pytest
import torch

from kernels_quantization import per_tensor_quant_fp8
from shared.testing.inputs import randn, row_strided

# opcheck's test_schema compares tensors with torch.allclose, which has no fp8 kernel in torch
# 2.13 ("mul_cpu_reduced_float" not implemented for 'Float8_e4m3fn'); the int8 path of
# per_token_group_quant_8bit runs the full opcheck.
NO_SCHEMA = ("test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SHAPES = ((1,), (7, 9), (3, 5, 129), (16, 4096))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_dynamic_matches_float64_oracle(dtype, shape, oracle):
    x = randn(*shape, dtype=dtype, seed=len(shape), scale=30.0)
    q, s = per_tensor_quant_fp8(x)
    s_ref = oracle.round_fp32(x.double().abs().max().clamp(min=1e-10).reshape(1) / 448.0)
    torch.testing.assert_close(s.double(), s_ref, rtol=0, atol=0)
    q_ref = oracle.e4m3(oracle.round_fp32(x.double() / s_ref))
    torch.testing.assert_close(q.double(), q_ref, rtol=0, atol=0)
    assert q.shape == x.shape and s.shape == (1,)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_static_scale_saturates_and_is_not_modified(dtype, oracle):
    x = row_strided(randn(9, 100, dtype=dtype, seed=5, scale=10.0))
    scale = torch.tensor([0.01])
    q, s = per_tensor_quant_fp8(x, scale=scale)
    assert s is scale and scale.item() == pytest.approx(0.01)
    q_ref = oracle.e4m3(oracle.round_fp32(x.double() / scale.double()))
    torch.testing.assert_close(q.double(), q_ref, rtol=0, atol=0)
    assert (q.float().abs() == 448).any()  # |x| up to ~40 over 0.01: saturated, never NaN
    assert not q.float().isnan().any()


def test_static_scale_inf_input_saturates():
    x = torch.tensor([float("inf"), float("-inf"), 1.0])
    q, _ = per_tensor_quant_fp8(x, scale=torch.tensor([1.0]))
    assert q.float().tolist() == [448.0, -448.0, 1.0]


def test_all_zero_and_empty():
    q, s = per_tensor_quant_fp8(torch.zeros(4, 8, dtype=torch.bfloat16))
    assert s.item() == pytest.approx(1e-10 / 448, rel=1e-6)
    assert q.float().abs().sum() == 0 and not q.float().isnan().any()
    q, s = per_tensor_quant_fp8(torch.empty(0, 8))
    assert q.shape == (0, 8) and s.shape == (1,) and s.item() == pytest.approx(1e-10 / 448)


def test_out_is_written_in_place(oracle):
    x = randn(5, 64, seed=2)
    out = torch.empty(5, 64, dtype=torch.float8_e4m3fn)
    q, s = per_tensor_quant_fp8(x, out=out)
    assert q is out
    torch.testing.assert_close(
        out.double(), oracle.e4m3(oracle.round_fp32(x.double() / s.double())), rtol=0, atol=0
    )


def test_bad_arguments():
    x = torch.randn(4, 64)
    with pytest.raises(
        TypeError, match=r"per_tensor_quant_fp8: scale must have dtype in \(float32"
    ):
        per_tensor_quant_fp8(x, scale=torch.tensor([1.0], dtype=torch.float16))
    with pytest.raises(
        ValueError, match=r"scale must hold exactly one fp32 value .*got shape \(2,\)"
    ):
        per_tensor_quant_fp8(x, scale=torch.ones(2))
    with pytest.raises(TypeError, match="scale must be a torch.Tensor, got float"):
        per_tensor_quant_fp8(x, scale=0.5)
    with pytest.raises(TypeError, match="x must have dtype in .*got int32"):
        per_tensor_quant_fp8(torch.ones(3, dtype=torch.int32))


def test_opcheck_static_and_dynamic():
    from kernels_quantization.ops.per_tensor_quant_fp8 import PER_TENSOR_QUANT_FP8

    x = randn(6, 32, dtype=torch.float16)
    q = torch.empty(6, 32, dtype=torch.float8_e4m3fn)
    torch.library.opcheck(
        PER_TENSOR_QUANT_FP8.torch_op, (q, torch.empty(1), x, False, None), test_utils=NO_SCHEMA
    )
    torch.library.opcheck(
        PER_TENSOR_QUANT_FP8.torch_op, (q, torch.tensor([0.1]), x, True, None), test_utils=NO_SCHEMA
    )
