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
from shared.testing.inputs import randn

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
