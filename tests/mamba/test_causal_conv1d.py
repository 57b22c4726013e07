"""mamba.causal_conv1d_fwd and mamba.causal_conv1d_update against float64 per-sequence loops of
the Mamba-2 convolution: widths 2..4, varlen (channel-last views) and batched inputs, sequences
shorter than W-1, padded slots, initial states on and off, circular decode states, speculative
L > 1, half dtypes, empty work, bad input, opcheck."""

from __future__ import annotations

import pytest
import torch

from kernels_mamba import causal_conv1d_fwd, causal_conv1d_update
from shared.testing.compare import assert_close


def _act(y, activation):
    return y * torch.sigmoid(y) if activation else y


def oracle_fwd(x, weight, bias, states, qsl, idx, init, activation, pad=-1):
    """(y float64 [D, T], states float64) for varlen x [D, T]; loops over sequences and taps."""
    y = x.double().clone()
    new_states = None if states is None else states.double().clone()
    width = weight.shape[1]
    w = weight.double()
    for b in range(len(qsl) - 1):
        c = b if idx is None else idx[b]
        if idx is not None and c == pad:
            continue
        start, end = qsl[b], qsl[b + 1]
        prefix = torch.zeros(x.shape[0], width - 1, dtype=torch.float64)
        if states is not None and init is not None and init[b]:
            prefix = states[c].double()
        xx = torch.cat([prefix, x[:, start:end].double()], dim=1)
        for t in range(end - start):
            acc = torch.zeros(x.shape[0], dtype=torch.float64)
            if bias is not None:
                acc += bias.double()
            for j in range(width):
                acc += w[:, j] * xx[:, t + j]
            y[:, start + t] = _act(acc, activation)
        if new_states is not None:
            new_states[c] = xx[:, -(width - 1) :]
    return y, new_states


def _rand(*shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("activation", ["silu", None])
def test_fwd_varlen_with_states(width, dtype, activation):
    dim, lens = 20, [5, 0, 1, 2, 13, 3]
    qsl = [0]
    for n in lens:
        qsl.append(qsl[-1] + n)
    proj = _rand(qsl[-1], dim + 6, seed=width, dtype=dtype)
    x = proj[:, :dim].T  # channel-last view: strides (1, dim + 6)
    weight, bias = _rand(dim, width, seed=1), _rand(dim, seed=2)
    states = _rand(9, dim, width - 1, seed=3)
    idx = [7, 2, -1, 0, 5, 8]
    init = [True, False, True, True, False, True]
    want_y, want_states = oracle_fwd(x, weight, bias, states, qsl, idx, init, activation)
    out = causal_conv1d_fwd(
        x,
        weight,
        bias,
        states,
        torch.tensor(qsl, dtype=torch.int32),
        torch.tensor(idx, dtype=torch.int32),
        torch.tensor(init),
        activation,
    )
    assert out is x
    assert_close(x, want_y.to(dtype))
    assert torch.equal(states, want_states.float())


@pytest.mark.parametrize("width", [2, 4])
def test_fwd_batched_without_states(width):
    x = _rand(3, 16, 9, seed=4, dtype=torch.float16)
    weight = _rand(16, width, seed=5)
    flat = x.transpose(0, 1).reshape(16, 27)
    want, _ = oracle_fwd(flat, weight, None, None, [0, 9, 18, 27], None, None, "silu")
    causal_conv1d_fwd(x, weight)
    assert_close(x, want.reshape(16, 3, 9).transpose(0, 1).to(torch.float16))


def test_fwd_batched_states_round_trip():
    """Prefill in two chunks with the state carried over equals one prefill of the whole."""
    dim, width = 8, 4
    weight, bias = _rand(dim, width, seed=6), _rand(dim, seed=7)
    full = _rand(2, dim, 10, seed=8)
    whole = full.clone()
    causal_conv1d_fwd(whole, weight, bias, torch.zeros(2, dim, 3), has_initial_state=None)
    states = torch.zeros(2, dim, 3)
    first, second = full[..., :6].clone(), full[..., 6:].clone()
    causal_conv1d_fwd(first, weight, bias, states, has_initial_state=torch.tensor([False, False]))
    causal_conv1d_fwd(second, weight, bias, states, has_initial_state=torch.tensor([True, True]))
    assert_close(torch.cat([first, second], -1), whole)


def test_fwd_empty_and_errors():
    weight = _rand(4, 3, seed=9)
    x = torch.empty(4, 0)
    causal_conv1d_fwd(x, weight, None, None, torch.zeros(1, dtype=torch.int32))
    x = _rand(4, 6, seed=10)
    qsl = torch.tensor([0, 6], dtype=torch.int32)
    with pytest.raises(
        ValueError, match=r"causal_conv1d_fwd: varlen x \[D, T\] needs query_start_loc"
    ):
        causal_conv1d_fwd(x, weight)
    with pytest.raises(
        ValueError, match=r"weight must have shape \[D, W\] = \[4, 2..4\], got \(4, 5\)"
    ):
        causal_conv1d_fwd(x, _rand(4, 5, seed=0), None, None, qsl)
    with pytest.raises(
        ValueError, match=r"conv_states must have shape \[S, D, W-1\] = \[S, 4, 2\]"
    ):
        causal_conv1d_fwd(x, weight, None, torch.zeros(2, 4, 3), qsl)
    with pytest.raises(ValueError, match=r"activation must be one of .* got 'gelu'"):
        causal_conv1d_fwd(x, weight, None, None, qsl, activation="gelu")
    with pytest.raises(ValueError, match=r"query_start_loc must be non-decreasing within \[0, 6\]"):
        causal_conv1d_fwd(x, weight, None, None, torch.tensor([0, 7], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"cache_indices must lie in \[0, 2\)"):
        causal_conv1d_fwd(
            x, weight, None, torch.zeros(2, 4, 2), qsl, torch.tensor([2], dtype=torch.int32)
        )


def oracle_update(x, state, weight, bias, activation, seqlens=None, idx=None, pad=-1):
    xv = x.double() if x.dim() == 3 else x.double()[..., None]
    out, new_state = xv.clone(), state.double().clone()
    width, length, state_len = weight.shape[1], xv.shape[2], state.shape[2]
    for b in range(xv.shape[0]):
        c = b if idx is None else idx[b]
        if idx is not None and c == pad:
            continue
        st = state[c].double()
        if seqlens is None:
            xx = torch.cat([st, xv[b]], dim=1)
            new_state[c] = xx[:, -state_len:]
        else:
            window = [(seqlens[b] - (width - 1) + k) % state_len for k in range(width - 1)]
            xx = torch.cat([st[:, window], xv[b]], dim=1)
            for t in range(length):
                new_state[c][:, (seqlens[b] + t) % state_len] = xv[b][:, t]
        n = xx.shape[1]
        for t in range(length):
            acc = bias.double().clone() if bias is not None else torch.zeros(xv.shape[1]).double()
            for j in range(width):
                acc += weight[:, j].double() * xx[:, n - length - (width - 1) + t + j]
            out[b, :, t] = _act(acc, activation)
    return (out if x.dim() == 3 else out[..., 0]), new_state


@pytest.mark.parametrize("width", [2, 3, 4])
@pytest.mark.parametrize("length", [None, 1, 3])
@pytest.mark.parametrize("state_len", [3, 7])
def test_update_shift_state(width, length, state_len):
    shape = (4, 12) if length is None else (4, 12, length)
    x = _rand(*shape, seed=width + state_len)
    state = _rand(6, 12, state_len, seed=11)
    weight, bias = _rand(12, width, seed=12), _rand(12, seed=13)
    idx = [5, -1, 0, 2]
    want_x, want_state = oracle_update(x, state, weight, bias, "silu", idx=idx)
    causal_conv1d_update(
        x, state, weight, bias, "silu", conv_state_indices=torch.tensor(idx, dtype=torch.int32)
    )
    assert_close(x, want_x.float())
    assert torch.equal(state, want_state.float())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_update_circular_state(dtype):
    x = _rand(3, 10, 2, seed=14, dtype=dtype)
    state = _rand(3, 10, 5, seed=15, dtype=dtype)
    weight = _rand(10, 4, seed=16)
    seqlens = [0, 4, 11]
    want_x, want_state = oracle_update(x, state, weight, None, None, seqlens=seqlens)
    causal_conv1d_update(x, state, weight, cache_seqlens=torch.tensor(seqlens, dtype=torch.int32))
    assert_close(x, want_x.to(dtype))
    assert torch.equal(state, want_state.to(dtype))


def test_update_empty_and_errors():
    state = _rand(2, 8, 3, seed=17)
    before = state.clone()
    causal_conv1d_update(torch.empty(0, 8), state, _rand(8, 4, seed=18))
    assert torch.equal(state, before)
    x, weight = _rand(2, 8, seed=19), _rand(8, 4, seed=20)
    with pytest.raises(
        ValueError, match=r"conv_state must have shape \[S, D, Ls\] = \[S, 8, >= 3\]"
    ):
        causal_conv1d_update(x, state[..., :2], weight)
    with pytest.raises(
        ValueError, match=r"without conv_state_indices conv_state needs >= B = 2 rows"
    ):
        causal_conv1d_update(x, state[:1], weight)
    with pytest.raises(ValueError, match=r"conv_state_indices must lie in \[0, 2\)"):
        causal_conv1d_update(x, state, weight, conv_state_indices=torch.tensor([0, 5]))
    with pytest.raises(ValueError, match=r"cache_seqlens must have 2 entries, got 1"):
        causal_conv1d_update(x, state, weight, cache_seqlens=torch.tensor([0]))


def test_opcheck():
    from kernels_mamba.ops.causal_conv1d_fwd import CAUSAL_CONV1D_FWD
    from kernels_mamba.ops.causal_conv1d_update import CAUSAL_CONV1D_UPDATE

    x, weight, bias = _rand(8, 9, seed=21), _rand(8, 3, seed=22), _rand(8, seed=23)
    states = _rand(3, 8, 2, seed=24)
    qsl = torch.tensor([0, 4, 9], dtype=torch.int32)
    idx = torch.tensor([2, 0], dtype=torch.int32)
    init = torch.tensor([True, False])
    torch.library.opcheck(
        CAUSAL_CONV1D_FWD.torch_op, (x, weight, bias, states, qsl, idx, init, "silu", -1, None)
    )
    torch.library.opcheck(
        CAUSAL_CONV1D_UPDATE.torch_op,
        (_rand(2, 8, seed=25), states, weight, bias, None, None, idx, -1, None),
    )
