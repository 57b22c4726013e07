"""mamba.selective_state_update against float64 loops over requests and heads: groups, tied
(stride-0) per-head parameters, softplus on both sides of its threshold, D and z optional,
padded slots, bf16 state, out=, empty batch, bad input, opcheck and torch.compile."""

from __future__ import annotations

import math

import pytest
import torch

from kernels_mamba import selective_state_update
from shared.testing.compare import assert_close


def oracle(state, x, dt, A, B, C, D, z, dt_bias, softplus, idx, pad=-1):  # noqa: N803
    new_state = state.double().clone()
    out = torch.zeros(x.shape, dtype=torch.float64)
    heads, groups = x.shape[1], B.shape[1]
    for b in range(x.shape[0]):
        c = b if idx is None else idx[b]
        if idx is not None and c == pad:
            continue
        for h in range(heads):
            g = h // (heads // groups)
            step = dt[b, h].double() + (dt_bias[h].double() if dt_bias is not None else 0)
            if softplus:
                step = torch.tensor(
                    [v if v > 20 else math.log1p(math.exp(v)) for v in step.tolist()]
                )
                step = step.double()
            s = state[c, h].double()
            s = (
                s * torch.exp(step[:, None] * A[h].double())
                + (step[:, None] * B[b, g].double()[None, :]) * x[b, h].double()[:, None]
            )
            new_state[c, h] = s
            y = (s * C[b, g].double()[None, :]).sum(-1)
            if D is not None:
                y = y + x[b, h].double() * D[h].double()
            if z is not None:
                zz = z[b, h].double()
                y = y * zz * torch.sigmoid(zz)
            out[b, h] = y
    return out, new_state


def _inputs(batch, heads, head_dim, dstate, groups, seed, tied=False, state_dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return torch.randn(*shape, generator=g) * scale

    state = rnd(batch + 3, heads, head_dim, dstate).to(state_dtype)
    x, z = rnd(batch, heads, head_dim), rnd(batch, heads, head_dim)
    dt = rnd(batch, heads, head_dim, scale=2.0)
    if tied:
        A = (-torch.rand(heads, generator=g))[:, None, None].expand(heads, head_dim, dstate)
        D = rnd(heads)[:, None].expand(heads, head_dim)
        dt_bias = rnd(heads)[:, None].expand(heads, head_dim)
    else:
        A = -torch.rand(heads, head_dim, dstate, generator=g)
        D, dt_bias = rnd(heads, head_dim), rnd(heads, head_dim)
    B, C = rnd(batch, groups, dstate), rnd(batch, groups, dstate)
    return state, x, dt, A, B, C, D, z, dt_bias


@pytest.mark.parametrize(
    ("batch", "heads", "head_dim", "dstate", "groups"),
    [(1, 1, 1, 1, 1), (3, 4, 8, 16, 2), (2, 6, 5, 13, 3), (4, 8, 16, 64, 1)],
)
@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("softplus", [False, True])
def test_matches_oracle(batch, heads, head_dim, dstate, groups, tied, softplus):
    args = _inputs(batch, heads, head_dim, dstate, groups, seed=batch + heads + dstate, tied=tied)
    state = args[0]
    want_out, want_state = oracle(*args, softplus, None)
    out = selective_state_update(*args, softplus)
    assert_close(out, want_out.float())
    assert_close(state, want_state.float())


def test_softplus_threshold_and_optional_terms():
    state, x, dt, A, B, C, _, _, _ = _inputs(2, 2, 4, 8, 1, seed=1)
    dt[0, 0] = torch.tensor([19.0, 21.0, -30.0, 0.0])
    want_out, want_state = oracle(state, x, dt, A, B, C, None, None, None, True, None)
    out = selective_state_update(state, x, dt, A, B, C, dt_softplus=True)
    assert_close(out, want_out.float())
    assert_close(state, want_state.float())


def test_padded_slots_bf16_state_and_out():
    state, x, dt, A, B, C, D, z, dt_bias = _inputs(
        4, 4, 8, 16, 2, seed=2, state_dtype=torch.bfloat16
    )
    idx = [6, -1, 0, 3]
    want_out, want_state = oracle(state, x, dt, A, B, C, D, z, dt_bias, True, idx)
    out = torch.full((4, 4, 8), 7.0)
    got = selective_state_update(
        state, x, dt, A, B, C, D, z, dt_bias, True,
        state_batch_indices=torch.tensor(idx, dtype=torch.int32), out=out,
    )  # fmt: skip
    assert got is out
    assert (out[1] == 7.0).all()  # the padded row is left untouched
    assert_close(out[[0, 2, 3]], want_out[[0, 2, 3]].float())
    assert_close(state, want_state.to(torch.bfloat16))


def test_empty_and_errors():
    state, x, dt, A, B, C, _, _, dt_bias = _inputs(2, 4, 8, 16, 2, seed=3)
    before = state.clone()
    assert selective_state_update(state, x[:0], dt[:0], A, B[:0], C[:0]).shape == (0, 4, 8)
    assert torch.equal(state, before)
    with pytest.raises(ValueError, match=r"B must be \[B, ng, ds\] with ng dividing nh = 4"):
        selective_state_update(state, x, dt, A, B[:, :1].expand(2, 3, 16), C)
    with pytest.raises(ValueError, match=r"selective_state_update: A must have shape \(4, 8, 16\)"):
        selective_state_update(state, x, dt, A[..., :8], B, C)
    with pytest.raises(ValueError, match=r"dt_bias must have 2 dims, got shape \(4,\)"):
        selective_state_update(state, x, dt, A, B, C, dt_bias=dt_bias[:, 0])
    with pytest.raises(ValueError, match=r"state_batch_indices must lie in \[0, 5\)"):
        selective_state_update(state, x, dt, A, B, C, state_batch_indices=torch.tensor([0, 9]))


def test_opcheck_and_compile():
    from kernels_mamba.ops.selective_state_update import SELECTIVE_STATE_UPDATE

    state, x, dt, A, B, C, D, z, dt_bias = _inputs(2, 4, 8, 16, 2, seed=4)
    out = torch.empty(2, 4, 8)
    idx = torch.tensor([1, -1], dtype=torch.int32)
    args = (out, state, x, dt, A, B, C, D, z, dt_bias, True, idx, -1, None)
    torch.library.opcheck(SELECTIVE_STATE_UPDATE.torch_op, args)

    def step(state, x, dt):
        return selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, True)

    eager_state, compiled_state = state.clone(), state.clone()
    want = step(eager_state, x, dt)
    got = torch.compile(step, fullgraph=True)(compiled_state, x, dt)
    assert torch.equal(got, want) and torch.equal(compiled_state, eager_state)
