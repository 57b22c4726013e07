"""KERNELS_NO_JIT=1: a hit loads; a miss (or a corrupted artifact) raises ModuleNotBuiltError
naming the module and the ``kernels-jit build`` command, and compiles nothing."""

from __future__ import annotations

import pytest

from kernels_jit import ModuleNotBuiltError, cache, load_module, loader


def test_miss_raises_module_not_built_naming_the_module_and_command(sandbox, monkeypatch):
    monkeypatch.setenv("CXX", str(sandbox.cxx_wrapper()))
    monkeypatch.setenv("KERNELS_NO_JIT", "1")
    spec = sandbox.adder()
    with pytest.raises(ModuleNotBuiltError) as caught:
        load_module(spec)
    message = str(caught.value)
    assert spec.uri in message and sandbox.package in message
    assert f"kernels-jit build --group {sandbox.package} --cpu --cache-dir {sandbox.cache}" in (
        message
    )
    assert "KERNELS_NO_JIT" in message
    assert sandbox.compiles() == [] and not sandbox.cache.exists()


def test_cuda_miss_names_the_arch_to_build_for(sandbox, monkeypatch):
    monkeypatch.setenv("KERNELS_NO_JIT", "1")
    monkeypatch.setenv("KERNELS_CUDA_ARCH", "9.0a")
    sandbox.write("csrc/k.cuh", "#pragma once\ninline int one() { return 1; }\n")
    spec = sandbox.spec("k", ("csrc/k.cuh",), (("one", "one"),), device="cuda")
    with pytest.raises(ModuleNotBuiltError, match=r"build --group \S+ --arch sm_90a --cache-dir"):
        load_module(spec)


def test_hit_loads_with_no_jit(sandbox, monkeypatch):
    spec = sandbox.adder(offset=6)
    loader.ensure_built(spec)
    monkeypatch.setenv("KERNELS_NO_JIT", "true")
    assert load_module(spec).add(1, 1) == 8


@pytest.mark.parametrize("value", ["1", "TRUE", "yes", "On"])
def test_no_jit_spellings(sandbox, monkeypatch, value):
    monkeypatch.setenv("KERNELS_NO_JIT", value)
    with pytest.raises(ModuleNotBuiltError):
        load_module(sandbox.adder())


def test_corrupted_artifact_with_no_jit_is_an_error_not_a_crash(sandbox):
    spec = sandbox.adder()
    artifact = loader.ensure_built(spec)
    with open(artifact, "r+b") as handle:
        handle.truncate(artifact.stat().st_size // 2)
    body = """
    try:
        load_module(spec)
        print(json.dumps({"error": None}))
    except errors.ModuleNotBuiltError as exc:
        print(json.dumps({"error": str(exc)}))
    """
    result = sandbox.python(sandbox.child_code(spec, body), sandbox.env(KERNELS_NO_JIT="1"))
    assert result["error"] is not None and "truncated" in result["error"]
    assert cache.verify(artifact) is not None  # left as it was: nothing was rebuilt
