"""The group's CUDA sources build for sm_90a through the real JIT pipeline (on every machine),
and, on the GPU, every kernel path runs clean under compute-sanitizer's memcheck."""

from __future__ import annotations

import pytest

from shared.testing.builds import compile_group_for_hopper, run_memcheck

MODULES = [
    "alloc_decode_cuda",
    "alloc_extend_cuda",
    "copy_blocks_cuda",
    "get_last_loc_cuda",
    "write_req_to_token_pool_cuda",
]


def test_cuda_sources_compile_for_sm90a():
    assert sorted(compile_group_for_hopper("memory")) == MODULES


# Every kernel with out-of-range values (skipped, never read or written out of bounds), int32 and
# int64 indices, batches past one 1024-request chunk, vector and byte copies.
_MEMCHECK_SCRIPT = """
import torch
from kernels_memory import (alloc_decode, alloc_extend, copy_blocks, get_last_loc,
                            write_req_to_token_pool)
dev = "cuda"
for dt in (torch.int32, torch.int64):
    table = torch.randint(0, 1000, (8, 64), device=dev, dtype=dt)
    rows = torch.tensor([0, 7, 9, -1, 3], device=dev, dtype=dt)
    lens = torch.tensor([0, 64, 3, 2, 65], device=dev, dtype=dt)
    get_last_loc(table, rows, lens)
    starts = torch.tensor([0, 60, 3, 0, 10], device=dev, dtype=dt)
    ends = torch.tensor([5, 70, 3, 4, 8], device=dev, dtype=dt)
    write_req_to_token_pool(table, rows, starts, ends, torch.arange(7, device=dev, dtype=dt))
    big = torch.zeros(300, 70, device=dev, dtype=dt)
    b_rows = torch.randperm(300, device=dev)[:250]
    b_starts = torch.randint(0, 70, (250,), device=dev)
    b_prefix = [torch.arange(int(k) % 90, device=dev, dtype=dt) for k in range(250)]
    none = torch.empty(0, device=dev, dtype=torch.int64)
    write_req_to_token_pool(big, b_rows, b_starts, b_starts + 0, none, prefixes=b_prefix)
    for b in (1, 5, 3000):
        seq = torch.randint(1, 100, (b,), device=dev, dtype=dt)
        last = torch.randint(-5, 100, (b,), device=dev, dtype=dt)
        for ps in (1, 16):
            alloc_decode(seq, last, torch.arange(b // 3, device=dev, dtype=dt), ps)
            pre = seq // 2
            alloc_extend(pre, seq, last, torch.arange(7, device=dev, dtype=dt) - 2, ps,
                         extend_num_tokens=int((seq - pre).sum()) + 3)
keys = [torch.randn(10, 4, 3, device=dev) for _ in range(3)]
vals = [torch.randn(10, 4, 3, device=dev).half() for _ in range(3)]
copy_blocks(keys, vals, torch.tensor([[0, 5], [3, 9], [-1, 2], [1, 10]], device=dev))
keys = [torch.randn(10, 4, 8, device=dev) for _ in range(2)]
copy_blocks(keys, [k.clone() for k in keys], torch.tensor([[0, 5], [3, 9]], device=dev))
torch.cuda.synchronize()
print("done")
"""


@pytest.mark.gpu
@pytest.mark.slow
def test_memcheck_every_kernel_path():
    run_memcheck("memory", _MEMCHECK_SCRIPT)
