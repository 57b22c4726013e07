"""A cache hit in a new process loads the artifact without ninja and without compiling; a cache
shipped to a machine with no compiler at all still hits."""

from __future__ import annotations

import os
import shutil

from kernels_jit import cache, loader


def _env_without_ninja(sandbox, **overrides):
    """PATH without any directory holding a ``ninja``, and the ninja wheel made unimportable."""
    hide = sandbox.tmp / "hide"
    hide.mkdir(exist_ok=True)
    (hide / "ninja.py").write_text("raise ImportError('ninja hidden by the test')\n")
    env = sandbox.env(**{"CXX": sandbox.real_cxx, **overrides})
    env["PATH"] = os.pathsep.join(
        d
        for d in env["PATH"].split(os.pathsep)
        if d and not os.path.exists(os.path.join(d, "ninja"))
    )
    env["PYTHONPATH"] = os.pathsep.join([str(hide), env["PYTHONPATH"]])
    return env


CHECK_NO_NINJA = """
import shutil
try:
    import ninja
    ninja_importable = True
except ImportError:
    ninja_importable = False
m = load_module(spec)
print(json.dumps({"sum": int(m.add(2, 3)), "ninja": shutil.which("ninja"),
                  "ninja_importable": ninja_importable}))
"""


def test_hit_in_new_process_runs_neither_ninja_nor_the_compiler(sandbox):
    cxx = sandbox.cxx_wrapper()
    spec = sandbox.adder(offset=1)
    first = sandbox.python(sandbox.child_code(spec, sandbox.CALL_ADD), sandbox.env(CXX=str(cxx)))
    assert first["sum"] == 6
    assert len(sandbox.compiles()) == 1
    before = sandbox.invocations()

    env = _env_without_ninja(sandbox, CXX=str(cxx))
    second = sandbox.python(sandbox.child_code(spec, CHECK_NO_NINJA), env)
    assert second == {"sum": 6, "ninja": None, "ninja_importable": False}
    assert sandbox.invocations() == before  # no compile, no link


def test_miss_without_ninja_is_a_clear_error(sandbox):
    """The setup of the test above really removes ninja: a miss then fails (naming ninja)."""
    spec = sandbox.adder()
    env = _env_without_ninja(sandbox)
    body = """
    try:
        load_module(spec)
        print(json.dumps({"error": None}))
    except errors.BuildError as exc:
        print(json.dumps({"error": str(exc)}))
    """
    result = sandbox.python(sandbox.child_code(spec, body), env)
    assert result["error"] is not None and "ninja" in result["error"]


def test_prebuilt_cache_loads_where_no_compiler_exists(sandbox):
    """A cache built elsewhere is shipped to a machine without a compiler: the full key (which
    needs the compiler's version) cannot be computed, the source key finds the artifact."""
    spec = sandbox.adder(offset=2)
    loader.ensure_built(spec)
    no_compiler = {"CXX": str(sandbox.tmp / "no" / "such-c++"), "KERNELS_NO_JIT": "1"}
    assert sandbox.python(
        sandbox.child_code(spec, sandbox.CALL_ADD), sandbox.env(**no_compiler)
    ) == {"sum": 7}
    # A source that changed since the cache was built is a miss, not a stale hit.
    sandbox.value_header().write_text("#define OFFSET_VALUE 3\n")
    body = """
    try:
        load_module(spec)
        print(json.dumps({"error": None}))
    except errors.ModuleNotBuiltError as exc:
        print(json.dumps({"error": str(exc)}))
    """
    result = sandbox.python(sandbox.child_code(spec, body), sandbox.env(**no_compiler))
    assert result["error"] is not None and spec.uri in result["error"]
    assert "no compiler here" in result["error"]


def test_cache_from_another_compiler_version(sandbox):
    """Built by another compiler version: KERNELS_NO_JIT=1 uses it (same source key); with JIT
    allowed the local compiler rebuilds it (the compiler is part of the full key)."""
    spec = sandbox.adder(offset=2)
    other = sandbox.cxx_wrapper("other-cxx", version="g++ (other) 1.0")
    first = sandbox.python(sandbox.child_code(spec, sandbox.CALL_ADD), sandbox.env(CXX=str(other)))
    assert first == {"sum": 7} and len(sandbox.compiles()) == 1
    local = str(sandbox.cxx_wrapper("local-cxx"))
    code = sandbox.child_code(spec, sandbox.CALL_ADD)
    assert sandbox.python(code, sandbox.env(CXX=local, KERNELS_NO_JIT="1")) == {"sum": 7}
    assert len(sandbox.compiles()) == 1
    assert sandbox.python(code, sandbox.env(CXX=local)) == {"sum": 7}
    assert len(sandbox.compiles()) == 2
    assert len(list(sandbox.cache.rglob("*.so"))) == 2


def test_prefer_prebuilt_loads_a_shipped_cache_and_compiles_the_rest(sandbox):
    """KERNELS_PREFER_PREBUILT=1 with a compiler present: an artifact another compiler version
    built (same source key) is loaded instead of compiled; a module the shipped cache lacks (or
    whose sources changed since) is compiled as usual."""
    spec = sandbox.adder(offset=2)
    other = sandbox.cxx_wrapper("other-cxx", version="g++ (other) 1.0")
    code = sandbox.child_code(spec, sandbox.CALL_ADD)
    assert sandbox.python(code, sandbox.env(CXX=str(other))) == {"sum": 7}
    assert len(sandbox.compiles()) == 1
    prefer = sandbox.env(CXX=str(sandbox.cxx_wrapper("local-cxx")), KERNELS_PREFER_PREBUILT="1")
    assert sandbox.python(code, prefer) == {"sum": 7}
    assert len(sandbox.compiles()) == 1  # the shipped artifact, not a build
    aot = """
    from kernels_jit import loader
    print(json.dumps({"path": str(loader.ensure_built(spec))}))
    """
    shipped = sandbox.python(sandbox.child_code(spec, aot), prefer)["path"]
    assert len(sandbox.compiles()) == 1 and shipped.endswith(".so")  # AOT: counts as built
    sandbox.value_header().write_text("#define OFFSET_VALUE 3\n")
    assert sandbox.python(code, prefer) == {"sum": 8}
    assert len(sandbox.compiles()) == 2  # no artifact of the new sources: compiled here


def test_hit_ignores_a_broken_ninja_on_path(sandbox, monkeypatch):
    """In-process variant: with a hit, even a ninja that would fail is never run."""
    spec = sandbox.adder()
    path = loader.ensure_built(spec)
    loader._LOADED.pop(spec, None)
    fake = sandbox.tmp / "fakebin"
    fake.mkdir()
    (fake / "ninja").write_text("#!/bin/sh\necho ninja must not run >&2\nexit 1\n")
    (fake / "ninja").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    assert shutil.which("ninja") == str(fake / "ninja")
    assert loader.load_module(spec).add(1, 2) == 3
    assert cache.verify(path) is None
