"""AOT precompilation: every module (CUDA ones per arch, CPU ones once) is built into the cache in
parallel, and a new process with KERNELS_NO_JIT=1 loads them all; failures are all reported."""

from __future__ import annotations

import json
import shutil

import pytest

from kernels_jit import ModuleSpec, aot, cache, loader
from kernels_jit.errors import PrecompileError

LOAD_ALL = """
import json
from kernels_jit import ModuleSpec, load_module
specs = [ModuleSpec(**fields) for fields in json.loads({specs!r})]
out = {{}}
for spec in specs:
    m = load_module(spec)
    out[spec.uri] = int(m.add(2, 3)) if spec.device == "cpu" else "loaded"
print(json.dumps(out))
"""


def _fields(spec: ModuleSpec) -> dict:
    return {
        "name": spec.name,
        "package": spec.package,
        "sources": list(spec.sources),
        "exports": [list(e) for e in spec.exports],
        "device": spec.device,
        "flags": list(spec.flags),
    }


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_precompile_then_load_with_no_jit(sandbox):
    from kernels_elementwise.ops.add_constant import ADD_CONSTANT_CUDA

    one = sandbox.adder("one", flags=("-DOFFSET_VALUE=1",))
    two = sandbox.adder("two", flags=("-DOFFSET_VALUE=2",))
    modules = [one, two, ADD_CONSTANT_CUDA, one]  # a duplicate is built once
    paths = aot.precompile(modules, archs=["sm_90a"], jobs=2, progress=False)
    assert len(paths) == 3
    assert all(cache.verify(p) is None for p in paths)
    cuda_path = paths[2]
    assert cuda_path.relative_to(sandbox.cache).parts[0] == "sm_90a"
    assert "sm_90a" in str(cuda_path)

    # A fresh process that may not compile loads all three from the cache.
    specs = json.dumps([_fields(m) for m in (one, two, ADD_CONSTANT_CUDA)])
    env = sandbox.env(KERNELS_NO_JIT="1", KERNELS_CUDA_ARCH="sm_90a")
    result = sandbox.python(LOAD_ALL.format(specs=specs), env)
    assert result == {"one_cpu": 6, "two_cpu": 7, "add_constant_cuda": "loaded"}

    # Already built: a second precompile compiles nothing.
    cxx = sandbox.cxx_wrapper()
    import os

    os.environ["CXX"] = str(cxx)  # restored by the sandbox's monkeypatch (CXX is cleared)
    try:
        assert aot.precompile([one, two], progress=False) == paths[:2]
    finally:
        del os.environ["CXX"]
    assert sandbox.compiles() == []


def test_precompile_reports_every_failure_and_builds_the_rest(sandbox):
    good = sandbox.adder("good")
    sandbox.write("csrc/bad1.h", "#pragma once\nint bad1( {\n")
    sandbox.write("csrc/bad2.h", "#pragma once\n#error bad2 is broken on purpose\n")
    bad1 = sandbox.spec("bad1", ("csrc/bad1.h",), (("f", "bad1"),))
    bad2 = sandbox.spec("bad2", ("csrc/bad2.h",), (("f", "bad2"),))
    with pytest.raises(PrecompileError) as caught:
        aot.precompile([bad1, good, bad2], jobs=2, progress=True)
    failures = dict(caught.value.failures)
    assert set(failures) == {f"{sandbox.package}:bad1_cpu", f"{sandbox.package}:bad2_cpu"}
    assert "bad2 is broken on purpose" in str(caught.value)
    assert "bad1.h:2" in str(caught.value)
    assert loader.is_cached(good)


def test_plan_builds_cuda_modules_per_arch_and_cpu_modules_once(sandbox, monkeypatch):
    cpu = sandbox.adder()
    sandbox.write("csrc/k.cuh", "#pragma once\ninline int one() { return 1; }\n")
    gpu = sandbox.spec("k", ("csrc/k.cuh",), (("one", "one"),), device="cuda")
    tasks = aot.plan([cpu, gpu, gpu], archs=["9.0a", "sm_100a", "sm_90a"])
    assert tasks == [(cpu, None), (gpu, "sm_100a"), (gpu, "sm_90a")]
    monkeypatch.setenv("KERNELS_CUDA_ARCH", "sm_90a")
    assert aot.plan([gpu]) == [(gpu, "sm_90a")]
    with pytest.raises(ValueError):
        aot.plan([gpu], archs=["sm_9"])
    with pytest.raises(ValueError):
        aot.precompile([cpu], jobs=0)
