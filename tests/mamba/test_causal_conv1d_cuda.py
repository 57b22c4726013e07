"""The CUDA backends of mamba.causal_conv1d_fwd and mamba.causal_conv1d_update against the torch
reference on the same inputs: widths 2..4, every dtype, channel-last and contiguous varlen views,
batched inputs, initial states, padded and too-short sequences, long sequences (several rounds of
the fwd kernel), circular and shifted decode states, speculative L > 1, strided and misaligned
views, empty work, CUDA graphs and torch.compile. On CPU the torch backend runs the same checks."""

from __future__ import annotations

import pytest
import torch

from kernels_mamba import causal_conv1d_fwd, causal_conv1d_update
from shared.testing.compare import assert_close
from shared.testing.inputs import misaligned, randn

BACKENDS = [
    pytest.param("cpu", "torch", id="torch"),
    pytest.param("cuda", "cuda", id="cuda", marks=pytest.mark.gpu),
]
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _qsl(lens, device):
    q = [0]
    for n in lens:
        q.append(q[-1] + n)
    return torch.tensor(q, dtype=torch.int32, device=device)


def _fwd_both(backend, x, *args, **kwargs):
    """Runs the backend and the reference on clones; returns ((x, states), (x_ref, states_ref))."""
    states = args[2] if len(args) > 2 else kwargs.get("conv_states")
    got_x, ref_x = x.clone(), x.clone()
    if x.dim() == 2 and x.stride(0) == 1:  # keep the channel-last layout of the input
        got_x = x.T.clone().T
        ref_x = x.T.clone().T
    got_s = None if states is None else states.clone()
    ref_s = None if states is None else states.clone()

    def call(xx, ss, name):
        a = list(args)
        kw = dict(kwargs)
        if len(a) > 2:
            a[2] = ss
        elif "conv_states" in kw:
            kw["conv_states"] = ss
        causal_conv1d_fwd(xx, *a, backend=name, **kw)

    call(got_x, got_s, backend)
    call(ref_x, ref_s, "torch")
    return (got_x, got_s), (ref_x, ref_s)


@pytest.mark.parametrize(("device", "backend"), BACKENDS)
@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["channel_last", "contiguous"])
def test_fwd_varlen(device, backend, width, dtype, layout):
    dim, lens = 48, [5, 0, 1, 2, 300, 3, 2100]
    qsl = _qsl(lens, device)
    tokens = int(qsl[-1])
    if layout == "channel_last":
        x = randn(tokens, dim + 8, dtype=dtype, device=device, seed=width)[:, :dim].T
    else:
        x = randn(dim, tokens, dtype=dtype, device=device, seed=width)
    weight = randn(dim, width, device=device, seed=1)
    bias = randn(dim, device=device, seed=2)
    states = randn(9, dim, width - 1, dtype=dtype, device=device, seed=3)
    idx = torch.tensor([4, -1, 1, 0, 7, 2, 8], dtype=torch.int32, device=device)
    init = torch.tensor([True, True, False, True, True, False, True], device=device)
    got, ref = _fwd_both(backend, x, weight, bias, states, qsl, idx, init, "silu")
    assert_close(got[0], ref[0], name="x")
    assert_close(got[1], ref[1], name="conv_states")


@pytest.mark.parametrize(("device", "backend"), BACKENDS)
@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["channel_last", "contiguous"])
def test_fwd_varlen_long_sequences(device, backend, width, dtype, layout):
    """Sequences of several iterations of the channel-first warp (whole interior iterations,
    sequence starts off a pack boundary, a row whose start is off a 16-byte boundary) and several
    rounds of the channel-last CTA, with and without initial states and silu."""
    dim, lens = 24, [3, 5001, 0, 7, 9000]
    qsl = _qsl(lens, device)
    tokens = int(qsl[-1])
    if layout == "channel_last":
        x = randn(tokens, dim + 8, dtype=dtype, device=device, seed=width)[:, :dim].T
    else:  # rows of 14011 elements: most rows start off a 16-byte boundary
        x = randn(dim, tokens, dtype=dtype, device=device, seed=width)
    weight = randn(dim, width, dtype=dtype, device=device, seed=1)
    bias = randn(dim, device=device, seed=2)
    states = randn(6, dim, width - 1, dtype=dtype, device=device, seed=3)
    idx = torch.tensor([5, 0, 3, 1, 2], dtype=torch.int32, device=device)
    init = torch.tensor([True, False, True, True, True], device=device)
    for act in ("silu", None):
        got, ref = _fwd_both(backend, x, weight, bias, states, qsl, idx, init, act)
        assert_close(got[0], ref[0], name="x")
        assert_close(got[1], ref[1], name="conv_states")


@pytest.mark.parametrize(("device", "backend"), BACKENDS)
@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fwd_varlen_short_rows(device, backend, width, dtype):
    """Channel-first rows of at most 512 columns (the 2-pack warp kernel, every dtype):
    several sequences with initial states, a padded, an empty and a too-short one."""
    dim, lens = 40, [5, 0, 1, 2, 300, 3, 150]
    qsl = _qsl(lens, device)
    x = randn(dim, int(qsl[-1]), dtype=dtype, device=device, seed=width)
    weight = randn(dim, width, dtype=dtype, device=device, seed=1)
    bias = randn(dim, device=device, seed=2)
    states = randn(9, dim, width - 1, dtype=dtype, device=device, seed=3)
    idx = torch.tensor([4, -1, 1, 0, 7, 2, 8], dtype=torch.int32, device=device)
    init = torch.tensor([True, True, False, True, True, False, True], device=device)
    for act in ("silu", None):
        got, ref = _fwd_both(backend, x, weight, bias, states, qsl, idx, init, act)
        assert_close(got[0], ref[0], name="x")
        assert_close(got[1], ref[1], name="conv_states")


def _cf_packs_run(fn) -> list[int]:
    """The packs per lane (kU: 2 or 8) of every channel-first warp kernel run while fn runs
    (its instantiation's name, from torch.profiler)."""
    import re

    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    names = " ".join(event.key for event in prof.key_averages())
    return sorted({int(u) for u in re.findall(r"fwd_cf_kernel<[^<>]*, (\d+)>", names)})


# _SHORT_ROW_MAX_BYTES (read each call): channel-first rows of at most that many bytes take the
# 2-pack kernel (two iterations loaded ahead), longer ones the 8-pack kernel (one ahead). Each
# side of the default (2 KB: 1024 16-bit columns, 512 fp32) and of a row's exact byte count, and
# both kernels forced on every length: the 8-pack kernel on short rows, the 2-pack kernel over
# many iterations (each buffer reloaded in turn), batched and varlen with states.
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("length", [7, 500, 512, 513, 1023, 1024, 1025, 4100])
@pytest.mark.parametrize("setting", ["default", "never", "always", "edge", "edge-1"])
def test_fwd_short_row_threshold(monkeypatch, dtype, length, setting):
    import sys

    from kernels_mamba.ops import causal_conv1d_fwd as mod

    row_bytes = length * dtype.itemsize
    threshold = {
        "default": mod._SHORT_ROW_MAX_BYTES,
        "never": -1,
        "always": sys.maxsize,
        "edge": row_bytes,
        "edge-1": row_bytes - 1,
    }[setting]
    monkeypatch.setattr(mod, "_SHORT_ROW_MAX_BYTES", threshold)
    expected = [2] if row_bytes <= threshold else [8]
    dim, width = 40, 4
    x = randn(3, dim, length, dtype=dtype, device="cuda", seed=length)
    weight = randn(dim, width, dtype=dtype, device="cuda", seed=1)
    bias = randn(dim, device="cuda", seed=2)
    out = []
    packs = _cf_packs_run(
        lambda: out.append(_fwd_both("cuda", x, weight, bias, None, None, None, None, "silu"))
    )
    assert packs == expected, (packs, threshold)
    assert_close(out[0][0][0], out[0][1][0], name="x")
    # varlen [D, T] with states: T (every sequence's bound) is the row length
    lens = [3, length - 10, 0, 7] if length > 10 else [length]
    qsl = _qsl(lens, "cuda")
    xv = randn(dim, length, dtype=dtype, device="cuda", seed=length + 1)
    states = randn(5, dim, width - 1, dtype=dtype, device="cuda", seed=3)
    idx = torch.tensor([4, 0, 1, 2][: len(lens)], dtype=torch.int32, device="cuda")
    init = torch.tensor([True, False, True, True][: len(lens)], device="cuda")
    out.clear()
    packs = _cf_packs_run(
        lambda: out.append(_fwd_both("cuda", xv, weight, bias, states, qsl, idx, init, None))
    )
    assert packs == expected, (packs, threshold)
    got, ref = out[0]
    assert_close(got[0], ref[0], name="x")
    assert_close(got[1], ref[1], name="conv_states")


@pytest.mark.parametrize(("device", "backend"), BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("length", [1, 7, 500, 1000, 1023, 1030, 4100])
def test_fwd_batched_no_state(device, backend, dtype, length):
    """Rows of up to 1024 (16-bit) or 512 (fp32) columns take the 2-pack warp kernel (1023: rows
    off a 16-byte boundary, 3 iterations of it), longer ones the 8-pack kernel (4100: 3 or more
    iterations, the next one's packs loaded during each)."""
    dim, width = 40, 4
    x = randn(3, dim, length, dtype=dtype, device=device, seed=length)
    weight = randn(dim, width, dtype=dtype, device=device, seed=1)
    got, ref = _fwd_both(backend, x, weight, None, None, None, None, None, None)
    assert_close(got[0], ref[0], name="x")


@pytest.mark.parametrize(("device", "backend"), BACKENDS)
def test_fwd_batched_channel_last_with_states_and_odd_dim(device, backend):
    dim, width, length = 37, 3, 260
    x = randn(2, length, dim, dtype=torch.bfloat16, device=device).transpose(1, 2)
    weight = randn(dim, width, device=device, seed=1)
    bias = randn(dim, dtype=torch.bfloat16, device=device, seed=2)
    states = randn(4, dim, width - 1, device=device, seed=3)
    idx = torch.tensor([3, 1], dtype=torch.int64, device=device)
    init = torch.tensor([True, False], device=device)
    got_x, ref_x = x.clone(), x.clone()
    got_s, ref_s = states.clone(), states.clone()
    causal_conv1d_fwd(got_x, weight, bias, got_s, None, idx, init, backend=backend)
    causal_conv1d_fwd(ref_x, weight, bias, ref_s, None, idx, init, backend="torch")
    assert_close(got_x, ref_x, name="x")
    assert_close(got_s, ref_s, name="conv_states")


@pytest.mark.parametrize(("device", "backend"), BACKENDS)
def test_fwd_misaligned_and_empty(device, backend):
    dim, width = 16, 4
    x = randn(50, dim, dtype=torch.bfloat16, device=device)
    got = misaligned(x).T  # channel-last, one element past a 16-byte boundary: the scalar path
    ref = x.clone().T
    weight = randn(dim, width, device=device, seed=1)
    qsl = _qsl([20, 30], device)
    causal_conv1d_fwd(got, weight, None, None, qsl, backend=backend)
    causal_conv1d_fwd(ref, weight, None, None, qsl, backend="torch")
    assert_close(got, ref, name="x")
    empty = torch.empty(dim, 0, device=device)
    causal_conv1d_fwd(empty, weight, None, None, _qsl([0], device), backend=backend)


def _update_both(backend, x, state, *args, **kwargs):
    """Both backends on clones (a clone keeps a transposed state's layout); returns ``backend``'s
    x."""
    got_x, ref_x = x.clone(), x.clone()
    got_s, ref_s = state.clone(), state.clone()
    causal_conv1d_update(got_x, got_s, *args, backend=backend, **kwargs)
    causal_conv1d_update(ref_x, ref_s, *args, backend="torch", **kwargs)
    assert_close(got_x, ref_x, name="x")
    assert_close(got_s, ref_s, name="conv_state")
    return got_x


@pytest.mark.parametrize(("device", "backend"), BACKENDS)
@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("length", [None, 1, 3])
@pytest.mark.parametrize("circular", [False, True])
def test_update(device, backend, width, dtype, length, circular):
    batch, dim, state_len = 5, 130, width - 1 + (2 if circular else 0)
    shape = (batch, dim) if length is None else (batch, dim, length)
    x = randn(*shape, dtype=dtype, device=device, seed=width)
    state = randn(7, dim, state_len, dtype=dtype, device=device, seed=1)
    weight = randn(dim, width, device=device, seed=2)
    bias = randn(dim, device=device, seed=3)
    idx = torch.tensor([6, -1, 0, 3, 2], dtype=torch.int32, device=device)
    seqlens = torch.tensor([0, 4, 9, 1, 17], dtype=torch.int32, device=device) if circular else None
    _update_both(
        backend,
        x,
        state,
        weight,
        bias,
        "silu",
        cache_seqlens=seqlens,
        conv_state_indices=idx,
    )


@pytest.mark.parametrize(("device", "backend"), BACKENDS)
@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("circular", [False, True])
@pytest.mark.parametrize("state_layout", ["rows", "channel_last"])
@pytest.mark.parametrize("weight_like_x", [True, False])
def test_update_decode_vector_path(
    device, backend, width, dtype, circular, state_layout, weight_like_x
):
    """The decode shape (x [B, D], Ls = W-1, D a multiple of the 16-byte pack): 16-byte state,
    x, tap and bias packs (weight and bias in the dtype of x) or scalar taps (fp32 weight), the
    state as [S, D, W-1] rows or the [S, W-1, D] channel-last view, shifted or circular."""
    batch, dim, slots = 6, 256, 9
    x = randn(batch, dim, dtype=dtype, device=device, seed=width)
    if state_layout == "rows":
        state = randn(slots, dim, width - 1, dtype=dtype, device=device, seed=1)
    else:
        state = randn(slots, width - 1, dim, dtype=dtype, device=device, seed=1).transpose(1, 2)
    wdtype = dtype if weight_like_x else torch.float32
    weight = randn(dim, width, dtype=wdtype, device=device, seed=2)
    bias = randn(dim, dtype=wdtype, device=device, seed=3)
    idx = torch.tensor([8, -1, 0, 3, 2, 5], dtype=torch.int32, device=device)
    seqlens = (
        torch.tensor([0, 4, 9, 1, 17, 2], dtype=torch.int32, device=device) if circular else None
    )
    got_s, ref_s = state.clone(), state.clone()
    if state_layout == "channel_last":  # keep the layout through the clones
        got_s = state.transpose(1, 2).clone().transpose(1, 2)
        ref_s = state.transpose(1, 2).clone().transpose(1, 2)
    got_x, ref_x = x.clone(), x.clone()
    kw = {"cache_seqlens": seqlens, "conv_state_indices": idx}
    causal_conv1d_update(got_x, got_s, weight, bias, "silu", backend=backend, **kw)
    causal_conv1d_update(ref_x, ref_s, weight, bias, "silu", backend="torch", **kw)
    assert_close(got_x, ref_x, name="x")
    assert_close(got_s, ref_s, name="conv_state")
    causal_conv1d_update(got_x, got_s, weight, None, None, backend=backend)  # no bias, no idx
    causal_conv1d_update(ref_x, ref_s, weight, None, None, backend="torch")
    assert_close(got_x, ref_x, name="x")
    assert_close(got_s, ref_s, name="conv_state")


@pytest.mark.parametrize(("device", "backend"), BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("circular", [False, True])
@pytest.mark.parametrize("state_layout", ["rows", "channel_last"])
@pytest.mark.parametrize("batch", [258, 521])
def test_update_decode_many_rows(device, backend, dtype, circular, state_layout, batch):
    """Large decode batches at D = 4096: B = 258 (a row per thread, the grid one wave of 16 CTAs
    per SM on the H200) and B = 521 (past one wave: 4 batch rows per thread, the last group of
    rows short): permuted state rows, pad_slot_id rows untouched, shifted or circular."""
    dim, width, slots = 4096, 4, 600
    x = randn(batch, dim, dtype=dtype, device=device, seed=4)
    if state_layout == "rows":
        state = randn(slots, dim, width - 1, dtype=dtype, device=device, seed=1)
    else:
        state = randn(slots, width - 1, dim, dtype=dtype, device=device, seed=1).transpose(1, 2)
    weight = randn(dim, width, dtype=dtype, device=device, seed=2)
    bias = randn(dim, dtype=dtype, device=device, seed=3)
    g = torch.Generator().manual_seed(5)
    idx = torch.randperm(slots, generator=g)[:batch].to(torch.int32)
    idx[::7] = -1
    idx = idx.to(device)
    seqlens = (
        torch.randint(0, 50, (batch,), generator=g, dtype=torch.int32).to(device)
        if circular
        else None
    )
    kw = {"cache_seqlens": seqlens, "conv_state_indices": idx}
    got_x = _update_both(backend, x, state, weight, bias, "silu", **kw)
    assert torch.equal(got_x[::7], x[::7])


@pytest.mark.parametrize(("device", "backend"), BACKENDS)
def test_update_strided_views_no_indices(device, backend):
    batch, dim, width = 3, 64, 4
    x = randn(batch, dim + 5, dtype=torch.bfloat16, device=device)[:, 2 : dim + 2]
    state = randn(batch, 5, dim, dtype=torch.bfloat16, device=device).transpose(1, 2)
    weight = randn(width, dim, device=device).T
    _update_both(backend, x, state, weight, None, None)


@pytest.mark.gpu
def test_cuda_graph_and_compile():
    dim, width = 256, 4
    x = randn(4, dim, dtype=torch.bfloat16, device="cuda")
    state = randn(4, dim, width - 1, dtype=torch.bfloat16, device="cuda", seed=1)
    weight = randn(dim, width, device="cuda", seed=2)
    ref_x, ref_s = x.clone(), state.clone()
    causal_conv1d_update(ref_x, ref_s, weight, None, "silu", backend="torch")
    got_x, got_s = x.clone(), state.clone()
    causal_conv1d_update(got_x.clone(), got_s.clone(), weight, None, "silu")  # build first
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        causal_conv1d_update(got_x, got_s, weight, None, "silu")
    graph.replay()
    torch.cuda.synchronize()
    assert_close(got_x, ref_x)
    assert_close(got_s, ref_s)

    xs = randn(dim, 100, dtype=torch.bfloat16, device="cuda", seed=5)
    qsl = _qsl([40, 60], "cuda")
    ref = xs.clone()
    causal_conv1d_fwd(ref, weight, None, None, qsl, backend="torch")

    def f(t):
        causal_conv1d_fwd(t, weight, None, None, qsl)
        return t * 1

    got = torch.compile(f, fullgraph=True)(xs.clone())
    assert_close(got, ref)
