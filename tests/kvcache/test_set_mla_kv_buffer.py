"""kvcache.set_mla_kv_buffer against a loop: DeepSeek 512 + 64, odd widths, 2-D and 3-D layouts,
fp8 buffer with a scale, strided inputs, padding slots, empty input, out-of-range slots, bad
arguments, opcheck and torch.compile."""

from __future__ import annotations

import pytest
import torch

from kernels_kvcache import set_mla_kv_buffer
from shared.testing.inputs import randn

FP8 = torch.float8_e4m3fn


def _expected(buf, loc, nope, rope):
    out = buf.clone()
    rows = out.reshape(out.shape[0], -1)
    for i, slot in enumerate(loc.tolist()):
        if slot >= 0:
            rows[slot] = torch.cat((nope[i].reshape(-1), rope[i].reshape(-1))).to(out.dtype)
    return out


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize(("n", "s", "dn", "dr"), [(1, 2, 512, 64), (7, 32, 512, 64), (5, 9, 13, 3)])
@pytest.mark.parametrize("three_d", (False, True))
def test_matches_loop(dtype, n, s, dn, dr, three_d):
    shape = (n, 1) if three_d else (n,)
    nope, rope = randn(*shape, dn, dtype=dtype, seed=1), randn(*shape, dr, dtype=dtype, seed=2)
    buf = (
        randn(s, 1, dn + dr, dtype=dtype, seed=3)
        if three_d
        else randn(s, dn + dr, dtype=dtype, seed=3)
    )
    loc = torch.randperm(s, generator=torch.Generator().manual_seed(n))[:n]
    loc[0] = -1
    expected = _expected(buf, loc, nope, rope)
    set_mla_kv_buffer(buf, loc, nope, rope)
    assert torch.equal(buf, expected)


def test_fp8_buffer_with_scale(e4m3):
    nope = randn(4, 1, 32, dtype=torch.bfloat16, seed=4, scale=5)
    rope = randn(4, 1, 8, dtype=torch.bfloat16, seed=5)
    buf = torch.zeros(6, 1, 40, dtype=FP8)
    loc = torch.tensor([5, 0, -1, 2], dtype=torch.int32)
    set_mla_kv_buffer(buf, loc, nope, rope, scale=torch.tensor([0.5]))
    for i, slot in enumerate(loc.tolist()):
        if slot >= 0:
            row = torch.cat((nope[i, 0], rope[i, 0]))
            assert torch.equal(buf[slot, 0].double(), e4m3(row, 0.5))


def test_strided_inputs():
    latent = randn(5, 1, 600, dtype=torch.bfloat16, seed=6)
    nope, rope = latent[..., :512], latent[..., 512:576]  # views of one projection output
    buf = torch.zeros(8, 1, 576, dtype=torch.bfloat16)
    loc = torch.tensor([1, 3, 5, 7, 0])
    expected = _expected(buf, loc, nope, rope)
    set_mla_kv_buffer(buf, loc, nope, rope)
    assert torch.equal(buf, expected)


def test_empty_and_out_of_range():
    buf = torch.zeros(4, 24)
    set_mla_kv_buffer(buf, torch.empty(0, dtype=torch.int64), torch.empty(0, 16), torch.empty(0, 8))
    assert (buf == 0).all()
    with pytest.raises(
        ValueError, match=r"set_mla_kv_buffer: loc holds slot 9, outside the cache of 4 slots"
    ):
        set_mla_kv_buffer(buf, torch.tensor([9]), torch.ones(1, 16), torch.ones(1, 8))
    assert (buf == 0).all()


def test_bad_arguments():
    buf = torch.zeros(4, 24)
    nope, rope, loc = torch.ones(2, 16), torch.ones(2, 8), torch.tensor([0, 1])
    with pytest.raises(
        ValueError, match=r"kv_buffer rows must hold Dn \+ Dr = 16 \+ 4 = 20 values"
    ):
        set_mla_kv_buffer(buf, loc, nope, torch.ones(2, 4))
    with pytest.raises(
        ValueError, match=r"k_rope must be \[N, D\] or \[N, 1, D\], got shape \(2, 2, 4\)"
    ):
        set_mla_kv_buffer(buf, loc, nope, torch.ones(2, 2, 4))
    with pytest.raises(TypeError, match=r"k_rope must have dtype in \(float32\), got bfloat16"):
        set_mla_kv_buffer(buf, loc, nope, rope.bfloat16())
    with pytest.raises(TypeError, match="kv_buffer must have the dtype of its input rows"):
        set_mla_kv_buffer(buf.half(), loc, nope, rope)
    with pytest.raises(ValueError, match=r"kv_buffer must be \[S, 1, Dn\+Dr\] or \[S, Dn\+Dr\]"):
        set_mla_kv_buffer(torch.zeros(4, 2, 24), loc, nope, rope)
    with pytest.raises(ValueError, match=r"loc must have one slot per input row \(2\), got shape"):
        set_mla_kv_buffer(buf, torch.tensor([0, 1, 2]), nope, rope)
    with pytest.raises(ValueError, match=r"k_rope must have N = 2 rows like k_nope, got shape"):
        set_mla_kv_buffer(buf, loc, nope, torch.ones(3, 8))


def test_opcheck():
    from kernels_kvcache.ops.set_mla_kv_buffer import SET_MLA_KV_BUFFER

    buf = torch.zeros(6, 1, 24, dtype=torch.bfloat16)
    nope = randn(3, 1, 16, dtype=torch.bfloat16)
    rope = randn(3, 1, 8, dtype=torch.bfloat16, seed=1)
    torch.library.opcheck(
        SET_MLA_KV_BUFFER.torch_op, (buf, torch.tensor([4, -1, 0]), nope, rope, None, None)
    )


def test_torch_compile_fullgraph_aot():
    buf = torch.zeros(6, 24)
    nope, rope = randn(3, 16, seed=1), randn(3, 8, seed=2)
    loc = torch.tensor([4, -1, 0])
    expected = _expected(buf, loc, nope, rope)

    def write(b, l, n, r):
        set_mla_kv_buffer(b, l, n, r)

    torch.compile(write, fullgraph=True, backend="aot_eager")(buf, loc, nope, rope)
    assert torch.equal(buf, expected)


# ------------------------------------------------------------------------------------------------
# The CUDA backend against the torch reference on the GPU: buffers poisoned first, compared byte
# for byte; DeepSeek 512 + 64 and odd widths, 2-D/3-D layouts, strided views, fp8 with a scale.

GPU = pytest.mark.gpu


def _op_module():
    from kernels_kvcache.ops import set_mla_kv_buffer as mod

    return mod


def _poisoned(shape, dtype):
    buf = torch.empty(*shape, dtype=dtype, device="cuda")
    buf.view(torch.uint8).fill_(0x7F) if dtype == FP8 else buf.fill_(float("nan"))
    return buf


def _run_both(buf, loc, nope, rope, **kw):
    ref = buf.clone()
    valid = loc.clone()
    valid[valid >= buf.shape[0]] = -1  # the reference raises; the kernel skips
    set_mla_kv_buffer(ref, valid, nope, rope, backend="torch", **kw)
    set_mla_kv_buffer(buf, loc, nope, rope, backend="cuda", **kw)
    torch.cuda.synchronize()
    assert torch.equal(buf.view(torch.uint8), ref.view(torch.uint8))


@GPU
@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize(
    ("n", "s", "dn", "dr"), [(1, 2, 512, 64), (7, 32, 512, 64), (5, 9, 13, 3), (700, 1031, 512, 64)]
)
@pytest.mark.parametrize("three_d", (False, True))
@pytest.mark.parametrize("fp8", (False, True), ids=("same", "fp8"))
@pytest.mark.parametrize("index_dtype", (torch.int32, torch.int64), ids=str)
def test_cuda_matches_reference(dtype, n, s, dn, dr, three_d, fp8, index_dtype):
    shape = (n, 1) if three_d else (n,)
    nope = randn(*shape, dn, dtype=dtype, device="cuda", seed=1, scale=40)
    rope = randn(*shape, dr, dtype=dtype, device="cuda", seed=2)
    buf = _poisoned((s, 1, dn + dr) if three_d else (s, dn + dr), FP8 if fp8 else dtype)
    loc = torch.randperm(s, generator=torch.Generator().manual_seed(n))[:n]
    loc[0] = -1
    kw = {"scale": torch.tensor([0.11], device="cuda")} if fp8 else {}
    _run_both(buf, loc.to(index_dtype).cuda(), nope, rope, **kw)


@GPU
@pytest.mark.parametrize("dtype", (torch.bfloat16, FP8), ids=str)
def test_cuda_strided_views_and_out_of_range(dtype):
    latent = randn(37, 1, 600, dtype=torch.bfloat16, device="cuda", seed=6)
    nope, rope = latent[..., :512], latent[..., 512:576]
    buf = _poisoned((64, 1, 576), dtype)
    loc = torch.randperm(64, generator=torch.Generator().manual_seed(6))[:37]
    loc[2], loc[3] = 64, 2**33
    _run_both(buf, loc.cuda(), nope, rope)
    odd = latent[..., 1:513]  # misaligned by one element: the scalar path
    _run_both(_poisoned((64, 1, 576), dtype), loc.cuda(), odd, rope)


@GPU
def test_cuda_graph_capture_and_compile():
    nope = randn(16, 512, dtype=torch.bfloat16, device="cuda", seed=1)
    rope = randn(16, 64, dtype=torch.bfloat16, device="cuda", seed=2)
    buf = _poisoned((128, 576), torch.bfloat16)
    loc = torch.randperm(128, device="cuda")[:16]
    set_mla_kv_buffer(buf, loc, nope, rope)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        set_mla_kv_buffer(buf, loc, nope, rope)
    nope.copy_(randn(16, 512, dtype=torch.bfloat16, device="cuda", seed=3))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(buf[loc], torch.cat((nope, rope), dim=-1))

    def write(b, l, n, r):
        set_mla_kv_buffer(b, l, n * 2, r)

    torch.compile(write, fullgraph=True)(buf, loc, nope, rope)
    assert torch.equal(buf[loc, :512], nope * 2)


@GPU
def test_cuda_opcheck():
    from kernels_kvcache.ops.set_mla_kv_buffer import SET_MLA_KV_BUFFER

    buf = torch.zeros(6, 1, 24, dtype=torch.bfloat16, device="cuda")
    nope = randn(3, 1, 16, dtype=torch.bfloat16, device="cuda")
    rope = randn(3, 1, 8, dtype=torch.bfloat16, device="cuda", seed=1)
    loc = torch.tensor([4, -1, 0], device="cuda")
    torch.library.opcheck(SET_MLA_KV_BUFFER.torch_op, (buf, loc, nope, rope, None, None))


@GPU
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("n", (2047, 2048, 5000))
@pytest.mark.parametrize("index_dtype", (torch.int32, torch.int64), ids=str)
def test_cuda_bulk_path_matches_reference(dtype, n, index_dtype):
    """From 2048 rows (to _BULK_MAX_ROWS) the bulk path (TMA bulk copies) writes 1024 + 128 B
    (bf16) runs."""
    latent = randn(n, 1, 600, dtype=dtype, device="cuda", seed=7)
    nope, rope = latent[..., :512], latent[..., 512:576]  # strided views
    s = n + 1000
    buf = _poisoned((s, 1, 576), dtype)
    loc = torch.randperm(s, generator=torch.Generator().manual_seed(n))[:n]
    loc[0], loc[1], loc[n - 1] = -1, s, s + 99
    _run_both(buf, loc.to(index_dtype).cuda(), nope, rope)


# The bulk gate (_BULK_MIN_ROWS, _BULK_MAX_ROWS, _BULK_MIN_RUN_BYTES, read each call): by default
# 2048 to 32768 rows take the bulk kernel (nope | rope back to back: one 1152-byte bf16 run); each
# setting's edge from both sides, forced on and off. (attributes, n, bulk expected)
_DEFAULT = {}
_GATE_CASES = [
    (_DEFAULT, 2048, True),
    (_DEFAULT, 2047, False),
    (_DEFAULT, 32768, True),
    (_DEFAULT, 32769, False),
    ({"_BULK_MAX_ROWS": -1}, 40000, True),
    ({"_BULK_MIN_RUN_BYTES": 1152}, 2048, True),  # one run of 1152 bytes, not 1024 + 128
    ({"_BULK_MIN_RUN_BYTES": 1153}, 2048, False),
    ({"_BULK_MIN_ROWS": -1}, 4096, False),
    ({"_BULK_MIN_ROWS": 0}, 1, True),
    ({"_BULK_MIN_ROWS": 0}, 100, True),
]


@GPU
@pytest.mark.parametrize(("attrs", "n", "bulk"), _GATE_CASES, ids=str)
def test_cuda_bulk_gate(monkeypatch, ran_bulk, attrs, n, bulk):
    for name, value in attrs.items():
        monkeypatch.setattr(_op_module(), name, value)
    latent = randn(n, 1, 640, dtype=torch.bfloat16, device="cuda", seed=61)
    nope, rope = latent[..., :512], latent[..., 512:576]  # as the bench suite passes them
    s = n + 300
    buf = _poisoned((s, 1, 576), torch.bfloat16)
    loc = torch.randperm(s, generator=torch.Generator().manual_seed(n))[:n]
    if n > 2:
        loc[1] = -1  # padding
    loc = loc.cuda()
    assert ran_bulk(lambda: _run_both(buf, loc, nope, rope)) == bulk
