"""shared.bench.precompile's work split and job processes, without a GPU."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")
from shared.bench import peers, precompile


def _case(op: str, shape: list[int], static: bool | None):
    impls = {"cuda": None}
    if static is not None:
        impls["torch_compile"] = peers.CompilePeer(lambda x: x, shape, lambda f, s: f(s), static)
    return SimpleNamespace(op=op, shape=shape, impls=impls)


def test_each_static_graph_is_a_job_and_each_op_shares_its_auto_shapes():
    cases = [
        _case("a", [1, 8], False),
        _case("a", [8192, 8], True),
        _case("b", [1, 8], False),
        _case("a", [64, 8], False),
        _case("b", [32768, 8], True),
        _case("c", [1, 8], None),  # no torch_compile peer: nothing to compile
    ]
    # static shapes one process each; the auto shapes of an op together, in the sweep's order
    assert precompile._jobs(cases) == [[1], [4], [0, 3], [2]]


def test_a_failing_job_is_reported_and_fails_the_run(tmp_path):
    # No CUDA here: kv_canary's inputs cannot be made, so each job process fails; the parent
    # reports every one and exits non-zero instead of hanging or hiding them.
    run = subprocess.run(
        [sys.executable, "-m", "shared.bench.precompile", "--group", "kv_canary", "--quick",
         "--static-compile", "large", "--jobs", "2", "--op", "kv_canary_write"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if run.returncode == 0:
        pytest.skip("a CUDA device is present: the jobs compiled")
    assert run.stdout.startswith("precompile: 2 process(es) for kv_canary")
    assert run.stdout.count("precompile kv_canary failed (exit 1)") == 2
