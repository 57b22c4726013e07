"""The group's CUDA sources build for sm_90a through the real JIT pipeline (on every machine),
and, on the GPU, every kernel path runs clean under compute-sanitizer's memcheck."""

from __future__ import annotations

import pytest

from kernels_jit import load_module
from shared.testing.builds import cuda_arch, group_modules, run_memcheck

# A CUTLASS instantiation takes a minute or more and ~4 GB of nvcc (60-95 s each on an idle
# 2-core machine, up to 250 s on a loaded one), so the CPU CI builds one module per fp8 op: the
# modules of one op share every line of source and differ only in template arguments (out
# dtype, tile config). The GPU run builds them all (run_memcheck's prebuild).
FP8_REPRESENTATIVES = {
    "fp8_scaled_mm": "fp8_scaled_mm_bf16_large_cuda",
    "fp8_blockwise_mm": "fp8_blockwise_mm_large_cuda",
}


def test_cuda_sources_compile_for_sm90a():
    """Every CUDA module the group declares (whatever ops it has: no per-op list to keep), but
    one representative per CUTLASS fp8 op."""
    declared = {m.uri: m for m in group_modules("gemm")}
    assert {"dsv3_router_gemm_cuda", "dsv3_fused_a_gemm_cuda"} <= set(declared)
    for op, uri in FP8_REPRESENTATIVES.items():
        assert uri in declared, f"{op}: representative module {uri} is not declared"
    chosen = [
        uri
        for uri in sorted(declared)
        if not any(uri.startswith(f"{op}_") for op in FP8_REPRESENTATIVES)
        or uri in FP8_REPRESENTATIVES.values()
    ]
    with cuda_arch():
        for uri in chosen:
            load_module(declared[uri])


# One call per kernel path. Small-M GEMMs: both row halves (M <= 8, M > 8) x 8/16 columns per CTA x
# cluster split 1/2/4, fp32 and bf16 out, ragged N and K, strided rows and out views, K = 0;
# fp8: both tile configs of each CUTLASS op, bf16/fp16 out, vector/scalar scales, bias.
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
from kernels_gemm import fp8_blockwise_mm, fp8_scaled_mm
f8 = torch.float8_e4m3fn
for m in (1, 5, 64, 65, 128, 129, 300):  # both tile configs of each fp8 op, ragged M and N
    for n, k in ((2112, 512), (144, 256)):
        a = torch.randn(m, k, device="cuda").to(f8)
        b = torch.randn(n, k, device="cuda").to(f8).t()
        for dtype in (torch.bfloat16, torch.float16):
            bias = torch.randn(n, device="cuda").to(dtype)
            fp8_scaled_mm(a, b, torch.rand(m, 1, device="cuda"), torch.rand(n, device="cuda"),
                          dtype, bias)
            fp8_scaled_mm(a, b, torch.rand(1, device="cuda"), torch.rand(1, device="cuda"), dtype)
        rows = (m + 3) // 4 * 4
        sa = torch.rand(k // 128, rows, device="cuda").t()[:m]
        sb = torch.rand((n + 127) // 128, k // 128, device="cuda").t()
        fp8_blockwise_mm(a, b, sa, sb)
        fp8_blockwise_mm(a[:, :128], b[:128], torch.rand(m, 1, device="cuda"), sb[:1])
torch.cuda.synchronize()
print("done")
"""


@pytest.mark.gpu
@pytest.mark.slow
def test_memcheck_every_kernel_path():
    run_memcheck("gemm", _MEMCHECK_SCRIPT)
