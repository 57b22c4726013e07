"""The group's CUDA sources build for sm_90a through the real JIT pipeline (on every machine),
and, on the GPU, every kernel path runs clean under compute-sanitizer's memcheck."""

from __future__ import annotations

import pytest

from shared.testing.builds import compile_group_for_hopper, run_memcheck


def test_cuda_sources_compile_for_sm90a():
    assert sorted(compile_group_for_hopper("embeddings")) == [
        "scatter_embeddings_cuda",
        "vocab_parallel_embedding_cuda",
    ]


# One call per kernel path: vector and scalar (misaligned, odd width) bodies, int32/int64 ids and
# positions, out-of-shard and negative ids, mask scans over several tiles (aligned and not), mask
# counts that do not match M, positions outside [0, T) (skipped, never touched).
_MEMCHECK_SCRIPT = """
import torch
from kernels_embeddings import scatter_embeddings, vocab_parallel_embedding
dev = "cuda"
for dtype in (torch.bfloat16, torch.float32):
    w = torch.randn(50, 136, device=dev).to(dtype)
    for id_dtype in (torch.int32, torch.int64):
        ids = torch.randint(-5, 200, (37, 3), device=dev).to(id_dtype)
        vocab_parallel_embedding(ids, w[:, :128], 10, 40, 5, 100, 115)
        vocab_parallel_embedding(ids, w[:, 1:128], 10, 40, 5, 100, 115)
        vocab_parallel_embedding(ids.reshape(-1)[::2], w[:, :128], 0, 50)
    for t, m, h in ((1, 1, 8), (300, 120, 64), (9000, 5000, 24), (5000, 5000, 3)):
        e = torch.randn(t, h + 2, device=dev).to(dtype)
        mm = torch.randn(m + 7, h + 2, device=dev)
        pos = torch.randperm(t, device=dev)[:m]
        for p in (pos, pos.int()):
            scatter_embeddings(e[:, :h], mm[:m, :h], positions=p)
            scatter_embeddings(e[:, 1:h + 1], mm[:m, 2:h + 2], positions=p)
        bad = pos.clone()
        bad[0] = t + 100
        scatter_embeddings(e[:, :h], mm[:m, :h], positions=bad)
        mask = torch.zeros(t + 1, dtype=torch.bool, device=dev)
        mask[pos] = True
        scatter_embeddings(e[:, :h], mm[:m, :h], mask=mask[:t])
        scatter_embeddings(e[:, :h], mm[:, :h], mask=mask[:t])  # fewer True than rows
        scatter_embeddings(e[:, :h], mm[: max(m // 2, 1), :h], mask=mask[:t])  # more True
        if t > 1:  # a mask one byte past its allocation: the unaligned scan
            scatter_embeddings(e[1:, :h], mm[:m, :h], mask=mask[1:t])
torch.cuda.synchronize()
print("done")
"""


@pytest.mark.gpu
@pytest.mark.slow
def test_memcheck_every_kernel_path():
    run_memcheck("embeddings", _MEMCHECK_SCRIPT)
