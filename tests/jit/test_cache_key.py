"""The content-addressed key: what changes it (every transitively included header, flags, arch,
compiler, versions) and what does not (mtimes, unrelated files, where the package lives)."""

from __future__ import annotations

import importlib
import os
import shutil
import time

import tvm_ffi

from kernels_jit import ModuleSpec, cache, loader


def _touch_everything(root):
    future = time.time() + 3600
    for path in root.rglob("*"):
        os.utime(path, (future, future))


def test_transitive_header_change_rebuilds_touch_does_not(sandbox, monkeypatch):
    monkeypatch.setenv("CXX", str(sandbox.cxx_wrapper()))
    spec = sandbox.adder(offset=1)
    closure = cache.header_closure(spec)
    assert set(closure) == {"csrc/adder.h", "csrc/adder/offset.h", "csrc/adder/value.h"}
    first_key = cache.cache_key(spec)
    first = loader.ensure_built(spec)
    assert len(sandbox.compiles()) == 1

    # The header two levels down changes: new key, new artifact, new behaviour.
    sandbox.value_header().write_text("#define OFFSET_VALUE 100\n")
    second_key = cache.cache_key(spec)
    assert second_key != first_key
    second = loader.ensure_built(spec)
    assert second != first and len(sandbox.compiles()) == 2
    assert tvm_ffi.load_module(str(second)).add(1, 1) == 102
    assert tvm_ffi.load_module(str(first)).add(1, 1) == 3  # the old one is untouched

    # Touching every file (what pip does to mtimes) changes nothing and builds nothing.
    _touch_everything(sandbox.pkg_dir)
    assert cache.cache_key(spec) == second_key
    assert loader.ensure_built(spec) == second
    assert len(sandbox.compiles()) == 2


def test_unrelated_files_do_not_change_the_key(sandbox):
    spec = sandbox.adder()
    key = cache.cache_key(spec)
    sandbox.write("csrc/unrelated.h", "#error never included\n")
    sandbox.write("__init__.py", "X = 1\n")
    assert cache.cache_key(spec) == key


def test_flags_change_the_key(sandbox):
    plain = sandbox.adder()
    flagged = sandbox.adder(flags=("-DOFFSET_VALUE=5",))
    assert cache.cache_key(plain) != cache.cache_key(flagged)
    assert cache.artifact_path(plain, cache.cache_key(plain)) != cache.artifact_path(
        flagged, cache.cache_key(flagged)
    )


def test_arch_changes_the_key_and_the_path(sandbox, monkeypatch):
    sandbox.write("csrc/k.cuh", "#pragma once\ninline int one() { return 1; }\n")
    spec = sandbox.spec("k", ("csrc/k.cuh",), (("one", "one"),), device="cuda")
    keys, paths = {}, {}
    for spelling, tag in (("sm_90a", "sm_90a"), ("9.0a", "sm_90a"), ("sm_100a", "sm_100a")):
        monkeypatch.setenv("KERNELS_CUDA_ARCH", spelling)
        keys[spelling] = cache.cache_key(spec)
        paths[spelling] = cache.artifact_path(spec, keys[spelling])
        assert paths[spelling].relative_to(sandbox.cache).parts[0] == tag
        assert f"-gencode=arch=compute_{tag[3:]},code={tag}" in cache.compile_flags(spec)
    assert keys["sm_90a"] == keys["9.0a"]
    assert keys["sm_90a"] != keys["sm_100a"]


def test_compiler_version_changes_the_key(sandbox, monkeypatch):
    spec = sandbox.adder()
    monkeypatch.setenv("CXX", str(sandbox.cxx_wrapper("real")))
    real = cache.cache_key(spec)
    monkeypatch.setenv("CXX", str(sandbox.cxx_wrapper("fake", version="c++ (fake) 99.0")))
    assert cache.cache_key(spec) != real
    # The compiler is not part of the source key (that one finds prebuilt artifacts).
    source = cache.source_key(spec)
    monkeypatch.setenv("CXX", str(sandbox.cxx_wrapper("real")))
    assert cache.source_key(spec) == source


def test_library_versions_change_the_key(sandbox, monkeypatch):
    spec = sandbox.adder()
    key = cache.cache_key(spec)
    own = cache.__version__
    monkeypatch.setattr(cache, "__version__", "999.0")
    assert cache.cache_key(spec) != key
    monkeypatch.setattr(cache, "__version__", own)
    assert cache.cache_key(spec) == key
    monkeypatch.setattr(tvm_ffi, "__version__", "0.0.0-other")
    assert cache.cache_key(spec) != key


def test_key_does_not_depend_on_where_the_package_is_installed(sandbox, monkeypatch):
    """An AOT cache built in one place must hit for the same package installed elsewhere."""
    spec = sandbox.adder()
    key = cache.cache_key(spec)
    elsewhere = sandbox.tmp / "site-packages-2"
    shutil.copytree(sandbox.pkg_dir, elsewhere / sandbox.package)
    monkeypatch.syspath_prepend(str(elsewhere))
    importlib.invalidate_caches()
    assert spec.package_dir == elsewhere / sandbox.package
    assert cache.cache_key(spec) == key


def test_quoted_and_angled_includes_are_searched_like_the_compiler(sandbox):
    """ "x.h" is looked up next to the including file first; <x.h> only in the include dirs."""
    sandbox.write("csrc/top.h", '#pragma once\n#include "x.h"\n#include <y.h>\n')
    sandbox.write("csrc/x.h", "// csrc/x.h\n")
    sandbox.write("inc/x.h", "// inc/x.h\n")
    sandbox.write("csrc/y.h", "// csrc/y.h: not on the <> path\n")
    sandbox.write("inc/y.h", "// inc/y.h\n")
    spec = ModuleSpec(
        name="top",
        package=sandbox.package,
        sources=("csrc/top.h",),
        exports=(("f", "f"),),
        device="cpu",
        include_dirs=("inc",),
    )
    assert set(cache.header_closure(spec)) == {"csrc/top.h", "csrc/x.h", "inc/y.h"}
    key = cache.cache_key(spec)
    (sandbox.pkg_dir / "csrc/y.h").write_text("// changed, but the compiler never reads it\n")
    assert cache.cache_key(spec) == key
    (sandbox.pkg_dir / "inc/y.h").write_text("// changed, and read\n")
    assert cache.cache_key(spec) != key


def test_non_utf8_header_is_keyed_by_bytes(sandbox):
    """A Latin-1 comment must neither crash the key (no text decoding) nor be ignored."""
    spec = sandbox.adder()
    sandbox.value_header().write_bytes(b"// caf\xe9 in latin-1\n#define OFFSET_VALUE 0\n")
    key = cache.cache_key(spec)
    sandbox.value_header().write_bytes(b"// caf\xe8 in latin-1\n#define OFFSET_VALUE 0\n")
    assert cache.cache_key(spec) != key
