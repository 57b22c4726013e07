"""The group's CUDA sources build for sm_90a through the real JIT pipeline (on every machine),
and, on the GPU, every kernel path runs clean under compute-sanitizer's memcheck."""

from __future__ import annotations

import pytest

from shared.testing.builds import compile_group_for_hopper, run_memcheck


def test_cuda_sources_compile_for_sm90a():
    assert sorted(compile_group_for_hopper("layernorm")) == ["layernorm_cuda", "rmsnorm_cuda"]


# One call per kernel path (see test_rmsnorm.py): register kernels of 1/2/4/8 vectors per thread,
# the vector and scalar loop kernels, strided/misaligned/3-D views, qk heads, layernorm.
_MEMCHECK_SCRIPT = """
import torch
from kernels_layernorm import (fused_add_rmsnorm, gemma_rmsnorm, layernorm, qk_rmsnorm, rmsnorm)
for dtype in (torch.bfloat16, torch.float32):
    for t, h in ((1, 8), (3, 24), (5, 128), (7, 1024), (9, 2048), (3, 5128), (2, 7168),
                 (2, 16384), (1, 32776), (2, 65536), (3, 127), (1, 1)):
        x = torch.randn(t, h, device="cuda").to(dtype)
        w = torch.randn(h, device="cuda").to(dtype)
        rmsnorm(x, w)
        if h > 1:
            gemma_rmsnorm(x[:, 1:], w[1:])  # misaligned rows: the scalar path
        fused_add_rmsnorm(x.clone(), torch.randn_like(x), w)
        layernorm(x, w, w)
        wide = torch.randn(t, h + 8, device="cuda").to(dtype)
        rmsnorm(wide[:, :h], w, out=torch.empty(t, h + 16, device="cuda", dtype=dtype)[:, 8:h + 8])
    qkv = torch.randn(7, 48 * 128, device="cuda").to(dtype)
    hw = torch.ones(128, device="cuda", dtype=dtype)
    qk_rmsnorm(qkv[:, :4096].view(7, 32, 128), qkv[:, 4096:5120].view(7, 8, 128), hw, hw)
    x3 = torch.randn(3, 12, 256, device="cuda").to(dtype)[:, :11]
    rmsnorm(x3, torch.ones(256, device="cuda", dtype=dtype))
torch.cuda.synchronize()
print("done")
"""


@pytest.mark.gpu
@pytest.mark.slow
def test_memcheck_every_kernel_path():
    run_memcheck("layernorm", _MEMCHECK_SCRIPT)
