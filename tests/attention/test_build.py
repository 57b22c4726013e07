"""The group's CUDA sources build for sm_90a through the real JIT pipeline (on every machine),
and, on the GPU, every kernel path runs clean under compute-sanitizer's memcheck."""

from __future__ import annotations

import pytest

from shared.testing.builds import compile_group_for_hopper, run_memcheck


def test_cuda_sources_compile_for_sm90a():
    assert sorted(compile_group_for_hopper("attention")) == [
        "concat_mla_k_cuda",
        "merge_state_cuda",
        "rope_inplace_cuda",
    ]


# One call per kernel path: rope (NeoX/GPT-J x packed/scalar x fp32/bf16 cache x 1 or 4 heads per
# thread, out-of-range positions skipped), merge_state (packed/scalar, strided LSE and outputs),
# concat_mla_k (16/8/4/2/1-byte chunks, non-contiguous inputs).
_MEMCHECK_SCRIPT = """
import torch
from kernels_attention import concat_mla_k, merge_state, rope_inplace
dev = "cuda"
for dtype in (torch.bfloat16, torch.float32, torch.float16):
    for cache_dtype in (torch.float32, torch.bfloat16):
        for is_neox in (True, False):
            for t, hq, hk, d, r in ((1, 32, 8, 128, 128), (3, 4, 1, 128, 64), (5, 2, 2, 40, 18),
                                    (2, 3, 0, 64, 64), (20001, 5, 2, 128, 128)):
                qkv = torch.randn(t, (hq + 2 * hk) * d + 1, device=dev).to(dtype)
                for off in (0, 1):
                    x = qkv[:, off:off + (hq + 2 * hk) * d]
                    q = x[:, :hq * d].view(t, hq, d)
                    k = x[:, hq * d:(hq + hk) * d].view(t, hk, d) if hk else None
                    cache = torch.randn(100, r, device=dev).to(cache_dtype)
                    pos = torch.randint(-3, 103, (t,), device=dev)
                    rope_inplace(q, k, cache, pos, is_neox=is_neox, backend="cuda")
                    rope_inplace(q, k, cache, pos.int(), is_neox=is_neox, backend="cuda")
    for t, h, d in ((1, 1, 1), (3, 8, 64), (5, 16, 512), (4, 3, 129), (7, 128, 512), (2, 5, 6)):
        v_a = torch.randn(t, h, d + 1, device=dev).to(dtype)
        v_b = torch.randn(t, h, d, device=dev).to(dtype)
        s_a = torch.randn(t, h, device=dev)
        s_b = torch.randn(h, t, device=dev).t()
        merge_state(v_a[..., :d], s_a, v_b, s_b, backend="cuda")
        merge_state(v_a[..., 1:], s_a, v_b, s_b, backend="cuda")
        lse_t = torch.empty(h, t, device=dev).t()
        v_c = v_a[..., :d].contiguous()
        merge_state(v_c, s_a, v_b, s_b, out=v_b, out_lse=lse_t, backend="cuda")  # in place
for dtype in (torch.bfloat16, torch.float32, torch.float8_e4m3fn):
    for t, h, dn, dr in ((1, 1, 1, 1), (3, 128, 128, 64), (5, 12, 128, 64), (2, 96, 40, 24),
                         (7, 3, 5, 3)):
        for shift in (0, 1, 2, 4):
            nope = torch.randn(t, h, dn + 8, device=dev).to(dtype)[..., shift:shift + dn]
            rope = torch.randn(t, 1, dr + 8, device=dev).to(dtype)[..., shift:shift + dr]
            k = torch.empty(t, h, dn + dr + 8, device=dev, dtype=dtype)[..., shift:shift + dn + dr]
            concat_mla_k(k, nope, rope, backend="cuda")
        nope_t = torch.randn(h, t, dn, device=dev).to(dtype).transpose(0, 1)
        rope = torch.randn(t, 1, dr, device=dev).to(dtype)
        k = torch.empty(t, h, dn + dr, device=dev, dtype=dtype)
        concat_mla_k(k, nope_t, rope, backend="cuda")
torch.cuda.synchronize()
print("done")
"""


@pytest.mark.gpu
@pytest.mark.slow
def test_memcheck_every_kernel_path():
    run_memcheck("attention", _MEMCHECK_SCRIPT)
