"""The group's CUDA sources build for sm_90a through the real JIT pipeline (on every machine),
and, on the GPU, every kernel path runs clean under compute-sanitizer's memcheck."""

from __future__ import annotations

import pytest

from shared.testing.builds import compile_group_for_hopper, run_memcheck


def test_cuda_sources_compile_for_sm90a():
    assert sorted(compile_group_for_hopper("kv_canary")) == [
        "kv_canary_verify_cuda",
        "kv_canary_write_cuda",
    ]


# One call per kernel path: write in one launch (N <= 128) and two, 1-3 sources (staged reads of
# equal and unequal lengths, direct loads of unaligned words), verify with and without tokens,
# out-of-range slots (reported, never read).
_MEMCHECK_SCRIPT = """
import torch
from kernels_kv_canary import KVSource, kv_canary_verify, kv_canary_write
for n, ps in ((5, 16), (128, 1), (700, 16)):
    pages = (4 * n + ps - 1) // ps
    k = torch.randn(pages, ps, 8, 128, device="cuda").to(torch.bfloat16)
    mla = torch.randn(pages * ps, 20, device="cuda").to(torch.float8_e4m3fn)
    for sources in ([KVSource(k, ps, 2048, 2048)], [KVSource(k, ps, 2048, 2048),
                    KVSource(k, ps, 2048, 1040)], [KVSource(k, ps, 2048, 2048),
                    KVSource(k, ps, 2048, 1000), KVSource(mla, 1, 20, 13)]):
        canary = torch.zeros(pages * ps, 4, dtype=torch.int64, device="cuda")
        slots = torch.randperm(pages * ps, device="cuda")[:n]
        tokens = torch.arange(n, device="cuda")
        indptr = torch.tensor([0, n // 2, n], dtype=torch.int32, device="cuda")
        seeds = torch.tensor([-1, 3], device="cuda")
        kv_canary_write(canary, sources, slots, tokens, tokens, indptr, seeds)
        kv_canary_verify(canary, sources, slots, slots.roll(1), tokens, tokens)
        kv_canary_verify(canary, sources, slots, slots.roll(1), tokens, backend="cuda")
    bad = torch.tensor([pages * ps + 5, -3, 0], device="cuda")
    kv_canary_verify(canary, sources, bad, bad, bad, backend="cuda")
torch.cuda.synchronize()
print("done")
"""


@pytest.mark.gpu
@pytest.mark.slow
def test_memcheck_every_kernel_path():
    run_memcheck("kv_canary", _MEMCHECK_SCRIPT)
