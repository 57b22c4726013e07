"""Build a CPU module from C++ sources through the whole pipeline, load it, call it; the cache
layout it publishes; ModuleSpec declarations."""

from __future__ import annotations

import platform

import pytest
import torch

from kernels_jit import ModuleSpec, cache, declared_modules, load_module, loader
from kernels_jit.loader import CompiledFunction


def test_cpu_module_builds_loads_and_computes(sandbox):
    spec = sandbox.adder(offset=40)
    module = load_module(spec)
    assert module.add(2, 3) == 45
    assert module.add(-50, 5) == -5
    assert load_module(spec) is module  # memoised for the life of the process


def test_artifact_layout_and_record(sandbox):
    spec = sandbox.adder()
    load_module(spec)
    key = cache.cache_key(spec)
    artifact = cache.artifact_path(spec, key)
    assert artifact == sandbox.cache / f"cpu_{platform.machine()}" / spec.uri / key / (
        f"{spec.uri}.so"
    )
    assert artifact.is_file()
    record = cache.read_record(artifact)
    assert record["key"] == key and record["uri"] == spec.uri
    assert (record["size"], record["sha256"]) == cache.file_digest(artifact)
    assert cache.verify(artifact, key) is None
    assert loader.is_cached(spec)
    # Nothing of the build is left behind but the lock file.
    assert not list(cache.module_dir(spec).glob(".staging-*"))
    assert (cache.module_dir(spec) / f"{key}.lock").exists()


def test_reference_add_constant_cpu(sandbox):
    from kernels_elementwise.ops.add_constant import ADD_CONSTANT_CPU

    module = load_module(ADD_CONSTANT_CPU)
    x = torch.linspace(-3, 3, 1031, dtype=torch.float32)
    out = torch.empty_like(x)
    module.add_constant(out, x, 0.75)
    torch.testing.assert_close(out, x + 0.75, rtol=0, atol=0)
    assert str(sandbox.cache) in str(loader.artifact_of(ADD_CONSTANT_CPU))


def test_specialisations_of_one_module_are_distinct(sandbox):
    """Same name, other flags: both are declared (AOT sees both) and each gets its own build."""
    one = sandbox.adder(flags=("-DOFFSET_VALUE=1",))
    two = sandbox.adder(flags=("-DOFFSET_VALUE=2",))
    assert one.uri == two.uri
    assert {one, two} <= set(declared_modules(sandbox.package))
    assert load_module(one).add(0, 0) == 1
    assert load_module(two).add(0, 0) == 2


def test_spec_accepts_lists_and_stays_hashable(sandbox):
    sandbox.adder()
    spec = ModuleSpec(
        name="adder",
        package=sandbox.package,
        sources=["csrc/adder.h"],
        exports=[["add", "add_ints"]],
        device="cpu",
        flags=["-DOFFSET_VALUE=7"],
    )
    assert spec.sources == ("csrc/adder.h",) and spec.exports == (("add", "add_ints"),)
    add = CompiledFunction(spec, "add")
    assert hash(spec) == hash(add.spec)
    assert add(1, 1) == 9
    with pytest.raises(KeyError, match="exports no 'sub'"):
        CompiledFunction(spec, "sub")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"name": "bad-name"}, "must be"),
        ({"name": "caf\u00e9"}, "must be"),
        ({"sources": ("/etc/passwd",)}, "inside the package"),
        ({"sources": ("../outside.h",)}, "inside the package"),
        ({"exports": (("add", "a"), ("add", "b"))}, "duplicate"),
        ({"exports": (("not an identifier", "f"),)}, "C identifier"),
        ({"device": "tpu"}, "device"),
        ({"sources": ()}, "at least one"),
    ],
)
def test_spec_rejects_bad_declarations(sandbox, fields, message):
    base = {
        "name": "ok",
        "package": sandbox.package,
        "sources": ("csrc/ok.h",),
        "exports": (("f", "f"),),
        "device": "cpu",
    }
    with pytest.raises(ValueError, match=message):
        ModuleSpec(**{**base, **fields})
