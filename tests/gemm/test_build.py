"""The group's CUDA sources build for sm_90a through the real JIT pipeline (on every machine),
and, on the GPU, every kernel path runs clean under compute-sanitizer's memcheck."""

from __future__ import annotations

import pytest

from shared.testing.builds import compile_group_for_hopper, group_modules, run_memcheck


def test_cuda_sources_compile_for_sm90a():
    """Every CUDA module the group declares (whatever ops it has: no per-op list to keep)."""
    declared = sorted(m.uri for m in group_modules("gemm"))
    assert {"dsv3_router_gemm_cuda", "dsv3_fused_a_gemm_cuda"} <= set(declared)
    assert sorted(compile_group_for_hopper("gemm")) == declared


# One call per small-M kernel path: both row halves (M <= 8, M > 8) x 8/16 columns per CTA x
# cluster split 1/2/4, fp32 and bf16 out, ragged N and K, strided rows and out views, K = 0.
_MEMCHECK_SCRIPT = """
import torch
from kernels_gemm import dsv3_fused_a_gemm, dsv3_router_gemm
for m in (1, 5, 8, 9, 16):
    for e, k in ((256, 7168), (384, 7168), (7, 1024), (33, 4096), (13, 8), (256, 0)):
        x = torch.randn(m, k + 8, device="cuda").bfloat16()[:, :k]
        w = (torch.randn(e, k + 16, device="cuda") * 0.05).bfloat16()[:, :k]
        dsv3_router_gemm(x, w)
        dsv3_router_gemm(x, w, out_dtype=torch.bfloat16, enable_pdl=False)
        dsv3_router_gemm(x, w, out=torch.empty(e, m, device="cuda").t())
    for n, k in ((2112, 7168), (2112, 512), (100, 1024), (9, 24)):
        a = torch.randn(m, k, device="cuda").bfloat16()
        w = (torch.randn(n, k + 8, device="cuda") * 0.05).bfloat16()[:, :k]
        dsv3_fused_a_gemm(a, w.t())
        dsv3_fused_a_gemm(a, w.t(), out=torch.empty(m, n + 5, device="cuda").bfloat16()[:, 2:n + 2])
torch.cuda.synchronize()
print("done")
"""


@pytest.mark.gpu
@pytest.mark.slow
def test_memcheck_every_kernel_path():
    run_memcheck("gemm", _MEMCHECK_SCRIPT)
