"""The group's CUDA sources build for sm_90a through the real JIT pipeline (on every machine),
and, on the GPU, every kernel path runs clean under compute-sanitizer's memcheck."""

from __future__ import annotations

import pytest

from shared.testing.builds import compile_group_for_hopper, run_memcheck


def test_cuda_sources_compile_for_sm90a():
    assert sorted(compile_group_for_hopper("speculative")) == [
        "chain_speculative_sampling_cuda",
        "segment_packbits_cuda",
        "verify_tree_greedy_cuda",
    ]


# One call per kernel path: packbits fast (aligned) and byte paths, skipped segments; verify with
# the staged (N <= 64) and global trees, cyclic siblings; chain with packed/scalar rows, n = 0,
# clusters of 8 (slices in registers) and of fewer CTAs (slices of several tiles, the draw's tile
# found from the recorded tile sums), 3 and 1 CTAs forced (past the 16 recorded tiles), the
# zero-residual fallback.
_MEMCHECK_SCRIPT = """
import torch
from kernels_speculative import chain_speculative_sampling, segment_packbits, verify_tree_greedy
for lens in ([4096] * 64, [3, 0, 17, 33, 1000], [1] * 300, [9, 0, 2] * 700):
    for shift in (0, 3):
        x = torch.rand(sum(lens) + shift, device="cuda") < 0.5
        ptr = torch.tensor([0] + lens, device="cuda").cumsum(0).int() + shift
        for order in ("little", "big"):
            segment_packbits(x, ptr, bitorder=order)
x = torch.rand(40, device="cuda") < 0.5
segment_packbits(x, torch.tensor([0, 9, 40], device="cuda"),
                 output_indptr=torch.tensor([0, 2, 900], device="cuda"),
                 out=torch.zeros(6, dtype=torch.uint8, device="cuda"))
for b, n, s in ((1, 1, 1), (16, 64, 8), (3, 65, 6), (2, 300, 9)):
    local = torch.arange(n, device="cuda")
    index = (torch.arange(b, device="cuda")[:, None] * n + local).long()
    child = torch.where(2 * local + 1 < n, 2 * local + 1, -1).expand(b, n).contiguous()
    sib = torch.where(local % 2 == 1, (local + 1) % n, -1).expand(b, n).contiguous()
    cand = torch.randint(0, 2, (b, n), device="cuda")
    target = torch.randint(0, 2, (b * n,), device="cuda")
    verify_tree_greedy(torch.full((b * n,), -1, dtype=torch.int32, device="cuda"),
                       torch.full((b, s), -1, dtype=torch.int32, device="cuda"),
                       torch.zeros(b, dtype=torch.int32, device="cuda"),
                       cand, index, child, sib, target)
for dtype in (torch.float32, torch.bfloat16):
    for b, n, v in ((1, 8, 128256), (33, 2, 128256), (2, 3, 32003), (3, 0, 7), (4, 3, 4099),
                    (2, 2, 1)):
        d = torch.rand(b, n, v, device="cuda").softmax(-1).to(dtype)
        t = torch.rand(b, n + 1, v, device="cuda").softmax(-1).to(dtype)
        ids = torch.randint(0, v, (b, n), device="cuda", dtype=torch.int32)
        chain_speculative_sampling(d, ids, t, seed=1, offset=2)
    d = torch.rand(1, 1, 128256, device="cuda").softmax(-1).to(dtype)
    d[0, 0, 5] = 0
    chain_speculative_sampling(d, torch.tensor([[5]], dtype=torch.int32, device="cuda"),
                               torch.cat([d, d], dim=1), seed=3)
from kernels_speculative.ops import chain_speculative_sampling as m
for c, b, v in ((3, 2, 128256), (1, 2, 300000)):
    d = torch.rand(b, 1, v, device="cuda").softmax(-1)
    t = torch.rand(b, 2, v, device="cuda").softmax(-1)
    ids = torch.randint(0, v, (b, 1), device="cuda", dtype=torch.int32)
    outs = (torch.empty(b, 2, dtype=torch.int32, device="cuda"),
            torch.empty(b, dtype=torch.int32, device="cuda"),
            torch.empty(b, dtype=torch.int32, device="cuda"))
    one = torch.ones(1, dtype=torch.int64, device="cuda")
    m._chain_speculative_sampling_in_clusters(*outs, d, ids, t, one, one, c)
torch.cuda.synchronize()
print("done")
"""


@pytest.mark.gpu
@pytest.mark.slow
def test_memcheck_every_kernel_path():
    run_memcheck("speculative", _MEMCHECK_SCRIPT)
