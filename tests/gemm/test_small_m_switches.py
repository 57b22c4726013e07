"""The small-M engine's host switches (csrc/small_m_gemm.cuh), module attributes of each op file
read on every call: _RING_MAX_M (the ring kernel for long runs at M <= it), _CLUSTER_PUSH
(st.async pushes in the split-K reduction, else DSMEM stores and a cluster barrier) and
_WEIGHT_FIRST (under PDL the weight before griddepcontrol.wait). Every setting must give the
float64-bounded result, bit for bit the same as every other (same k order and sums; equal up to
the sign of zero), and keep the PDL contract (only x waits)."""

from __future__ import annotations

import itertools

import pytest
import torch

import kernels_gemm.ops.dsv3_fused_a_gemm as fused_a_module
import kernels_gemm.ops.dsv3_router_gemm as router_module
from kernels_gemm import dsv3_fused_a_gemm, dsv3_router_gemm
from shared.testing.graphs import assert_pdl_chain_matches_eager
from shared.testing.inputs import poison, randn


def _check(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, name: str) -> None:
    """out = x @ w.T ([M, K] by [N, K] rows) within the fp32-accumulation bound of the ops' own
    tests ((K/16 + 16) * 2^-22 * |x| @ |w|.T), plus one ulp for bf16 out."""
    xd, wd = x.double().cpu(), w.double().cpu()
    exact = xd @ wd.t()
    bound = (x.shape[1] / 16 + 16) * 2.0**-22 * (xd.abs() @ wd.abs().t())
    if out.dtype == torch.bfloat16:
        bound = bound + 2.0**-8 * exact.abs()
    got = out.double().cpu()
    assert not got.isnan().any(), f"{name}: NaN (an element was not written)"
    bad = (got - exact).abs() > bound + 1e-30
    assert not bad.any(), f"{name}: {int(bad.sum())} of {bad.numel()} elements outside the bound"


# (ring_max_m, push, weight_first): the ring never, from M 9 on only (the threshold), always.
COMBOS = list(itertools.product((0, 8, 16), (False, True), (False, True)))
IDS = [f"ring{r}-push{int(p)}-wfirst{int(w)}" for r, p, w in COMBOS]


def _set(monkeypatch, module, combo) -> None:
    ring_max_m, push, weight_first = combo
    monkeypatch.setattr(module, "_RING_MAX_M", ring_max_m)
    monkeypatch.setattr(module, "_CLUSTER_PUSH", push)
    monkeypatch.setattr(module, "_WEIGHT_FIRST", weight_first)


def test_defaults():
    """The defaults of 2026-12-05 (the H100 A/B): fused_a the ring and the weight first without
    the push instantiation, the router all three."""
    assert (fused_a_module._RING_MAX_M, fused_a_module._CLUSTER_PUSH) == (16, False)
    assert fused_a_module._WEIGHT_FIRST is True
    assert (router_module._RING_MAX_M, router_module._CLUSTER_PUSH) == (16, True)
    assert router_module._WEIGHT_FIRST is True


@pytest.mark.parametrize(
    ("module", "name"),
    ((fused_a_module, "dsv3_fused_a_gemm"), (router_module, "dsv3_router_gemm")),
)
def test_cuda_backend_passes_the_attributes_read_at_call_time(monkeypatch, module, name):
    """The cuda backend reads the attributes on each call (not at import) and passes them after
    enable_pdl, as ints."""
    seen = []
    monkeypatch.setattr(module, f"_{name}_kernel", lambda *args: seen.append(args[3:]))
    backend = getattr(module, f"_{name}_cuda")
    for combo in ((0, False, False), (9, True, False), (16, False, True)):
        _set(monkeypatch, module, combo)
        backend("out", "x", "w", -1)
        ring_max_m, push, weight_first = combo
        assert seen[-1] == (-1, ring_max_m, int(push), int(weight_first))
        assert all(type(v) is int for v in seen[-1])


@pytest.mark.gpu
@pytest.mark.parametrize("combo", COMBOS, ids=IDS)
@pytest.mark.parametrize("m", (1, 8, 9, 16))
def test_fused_a_every_switch_setting(monkeypatch, combo, m):
    """DeepSeek-V3's 2112 x 7168 (runs of 28: gemm_kernel or the ring by _RING_MAX_M and M) and
    a narrow weight over a long K (40 x 16392: split-K clusters of 4, the reduction by
    _CLUSTER_PUSH, runs of 17 and a partial last one), with and without PDL: correct, and equal to
    the default setting's bytes."""
    for n, k in ((2112, 7168), (40, 16392)):
        a = randn(m, k, dtype=torch.bfloat16, device="cuda", seed=3 * m + n)
        b = randn(n, k, dtype=torch.bfloat16, device="cuda", seed=n, scale=0.05).t()
        default = dsv3_fused_a_gemm(a, b)
        _set(monkeypatch, fused_a_module, combo)
        for pdl in (False, True):
            out = poison(torch.empty(m, n, device="cuda", dtype=torch.bfloat16))
            dsv3_fused_a_gemm(a, b, out=out, enable_pdl=pdl)
            _check(out, a, b.t(), name=f"m={m} n={n} k={k} pdl={pdl}")
            assert torch.equal(out, default), f"m={m} n={n} k={k} pdl={pdl}: not the default's"
        monkeypatch.undo()


@pytest.mark.gpu
@pytest.mark.parametrize("combo", COMBOS, ids=IDS)
@pytest.mark.parametrize("m", (1, 8, 9, 16))
def test_router_every_switch_setting(monkeypatch, combo, m):
    """E = 256 and 384 at K = 7168 (clusters of 4: the reduction by _CLUSTER_PUSH) and E = 24 at
    K = 16384 (runs of 16 in clusters of 4: the ring by _RING_MAX_M), fp32 and bf16 logits, with
    and without PDL: correct, and equal to the default setting's bytes."""
    for e, k in ((256, 7168), (384, 7168), (24, 16384)):
        x = randn(m, k, dtype=torch.bfloat16, device="cuda", seed=5 * m + e)
        w = randn(e, k, dtype=torch.bfloat16, device="cuda", seed=e, scale=0.05)
        for out_dtype in (torch.float32, torch.bfloat16):
            default = dsv3_router_gemm(x, w, out_dtype=out_dtype)
            _set(monkeypatch, router_module, combo)
            for pdl in (False, True):
                out = poison(torch.empty(m, e, device="cuda", dtype=out_dtype))
                dsv3_router_gemm(x, w, out_dtype=out_dtype, out=out, enable_pdl=pdl)
                name = f"m={m} e={e} k={k} {out_dtype} pdl={pdl}"
                _check(out, x, w, name=name)
                assert torch.equal(out, default), f"{name}: not the default's"
            monkeypatch.undo()


@pytest.mark.gpu
@pytest.mark.parametrize("combo", COMBOS, ids=IDS)
@pytest.mark.parametrize("m", (1, 9))
def test_pdl_chains_under_every_switch_setting(monkeypatch, combo, m):
    """The PDL contract under each setting: a graph of PDL calls whose x / a the kernel right
    before wrote replays bit for bit as the eager calls without PDL (fused_a 2112 x 7168, the
    router 256 x 7168 in clusters)."""
    _set(monkeypatch, fused_a_module, combo)
    _set(monkeypatch, router_module, combo)
    steps = 4
    bs = [
        randn(2112, 7168, dtype=torch.bfloat16, device="cuda", seed=90 + i, scale=0.05).t()
        for i in range(steps)
    ]
    as_ = [randn(m, 7168, dtype=torch.bfloat16, device="cuda", seed=95 + i) for i in range(steps)]
    assert_pdl_chain_matches_eager(
        lambda i, a, out, pdl: dsv3_fused_a_gemm(a, bs[i], out=out, enable_pdl=pdl),
        as_,
        2112,
        torch.bfloat16,
    )
    ws = [
        randn(256, 7168, dtype=torch.bfloat16, device="cuda", seed=100 + i, scale=0.05)
        for i in range(steps)
    ]
    xs = [randn(m, 7168, dtype=torch.bfloat16, device="cuda", seed=105 + i) for i in range(steps)]
    assert_pdl_chain_matches_eager(
        lambda i, x, out, pdl: dsv3_router_gemm(
            x, ws[i], out_dtype=torch.bfloat16, out=out, enable_pdl=pdl
        ),
        xs,
        256,
        torch.bfloat16,
    )
