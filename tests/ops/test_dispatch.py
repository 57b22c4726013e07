"""Dispatch: priority, per-call eligibility, backend= and KERNELS_BACKEND overrides, explain."""

from __future__ import annotations

import pytest
import torch

from kernels_elementwise import add_constant
from kernels_elementwise.add_constant import ADD_CONSTANT
from kernels_jit import dispatch
from kernels_jit.registry import Backend, OpSpec, register_group


@pytest.fixture(autouse=True)
def _fresh_selection(monkeypatch):
    monkeypatch.delenv("KERNELS_BACKEND", raising=False)
    dispatch.clear_caches()
    yield
    dispatch.clear_caches()


def _args(x):
    return (torch.empty_like(x), x, 1.0)


def test_priority_picks_first_eligible_backend():
    x = torch.randn(64)
    text = ADD_CONSTANT.explain(_args(x))
    assert "cpu: chosen" in text
    assert "cuda: no, runs on cuda" in text
    assert "torch: eligible, lower priority" in text


def test_per_call_eligibility_falls_back():
    x = torch.randn(8, 16)[:, ::2]
    text = ADD_CONSTANT.explain((torch.empty(8, 8)[:, :], x, 1.0))
    assert "cpu: no, needs contiguous x and out" in text
    assert "torch: chosen" in text


def test_backend_argument_forces_backend():
    x = torch.randn(64)
    fn = ADD_CONSTANT.select(_args(x), backend="torch")
    assert fn.__name__ == "_add_constant_torch"
    with pytest.raises(ValueError, match="backend 'cuda' cannot run here: runs on cuda"):
        add_constant(x, 1.0, backend="cuda")
    with pytest.raises(KeyError, match="has no backend 'nope'"):
        add_constant(x, 1.0, backend="nope")


@pytest.mark.parametrize("setting", ["torch", "elementwise.add_constant=torch"])
def test_environment_override(monkeypatch, setting):
    monkeypatch.setenv("KERNELS_BACKEND", setting)
    dispatch.clear_caches()
    x = torch.randn(64)
    assert ADD_CONSTANT.select(_args(x)).__name__ == "_add_constant_torch"
    assert "forced to 'torch'" in ADD_CONSTANT.explain(_args(x))


def test_override_for_other_op_does_not_apply(monkeypatch):
    monkeypatch.setenv("KERNELS_BACKEND", "layernorm.rmsnorm=torch")
    dispatch.clear_caches()
    assert "cpu: chosen" in ADD_CONSTANT.explain(_args(torch.randn(4)))


def test_resolution_is_cached():
    x = torch.randn(64)
    ADD_CONSTANT.select(_args(x))
    assert (x.device, x.dtype, None) in ADD_CONSTANT._cache


def test_registration_is_validated():
    good = Backend("torch", "kernels_elementwise.reference:add_constant", devices=("cpu",))
    with pytest.raises(ValueError, match="no 'torch' reference backend"):
        register_group(
            "elementwise",
            [
                OpSpec(
                    "elementwise",
                    "no_reference",
                    "kernels_elementwise.x:y",
                    (Backend("cuda", "kernels_elementwise.x:y", ("cuda",)),),
                    "d",
                    "kernels_elementwise.x:s",
                )
            ],
        )
    with pytest.raises(ValueError, match="'jit' prefix"):
        register_group(
            "elementwise",
            [
                OpSpec(
                    "elementwise",
                    "jit_thing",
                    "kernels_elementwise.x:y",
                    (good,),
                    "d",
                    "kernels_elementwise.x:s",
                )
            ],
        )
    with pytest.raises(ValueError, match="is registered by group"):
        register_group(
            "elementwise",
            [
                OpSpec(
                    "gemm",
                    "thing",
                    "kernels_elementwise.x:y",
                    (good,),
                    "d",
                    "kernels_elementwise.x:s",
                )
            ],
        )
    with pytest.raises(ValueError, match="unknown group"):
        register_group("spatial", [])
    with pytest.raises(ValueError, match="registered twice with different specs"):
        register_group(
            "elementwise",
            [
                OpSpec(
                    "elementwise",
                    "add_constant",
                    "kernels_elementwise.x:y",
                    (good,),
                    "d",
                    "kernels_elementwise.x:s",
                )
            ],
        )
