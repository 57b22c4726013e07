"""Dispatch: priority, per-call eligibility, backend= and KERNELS_BACKEND overrides, explain,
fall-back warnings and strict mode, and the one-line registration."""

from __future__ import annotations

import warnings

import pytest
import torch

import kernels_ops
from kernels_elementwise import add_constant
from kernels_elementwise.ops.add_constant import ADD_CONSTANT
from kernels_jit import dispatch
from kernels_jit.errors import FallbackError, KernelsFallbackWarning
from kernels_jit.registry import op, register_group


@pytest.fixture(autouse=True)
def _fresh_selection(monkeypatch):
    monkeypatch.delenv("KERNELS_BACKEND", raising=False)
    monkeypatch.delenv("KERNELS_STRICT", raising=False)
    dispatch.clear_caches()
    yield
    dispatch.clear_caches()


def _args(x):
    return (torch.empty_like(x), x, 1.0)


def test_priority_picks_first_eligible_backend():
    text = kernels_ops.explain("elementwise.add_constant", torch.randn(64), 1.0)
    assert "cpu: chosen" in text
    assert "cuda: no, runs on cuda" in text
    assert "torch: eligible, lower priority" in text


def test_explain_takes_the_public_arguments_and_runs_nothing():
    x = torch.randn(8, 16)[:, ::2]
    before = x.clone()
    text = kernels_ops.explain("elementwise.add_constant", x, 1.0, out=x)
    assert "cpu: no, needs contiguous x and out" in text
    assert "torch: chosen" in text
    assert torch.equal(x, before)
    w = torch.ones(16)
    text = kernels_ops.explain("layernorm.rmsnorm", torch.randn(4, 16), w, 1e-6)
    assert text.startswith("layernorm.rmsnorm on cpu with float32")
    assert "torch: chosen" in text
    empty = kernels_ops.explain("moe.topk_softmax", torch.empty(0, 2), torch.empty(0, 2,
                                dtype=torch.int32), torch.empty(0, 8))  # fmt: skip
    assert "launches nothing" in empty
    # Validation runs as in a real call.
    with pytest.raises(TypeError, match="add_constant: x must have dtype"):
        kernels_ops.explain("elementwise.add_constant", x.double(), 1.0)


def test_backend_argument_forces_backend():
    x = torch.randn(64)
    fn = ADD_CONSTANT.select(_args(x), backend="torch")
    assert fn.__name__ == "_add_constant_torch"
    with pytest.raises(ValueError, match=r"backend 'cuda' cannot run here \(backend='cuda'\)"):
        add_constant(x, 1.0, backend="cuda")
    with pytest.raises(KeyError, match="has no backend 'nope'"):
        add_constant(x, 1.0, backend="nope")


@pytest.mark.parametrize("setting", ["torch", "elementwise.add_constant=torch"])
def test_environment_override(monkeypatch, setting):
    monkeypatch.setenv("KERNELS_BACKEND", setting)
    x = torch.randn(64)
    assert ADD_CONSTANT.select(_args(x)).__name__ == "_add_constant_torch"
    assert "forced to 'torch'" in ADD_CONSTANT.explain_call(_args(x))


def test_override_for_other_op_does_not_apply(monkeypatch):
    monkeypatch.setenv("KERNELS_BACKEND", "layernorm.rmsnorm=torch")
    assert "cpu: chosen" in ADD_CONSTANT.explain_call(_args(torch.randn(4)))


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("nonsense", r"KERNELS_BACKEND: entry 'nonsense' is neither 'torch'"),
        ("layernorm.rmsnorn=torch", r"KERNELS_BACKEND: entry layernorm.rmsnorn=torch: no op"),
        ("nogroup.op=torch", r"KERNELS_BACKEND: entry nogroup.op=torch: no op"),
        ("elementwise.add_constant=triton", r"add_constant has no backend 'triton'"),
        ("elementwise.add_constant", r"neither 'torch'"),
        ("rmsnorm=torch", r"entry 'rmsnorm=torch' is not <group>.<op>=<backend>"),
    ],
)
def test_bad_environment_override_is_a_clear_error(monkeypatch, setting, message):
    monkeypatch.setenv("KERNELS_BACKEND", setting)
    with pytest.raises(ValueError, match=message):
        add_constant(torch.randn(4), 1.0)


def test_environment_override_that_cannot_run_here_names_the_variable(monkeypatch):
    monkeypatch.setenv("KERNELS_BACKEND", "elementwise.add_constant=cuda")
    with pytest.raises(ValueError, match=r"KERNELS_BACKEND forces 'cuda'\): runs on cuda"):
        add_constant(torch.randn(4), 1.0)


def test_resolution_is_cached():
    x = torch.randn(64)
    ADD_CONSTANT.select(_args(x))
    assert (x.device, x.dtype, None) in ADD_CONSTANT._cache


def _pretend_cuda(monkeypatch):
    """Selection as on a CUDA device: the CPU backend stands in for the fast one."""
    cuda = torch.device("cuda")
    spec = ADD_CONSTANT.spec
    cpu = spec.backend("cpu")
    fake = type(cpu)(**{**cpu.__dict__, "devices": ("cuda",)})
    fake_spec = type(spec)(**{**spec.__dict__, "backends": (fake, spec.backends[-1])})
    monkeypatch.setattr(ADD_CONSTANT, "spec", fake_spec)
    monkeypatch.setattr(dispatch, "_sm", lambda device: 90)
    return ADD_CONSTANT._candidates(cuda, torch.float32, None)


def test_fall_back_on_cuda_warns_once_per_reason(monkeypatch):
    candidates = _pretend_cuda(monkeypatch)
    strided = torch.randn(4, 8)[:, ::2]
    args = (torch.empty(4, 4), strided, 1.0)
    with pytest.warns(KernelsFallbackWarning, match="needs contiguous x and out"):
        assert ADD_CONSTANT._choose(candidates, args).name == "torch"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert ADD_CONSTANT._choose(candidates, args).name == "torch"  # once only
        contiguous = (torch.empty(4), torch.randn(4), 1.0)
        assert ADD_CONSTANT._choose(candidates, contiguous).name == "cpu"  # no fall-back


def test_strict_mode_makes_the_fall_back_an_error(monkeypatch):
    candidates = _pretend_cuda(monkeypatch)
    monkeypatch.setenv("KERNELS_STRICT", "1")
    args = (torch.empty(4, 4), torch.randn(4, 8)[:, ::2], 1.0)
    with pytest.raises(FallbackError, match="KERNELS_STRICT=1 is set"):
        ADD_CONSTANT._choose(candidates, args)


def test_no_warning_on_cpu_or_for_reference_only_ops():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        add_constant(torch.randn(8, 16)[:, ::2], 1.0)  # cpu backend declined: not a GPU cliff


def test_launch_knobs_stay_out_of_the_schema():
    from kernels_layernorm.ops.rmsnorm import RMSNORM

    schema = str(RMSNORM.torch_op.default._schema)
    assert "pdl" not in schema
    assert RMSNORM.knobs == {"enable_pdl": -1}


def test_registration_is_validated():
    with pytest.raises(ValueError, match="'jit' prefix"):
        register_group("kernels_elementwise", op("jit_thing", "d", dtypes=("float32",)))
    with pytest.raises(ValueError, match="unknown backend kind 'cudaa'"):
        register_group("kernels_elementwise", op("thing", "d", "cudaa", dtypes=("float32",)))
    with pytest.raises(ValueError, match="unknown dtypes"):
        register_group("kernels_elementwise", op("thing", "d", dtypes=("float33",)))
    with pytest.raises(ValueError, match="declares no dtypes"):
        register_group("kernels_elementwise", op("thing", "d", dtypes=()))
    with pytest.raises(ValueError, match="unknown group package"):
        register_group("kernels_spatial", op("thing", "d", dtypes=("float32",)))
    with pytest.raises(ValueError, match="registered twice with different specs"):
        register_group("kernels_elementwise", op("add_constant", "other", dtypes=("float32",)))


def test_one_line_declaration_derives_every_target():
    spec = ADD_CONSTANT.spec
    assert spec.module == "kernels_elementwise.ops.add_constant"
    assert spec.public == "kernels_elementwise.ops.add_constant:add_constant"
    assert spec.samples == "kernels_elementwise.ops.add_constant:_add_constant_samples"
    assert [(b.name, b.kind, b.target.partition(":")[2]) for b in spec.backends] == [
        ("cuda", "cuda", "_add_constant_cuda"),
        ("cpu", "cpu", "_add_constant_cpu"),
        ("torch", "torch", "_add_constant_torch"),
    ]
    assert spec.backend("cuda").eligible.endswith(":_add_constant_cuda_eligible")
