"""ModuleSpec.dist_include_dirs: headers from an installed distribution (CUTLASS from the
nvidia-cutlass wheel). The directory is searched by the build; the distribution's version, not
the content of its headers, enters the key; a missing distribution or directory is a clear
ToolchainError at build time (the key itself still computes, so prebuilt lookups work)."""

from __future__ import annotations

import uuid

import pytest
import tvm_ffi

from kernels_jit import cache, loader
from kernels_jit.errors import ToolchainError

HEADER_USER = """\
#include <kjdist/value.h>
inline int64_t add_dist(int64_t a, int64_t b) { return a + b + KJDIST_VALUE; }
"""


class FakeDistribution:
    """An installed distribution ``name`` on sys.path: a dist-info with a version, and a header
    ``include/kjdist/value.h`` defining KJDIST_VALUE."""

    def __init__(self, sandbox, monkeypatch):
        self.name = f"kjdist-{uuid.uuid4().hex[:8]}"
        self.root = sandbox.tmp / "site"
        self.info = self.root / f"{self.name.replace('-', '_')}-0.dist-info"
        self.info.mkdir(parents=True)
        self.header = self.root / "kjdist_data" / "include" / "kjdist" / "value.h"
        self.header.parent.mkdir(parents=True)
        self.set_version("1.0")
        self.set_value(10)
        monkeypatch.syspath_prepend(str(self.root))

    def set_version(self, version: str) -> None:
        (self.info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {self.name}\nVersion: {version}\n"
        )

    def set_value(self, value: int) -> None:
        self.header.write_text(f"#pragma once\n#define KJDIST_VALUE {value}\n")


def _spec(sandbox, dist: str, sub: str = "kjdist_data/include"):
    sandbox.write("csrc/user.h", HEADER_USER)
    return sandbox.spec(
        "dist_user", ("csrc/user.h",), (("add", "add_dist"),), dist_include_dirs=((dist, sub),)
    )


def test_headers_of_an_installed_distribution_build(sandbox, monkeypatch):
    dist = FakeDistribution(sandbox, monkeypatch)
    spec = _spec(sandbox, dist.name)
    assert cache.dist_include_dirs(spec) == [dist.header.parent.parent]
    assert tvm_ffi.load_module(str(loader.ensure_built(spec))).add(2, 3) == 15


def test_the_version_enters_the_key_not_the_header_content(sandbox, monkeypatch):
    dist = FakeDistribution(sandbox, monkeypatch)
    spec = _spec(sandbox, dist.name)
    key = cache.source_key(spec)
    dist.set_value(20)  # same version, other headers: the version stands for them
    assert cache.source_key(spec) == key
    dist.set_version("1.1")
    assert cache.source_key(spec) != key
    dist.set_version("1.0")
    assert cache.source_key(spec) == key
    other_dir = _spec(sandbox, dist.name, sub="kjdist_data")
    assert cache.source_key(other_dir) != key


def test_missing_distribution_is_a_toolchain_error(sandbox):
    spec = _spec(sandbox, f"kjdist-missing-{uuid.uuid4().hex[:8]}")
    cache.source_key(spec)  # computes ("not installed"): a prebuilt artifact can still be found
    with pytest.raises(
        ToolchainError, match=r"needs the headers of the distribution .*pip install"
    ):
        cache.dist_include_dirs(spec)
    with pytest.raises(ToolchainError, match="not installed"):
        loader.ensure_built(spec)


def test_missing_directory_is_a_toolchain_error(sandbox, monkeypatch):
    dist = FakeDistribution(sandbox, monkeypatch)
    spec = _spec(sandbox, dist.name, sub="kjdist_data/no_such_dir")
    with pytest.raises(ToolchainError, match="has no directory 'kjdist_data/no_such_dir'"):
        cache.dist_include_dirs(spec)


@pytest.mark.parametrize(
    "entry",
    [("nvidia-cutlass",), ("nvidia-cutlass", "/abs/include"), ("nvidia-cutlass", "../up"),
     ("", "include"), (1, "include")],
)  # fmt: skip
def test_bad_entries_are_rejected_at_declaration(sandbox, entry):
    with pytest.raises(ValueError, match="dist_include_dirs entry must be"):
        sandbox.spec("bad", ("csrc/user.h",), (("add", "add_dist"),), dist_include_dirs=(entry,))
