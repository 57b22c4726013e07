"""kvcache.reshape_and_cache_flash against a loop over slots: block sizes 1/5/16, Hk 1-8, Dv != D,
padding slots, K/V halves of one cache tensor, fp8 (and uint8-stored fp8) caches, empty input,
out-of-range slots, bad arguments, opcheck."""

from __future__ import annotations

import pytest
import torch

from kernels_kvcache import reshape_and_cache_flash
from shared.testing.inputs import randn

FP8 = torch.float8_e4m3fn


def _expected(key, value, key_cache, value_cache, slots, conv=None):
    k_out, v_out = key_cache.clone(), value_cache.clone()
    bs = key_cache.shape[1]
    for i, slot in enumerate(slots.tolist()):
        if slot < 0:
            continue
        k_out[slot // bs, slot % bs] = conv(key[i]) if conv else key[i]
        v_out[slot // bs, slot % bs] = conv(value[i]) if conv else value[i]
    return k_out, v_out


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize(
    ("n", "blocks", "bs", "heads", "d", "dv"),
    [(1, 1, 1, 1, 8, 8), (6, 4, 16, 2, 64, 64), (11, 3, 5, 8, 24, 40), (20, 2, 16, 1, 256, 128)],
)
def test_matches_loop(dtype, n, blocks, bs, heads, d, dv):
    key, value = randn(n, heads, d, dtype=dtype, seed=1), randn(n, heads, dv, dtype=dtype, seed=2)
    key_cache = randn(blocks, bs, heads, d, dtype=dtype, seed=3)
    value_cache = randn(blocks, bs, heads, dv, dtype=dtype, seed=4)
    slots = torch.randperm(blocks * bs, generator=torch.Generator().manual_seed(n))[:n]
    slots[n // 2] = -1
    k_ref, v_ref = _expected(key, value, key_cache, value_cache, slots)
    reshape_and_cache_flash(key, value, key_cache, value_cache, slots)
    assert torch.equal(key_cache, k_ref) and torch.equal(value_cache, v_ref)


def test_kv_halves_of_one_tensor_and_strided_key():
    kv = torch.zeros(3, 2, 4, 2, 32, dtype=torch.float16)  # [NB, 2, bs, Hk, D]
    qkv = randn(5, 6, 32, dtype=torch.float16, seed=5)
    key, value = qkv[:, 2:4], qkv[:, 4:6]
    slots = torch.tensor([11, 0, -1, 5, 3], dtype=torch.int32)
    k_ref, v_ref = _expected(key, value, kv[:, 0], kv[:, 1], slots)
    reshape_and_cache_flash(key, value, kv[:, 0], kv[:, 1], slots)
    assert torch.equal(kv[:, 0], k_ref) and torch.equal(kv[:, 1], v_ref)


@pytest.mark.parametrize("storage", (FP8, torch.uint8), ids=str)
def test_fp8_cache(storage, e4m3):
    key = randn(4, 2, 16, dtype=torch.bfloat16, seed=6, scale=3)
    value = randn(4, 2, 16, dtype=torch.bfloat16, seed=7)
    key_cache = torch.zeros(2, 4, 2, 16, dtype=storage)
    value_cache = torch.zeros(2, 4, 2, 16, dtype=storage)
    slots = torch.tensor([7, -1, 0, 2])
    reshape_and_cache_flash(
        key,
        value,
        key_cache,
        value_cache,
        slots,
        kv_cache_dtype="fp8",
        k_scale=torch.tensor([0.05]),
        v_scale=torch.tensor([2.0]),
    )
    k8, v8 = key_cache.view(FP8).double(), value_cache.view(FP8).double()
    for i, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(k8[slot // 4, slot % 4], e4m3(key[i], 0.05))
            assert torch.equal(v8[slot // 4, slot % 4], e4m3(value[i], 2.0))
    assert (k8[1, 2] == 0).all()


def test_empty_and_out_of_range():
    kc, vc = torch.zeros(2, 4, 1, 8), torch.zeros(2, 4, 1, 8)
    reshape_and_cache_flash(
        torch.empty(0, 1, 8), torch.empty(0, 1, 8), kc, vc, torch.empty(0, dtype=torch.int64)
    )
    assert (kc == 0).all()
    with pytest.raises(
        ValueError,
        match=r"reshape_and_cache_flash: slot_mapping holds slot 8, outside the cache of 8 slots",
    ):
        reshape_and_cache_flash(
            torch.ones(2, 1, 8), torch.ones(2, 1, 8), kc, vc, torch.tensor([8, 1])
        )
    assert (kc == 0).all()


def test_bad_arguments():
    key, value = torch.ones(2, 2, 8), torch.ones(2, 2, 8)
    kc, vc = torch.zeros(3, 4, 2, 8), torch.zeros(3, 4, 2, 8)
    slots = torch.tensor([0, 1])
    with pytest.raises(
        TypeError,
        match="kv_cache_dtype='auto' needs key_cache of the input dtype float32, got bfloat16",
    ):
        reshape_and_cache_flash(key, value, kc.bfloat16(), vc, slots)
    with pytest.raises(
        TypeError, match="kv_cache_dtype='fp8' needs value_cache of dtype float8_e4m3fn"
    ):
        reshape_and_cache_flash(key, value, kc.to(FP8), vc, slots, kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match=r"kv_cache_dtype must be one of .*got 'int8'"):
        reshape_and_cache_flash(key, value, kc, vc, slots, kv_cache_dtype="int8")
    with pytest.raises(
        ValueError,
        match=r"key_cache \[num_blocks, block_size, Hk, D\] must match the input's "
        r"\[Hk, D\] = \[2, 8\]",
    ):
        reshape_and_cache_flash(key, value, torch.zeros(3, 4, 1, 8), vc, slots)
    with pytest.raises(ValueError, match="key_cache and value_cache must share"):
        reshape_and_cache_flash(key, value, kc, torch.zeros(2, 4, 2, 8), slots)
    with pytest.raises(ValueError, match=r"key must have 3 dims, got shape \(2, 16\)"):
        reshape_and_cache_flash(key.reshape(2, 16), value, kc, vc, slots)


def test_opcheck():
    from kernels_kvcache.ops.reshape_and_cache_flash import RESHAPE_AND_CACHE_FLASH

    key, value = randn(3, 2, 16, seed=1), randn(3, 2, 8, seed=2)
    kc, vc = torch.zeros(2, 4, 2, 16), torch.zeros(2, 4, 2, 8)
    args = (kc, vc, key, value, torch.tensor([5, -1, 2]), "auto", None, None, None)
    torch.library.opcheck(RESHAPE_AND_CACHE_FLASH.torch_op, args)


# ------------------------------------------------------------------------------------------------
# The CUDA backend against the torch reference on the GPU: caches poisoned first, compared byte
# for byte; NHD and HND layouts, K/V halves of one tensor, fp8 and uint8 caches, odd shapes.

GPU = pytest.mark.gpu


def _op_module():
    from kernels_kvcache.ops import reshape_and_cache_flash as mod

    return mod


def _poison(t):
    if t.dtype in (FP8, torch.uint8):
        t.view(torch.uint8).fill_(0x7F)
    else:
        t.fill_(float("nan"))
    return t


def _caches(blocks, bs, heads, d, dv, dtype, layout):
    """(key_cache, value_cache) [NB, bs, Hk, D] views: separate NHD tensors, HND tensors seen
    through a permute, or the K/V halves of one [NB, 2, bs, Hk, D] tensor."""
    if layout == "nhd":
        kc = torch.empty(blocks, bs, heads, d, dtype=dtype, device="cuda")
        vc = torch.empty(blocks, bs, heads, dv, dtype=dtype, device="cuda")
    elif layout == "hnd":
        kc = torch.empty(blocks, heads, bs, d, dtype=dtype, device="cuda").permute(0, 2, 1, 3)
        vc = torch.empty(blocks, heads, bs, dv, dtype=dtype, device="cuda").permute(0, 2, 1, 3)
    else:
        kv = torch.empty(blocks, 2, bs, heads, d, dtype=dtype, device="cuda")
        kc, vc = kv[:, 0], kv[:, 1]
    return _poison(kc), _poison(vc)


def _bytes(t):
    return t.contiguous().view(torch.uint8)


def _run_both(key, value, kc, vc, slots, **kw):
    k_ref, v_ref = kc.clone(), vc.clone()
    valid = slots.clone()
    valid[valid >= kc.shape[0] * kc.shape[1]] = -1  # the reference raises; the kernel skips
    reshape_and_cache_flash(key, value, k_ref, v_ref, valid, backend="torch", **kw)
    reshape_and_cache_flash(key, value, kc, vc, slots, backend="cuda", **kw)
    torch.cuda.synchronize()
    assert torch.equal(_bytes(kc), _bytes(k_ref)) and torch.equal(_bytes(vc), _bytes(v_ref))


@GPU
@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize(
    ("n", "blocks", "bs", "heads", "d", "dv"),
    [(1, 1, 1, 1, 8, 8), (6, 4, 16, 2, 64, 64), (11, 3, 5, 8, 24, 40), (20, 2, 16, 1, 256, 128),
     (300, 40, 16, 8, 128, 128), (77, 9, 64, 3, 7, 5)],
)  # fmt: skip
@pytest.mark.parametrize("layout", ("nhd", "hnd", "halves"))
@pytest.mark.parametrize("cache", ("auto", "fp8", "uint8"))
def test_cuda_matches_reference(dtype, n, blocks, bs, heads, d, dv, layout, cache):
    if layout == "halves" and d != dv:
        dv = d
    key = randn(n, heads, d, dtype=dtype, device="cuda", seed=1, scale=20)
    value = randn(n, heads, dv, dtype=dtype, device="cuda", seed=2)
    cache_dtype = {"auto": dtype, "fp8": FP8, "uint8": torch.uint8}[cache]
    kc, vc = _caches(blocks, bs, heads, d, dv, cache_dtype, layout)
    slots = torch.randperm(blocks * bs, generator=torch.Generator().manual_seed(n))[:n]
    slots[n // 2] = -1
    kw = {}
    if cache != "auto":
        kw = {"kv_cache_dtype": "fp8", "k_scale": torch.tensor([0.3], device="cuda")}
    _run_both(key, value, kc, vc, slots.cuda(), **kw)


@GPU
def test_cuda_strided_inputs_int32_slots_and_out_of_range():
    qkv = randn(50, 12, 64, dtype=torch.bfloat16, device="cuda", seed=5)
    key, value = qkv[:, 4:8], qkv[:, 8:12]
    kc, vc = _caches(8, 16, 4, 64, 64, torch.bfloat16, "halves")
    slots = torch.randperm(128, generator=torch.Generator().manual_seed(5))[:50]
    slots[3], slots[4], slots[9] = 128, 10**6, -1
    _run_both(key, value, kc, vc, slots.to(torch.int32).cuda())


@GPU
def test_cuda_graph_capture_and_compile():
    key = randn(16, 8, 128, dtype=torch.bfloat16, device="cuda", seed=6)
    value = randn(16, 8, 128, dtype=torch.bfloat16, device="cuda", seed=7)
    kc, vc = _caches(4, 16, 8, 128, 128, torch.bfloat16, "nhd")
    slots = torch.randperm(64, device="cuda")[:16]
    reshape_and_cache_flash(key, value, kc, vc, slots)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        reshape_and_cache_flash(key, value, kc, vc, slots)
    key.copy_(randn(16, 8, 128, dtype=torch.bfloat16, device="cuda", seed=8))
    graph.replay()
    torch.cuda.synchronize()
    flat_k = kc.reshape(64, 8, 128)
    assert torch.equal(flat_k[slots], key)

    def write(key, value, kc, vc, slots):
        reshape_and_cache_flash(key * 2, value, kc, vc, slots)

    torch.compile(write, fullgraph=True)(key, value, kc, vc, slots)
    assert torch.equal(flat_k[slots], key * 2)


@GPU
def test_cuda_opcheck():
    from kernels_kvcache.ops.reshape_and_cache_flash import RESHAPE_AND_CACHE_FLASH

    key = randn(3, 2, 16, device="cuda", seed=1)
    value = randn(3, 2, 8, device="cuda", seed=2)
    kc = torch.zeros(2, 4, 2, 16, device="cuda")
    vc = torch.zeros(2, 4, 2, 8, device="cuda")
    slots = torch.tensor([5, -1, 2], device="cuda")
    args = (kc, vc, key, value, slots, "auto", None, None, None)
    torch.library.opcheck(RESHAPE_AND_CACHE_FLASH.torch_op, args)


# The bulk path (kv_write.cuh) from 2048 rows for caches of the input dtype: NHD heads move as one
# run per token, HND heads as one run each (block stride apart), K/V halves of one tensor; block
# sizes 16 and 5 (the divmod), D != Dv, 48- and 80-byte runs; 2047 rows stay on the register path.
# Any run length here (_BULK_MIN_RUN_BYTES = 0: the default keeps HND and short runs off the path).
@GPU
@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize(
    ("n", "blocks", "bs", "heads", "d", "dv"),
    [(2047, 160, 16, 8, 128, 128), (2048, 160, 16, 8, 128, 128), (3333, 900, 5, 3, 40, 24),
     (2100, 40, 64, 1, 256, 128)],
)  # fmt: skip
@pytest.mark.parametrize("layout", ("nhd", "hnd", "halves"))
@pytest.mark.parametrize("index_dtype", (torch.int32, torch.int64), ids=str)
def test_cuda_bulk_path_matches_reference(
    monkeypatch, dtype, n, blocks, bs, heads, d, dv, layout, index_dtype
):
    monkeypatch.setattr(_op_module(), "_BULK_MIN_RUN_BYTES", 0)
    if layout == "halves" and d != dv:
        dv = d
    key = randn(n, heads, d, dtype=dtype, device="cuda", seed=21, scale=20)
    value = randn(n, heads, dv, dtype=dtype, device="cuda", seed=22)
    kc, vc = _caches(blocks, bs, heads, d, dv, dtype, layout)
    slots = torch.randperm(blocks * bs, generator=torch.Generator().manual_seed(n))[:n]
    slots[n // 2], slots[3], slots[n - 1] = -1, blocks * bs, -5  # padding, out of range
    _run_both(key, value, kc, vc, slots.to(index_dtype).cuda())


@GPU
def test_cuda_bulk_path_fp8_stays_exact():
    n = 2500
    key = randn(n, 8, 128, dtype=torch.bfloat16, device="cuda", seed=23, scale=20)
    value = randn(n, 8, 128, dtype=torch.bfloat16, device="cuda", seed=24)
    kc, vc = _caches(200, 16, 8, 128, 128, FP8, "hnd")
    slots = torch.randperm(3200, generator=torch.Generator().manual_seed(25))[:n]
    slots[0] = -1
    kw = {"kv_cache_dtype": "fp8", "k_scale": torch.tensor([0.3], device="cuda")}
    _run_both(key, value, kc, vc, slots.cuda(), **kw)


# The bulk gate (_BULK_MIN_ROWS, _BULK_MAX_ROWS, _BULK_MIN_RUN_BYTES, read each call): by default
# NHD caches (a token's heads one run: 2 KB at 8 x 128 bf16) and K/V halves of one tensor take the
# bulk kernel from 2048 rows, HND caches (256-byte head runs) the register kernel; each setting's
# edge from both sides, forced on and off. (attributes, n, layout, heads, d, bulk expected)
_DEFAULT = {}
_GATE_CASES = [
    (_DEFAULT, 2048, "nhd", 8, 128, True),
    (_DEFAULT, 2047, "nhd", 8, 128, False),
    (_DEFAULT, 2048, "halves", 8, 128, True),
    (_DEFAULT, 4096, "hnd", 8, 128, False),
    (_DEFAULT, 2048, "nhd", 8, 64, True),  # 1024-byte runs: the edge
    (_DEFAULT, 2048, "nhd", 8, 56, False),  # 896-byte runs
    ({"_BULK_MIN_RUN_BYTES": 0}, 4096, "hnd", 8, 128, True),
    ({"_BULK_MIN_RUN_BYTES": 256}, 2048, "hnd", 8, 128, True),
    ({"_BULK_MIN_RUN_BYTES": 257}, 2048, "hnd", 8, 128, False),
    ({"_BULK_MIN_ROWS": -1}, 4096, "nhd", 8, 128, False),
    ({"_BULK_MIN_ROWS": 0}, 1, "nhd", 8, 128, True),
    ({"_BULK_MIN_ROWS": 0}, 40, "nhd", 8, 128, True),
    ({"_BULK_MAX_ROWS": 3000}, 3000, "nhd", 8, 128, True),
    ({"_BULK_MAX_ROWS": 3000}, 3001, "nhd", 8, 128, False),
]


@GPU
@pytest.mark.parametrize(("attrs", "n", "layout", "heads", "d", "bulk"), _GATE_CASES, ids=str)
def test_cuda_bulk_gate(monkeypatch, ran_bulk, attrs, n, layout, heads, d, bulk):
    for name, value in attrs.items():
        monkeypatch.setattr(_op_module(), name, value)
    key = randn(n, heads, d, dtype=torch.bfloat16, device="cuda", seed=41, scale=20)
    value = randn(n, heads, d, dtype=torch.bfloat16, device="cuda", seed=42)
    blocks = (n + 100) // 16 + 1
    kc, vc = _caches(blocks, 16, heads, d, d, torch.bfloat16, layout)
    slots = torch.randperm(blocks * 16, generator=torch.Generator().manual_seed(n))[:n]
    if n > 2:
        slots[n // 2] = -1  # padding
    slots = slots.cuda()
    assert ran_bulk(lambda: _run_both(key, value, kc, vc, slots)) == bulk
