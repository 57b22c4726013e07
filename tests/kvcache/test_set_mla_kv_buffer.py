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
