"""The group's CUDA sources build for sm_90a through the real JIT pipeline (on every machine),
and, on the GPU, every kernel path runs clean under compute-sanitizer's memcheck."""

from __future__ import annotations

import pytest

from shared.testing.builds import compile_group_for_hopper, run_memcheck


def test_cuda_sources_compile_for_sm90a():
    assert sorted(compile_group_for_hopper("sampling")) == ["filters_cuda", "sampling_draw_cuda"]


# One call per kernel path: each op and mode (scalar/per-row parameters, keep-all, argmax set,
# invalid rows), the vector and scalar (odd V, misaligned view) loops, every dtype.
_MEMCHECK_SCRIPT = """
import torch
import kernels_sampling as ks
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for b, v in ((1, 1), (3, 129), (2, 4096), (2, 128256), (5, 333)):
        logits = torch.randn(b, v + 1, device="cuda") * 3
        probs = logits.softmax(dim=1).to(dtype)
        for x in (probs[:, :v], probs[:, 1:]):
            ks.top_k_renorm_probs(x, 5)
            ks.top_k_renorm_probs(x, torch.full((b,), v, device="cuda", dtype=torch.int32))
            ks.top_p_renorm_probs(x, 0.9)
            ks.top_p_renorm_probs(x, torch.tensor([0.0, 1.0, float("nan")] * b, device="cuda")[:b])
            ks.min_p_renorm_probs(x, 0.05)
            ks.min_p_renorm_probs(x, torch.full((b,), 2.0, device="cuda"))
            ks.top_k_mask_logits(logits[:, :v].to(dtype), 7)
            ks.top_k_mask_logits(logits[:, 1:].to(dtype), torch.full((b,), -1, device="cuda"))
            ks.sampling_from_probs(x, seed=1)
            idx = torch.tensor([0, b - 1, b, -1], device="cuda")  # out of range: invalid rows
            ks.sampling_from_probs(x, indices=idx, seed=2)
            for order in ("top_k_first", "joint"):
                ks.top_k_top_p_sampling_from_probs(x, 5, 0.9, filter_apply_order=order, seed=3)
                ks.top_k_top_p_sampling_from_probs(
                    x, torch.full((b,), v, device="cuda"), torch.full((b,), 0.0, device="cuda"),
                    filter_apply_order=order, seed=4,
                )
                ks.top_k_top_p_sampling_from_probs(x, 0, 0.5, filter_apply_order=order, seed=5)
torch.cuda.synchronize()
print("done")
"""


@pytest.mark.gpu
@pytest.mark.slow
def test_memcheck_every_kernel_path():
    run_memcheck("sampling", _MEMCHECK_SCRIPT)
