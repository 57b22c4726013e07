"""The group's CUDA sources build for sm_90a through the real JIT pipeline (on every machine),
and, on the GPU, every kernel path runs clean under compute-sanitizer's memcheck."""

from __future__ import annotations

import pytest

from shared.testing.builds import compile_group_for_hopper, run_memcheck


def test_cuda_sources_compile_for_sm90a():
    assert sorted(compile_group_for_hopper("lplb")) == ["lplb_dispatch_cuda", "solve_lp_cuda"]


# One call per kernel path: solve_lp with A in shared memory (fp32, fp64) and in global memory,
# the trivial m = 0 / n = 0 problems, infeasible and iteration-limited problems; lplb_dispatch with
# default and given counts, int64 ids, negative and out-of-range ids, and a broken layout; the draw
# alone on given shares (int32/int64, no slots, a broken layout).
_MEMCHECK_SCRIPT = """
import torch
from kernels_lplb import lplb_dispatch, solve_lp
from kernels_lplb.ops.lplb_dispatch import replicated_layout
g = torch.Generator().manual_seed(0)
for p, m, n, dtype in ((3, 4, 9, torch.float32), (2, 40, 74, torch.float64),
                       (1, 150, 300, torch.float32), (2, 7, 3, torch.float32)):
    a = torch.randn(p, m, n, generator=g, dtype=dtype)
    x0 = torch.rand(p, n, generator=g, dtype=dtype)
    b = (a @ x0[..., None])[..., 0]
    c = torch.rand(p, n, generator=g, dtype=dtype)
    solve_lp(a.cuda(), b.cuda(), c.cuda())
    solve_lp(a.cuda(), -b.abs().cuda() - 1, c.cuda(), max_iters=3)
solve_lp(torch.empty(2, 0, 3, device="cuda"), torch.empty(2, 0, device="cuda"),
         torch.ones(2, 3, device="cuda"))
solve_lp(torch.empty(2, 2, 0, device="cuda"), torch.ones(2, 2, device="cuda"),
         torch.empty(2, 0, device="cuda"))
phy2log, log2phy = replicated_layout(256, 32, 8)
topk = torch.randint(-1, 256, (1000, 8), generator=g, dtype=torch.int32)
counts = torch.randint(0, 100, (256,), generator=g)
for ids, p2l, l2p, cnt in ((topk, phy2log, log2phy, None), (topk, phy2log, log2phy, counts),
                           (topk.long(), phy2log.long(), log2phy.long(), counts.float())):
    lplb_dispatch(ids.cuda(), p2l.cuda(), l2p.cuda(), 8, counts=None if cnt is None else cnt.cuda())
bad = topk.clone()
bad[0, 0] = 300
lplb_dispatch(bad.cuda(), (phy2log + 1000).cuda(), log2phy.cuda(), 8)
_, shares = lplb_dispatch(topk.cuda(), phy2log.cuda(), log2phy.cuda(), 8)
broken = torch.where(log2phy >= 0, log2phy + 5000, -1)  # the draw alone: any values stay in bounds
for ids, l2p in ((topk, log2phy), (topk.long(), log2phy.long()), (topk[:0], log2phy),
                 (bad, broken)):
    lplb_dispatch(ids.cuda(), phy2log.cuda(), l2p.cuda(), 8, shares=shares)
torch.cuda.synchronize()
print("done")
"""


@pytest.mark.gpu
@pytest.mark.slow
def test_memcheck_every_kernel_path():
    run_memcheck("lplb", _MEMCHECK_SCRIPT)
