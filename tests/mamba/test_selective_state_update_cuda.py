"""The CUDA backend of mamba.selective_state_update against the torch reference on the same
inputs: fp32/bf16/fp16 states, tied (stride-0) and full A/dt/dt_bias, ngroups > 1, dstate not a
multiple of the pack (the scalar path) or not a power of two, padded slots (state and out rows
untouched), int64 indices, strided views, the Mamba2-2.7B head shape, CUDA graphs and
torch.compile. On CPU the torch backend runs the same checks."""

from __future__ import annotations

import pytest
import torch

from kernels_mamba import selective_state_update
from shared.testing.compare import assert_close
from shared.testing.inputs import poison, randn

BACKENDS = [
    pytest.param("cpu", "torch", id="torch"),
    pytest.param("cuda", "cuda", id="cuda", marks=pytest.mark.gpu),
]


def _inputs(device, batch, heads, head_dim, dstate, groups, tied, dtype, seed=0):
    def r(*shape, scale=1.0, s=0):
        return randn(*shape, dtype=dtype, device=device, seed=seed + s, scale=scale)

    x, z = r(batch, heads, head_dim, s=1), r(batch, heads, head_dim, s=2)
    if tied:
        dt = r(batch, heads, 1, scale=0.5, s=3).expand(batch, heads, head_dim)
        A = -randn(heads, device=device, seed=4).abs()[:, None, None]
        A = A.expand(heads, head_dim, dstate)
        D = randn(heads, device=device, seed=5)[:, None].expand(heads, head_dim)
        dt_bias = randn(heads, device=device, seed=6)[:, None].expand(heads, head_dim)
    else:
        dt = r(batch, heads, head_dim, scale=0.5, s=3)
        A = -randn(heads, head_dim, dstate, device=device, seed=4).abs()
        D = randn(heads, head_dim, device=device, seed=5)
        dt_bias = randn(heads, head_dim, device=device, seed=6)
    B, C = r(batch, groups, dstate, s=7), r(batch, groups, dstate, s=8)
    return x, dt, A, B, C, D, z, dt_bias


def _both(backend, state, *args, **kwargs):
    out_kw = kwargs.pop("out", None)
    got_s, ref_s = state.clone(), state.clone()
    got_o = None if out_kw is None else poison(out_kw.clone())
    ref_o = None if out_kw is None else got_o.clone()
    got = selective_state_update(got_s, *args, backend=backend, out=got_o, **kwargs)
    ref = selective_state_update(ref_s, *args, backend="torch", out=ref_o, **kwargs)
    assert_close(got_s, ref_s, name="state")
    if out_kw is not None:  # untouched rows stay NaN in both: compare with NaNs equal
        assert torch.equal(got.isnan(), ref.isnan())
        got, ref = got.nan_to_num(), ref.nan_to_num()
    assert_close(got, ref, name="out")


@pytest.mark.parametrize(("device", "backend"), BACKENDS)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize(
    ("heads", "head_dim", "dstate", "groups"),
    [(4, 8, 16, 2), (3, 5, 12, 1), (6, 64, 128, 3), (2, 70, 13, 1), (4, 16, 256, 4)],
)
def test_matches_reference(device, backend, state_dtype, tied, heads, head_dim, dstate, groups):
    batch = 3
    args = _inputs(device, batch, heads, head_dim, dstate, groups, tied, torch.bfloat16)
    state = randn(5, heads, head_dim, dstate, dtype=state_dtype, device=device, seed=9)
    idx = torch.tensor([4, -1, 0], dtype=torch.int32, device=device)
    out = torch.empty(batch, heads, head_dim, dtype=torch.bfloat16, device=device)
    _both(backend, state, *args, True, state_batch_indices=idx, out=out)


@pytest.mark.parametrize(("device", "backend"), BACKENDS)
def test_fp32_no_optional_terms_int64_indices(device, backend):
    x, dt, A, B, C, *_ = _inputs(device, 4, 4, 8, 32, 1, False, torch.float32)
    state = randn(6, 4, 8, 32, device=device)
    idx = torch.tensor([5, 1, 2, 0], dtype=torch.int64, device=device)
    _both(backend, state, x, dt, A, B, C, state_batch_indices=idx)
    _both(backend, state[:4], x, dt * 40, A, B, C, dt_softplus=True)  # threshold 20


@pytest.mark.parametrize(("device", "backend"), BACKENDS)
def test_strided_state_and_inputs(device, backend):
    heads, hd, ds = 4, 8, 16
    x, dt, A, B, C, D, z, dt_bias = _inputs(device, 2, heads, hd, ds, 2, True, torch.float32)
    wide = randn(3, heads, hd, ds + 4, device=device)[..., :ds]  # row stride ds + 4
    x = randn(2, heads, hd + 3, device=device)[..., 1 : hd + 1]
    _both(backend, wide, x, dt, A, B, C, D, z, dt_bias, True)


@pytest.mark.parametrize(("device", "backend"), BACKENDS)
def test_mamba2_head_shape(device, backend):
    heads, hd, ds = 80, 64, 128
    args = _inputs(device, 2, heads, hd, ds, 1, True, torch.bfloat16)
    state = randn(2, heads, hd, ds, device=device, seed=3)
    _both(backend, state, *args, True)


@pytest.mark.parametrize(("device", "backend"), BACKENDS)
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    ("batch", "heads", "head_dim", "dstate"),
    [
        (1, 4, 64, 128),  # few CTAs: 64-thread CTAs, several tiles per head
        (1, 2, 37, 24),  # odd head_dim: a partial last tile, 3 packs per bf16 row
        (40, 3, 64, 128),  # many CTAs: 256-thread CTAs, one tile per head
        (2, 2, 5, 1040),  # two ds slabs of B/C in shared memory (1024 + 16)
        (2, 2, 3, 1030),  # two slabs on the element path (ds not a multiple of the pack)
    ],
)
def test_cta_sizes_tiles_and_slabs(device, backend, state_dtype, batch, heads, head_dim, dstate):
    args = _inputs(device, batch, heads, head_dim, dstate, 1, True, torch.bfloat16, seed=11)
    state = randn(batch + 1, heads, head_dim, dstate, dtype=state_dtype, device=device, seed=12)
    idx = torch.arange(batch, 0, -1, dtype=torch.int32, device=device)
    out = torch.empty(batch, heads, head_dim, dtype=torch.bfloat16, device=device)
    _both(backend, state, *args, True, state_batch_indices=idx, out=out)


@pytest.mark.parametrize(("device", "backend"), BACKENDS)
def test_head_a_with_per_row_dt_and_mixed_dtypes(device, backend):
    """A per head (stride 0: exp(dt' A) once per row) with dt and dt_bias per row; fp32 B/C and
    D with fp16 x/z/dt (every small input in its own dtype); and the reverse, a full A with dt
    tied."""
    batch, heads, hd, ds, groups = 3, 4, 24, 64, 2
    x, dt, A, B, C, D, z, dt_bias = _inputs(device, batch, heads, hd, ds, groups, False, torch.half)
    a_head = -randn(heads, device=device, seed=20).abs()[:, None, None].expand(heads, hd, ds)
    state = randn(batch, heads, hd, ds, dtype=torch.bfloat16, device=device, seed=21)
    _both(backend, state, x, dt, a_head, B.float(), C.float(), D, z, dt_bias.half(), True)
    dt_tied = dt[:, :, :1].expand(batch, heads, hd)
    _both(backend, state.float(), x, dt_tied, A, B, C, D.half(), None, None, False)


@pytest.mark.gpu
def test_cuda_graph_and_compile():
    heads, hd, ds = 8, 64, 128
    args = _inputs("cuda", 4, heads, hd, ds, 2, True, torch.bfloat16)
    state = randn(4, heads, hd, ds, device="cuda", seed=3)
    ref_s = state.clone()
    ref = selective_state_update(ref_s, *args, True, backend="torch")
    got_s = state.clone()
    selective_state_update(got_s.clone(), *args, True)  # build before capture
    out = torch.empty_like(ref)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        selective_state_update(got_s, *args, True, out=out)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, ref)
    assert_close(got_s, ref_s)

    comp_s = state.clone()
    fn = torch.compile(lambda s: selective_state_update(s, *args, True) * 1, fullgraph=True)
    assert_close(fn(comp_s), ref)
    assert_close(comp_s, ref_s)
