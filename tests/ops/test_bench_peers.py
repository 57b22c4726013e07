"""Peer sources for the benchmarks (no GPU, no network): the cut of a wheel's Triton kernels
(``shared.bench.fetch_peers.jit_functions``) and its import (``shared.bench.peers.peer_source``)."""

from __future__ import annotations

import ast

import pytest

from shared.bench import fetch_peers, peers

SOURCE = """
import torch
import triton
import triton.language as tl
from framework import platform


@triton.jit(do_not_specialize=["free_ptr"])
def kept_kernel(free_ptr, out_ptr, n: tl.constexpr):
    tl.store(out_ptr, tl.load(free_ptr) + n)


@jit_alias
def aliased_kernel(x_ptr):
    tl.store(x_ptr, 1)


@triton.jit
def other_kernel(x_ptr):
    tl.store(x_ptr, 2)


def launcher(x):
    return platform.launch(x)
"""


def _decorators(text: str) -> dict[str, list[str]]:
    tree = ast.parse(text)
    return {
        n.name: [ast.unparse(d) for d in n.decorator_list]
        for n in tree.body
        if isinstance(n, ast.FunctionDef)
    }


def test_jit_functions_keep_the_kernels_and_their_options_only():
    cut = fetch_peers.jit_functions([SOURCE], "SGLang")
    assert cut.startswith('"""Cut from SGLang (Apache-2.0)')
    assert _decorators(cut) == {
        "kept_kernel": ["triton.jit(do_not_specialize=['free_ptr'])"],
        "aliased_kernel": ["triton.jit"],
        "other_kernel": ["triton.jit"],
    }
    assert "framework" not in cut and "launcher" not in cut


def test_jit_functions_by_name():
    cut = fetch_peers.jit_functions([SOURCE], "SGLang", ("kept_kernel",))
    assert list(_decorators(cut)) == ["kept_kernel"]


def test_jit_functions_of_several_modules_in_one():
    other = "import triton\n\n\n@triton.jit\ndef second_kernel(x_ptr):\n    pass\n"
    cut = fetch_peers.jit_functions([SOURCE, other], "SGLang", ("kept_kernel", "second_kernel"))
    assert list(_decorators(cut)) == ["kept_kernel", "second_kernel"]
    assert cut.count("import triton\n") == 1


@pytest.fixture
def peers_dir(tmp_path, monkeypatch):
    monkeypatch.setattr(peers, "PEERS_DIR", tmp_path)
    peers.peer_source.cache_clear()
    yield tmp_path
    peers.peer_source.cache_clear()


def test_peer_source_absent_broken_or_without_its_entry(peers_dir, capsys):
    assert peers.peer_source("nothing", "kernel") is None
    (peers_dir / "broken").mkdir()
    (peers_dir / "broken" / "kernel.py").write_text("import no_such_module_here\n")
    assert peers.peer_source("broken", "kernel") is None
    assert "peer broken" in capsys.readouterr().out
    (peers_dir / "other").mkdir()
    (peers_dir / "other" / "kernel.py").write_text("def something_else():\n    pass\n")
    assert peers.peer_source("other", "kernel") is None


def test_peer_source_loads_the_cut(peers_dir):
    (peers_dir / "cut").mkdir()
    (peers_dir / "cut" / "kernel.py").write_text(fetch_peers.jit_functions([SOURCE], "SGLang"))
    module = peers.peer_source("cut", "kept_kernel")
    assert module is not None and hasattr(module.kept_kernel, "fn")


def test_describe_names_the_source_peers_found(peers_dir):
    assert peers.describe()["sglang_triton"] == {"status": "absent", "ran": False}
    (peers_dir / "sglang_memory").mkdir()
    (peers_dir / "sglang_memory" / "kernel.py").write_text("")
    info = peers.describe({"sglang_triton"})["sglang_triton"]
    assert info["status"] == "found" and info["cuts"] == ["sglang_memory"] and info["ran"]
    assert info["version"].startswith("sglang ")
