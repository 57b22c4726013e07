"""attention.merge_state against a float64 formula: random LSEs, MLA's D = 512, -inf and +inf
(empty) segments, both empty, NaN, transposed LSE storage, out=/out_lse= views, empty input, bad
arguments, opcheck and torch.compile."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels_attention import merge_state, reference
from shared.testing.compare import assert_close
from shared.testing.inputs import poison, randn

INF = float("inf")


def _expected(v_a, s_a, v_b, s_b):
    """Per (t, h) with Python floats: the merged value and LSE, empty segments handled."""
    t_, h_ = s_a.shape
    v = torch.empty(v_a.shape, dtype=torch.float64)
    s = torch.empty(t_, h_, dtype=torch.float64)
    for t in range(t_):
        for h in range(h_):
            a, b = float(s_a[t, h]), float(s_b[t, h])
            a = -INF if a == INF else a
            b = -INF if b == INF else b
            if a == -INF and b == -INF:
                v[t, h], s[t, h] = 0.0, -INF
                continue
            m = max(a, b) if not (math.isnan(a) or math.isnan(b)) else math.nan
            wa, wb = math.exp(a - m), math.exp(b - m)
            v[t, h] = (wa * v_a[t, h].double() + wb * v_b[t, h].double()) / (wa + wb)
            s[t, h] = m + math.log(wa + wb) if not math.isnan(m) else math.nan
    return v, s


@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize("shape", ((1, 1, 1), (3, 8, 64), (5, 16, 512), (4, 3, 129)), ids=str)
def test_matches_float64(dtype, shape):
    t, h, d = shape
    v_a, v_b = randn(t, h, d, dtype=dtype, seed=1), randn(t, h, d, dtype=dtype, seed=2)
    s_a, s_b = randn(t, h, seed=3, scale=4), randn(t, h, seed=4, scale=4)
    v, s = merge_state(v_a, s_a, v_b, s_b)
    v_ref, s_ref = _expected(v_a, s_a, v_b, s_b)
    assert_close(v, v_ref.to(dtype))
    assert_close(s, s_ref.float())


@settings(max_examples=25, deadline=None)
@given(
    s_a=st.lists(st.sampled_from([-INF, INF, -30.0, 0.0, 1.5, 80.0]), min_size=6, max_size=6),
    s_b=st.lists(st.sampled_from([-INF, INF, -30.0, 0.0, 2.5, 80.0]), min_size=6, max_size=6),
)
def test_special_lse_values(s_a, s_b):
    s_a_t = torch.tensor(s_a).reshape(2, 3)
    s_b_t = torch.tensor(s_b).reshape(2, 3)
    v_a, v_b = randn(2, 3, 4, seed=5), randn(2, 3, 4, seed=6)
    v, s = merge_state(v_a, s_a_t, v_b, s_b_t)
    v_ref, s_ref = _expected(v_a, s_a_t, v_b, s_b_t)
    assert_close(v, v_ref.float())
    assert_close(s, s_ref.float())


def test_edge_cases_named():
    v_a, v_b = torch.full((1, 4, 2), 3.0), torch.full((1, 4, 2), 5.0)
    s_a = torch.tensor([[-INF, INF, -INF, 0.0]])
    s_b = torch.tensor([[-INF, 1.0, 2.0, float("nan")]])
    v, s = merge_state(v_a, s_a, v_b, s_b)
    assert v[0, 0].tolist() == [0.0, 0.0] and s[0, 0].item() == -INF  # both empty: v = 0
    assert v[0, 1].tolist() == [5.0, 5.0] and s[0, 1].item() == 1.0  # +inf counts as empty
    assert v[0, 2].tolist() == [5.0, 5.0] and s[0, 2].item() == 2.0
    assert v[0, 3].isnan().all() and s[0, 3].isnan()  # NaN propagates


def test_transposed_lse_and_out_views():
    t, h, d = 5, 4, 32
    v_a, v_b = (
        randn(t, h, d, dtype=torch.bfloat16, seed=7),
        randn(t, h, d, dtype=torch.bfloat16, seed=8),
    )
    s_a = randn(h, t, seed=9).t()  # [H, T] storage
    s_b = randn(t, h, seed=10)
    wide = torch.zeros(t, h, d + 8, dtype=torch.bfloat16)
    lse_storage = torch.zeros(h, t)
    out, _ = merge_state(v_a, s_a, v_b, s_b, out=wide[..., 4 : 4 + d], out_lse=lse_storage.t())
    v_ref, s_ref = _expected(v_a, s_a, v_b, s_b)
    assert_close(wide[..., 4 : 4 + d], v_ref.bfloat16())
    assert_close(lse_storage.t(), s_ref.float())
    assert out.data_ptr() == wide[..., 4:].data_ptr() and (wide[..., :4] == 0).all()


def test_empty():
    v, s = merge_state(
        torch.empty(0, 4, 8), torch.empty(0, 4), torch.empty(0, 4, 8), torch.empty(0, 4)
    )
    assert v.shape == (0, 4, 8) and s.shape == (0, 4)


def test_bad_arguments():
    v, s = torch.ones(2, 3, 4), torch.zeros(2, 3)
    with pytest.raises(
        ValueError,
        match=r"merge_state: s_b must have shape \(2, 3\) \(\[T, H\] of v_a\), got \(3, 2\)",
    ):
        merge_state(v, s, v, s.t())
    with pytest.raises(TypeError, match=r"s_a must have dtype in \(float32\), got bfloat16"):
        merge_state(v, s.bfloat16(), v, s)
    with pytest.raises(TypeError, match=r"v_b must have dtype in \(float32\), got float16"):
        merge_state(v, s, v.half(), s)
    with pytest.raises(ValueError, match=r"v_b must have the shape of v_a"):
        merge_state(v, s, torch.ones(2, 3, 5), s)
    with pytest.raises(TypeError, match="out must have dtype float32, got bfloat16"):
        merge_state(v, s, v, s, out=torch.empty(2, 3, 4, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match=r"out_lse must have shape \(2, 3\), got \(2,\)"):
        merge_state(v, s, v, s, out_lse=torch.empty(2))


def test_opcheck():
    from kernels_attention.ops.merge_state import MERGE_STATE

    v_a, v_b = randn(3, 2, 16, dtype=torch.float16), randn(3, 2, 16, dtype=torch.float16, seed=1)
    s_a, s_b = randn(3, 2, seed=2), randn(2, 3, seed=3).t()
    out, out_lse = torch.empty_like(v_a), torch.empty(3, 2)
    torch.library.opcheck(MERGE_STATE.torch_op, (out, out_lse, v_a, s_a, v_b, s_b, None))


def test_torch_compile_fullgraph_aot():
    v_a, v_b = randn(4, 2, 8, seed=1), randn(4, 2, 8, seed=2)
    s_a, s_b = randn(4, 2, seed=3), randn(4, 2, seed=4)
    v, s = torch.compile(merge_state, fullgraph=True, backend="aot_eager")(v_a, s_a, v_b, s_b)
    v_ref, s_ref = reference.merge_state(v_a, s_a, v_b, s_b)
    assert_close(v, v_ref)
    assert_close(s, s_ref)


# --- every backend against the reference (the CUDA kernel on the GPU) ---------------------------

BACKENDS = {"cpu": ("torch",), "cuda": ("cuda", "torch")}


def _device_params():
    return [
        pytest.param("cpu", id="cpu"),
        pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
    ]


def _check_backends(device, v_a, s_a, v_b, s_b, out=None, out_lse=None):
    """Every backend of ``device`` into poisoned outputs (or the given views), against the
    reference."""
    v_ref, s_ref = reference.merge_state(v_a, s_a, v_b, s_b)
    for backend in BACKENDS[device]:
        o = poison(torch.empty_like(v_a)) if out is None else poison(out)
        ol = poison(torch.empty_like(s_ref)) if out_lse is None else poison(out_lse)
        v, s = merge_state(v_a, s_a, v_b, s_b, out=o, out_lse=ol, backend=backend)
        assert v is o and s is ol
        assert_close(v, v_ref, name=f"{backend} v")
        assert_close(s, s_ref, name=f"{backend} lse")


SHAPES = (
    (1, 1, 1),
    (3, 8, 64),
    (5, 16, 512),
    (4, 3, 129),
    (7, 128, 512),  # MLA, 128 heads
    (33, 32, 128),
    (2, 5, 4),
    (3, 7, 6),  # D = 6: no whole 16-byte packs at any dtype (the scalar path)
)


@pytest.mark.parametrize("device", _device_params())
@pytest.mark.parametrize("dtype", (torch.float32, torch.float16, torch.bfloat16), ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_backends_match_reference(device, dtype, shape):
    t, h, d = shape
    v_a = randn(t, h, d, dtype=dtype, device=device, seed=1)
    v_b = randn(t, h, d, dtype=dtype, device=device, seed=2)
    s_a = randn(t, h, device=device, seed=3, scale=4)
    s_b = randn(h, t, device=device, seed=4, scale=4).t()  # [H, T] storage
    _check_backends(device, v_a, s_a, v_b, s_b)


@pytest.mark.parametrize("device", _device_params())
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_strided_misaligned_and_special_values(device, dtype):
    t, h, d = 6, 5, 128
    inf, nan = float("inf"), float("nan")
    wide = randn(t, h, d + 8, dtype=dtype, device=device, seed=5)
    v_a = wide[..., 1 : d + 1]  # misaligned rows: the scalar path
    v_b = randn(t, 2 * h, d, dtype=dtype, device=device, seed=6)[:, ::2]  # head-strided
    s_a = randn(t, h, device=device, seed=7, scale=3)
    s_b = randn(t, h, device=device, seed=8, scale=3)
    s_a[0, :] = -inf
    s_b[0, :3] = -inf  # both empty: v = 0, lse = -inf
    s_a[1, 0], s_b[1, 1], s_a[2, 2] = inf, inf, nan
    s_a[3, 3], s_b[3, 3] = 80.0, -80.0
    _check_backends(device, v_a, s_a, v_b, s_b)
    _check_backends(device, v_a.contiguous(), s_a, v_b.contiguous(), s_b)
    out = torch.empty(t, h, d + 16, dtype=dtype, device=device)[..., 8 : d + 8]
    out_lse = torch.empty(h, t, device=device).t()
    _check_backends(device, v_a.contiguous(), s_a, v_b, s_b, out=out, out_lse=out_lse)


@pytest.mark.parametrize("device", _device_params())
def test_in_place_into_v_a(device):
    v_a = randn(9, 4, 64, dtype=torch.bfloat16, device=device, seed=9)
    v_b = randn(9, 4, 64, dtype=torch.bfloat16, device=device, seed=10)
    s_a, s_b = randn(9, 4, device=device, seed=11), randn(9, 4, device=device, seed=12)
    v_ref, s_ref = reference.merge_state(v_a, s_a, v_b, s_b)
    v, s = merge_state(v_a, s_a, v_b, s_b, out=v_a)
    assert v is v_a
    assert_close(v_a, v_ref)
    assert_close(s, s_ref)


@pytest.mark.gpu
def test_cuda_large_tokens_and_empty():
    t, h, d = 4099, 32, 128
    v_a = randn(t, h, d, dtype=torch.bfloat16, device="cuda", seed=13)
    v_b = randn(t, h, d, dtype=torch.bfloat16, device="cuda", seed=14)
    s_a = randn(t, h, device="cuda", seed=15, scale=5)
    s_b = randn(t, h, device="cuda", seed=16, scale=5)
    _check_backends("cuda", v_a, s_a, v_b, s_b)
    empty = torch.empty(0, 4, 8, device="cuda")
    v, s = merge_state(
        empty, torch.empty(0, 4, device="cuda"), empty, torch.empty(0, 4, device="cuda")
    )
    assert v.shape == (0, 4, 8) and s.shape == (0, 4)


def test_compiled_kernel_rejects_bad_input_itself():
    """A direct call of the raw function, past the Python checks, fails cleanly in C++ (the
    arguments are checked before the device, so CPU tensors exercise every check)."""
    from kernels_attention.ops.merge_state import MERGE_STATE_CUDA
    from kernels_jit import load_module
    from shared.testing.builds import cuda_arch

    with cuda_arch():  # builds for sm_90a where no GPU says which arch
        raw = load_module(MERGE_STATE_CUDA).merge_state
    v, s = torch.ones(2, 3, 4), torch.zeros(2, 3)
    with pytest.raises(ValueError, match="same shape"):
        raw(torch.empty(2, 3, 5), torch.empty(2, 3), v, s, v, s)
    with pytest.raises(TypeError, match="s_a must be float32"):
        raw(torch.empty_like(v), torch.empty_like(s), v, s.half(), v, s)
    with pytest.raises(ValueError, match="out_lse and s_a must not overlap"):
        raw(torch.empty_like(v), s, v, s, v, s.clone())
    with pytest.raises(ValueError, match="out and v_a must not overlap"):
        big = torch.ones(2, 3, 8)
        raw(big[..., 2:6], torch.empty_like(s), big[..., :4], s, v, s)
    with pytest.raises(ValueError, match="v_a is on the wrong device type"):
        raw(v, torch.empty_like(s), v, s, v.clone(), s)  # out = v_a itself is allowed


@pytest.mark.gpu
def test_cuda_graph_capture():
    t, h, d = 17, 16, 512
    v_a = randn(t, h, d, dtype=torch.bfloat16, device="cuda", seed=1)
    v_b = randn(t, h, d, dtype=torch.bfloat16, device="cuda", seed=2)
    s_a, s_b = randn(t, h, device="cuda", seed=3), randn(t, h, device="cuda", seed=4)
    out, out_lse = torch.empty_like(v_a), torch.empty(t, h, device="cuda")
    merge_state(v_a, s_a, v_b, s_b, out=out, out_lse=out_lse)  # builds and loads before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        merge_state(v_a, s_a, v_b, s_b, out=out, out_lse=out_lse)
    poison(out)
    poison(out_lse)
    graph.replay()
    torch.cuda.synchronize()
    v_ref, s_ref = reference.merge_state(v_a, s_a, v_b, s_b)
    assert_close(out, v_ref)
    assert_close(out_lse, s_ref)


@pytest.mark.gpu
def test_torch_compile_fullgraph_cuda():
    v_a = randn(4, 2, 64, dtype=torch.bfloat16, device="cuda", seed=1)
    v_b = randn(4, 2, 64, dtype=torch.bfloat16, device="cuda", seed=2)
    s_a, s_b = randn(4, 2, device="cuda", seed=3), randn(4, 2, device="cuda", seed=4)
    v, s = torch.compile(merge_state, fullgraph=True)(v_a, s_a, v_b, s_b)
    v_ref, s_ref = reference.merge_state(v_a, s_a, v_b, s_b)
    assert_close(v, v_ref)
    assert_close(s, s_ref)


@pytest.mark.gpu
def test_opcheck_cuda():
    from kernels_attention.ops.merge_state import MERGE_STATE

    v_a = randn(3, 2, 16, dtype=torch.bfloat16, device="cuda")
    v_b = randn(3, 2, 16, dtype=torch.bfloat16, device="cuda", seed=1)
    s_a, s_b = randn(3, 2, device="cuda", seed=2), randn(2, 3, device="cuda", seed=3).t()
    out, out_lse = torch.empty_like(v_a), torch.empty(3, 2, device="cuda")
    torch.library.opcheck(MERGE_STATE.torch_op, (out, out_lse, v_a, s_a, v_b, s_b, None))
