"""The group's CUDA sources build for sm_90a through the real JIT pipeline (on every machine),
and, on the GPU, every kernel path runs clean under compute-sanitizer's memcheck."""

from __future__ import annotations

import pytest

from shared.testing.builds import compile_group_for_hopper, run_memcheck


def test_cuda_sources_compile_for_sm90a():
    assert sorted(compile_group_for_hopper("moe")) == [
        "gate_topk_renorm_cuda",
        "moe_align_block_size_cuda",
        "moe_sum_reduce_cuda",
        "topk_softmax_cuda",
    ]


# One call per kernel path: moe_sum_reduce with compile-time k (1, 2, 4, 8, 9) and runtime k,
# packed and scalar, weighted; topk_softmax and gate_topk_renorm for every experts-per-lane
# instantiation, partial blocks of warps, strided views; moe_align_block_size one-block and
# count / scan / scatter, int32 and int64 ids, out-of-range ids.
_MEMCHECK_SCRIPT = """
import torch
from kernels_moe import gate_topk_renorm, moe_align_block_size, moe_sum_reduce, topk_softmax
for dtype in (torch.bfloat16, torch.float32, torch.float16):
    for t, k, h in ((1, 2, 2048), (3, 4, 24), (5, 8, 129), (2, 9, 7168), (3, 3, 64), (2, 12, 8),
                    (1, 1, 1), (4, 0, 16)):
        x = torch.randn(t, k, h, device="cuda").to(dtype)
        moe_sum_reduce(x, routed_scaling_factor=2.5)
        moe_sum_reduce(x, topk_weights=torch.rand(t, k, device="cuda"))
        if h > 1:
            moe_sum_reduce(x[:, :, 1:])
    for t, e, k in ((1, 8, 2), (7, 60, 6), (9, 256, 8), (5, 384, 8), (3, 1000, 32), (2, 33, 32)):
        g = torch.randn(t, e + 3, device="cuda").to(dtype)[:, 3:]
        topk_softmax(torch.empty(t, k, device="cuda"),
                     torch.empty(t, k, dtype=torch.int32, device="cuda"), g, True,
                     moe_softcapping=2.0, correction_bias=torch.randn(e, device="cuda"))
for dtype in (torch.bfloat16, torch.float32):
    for t, e, k, ng, tg in ((1, 256, 8, 8, 4), (7, 384, 8, 1, 1), (5, 30, 5, 3, 2),
                            (3, 1024, 8, 32, 4), (6, 96, 32, 4, 4)):
        lg = torch.randn(t, e, device="cuda").to(dtype)
        gate_topk_renorm(lg, torch.randn(e, device="cuda"), k, n_group=ng, topk_group=tg)
for t, k, e, bs in ((1, 8, 256, 64), (64, 8, 256, 64), (512, 8, 256, 64), (513, 8, 256, 64),
                    (8192, 8, 256, 64), (100, 4, 1024, 16), (3000, 2, 8, 128)):
    ids = torch.randint(-1, e, (t, k), device="cuda", dtype=torch.int32)
    moe_align_block_size(ids, e, bs)
    moe_align_block_size(ids.long(), e, bs)
bad = torch.randint(-5, 20, (700, 8), device="cuda", dtype=torch.int32)
moe_align_block_size(bad, 10, 16, backend="cuda")
moe_align_block_size(bad[:3], 10, 16, backend="cuda")
torch.cuda.synchronize()
print("done")
"""


@pytest.mark.gpu
@pytest.mark.slow
def test_memcheck_every_kernel_path():
    run_memcheck("moe", _MEMCHECK_SCRIPT)
