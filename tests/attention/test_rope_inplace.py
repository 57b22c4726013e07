"""attention.rope_inplace against a float64 loop over tokens, heads and pairs: NeoX and GPT-J,
full and partial rotary dims, Hq != Hk, 2-D inputs, q/k as views of a fused qkv buffer, k None,
empty input, out-of-range positions, bad arguments, opcheck and torch.compile."""

from __future__ import annotations

import pytest
import torch

from kernels_attention import reference, rope_inplace
from shared.testing.compare import assert_close
from shared.testing.inputs import randn


def _cache(max_pos: int, r: int, base: float = 10000.0) -> torch.Tensor:
    """A real cos/sin table: cos(pos * theta_i) in the first half, sin in the second."""
    inv_freq = base ** (-torch.arange(0, r, 2, dtype=torch.float64) / r)
    angles = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=-1).float()


def _expected(x: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor, is_neox: bool):
    """Rotate every pair of every head of x [T, H, D] in float64, one pair at a time."""
    out = x.double().clone()
    half = cache.shape[1] // 2
    for t, pos in enumerate(positions.tolist()):
        for h in range(x.shape[1]):
            for i in range(half):
                a, b = (i, i + half) if is_neox else (2 * i, 2 * i + 1)
                cos, sin = float(cache[pos, i]), float(cache[pos, half + i])
                x1, x2 = float(x[t, h, a]), float(x[t, h, b])
                out[t, h, a] = x1 * cos - x2 * sin
                out[t, h, b] = x2 * cos + x1 * sin
    return out


CONFIGS = (  # (T, Hq, Hk, D, R)
    (1, 1, 1, 2, 2),
    (5, 4, 2, 128, 128),  # Llama-like GQA, full rotary
    (3, 2, 1, 64, 64),  # DeepSeek MLA rope part
    (4, 3, 1, 128, 64),  # GLM partial rotary
    (6, 2, 2, 40, 18),  # nothing a power of two
)


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("is_neox", (True, False), ids=("neox", "gptj"))
def test_matches_float64_loop(dtype, config, is_neox):
    t, hq, hk, d, r = config
    q, k = randn(t, hq, d, dtype=dtype, seed=1), randn(t, hk, d, dtype=dtype, seed=2)
    cache = _cache(50, r)
    positions = torch.randint(0, 50, (t,), generator=torch.Generator().manual_seed(t))
    q_ref, k_ref = _expected(q, cache, positions, is_neox), _expected(k, cache, positions, is_neox)
    q_in, k_in = q.clone(), k.clone()
    assert rope_inplace(q, k, cache, positions, is_neox=is_neox, rotary_dim=r) is None
    assert_close(q, q_ref.to(dtype), name="q")
    assert_close(k, k_ref.to(dtype), name="k")
    assert torch.equal(q[..., r:], q_in[..., r:]) and torch.equal(k[..., r:], k_in[..., r:])


def test_2d_inputs_as_views_of_fused_qkv():
    t, hq, hk, d = 4, 4, 2, 32
    qkv = randn(t, (hq + 2 * hk) * d, dtype=torch.bfloat16, seed=3)
    q, k = qkv[:, : hq * d], qkv[:, hq * d : (hq + hk) * d]  # row stride != H*D
    v_before = qkv[:, (hq + hk) * d :].clone()
    cache = _cache(16, 16)
    positions = torch.tensor([0, 15, 3, 3], dtype=torch.int32)
    q_ref = _expected(q.reshape(t, hq, d), cache, positions, True).reshape(t, -1)
    k_ref = _expected(k.reshape(t, hk, d), cache, positions, True).reshape(t, -1)
    rope_inplace(q, k, cache, positions, is_neox=True, head_size=d)
    assert_close(qkv[:, : hq * d], q_ref.bfloat16())
    assert_close(qkv[:, hq * d : (hq + hk) * d], k_ref.bfloat16())
    assert torch.equal(qkv[:, (hq + hk) * d :], v_before)


def test_q_only_and_position_zero_is_identity():
    q = randn(3, 2, 8, seed=4)
    before = q.clone()
    rope_inplace(q, None, _cache(4, 8), torch.zeros(3, dtype=torch.int64), is_neox=False)
    assert_close(q, before)  # cos 1, sin 0


def test_empty_and_out_of_range_positions():
    q, k = torch.empty(0, 2, 8), torch.empty(0, 1, 8)
    rope_inplace(q, k, _cache(4, 8), torch.empty(0, dtype=torch.int64), is_neox=True)
    q = randn(2, 2, 8, seed=5)
    before = q.clone()
    with pytest.raises(ValueError, match=r"rope_inplace: positions must lie in \[0, 4\) .*found 4"):
        rope_inplace(q, None, _cache(4, 8), torch.tensor([1, 4]), is_neox=True)
    with pytest.raises(ValueError, match="found -1"):
        rope_inplace(q, None, _cache(4, 8), torch.tensor([-1, 0]), is_neox=True)
    assert torch.equal(q, before)


def test_bad_arguments():
    q, k, cache, pos = (
        torch.ones(2, 4, 16),
        torch.ones(2, 2, 16),
        _cache(8, 16),
        torch.tensor([0, 1]),
    )
    with pytest.raises(ValueError, match=r"a 2-D q \[T, H\*D\] needs head_size"):
        rope_inplace(q.reshape(2, 64), k, cache, pos, is_neox=True)
    with pytest.raises(ValueError, match="rotary_dim = 8 must equal the cos_sin_cache width 16"):
        rope_inplace(q, k, cache, pos, is_neox=True, rotary_dim=8)
    with pytest.raises(ValueError, match=r"must be even and in \[2, D = 16\], got 18"):
        rope_inplace(q, k, _cache(8, 18), pos, is_neox=True)
    with pytest.raises(
        TypeError, match=r"cos_sin_cache must have dtype in \(float32\), got bfloat16"
    ):
        rope_inplace(q, k, cache.bfloat16(), pos, is_neox=True)
    with pytest.raises(ValueError, match=r"positions must have one entry per token \(T = 2\)"):
        rope_inplace(q, k, cache, torch.tensor([0, 1, 2]), is_neox=True)
    with pytest.raises(ValueError, match=r"k \[T, Hk, D\] must share T = 2 and D = 16 with q"):
        rope_inplace(q, torch.ones(2, 2, 8), cache, pos, is_neox=True)
    with pytest.raises(TypeError, match="k must have the dtype of q"):
        rope_inplace(q, k.half(), cache, pos, is_neox=True)
    with pytest.raises(ValueError, match="q's width 60 is not a multiple of head_size = 16"):
        rope_inplace(torch.ones(2, 60), None, cache, pos, is_neox=True, head_size=16)


def test_opcheck():
    from kernels_attention.ops.rope_inplace import ROPE_INPLACE

    q, k = randn(3, 4, 32, dtype=torch.bfloat16), randn(3, 2, 32, dtype=torch.bfloat16, seed=1)
    args = (q, k, _cache(8, 16), torch.tensor([1, 7, 0]), False, None)
    torch.library.opcheck(ROPE_INPLACE.torch_op, args)
    torch.library.opcheck(
        ROPE_INPLACE.torch_op, (q, None, _cache(8, 32), torch.tensor([1, 7, 0]), True, None)
    )


def test_torch_compile_fullgraph():
    """Inductor, so the in-place custom op on views is functionalised and lowered (~5 s on CPU)."""
    cache = _cache(32, 64)
    positions = torch.tensor([3, 31, 0, 7, 7])

    def attend(qkv):
        q, k = qkv[:, :128], qkv[:, 128:192]
        rope_inplace(q, k, cache, positions, is_neox=True, head_size=64)
        return qkv * 1

    qkv = randn(5, 256, dtype=torch.bfloat16, seed=6)
    expected = qkv.clone()
    reference.rope_inplace(
        expected[:, :128].view(5, 2, 64),
        expected[:, 128:192].view(5, 1, 64),
        cache,
        positions,
        True,
    )
    assert_close(torch.compile(attend, fullgraph=True)(qkv.clone()), expected)
