"""The group's CUDA sources build for sm_90a through the real JIT pipeline (on every machine),
and, on the GPU, every kernel path runs clean under compute-sanitizer's memcheck."""

from __future__ import annotations

import pytest

from shared.testing.builds import compile_group_for_hopper, run_memcheck


def test_cuda_sources_compile_for_sm90a():
    assert sorted(compile_group_for_hopper("grammar")) == ["apply_token_bitmask_inplace_cuda"]


# One call per kernel path: each dtype, vector and scalar (misaligned) rows, int32/int64/no
# indices (out-of-range ones skipped), padded vocab, V around the 32-word slices, 1-D input.
_MEMCHECK_SCRIPT = """
import torch
from kernels_grammar import apply_token_bitmask_inplace
for dtype in (torch.float32, torch.float16, torch.bfloat16):
    for b, v in ((1, 1), (3, 33), (2, 1000), (4, 1024), (3, 1025), (2, 4099), (5, 128256)):
        w = (v + 31) // 32
        logits = torch.randn(b, v + 3, device="cuda").to(dtype)
        mask = torch.randint(-(2**31), 2**31 - 1, (b, w + 1), device="cuda", dtype=torch.int32)
        apply_token_bitmask_inplace(logits[:, :v], mask[:, :w].contiguous())
        apply_token_bitmask_inplace(logits[:, 1:v + 1], mask[:, :w].contiguous())
        apply_token_bitmask_inplace(logits[:, :v], mask, vocab_size=max(v - 7, 0))
        for ix in (torch.tensor([b - 1, 0, b - 1], device="cuda"),
                   torch.tensor([0, b, -1], device="cuda", dtype=torch.int32)):
            apply_token_bitmask_inplace(logits[:, :v], mask[:, :w].contiguous(), indices=ix)
        apply_token_bitmask_inplace(logits[0, :v].contiguous(), mask[0, :w].contiguous())
torch.cuda.synchronize()
print("done")
"""


@pytest.mark.gpu
@pytest.mark.slow
def test_memcheck_every_kernel_path():
    run_memcheck("grammar", _MEMCHECK_SCRIPT)
