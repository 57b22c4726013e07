"""The group's CUDA sources build for sm_90a through the real JIT pipeline (on every machine),
and, on the GPU, every kernel path runs clean under compute-sanitizer's memcheck."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from shared.testing.builds import compile_group_for_hopper

ROOT = Path(__file__).resolve().parents[2]


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
    sanitizer = shutil.which("compute-sanitizer")
    if sanitizer is None:
        cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
        candidate = Path(cuda_home) / "bin" / "compute-sanitizer"
        sanitizer = str(candidate) if candidate.exists() else None
    if sanitizer is None:
        pytest.skip("compute-sanitizer not found (CUDA_HOME/bin or PATH)")
    compile_group_for_hopper("embeddings")  # build outside the sanitizer (same cache dir)
    result = subprocess.run(
        [
            sanitizer,
            "--tool",
            "memcheck",
            "--error-exitcode",
            "3",
            sys.executable,
            "-c",
            textwrap.dedent(_MEMCHECK_SCRIPT),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert result.returncode == 0 and "done" in result.stdout, (
        result.stdout[-4000:] + result.stderr[-4000:]
    )
