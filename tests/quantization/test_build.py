"""The group's CUDA sources build for sm_90a through the real JIT pipeline (on every machine),
and, on the GPU, every quantization kernel path runs clean under compute-sanitizer's memcheck."""

from __future__ import annotations

import pytest

from shared.testing.builds import compile_group_for_hopper, run_memcheck

QUANT_MODULES = {
    "per_tensor_quant_fp8_cuda",
    "per_token_group_quant_8bit_cuda",
    "per_token_quant_fp8_cuda",
}


def test_cuda_sources_compile_for_sm90a():
    # hadamard_transform's module is checked by its own tests.
    assert set(compile_group_for_hopper("quantization")) >= QUANT_MODULES


def test_compiled_entries_check_arguments_before_the_device():
    """The C++ entries name the op and argument (CPU tensors: every check but the device runs)."""
    import torch

    from kernels_jit import load_module
    from kernels_quantization.ops import per_tensor_quant_fp8 as pt
    from kernels_quantization.ops import per_token_group_quant_8bit as pg
    from kernels_quantization.ops import per_token_quant_fp8 as ptok
    from shared.testing.builds import cuda_arch

    with cuda_arch():
        tok = load_module(ptok.PER_TOKEN_QUANT_FP8_CUDA).per_token_quant_fp8
        grp = load_module(pg.PER_TOKEN_GROUP_QUANT_8BIT_CUDA).per_token_group_quant_8bit
        ten = load_module(pt.PER_TENSOR_QUANT_FP8_CUDA).per_tensor_quant_fp8
    x = torch.randn(4, 64)
    fp8 = torch.empty(4, 64, dtype=torch.float8_e4m3fn)
    with pytest.raises(TypeError, match="per_token_quant_fp8: q must have dtype float8_e4m3fn"):
        tok(torch.empty(4, 64, dtype=torch.int8), torch.empty(4, 1), x)
    with pytest.raises(ValueError, match=r"per_token_quant_fp8: s must have shape \[4, 1\]"):
        tok(fp8, torch.empty(4), x)
    with pytest.raises(ValueError, match="per_token_quant_fp8: x is on the wrong device"):
        tok(fp8, torch.empty(4, 1), x)
    with pytest.raises(TypeError, match="per_token_group_quant_8bit: q must have dtype"):
        grp(
            torch.empty(4, 64, dtype=torch.float8_e5m2),
            torch.empty(4, 2),
            x,
            32,
            1e-10,
            0,
            0,
            0,
            None,
        )
    with pytest.raises(ValueError, match="group_size must be one of"):
        grp(fp8, torch.empty(4, 2), x, 48, 1e-10, False, False, False, None)
    with pytest.raises(ValueError, match=r"s must have shape \[\.\.\., 2\]"):
        grp(fp8, torch.empty(4, 3), x, 32, 1e-10, False, False, False, None)
    with pytest.raises(TypeError, match="s must have dtype int32"):
        grp(fp8, torch.empty(4, 1), x, 32, 1e-10, True, True, False, None)
    with pytest.raises(ValueError, match="eps must be a finite number > 0"):
        grp(fp8, torch.empty(4, 2), x, 32, 0.0, False, False, False, None)
    with pytest.raises(ValueError, match="per_tensor_quant_fp8: s must hold exactly one"):
        ten(fp8, torch.empty(2), x, False)
    with pytest.raises(ValueError, match="per_tensor_quant_fp8: x is on the wrong device"):
        ten(fp8, torch.empty(1), x, False)


# One call per kernel path: per_token_quant_fp8's register kernels (1/2/4/8 vectors per thread),
# vector and scalar loop kernels; per_token_group_quant_8bit's vector and scalar kernels in every
# scale layout, fp8 and int8, 3-D and strided views, fused silu_and_mul, masked rows and the
# grid-stride loop; per_tensor_quant_fp8's fused block, the cluster kernel ((2, 32776)), the
# memset + sweep + quantize path, the resident kernel, static, flat tails, row mode and
# misaligned views.
_MEMCHECK_SCRIPT = """
import torch
from kernels_quantization import (per_tensor_quant_fp8, per_token_group_quant_8bit,
                                  per_token_quant_fp8)
for dtype in (torch.bfloat16, torch.float32):
    for t, k in ((1, 8), (3, 24), (5, 128), (7, 1024), (2, 7168), (300, 7168), (2, 32776),
                 (3, 127), (1, 1)):
        x = torch.randn(t, k, device="cuda").to(dtype)
        per_token_quant_fp8(x, backend="cuda")
        if k > 1:
            per_token_quant_fp8(x[:, 1:], backend="cuda")
        for scale in (None, torch.tensor([0.1], device="cuda")):
            per_tensor_quant_fp8(x, scale=scale, backend="cuda")
            if k > 1:
                per_tensor_quant_fp8(x[:, 1:], scale=scale, backend="cuda")
    for g in (16, 128, 256):
        for m in (1, 5, 33):
            x = torch.randn(m, 4 * g + g, device="cuda").to(dtype)
            for dst in (torch.float8_e4m3fn, torch.int8):
                per_token_group_quant_8bit(x, g, dst_dtype=dst, backend="cuda")
                per_token_group_quant_8bit(x[:, 1:1 + 4 * g], g, dst_dtype=dst, backend="cuda")
                per_token_group_quant_8bit(x, g, dst_dtype=dst, column_major_scales=True,
                                           scale_tma_aligned=True, backend="cuda")
                per_token_group_quant_8bit(x, g, dst_dtype=dst, column_major_scales=True,
                                           scale_tma_aligned=True, scale_ue8m0=True,
                                           pack_ue8m0=True, backend="cuda")
    x3 = torch.randn(3, 12, 512, device="cuda").to(dtype)[:, :11]
    per_token_group_quant_8bit(x3, 128, column_major_scales=True, backend="cuda")
    xe = torch.randn(6, 3, 1024, device="cuda").to(dtype)
    mm = torch.tensor([2, 0, 3, 7, -1, 1], dtype=torch.int32, device="cuda")
    per_token_group_quant_8bit(xe, 128, fuse_silu_and_mul=True, masked_m=mm, backend="cuda")
    per_token_group_quant_8bit(xe[:, :, 1:513], 128, fuse_silu_and_mul=True, masked_m=mm,
                               backend="cuda")
    per_token_group_quant_8bit(xe, 64, column_major_scales=True, scale_tma_aligned=True,
                               scale_ue8m0=True, pack_ue8m0=True, masked_m=mm, backend="cuda")
    # more chunks than one wave of blocks: the grid-stride loop
    per_token_group_quant_8bit(torch.randn(3000, 4096, device="cuda").to(dtype), 128,
                               backend="cuda")
    per_tensor_quant_fp8(x3, backend="cuda")
    per_tensor_quant_fp8(torch.randn(70001, device="cuda").to(dtype), backend="cuda")
    # past the SMs' shared memory: the resident kernel (cp.async.bulk into shared memory)
    per_tensor_quant_fp8(torch.randn(4100, 4096, device="cuda").to(dtype), backend="cuda")
torch.cuda.synchronize()
print("done")
"""


@pytest.mark.gpu
@pytest.mark.slow
def test_memcheck_every_kernel_path():
    run_memcheck("quantization", _MEMCHECK_SCRIPT)
