"""The group's CUDA sources build for sm_90a through the real JIT pipeline (on every machine),
and, on the GPU, every kernel path runs clean under compute-sanitizer's memcheck."""

from __future__ import annotations

import pytest

from shared.testing.builds import compile_group_for_hopper, run_memcheck


def test_cuda_sources_compile_for_sm90a():
    assert sorted(compile_group_for_hopper("kvcache")) == [
        "reshape_and_cache_flash_cuda",
        "set_mla_kv_buffer_cuda",
        "store_cache_cuda",
    ]


# One call per kernel path: vector and scalar (misaligned) bodies, same-dtype and fp8 caches,
# int32 and int64 slots, padding, skipped and out-of-range slots (which must never be touched).
_MEMCHECK_SCRIPT = """
import torch
from kernels_kvcache import reshape_and_cache_flash, set_mla_kv_buffer, store_cache
fp8 = torch.float8_e4m3fn
dev = "cuda"
for dtype in (torch.bfloat16, torch.float32):
    for idx_dtype in (torch.int32, torch.int64):
        n, s = 37, 64
        idx = torch.randperm(s, device=dev)[:n].to(idx_dtype)
        idx[0], idx[1], idx[2] = -1, s, s + 1000
        k = torch.randn(n, 1024, device=dev).to(dtype)
        v = torch.randn(n, 40, device=dev).to(dtype)
        for cache_dtype in (dtype, fp8):
            kc = torch.zeros(s, 1024, device=dev, dtype=cache_dtype)
            vc = torch.zeros(s, 40, device=dev, dtype=cache_dtype)
            sc = torch.ones(1, device=dev) * 0.5
            store_cache(k, v, kc, vc, idx, k_scale=sc, skip_index=int(idx[3]))
            store_cache(k[:, 1:], v[:, 1:], kc[:, 1:], vc[:, 1:], idx)
        key = torch.randn(n, 8, 128, device=dev).to(dtype)
        val = torch.randn(n, 8, 128, device=dev).to(dtype)
        kv = torch.zeros(4, 2, 16, 8, 128, device=dev, dtype=dtype)
        reshape_and_cache_flash(key, val, kv[:, 0], kv[:, 1], idx)
        hnd = torch.zeros(4, 8, 16, 128, device=dev, dtype=torch.uint8).permute(0, 2, 1, 3)
        reshape_and_cache_flash(key, val, hnd, hnd.clone(), idx, kv_cache_dtype="fp8")
        kc, vc = kv[:, 0, ..., 1:], kv[:, 1, ..., 1:]  # misaligned rows: the scalar path
        reshape_and_cache_flash(key[..., 1:], val[..., 1:], kc, vc, idx)
        lat = torch.randn(n, 1, 600, device=dev).to(dtype)
        for buf_dtype in (dtype, fp8):
            buf = torch.zeros(s, 1, 576, device=dev, dtype=buf_dtype)
            set_mla_kv_buffer(buf, idx, lat[..., :512], lat[..., 512:576])
            set_mla_kv_buffer(buf, idx, lat[..., 1:513], lat[..., 512:576])
# The bulk path (>= 2048 rows of 16-byte runs into caches of the input dtype): TMA bulk copies,
# for every run length (the default gate keeps these short-run and HND rows on the register path).
from kernels_kvcache.ops import reshape_and_cache_flash as rcf_mod
from kernels_kvcache.ops import set_mla_kv_buffer as mla_mod
from kernels_kvcache.ops import store_cache as sc_mod
for mod in (rcf_mod, mla_mod, sc_mod):
    mod._BULK_MIN_RUN_BYTES = 0
n, s = 2100, 4096
for idx_dtype in (torch.int32, torch.int64):
    idx = torch.randperm(s, device=dev)[:n].to(idx_dtype)
    idx[0], idx[1], idx[2] = -1, s, s + 1000
    k = torch.randn(n, 1024, device=dev).bfloat16()
    v = torch.randn(n, 40, device=dev).bfloat16()
    kc = torch.zeros(s, 1024, device=dev, dtype=torch.bfloat16)
    vc = torch.zeros(s, 40, device=dev, dtype=torch.bfloat16)
    store_cache(k, v, kc, vc, idx, skip_index=int(idx[3]))
    key = torch.randn(n, 8, 128, device=dev).bfloat16()
    kv = torch.zeros(s // 16, 2, 16, 8, 128, device=dev, dtype=torch.bfloat16)
    reshape_and_cache_flash(key, key, kv[:, 0], kv[:, 1], idx)
    hnd = torch.zeros(s // 16, 8, 16, 128, device=dev, dtype=torch.bfloat16).permute(0, 2, 1, 3)
    reshape_and_cache_flash(key, key, hnd, hnd.clone(), idx)
    lat = torch.randn(n, 1, 600, device=dev).bfloat16()
    buf = torch.zeros(s, 1, 576, device=dev, dtype=torch.bfloat16)
    set_mla_kv_buffer(buf, idx, lat[..., :512], lat[..., 512:576])
torch.cuda.synchronize()
print("done")
"""


@pytest.mark.gpu
@pytest.mark.slow
def test_memcheck_every_kernel_path():
    run_memcheck("kvcache", _MEMCHECK_SCRIPT)
