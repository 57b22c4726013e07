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
        TypeError, match=r"cos_sin_cache must have dtype in \(float32, bfloat16\), got float16"
    ):
        rope_inplace(q, k, cache.half(), pos, is_neox=True)
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


# --- every backend against the reference (the CUDA kernel on the GPU) ---------------------------

BACKENDS = {"cpu": ("torch",), "cuda": ("cuda", "torch")}


def _device_params():
    return [
        pytest.param("cpu", id="cpu"),
        pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
    ]


def _check_backends(device, base, views, cache, positions, is_neox, head_size=None):
    """Run every backend of ``device`` on the views ``views(buffer)`` -> (q, k) of a copy of
    ``base`` (so strides and alignment are the caller's); compare the whole buffer with the
    reference's (channels past R and bytes outside q and k must be unchanged)."""

    def heads(x):
        return x if x is None or x.dim() == 3 else x.view(x.shape[0], -1, head_size)

    expected = base.clone()
    q, k = views(expected)
    reference.rope_inplace(heads(q), heads(k), cache, positions, is_neox)
    for backend in BACKENDS[device]:
        out = base.clone()
        q, k = views(out)
        rope_inplace(q, k, cache, positions, is_neox=is_neox, backend=backend, head_size=head_size)
        assert_close(out, expected, name=f"{backend} q/k buffer")


GPU_CONFIGS = (
    *CONFIGS,
    (7, 32, 8, 128, 128),  # Llama
    (3, 16, 16, 64, 64),  # DeepSeek MLA rope part (GPT-J)
    (5, 12, 4, 256, 128),  # wide head, partial
    (9, 3, 1, 96, 24),  # R/2 = 12: NeoX packed at fp32, scalar at 16-bit dtypes
    (2, 5, 3, 72, 72),
)


@pytest.mark.gpu  # on the CPU only the reference runs: test_matches_float64_loop covers it
@pytest.mark.parametrize("device", ["cuda"])
@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize("cache_dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("config", GPU_CONFIGS, ids=str)
@pytest.mark.parametrize("is_neox", (True, False), ids=("neox", "gptj"))
def test_backends_match_reference(device, dtype, cache_dtype, config, is_neox):
    t, hq, hk, d, r = config
    qk = randn(t, hq + hk, d, dtype=dtype, device=device, seed=11)
    cache = _cache(64, r).to(cache_dtype).to(device)
    g = torch.Generator().manual_seed(t + d)
    for pos_dtype in (torch.int32, torch.int64):
        positions = torch.randint(0, 64, (t,), generator=g, dtype=pos_dtype).to(device)
        _check_backends(device, qk, lambda b: (b[:, :hq], b[:, hq:]), cache, positions, is_neox)
        _check_backends(device, qk, lambda b: (b[:, :hq], None), cache, positions, is_neox)


@pytest.mark.parametrize("device", _device_params())
@pytest.mark.parametrize("is_neox", (True, False), ids=("neox", "gptj"))
def test_fused_qkv_views_misaligned_and_q_only(device, is_neox):
    t, hq, hk, d = 6, 8, 2, 128
    cache = _cache(128, 128).to(device)
    positions = torch.tensor([5, 0, 127, 64, 3, 3], device=device)
    for offset in (0, 1):  # 1: every view starts one element past a 16-byte boundary
        buf = randn(t, offset + (hq + 2 * hk) * d + 8, dtype=torch.bfloat16, device=device)

        def qkv(b, offset=offset):
            return b[:, offset : offset + (hq + 2 * hk) * d]

        def views3(b):
            x = qkv(b)
            return x[:, : hq * d].view(t, hq, d), x[:, hq * d : (hq + hk) * d].view(t, hk, d)

        _check_backends(device, buf, views3, cache, positions, is_neox)
        _check_backends(device, buf, lambda b: (views3(b)[0], None), cache, positions, is_neox)

        # 2-D views with head_size, and head-strided 3-D views (every other head)
        def views2(b):
            x = qkv(b)
            return x[:, : hq * d], x[:, hq * d : (hq + hk) * d]

        _check_backends(device, buf, views2, cache, positions, is_neox, head_size=d)
        _check_backends(device, buf, lambda b: tuple(x[:, ::2] for x in views3(b)), cache,
                        positions, is_neox)  # fmt: skip
    # a cache whose rows are not 16-byte aligned (a view of a wider table): the scalar path
    wide = torch.zeros(128, 129, device=device)
    wide[:, 1:] = cache
    q = randn(t, hq, d, dtype=torch.bfloat16, device=device, seed=3)
    _check_backends(device, q, lambda b: (b, None), wide[:, 1:], positions, is_neox)


@pytest.mark.gpu
def test_many_tokens_heads_per_thread():
    """Enough work that each thread takes several heads (a ragged 7 heads per token)."""
    device = "cuda"
    t, hq, hk, d = 20001, 5, 2, 128
    qk = randn(t, hq + hk, d, dtype=torch.bfloat16, device=device, seed=4)
    cache = _cache(4096, 128).to(device)
    positions = torch.randint(0, 4096, (t,), generator=torch.Generator().manual_seed(1)).to(device)
    for is_neox in (True, False):
        _check_backends(device, qk, lambda b: (b[:, :hq], b[:, hq:]), cache, positions, is_neox)


@pytest.mark.gpu
def test_cuda_out_of_range_positions_are_skipped():
    """No host sync on CUDA: a token whose position is out of range is left untouched."""
    q = randn(4, 4, 32, dtype=torch.bfloat16, device="cuda", seed=6)
    k = randn(4, 2, 32, dtype=torch.bfloat16, device="cuda", seed=7)
    cache = _cache(8, 32).cuda()
    positions = torch.tensor([1, 8, -1, 7], device="cuda")
    q_out, k_out = q.clone(), k.clone()
    rope_inplace(q_out, k_out, cache, positions, is_neox=True, backend="cuda")
    q_ref, k_ref = q.clone(), k.clone()
    good = torch.tensor([0, 3], device="cuda")
    q_sel, k_sel = q_ref[good], k_ref[good]
    reference.rope_inplace(q_sel, k_sel, cache, positions[good], True)
    q_ref[good], k_ref[good] = q_sel, k_sel
    assert_close(q_out, q_ref)
    assert_close(k_out, k_ref)
    assert torch.equal(q_out[1:3], q[1:3]) and torch.equal(k_out[1:3], k[1:3])
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 8\)"):
        rope_inplace(q.clone(), k.clone(), cache, positions, is_neox=True, backend="torch")


@pytest.mark.gpu
def test_cuda_empty():
    q, k = torch.empty(0, 2, 8, device="cuda"), torch.empty(0, 1, 8, device="cuda")
    cache = _cache(4, 8).cuda()
    rope_inplace(q, k, cache, torch.empty(0, dtype=torch.int64, device="cuda"), is_neox=True)


def test_compiled_kernel_rejects_bad_input_itself():
    """A direct call of the raw function, past the Python checks, fails cleanly in C++ (the
    arguments are checked before the device, so CPU tensors exercise every check)."""
    from kernels_attention.ops.rope_inplace import ROPE_INPLACE_CUDA
    from kernels_jit import load_module
    from shared.testing.builds import cuda_arch

    with cuda_arch():  # builds for sm_90a where no GPU says which arch
        raw = load_module(ROPE_INPLACE_CUDA).rope_inplace
    q, cache = torch.ones(2, 4, 16), _cache(8, 16)
    pos = torch.tensor([0, 1])
    with pytest.raises(ValueError, match="must be even and in"):
        raw(q, None, _cache(8, 18), pos, True)
    with pytest.raises(TypeError, match="cos_sin_cache must be float32 or bfloat16"):
        raw(q, None, cache.half(), pos, True)
    with pytest.raises(TypeError, match="positions must be int32 or int64"):
        raw(q, None, cache, pos.float(), True)
    with pytest.raises(ValueError, match="one entry per token"):
        raw(q, None, cache, pos[:1], True)
    with pytest.raises(ValueError, match="must share T = 2 and D = 16"):
        raw(q, torch.ones(2, 2, 8), cache, pos, True)
    with pytest.raises(ValueError, match="q is on the wrong device type"):
        raw(q, torch.ones(2, 2, 16), cache, pos, False)


@pytest.mark.gpu
def test_cuda_graph_capture():
    q = randn(33, 32, 128, dtype=torch.bfloat16, device="cuda", seed=8)
    k = randn(33, 8, 128, dtype=torch.bfloat16, device="cuda", seed=9)
    cache = _cache(256, 128).cuda()
    positions = torch.randint(0, 256, (33,), device="cuda")
    q_in, k_in = q.clone(), k.clone()
    rope_inplace(q, k, cache, positions, is_neox=True)  # builds and loads before capture
    q.copy_(q_in)
    k.copy_(k_in)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        rope_inplace(q, k, cache, positions, is_neox=True)
    q.copy_(q_in)
    k.copy_(k_in)
    graph.replay()
    torch.cuda.synchronize()
    q_ref, k_ref = q_in.clone(), k_in.clone()
    reference.rope_inplace(q_ref, k_ref, cache, positions, True)
    assert_close(q, q_ref)
    assert_close(k, k_ref)


@pytest.mark.gpu
def test_torch_compile_fullgraph_cuda():
    cache = _cache(32, 64).cuda()
    positions = torch.tensor([3, 31, 0, 7, 7], device="cuda")

    def attend(qkv):
        q, k = qkv[:, :128], qkv[:, 128:192]
        rope_inplace(q, k, cache, positions, is_neox=False, head_size=64)
        return qkv * 1

    qkv = randn(5, 256, dtype=torch.bfloat16, device="cuda", seed=6)
    expected = qkv.clone()
    reference.rope_inplace(
        expected[:, :128].view(5, 2, 64), expected[:, 128:192].view(5, 1, 64), cache, positions,
        False,
    )  # fmt: skip
    assert_close(torch.compile(attend, fullgraph=True)(qkv.clone()), expected)


@pytest.mark.gpu
def test_opcheck_cuda():
    from kernels_attention.ops.rope_inplace import ROPE_INPLACE

    q = randn(3, 4, 32, dtype=torch.bfloat16, device="cuda")
    k = randn(3, 2, 32, dtype=torch.bfloat16, device="cuda", seed=1)
    pos = torch.tensor([1, 7, 0], device="cuda")
    torch.library.opcheck(ROPE_INPLACE.torch_op, (q, k, _cache(8, 16).cuda(), pos, False, None))
    torch.library.opcheck(
        ROPE_INPLACE.torch_op, (q, None, _cache(8, 32).bfloat16().cuda(), pos, True, None)
    )
