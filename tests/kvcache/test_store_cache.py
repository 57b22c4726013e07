"""kvcache.store_cache against a row-by-row loop: Llama-3-8B widths and odd widths, Dv != D, padding
and skipped slots, fp8 caches with scales, strided inputs, empty input, out-of-range slots, bad
arguments, opcheck and torch.compile."""

from __future__ import annotations

import pytest
import torch

from kernels_kvcache import store_cache
from shared.testing.compare import assert_close
from shared.testing.inputs import randn

FP8 = torch.float8_e4m3fn


def _expected(k, v, k_cache, v_cache, indices, skip=-1, conv_k=None, conv_v=None):
    k_out, v_out = k_cache.clone(), v_cache.clone()
    for i, slot in enumerate(indices.tolist()):
        if slot < 0 or slot == skip:
            continue
        k_out[slot] = conv_k(k[i]) if conv_k else k[i]
        v_out[slot] = conv_v(v[i]) if conv_v else v[i]
    return k_out, v_out


def _slots(n: int, s: int, seed: int) -> torch.Tensor:
    idx = torch.randperm(s, generator=torch.Generator().manual_seed(seed))[:n]
    idx[:: max(n // 3, 1)] = -1  # padding rows
    return idx


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize(
    ("n", "wk", "wv", "s"),
    [(1, 1024, 1024, 4), (7, 1024, 1024, 64), (13, 96, 40, 30), (5, 3, 5, 9)],
)
@pytest.mark.parametrize("index_dtype", (torch.int32, torch.int64), ids=str)
def test_matches_loop(dtype, n, wk, wv, s, index_dtype):
    k, v = randn(n, wk, dtype=dtype, seed=1), randn(n, wv, dtype=dtype, seed=2)
    k_cache, v_cache = randn(s, wk, dtype=dtype, seed=3), randn(s, wv, dtype=dtype, seed=4)
    idx = _slots(n, s, seed=n).to(index_dtype)
    k_ref, v_ref = _expected(k, v, k_cache, v_cache, idx)
    assert store_cache(k, v, k_cache, v_cache, idx) is None
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)


def test_skip_index_zero_like_sglang():
    k, v = randn(4, 16, seed=1), randn(4, 16, seed=2)
    k_cache, v_cache = torch.zeros(8, 16), torch.zeros(8, 16)
    idx = torch.tensor([0, 3, 0, 5])
    store_cache(k, v, k_cache, v_cache, idx, skip_index=0)
    assert (
        (k_cache[0] == 0).all() and torch.equal(k_cache[3], k[1]) and torch.equal(v_cache[5], v[3])
    )


def test_fp8_cache_with_scales(e4m3):
    k, v = (
        randn(9, 64, dtype=torch.bfloat16, seed=5, scale=4),
        randn(9, 32, dtype=torch.bfloat16, seed=6),
    )
    k_cache = torch.zeros(16, 64, dtype=FP8)
    v_cache = torch.zeros(16, 32, dtype=FP8)
    idx = _slots(9, 16, seed=7)
    store_cache(k, v, k_cache, v_cache, idx, k_scale=torch.tensor([0.01]), v_scale=None)
    for i, slot in enumerate(idx.tolist()):
        if slot >= 0:
            assert_close(k_cache[slot].double(), e4m3(k[i], 0.01), atol=0, rtol=0)
            assert_close(v_cache[slot].double(), e4m3(v[i]), atol=0, rtol=0)
    assert (k_cache.double().abs() == 448).any()  # |k| / 0.01 saturates


def test_strided_inputs_and_cache_views():
    qkv = randn(6, 3 * 128, dtype=torch.float16, seed=8)
    k, v = qkv[:, 128:256], qkv[:, 256:]  # views into a fused qkv buffer
    pool = torch.zeros(10, 2, 128, dtype=torch.float16)
    k_cache, v_cache = pool[:, 0], pool[:, 1]
    idx = torch.tensor([9, 2, -1, 4, 0, 7])
    k_ref, v_ref = _expected(k, v, k_cache, v_cache, idx)
    store_cache(k, v, k_cache, v_cache, idx)
    assert torch.equal(pool[:, 0], k_ref) and torch.equal(pool[:, 1], v_ref)


def test_empty_leaves_caches_untouched():
    k_cache, v_cache = randn(4, 8, seed=1), randn(4, 8, seed=2)
    before = k_cache.clone(), v_cache.clone()
    store_cache(
        torch.empty(0, 8), torch.empty(0, 8), k_cache, v_cache, torch.empty(0, dtype=torch.int64)
    )
    assert torch.equal(k_cache, before[0]) and torch.equal(v_cache, before[1])


def test_out_of_range_slot_raises():
    k_cache, v_cache = torch.zeros(4, 8), torch.zeros(4, 8)
    with pytest.raises(
        ValueError, match=r"store_cache: indices holds slot 4, outside the cache of 4 slots"
    ):
        store_cache(torch.ones(2, 8), torch.ones(2, 8), k_cache, v_cache, torch.tensor([1, 4]))
    assert (k_cache == 0).all()  # checked before any write


def test_bad_arguments():
    k, v = torch.ones(2, 8), torch.ones(2, 8)
    kc, vc = torch.zeros(4, 8), torch.zeros(4, 8)
    idx = torch.tensor([0, 1])
    with pytest.raises(
        TypeError,
        match=r"k_cache must have the dtype of its input rows \(float32\) or float8_e4m3fn, "
        r"got float16",
    ):
        store_cache(k, v, kc.half(), vc, idx)
    with pytest.raises(
        ValueError,
        match=r"v_cache rows must be as wide as v rows \(8\), got v_cache shape \(4, 6\)",
    ):
        store_cache(k, v, kc, torch.zeros(4, 6), idx)
    with pytest.raises(
        ValueError, match=r"indices must have one slot per input row \(2\), got shape \(3,\)"
    ):
        store_cache(k, v, kc, vc, torch.tensor([0, 1, 2]))
    with pytest.raises(
        TypeError, match=r"indices must have dtype in \(int32, int64\), got float32"
    ):
        store_cache(k, v, kc, vc, idx.float())
    with pytest.raises(ValueError, match=r"k_scale must hold exactly one fp32 value"):
        store_cache(k, v, kc.to(FP8), vc, idx, k_scale=torch.ones(2))
    with pytest.raises(TypeError, match=r"v must have dtype in \(float32\), got float16"):
        store_cache(k, v.half(), kc, vc, idx)
    with pytest.raises(
        ValueError, match="k_cache and v_cache must have the same number of slots S"
    ):
        store_cache(k, v, kc, torch.zeros(5, 8), idx)


def test_opcheck():
    from kernels_kvcache.ops.store_cache import STORE_CACHE

    k, v = randn(5, 32, dtype=torch.bfloat16), randn(5, 16, dtype=torch.bfloat16, seed=1)
    kc = torch.zeros(8, 32, dtype=torch.bfloat16)
    vc = torch.zeros(8, 16, dtype=torch.bfloat16)
    idx = torch.tensor([7, 1, -1, 3, 0])
    torch.library.opcheck(STORE_CACHE.torch_op, (kc, vc, k, v, idx, None, None, -1, None))


def test_torch_compile_fullgraph():
    """Inductor, so the mutating custom op is functionalised and lowered (about 5 s on CPU)."""

    def write(k, v, k_cache, v_cache, idx):
        store_cache(k * 2, v, k_cache, v_cache, idx)
        return k_cache.sum()

    k, v = randn(4, 16, seed=1), randn(4, 16, seed=2)
    k_cache, v_cache = torch.zeros(6, 16), torch.zeros(6, 16)
    idx = torch.tensor([5, -1, 0, 2])
    k_ref, v_ref = _expected(k * 2, v, k_cache, v_cache, idx)
    total = torch.compile(write, fullgraph=True)(k, v, k_cache, v_cache, idx)
    assert torch.equal(k_cache, k_ref) and torch.equal(v_cache, v_ref)
    assert_close(total, k_ref.sum())


# ------------------------------------------------------------------------------------------------
# The CUDA backend against the torch reference on the GPU: caches poisoned first (NaN, or the fp8
# NaN byte), compared byte for byte, so a write to a wrong slot or a missed row shows.

GPU = pytest.mark.gpu


def _op_module():
    from kernels_kvcache.ops import store_cache as mod

    return mod


def _poisoned(s, w, dtype, device="cuda"):
    cache = torch.empty(s, w, dtype=dtype, device=device)
    cache.view(torch.uint8).fill_(0x7F) if dtype == FP8 else cache.fill_(float("nan"))
    return cache


def _bytes(t):
    return t.contiguous().view(torch.uint8)


def _run_both(k, v, k_cache, v_cache, idx, **kw):
    """Run the torch reference on clones and the CUDA backend in place; assert equal bytes."""
    k_ref, v_ref = k_cache.clone(), v_cache.clone()
    valid = idx.clone()
    valid[valid >= k_cache.shape[0]] = -1  # the reference raises on these; the kernel skips them
    store_cache(k, v, k_ref, v_ref, valid, backend="torch", **kw)
    store_cache(k, v, k_cache, v_cache, idx, backend="cuda", **kw)
    torch.cuda.synchronize()
    assert torch.equal(_bytes(k_cache), _bytes(k_ref))
    assert torch.equal(_bytes(v_cache), _bytes(v_ref))


@GPU
@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize(
    ("n", "wk", "wv", "s"),
    [(1, 1024, 1024, 4), (7, 1024, 1024, 64), (13, 96, 40, 30), (5, 3, 5, 9), (517, 1024, 1024,
     4099), (33, 1000, 8, 50), (64, 2048, 576, 333)],
)  # fmt: skip
@pytest.mark.parametrize("index_dtype", (torch.int32, torch.int64), ids=str)
@pytest.mark.parametrize("fp8", (False, True), ids=("same", "fp8"))
def test_cuda_matches_reference(dtype, n, wk, wv, s, index_dtype, fp8):
    k = randn(n, wk, dtype=dtype, device="cuda", seed=1, scale=30)
    v = randn(n, wv, dtype=dtype, device="cuda", seed=2)
    cache_dtype = FP8 if fp8 else dtype
    k_cache, v_cache = _poisoned(s, wk, cache_dtype), _poisoned(s, wv, cache_dtype)
    idx = _slots(n, s, seed=n).to(index_dtype).cuda()
    scales = {}
    if fp8:
        scales = {"k_scale": torch.tensor([0.07], device="cuda"), "v_scale": None}
    _run_both(k, v, k_cache, v_cache, idx, **scales)


@GPU
def test_cuda_skip_index_out_of_range_and_strided_views():
    qkv = randn(40, 3 * 128, dtype=torch.bfloat16, device="cuda", seed=3)
    k, v = qkv[:, 128:256], qkv[:, 256:]
    pool = torch.full((64, 2, 128), float("nan"), dtype=torch.bfloat16, device="cuda")
    idx = torch.randperm(64, generator=torch.Generator().manual_seed(3))[:40]
    idx[5], idx[6], idx[7] = 64, 2**40, -7  # out of range (skipped on the GPU), padding
    _run_both(k, v, pool[:, 0], pool[:, 1], idx.cuda(), skip_index=int(idx[0]))


@GPU
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
def test_cuda_misaligned_rows_take_scalar_path(dtype):
    from shared.testing.inputs import misaligned

    k = misaligned(randn(9, 128, dtype=dtype, device="cuda", seed=4))
    v = randn(9, 128, dtype=dtype, device="cuda", seed=5)
    k_cache, v_cache = _poisoned(20, 128, dtype), _poisoned(20, 128, dtype)
    _run_both(k, v, k_cache, v_cache, torch.arange(9, device="cuda") * 2)
    k8, v8 = _poisoned(20, 128, FP8), _poisoned(20, 128, FP8)
    _run_both(k, v, k8, v8, torch.arange(9, device="cuda") * 2, v_scale=torch.ones(1).cuda() * 3)


@GPU
def test_cuda_graph_capture_and_compile():
    k = randn(16, 1024, dtype=torch.bfloat16, device="cuda", seed=6)
    v = randn(16, 1024, dtype=torch.bfloat16, device="cuda", seed=7)
    k_cache, v_cache = _poisoned(64, 1024, torch.bfloat16), _poisoned(64, 1024, torch.bfloat16)
    idx = torch.randperm(64, device="cuda")[:16]
    store_cache(k, v, k_cache, v_cache, idx)  # build and load outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        store_cache(k, v, k_cache, v_cache, idx)
    k.copy_(randn(16, 1024, dtype=torch.bfloat16, device="cuda", seed=8))
    idx.copy_(torch.randperm(64, device="cuda")[:16])
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(k_cache[idx.long()], k) and torch.equal(v_cache[idx.long()], v)

    def write(k, v, k_cache, v_cache, idx):
        store_cache(k * 2, v, k_cache, v_cache, idx)

    torch.compile(write, fullgraph=True)(k, v, k_cache, v_cache, idx)
    assert torch.equal(k_cache[idx.long()], k * 2)


@GPU
def test_cuda_opcheck():
    from kernels_kvcache.ops.store_cache import STORE_CACHE

    k = randn(5, 32, dtype=torch.bfloat16, device="cuda")
    v = randn(5, 16, dtype=torch.bfloat16, device="cuda", seed=1)
    kc = torch.zeros(8, 32, dtype=torch.bfloat16, device="cuda")
    vc = torch.zeros(8, 16, dtype=torch.bfloat16, device="cuda")
    idx = torch.tensor([7, 1, -1, 3, 0], device="cuda")
    torch.library.opcheck(STORE_CACHE.torch_op, (kc, vc, k, v, idx, None, None, -1, None))


# The bulk path (kv_write.cuh: TMA bulk copies through shared-memory stages) from 2048 rows, for
# caches of the input dtype with 16-byte runs and rows of at most 16 KiB; 2047 rows, fp8 caches,
# misaligned rows and wider rows stay on the register path. Row sizes pick the stage counts: 4 KiB
# (8 stages), 272 B (16), 10.25 KiB fp32 (4); row counts not multiples of 32 or of the grid. Any
# run length here (_BULK_MIN_RUN_BYTES = 0: the default keeps the short 96 + 40 rows off the path).
@GPU
@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize(
    ("n", "wk", "wv", "s"),
    [(2047, 1024, 1024, 4096), (2048, 1024, 1024, 4096), (4099, 1024, 1024, 9000),
     (3001, 96, 40, 6000), (2500, 2048, 576, 4000), (2048, 4096, 1024, 2100)],
)  # fmt: skip
@pytest.mark.parametrize("index_dtype", (torch.int32, torch.int64), ids=str)
def test_cuda_bulk_path_matches_reference(monkeypatch, dtype, n, wk, wv, s, index_dtype):
    monkeypatch.setattr(_op_module(), "_BULK_MIN_RUN_BYTES", 0)
    k = randn(n, wk, dtype=dtype, device="cuda", seed=11)
    v = randn(n, wv, dtype=dtype, device="cuda", seed=12)
    k_cache, v_cache = _poisoned(s, wk, dtype), _poisoned(s, wv, dtype)
    idx = _slots(n, s, seed=n + 1)
    idx[7], idx[40], idx[n - 1] = s, s + 12345, -3  # out of range (skipped on the GPU), padding
    _run_both(k, v, k_cache, v_cache, idx.to(index_dtype).cuda(), skip_index=int(idx[100]))


@GPU
def test_cuda_bulk_path_strided_views_fp8_and_misaligned():
    n, s = 2600, 4000
    qkv = randn(n, 3 * 512, dtype=torch.bfloat16, device="cuda", seed=13)
    k, v = qkv[:, 512:1024], qkv[:, 1024:]  # views into a fused qkv buffer
    pool = torch.full((s, 2, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    idx = _slots(n, s, seed=14)
    idx[5], idx[6] = 2**40, s  # int64 slots far out of range: skipped
    idx = idx.cuda()
    _run_both(k, v, pool[:, 0], pool[:, 1], idx)
    k8, v8 = _poisoned(s, 512, FP8), _poisoned(s, 512, FP8)  # fp8: the register path
    _run_both(k, v, k8, v8, idx, k_scale=torch.tensor([0.05], device="cuda"))
    from shared.testing.inputs import misaligned

    km = misaligned(randn(n, 128, dtype=torch.float16, device="cuda", seed=15))
    vm = randn(n, 128, dtype=torch.float16, device="cuda", seed=16)
    kc, vc = _poisoned(s, 128, torch.float16), _poisoned(s, 128, torch.float16)
    _run_both(km, vm, kc, vc, idx)  # misaligned: the scalar path


@GPU
def test_cuda_bulk_path_long_ranges():
    """Rows of 16 KiB (4 stages, 65.7 KB of shared memory: the opt-in above 48 KB, ~3 CTAs per
    SM): ~100 tokens per CTA, so the slot batches swap, the stages go round many times and every
    refill waits on wait_group.read (the other bulk tests give each CTA a few tokens)."""
    n, s = 40000, 41000
    k = randn(n, 4096, dtype=torch.bfloat16, device="cuda", seed=31)
    v = randn(n, 4096, dtype=torch.bfloat16, device="cuda", seed=32)
    k_cache = _poisoned(s, 4096, torch.bfloat16)
    v_cache = _poisoned(s, 4096, torch.bfloat16)
    idx = _slots(n, s, seed=33)
    idx[100], idx[5000] = -1, s  # padding, out of range (skipped)
    _run_both(k, v, k_cache, v_cache, idx.cuda(), skip_index=int(idx[7]))


@GPU
def test_cuda_bulk_path_graph_capture():
    n, s = 4096, 8192
    k = randn(n, 1024, dtype=torch.bfloat16, device="cuda", seed=17)
    v = randn(n, 1024, dtype=torch.bfloat16, device="cuda", seed=18)
    k_cache, v_cache = _poisoned(s, 1024, torch.bfloat16), _poisoned(s, 1024, torch.bfloat16)
    idx = torch.randperm(s, device="cuda")[:n]
    store_cache(k, v, k_cache, v_cache, idx)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        store_cache(k, v, k_cache, v_cache, idx)
    k.copy_(randn(n, 1024, dtype=torch.bfloat16, device="cuda", seed=19))
    idx.copy_(torch.randperm(s, device="cuda")[:n])
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(k_cache[idx], k) and torch.equal(v_cache[idx], v)


# The bulk gate (_BULK_MIN_ROWS, _BULK_MAX_ROWS, _BULK_MIN_RUN_BYTES, read each call): by default
# rows of at least 1 KB (a cache row is one run) take the bulk kernel from 2048 rows; each
# setting's edge from both sides, forced on and off. (attributes, n, wk, wv, bulk expected)
_DEFAULT = {}
_GATE_CASES = [
    (_DEFAULT, 2048, 1024, 1024, True),
    (_DEFAULT, 2047, 1024, 1024, False),
    (_DEFAULT, 2048, 512, 512, True),  # 1024-byte runs: the edge
    (_DEFAULT, 2048, 512, 504, False),  # a mean run of 1016 bytes
    (_DEFAULT, 3001, 96, 40, False),
    ({"_BULK_MIN_RUN_BYTES": 0}, 3001, 96, 40, True),
    ({"_BULK_MIN_ROWS": -1}, 4096, 1024, 1024, False),
    ({"_BULK_MIN_ROWS": 0}, 1, 1024, 1024, True),
    ({"_BULK_MIN_ROWS": 0}, 33, 1024, 1024, True),
    ({"_BULK_MAX_ROWS": 4096}, 4096, 1024, 1024, True),
    ({"_BULK_MAX_ROWS": 4096}, 4097, 1024, 1024, False),
]


@GPU
@pytest.mark.parametrize(("attrs", "n", "wk", "wv", "bulk"), _GATE_CASES, ids=str)
def test_cuda_bulk_gate(monkeypatch, ran_bulk, attrs, n, wk, wv, bulk):
    for name, value in attrs.items():
        monkeypatch.setattr(_op_module(), name, value)
    s = n + 500
    k = randn(n, wk, dtype=torch.bfloat16, device="cuda", seed=51)
    v = randn(n, wv, dtype=torch.bfloat16, device="cuda", seed=52)
    k_cache, v_cache = _poisoned(s, wk, torch.bfloat16), _poisoned(s, wv, torch.bfloat16)
    idx = _slots(n, s, seed=n).cuda()
    assert ran_bulk(lambda: _run_both(k, v, k_cache, v_cache, idx)) == bulk
