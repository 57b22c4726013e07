"""Concurrent cold starts: four processes asking for the same cold module at the same moment make
exactly one build; the other three wait on the lock and load what it published."""

from __future__ import annotations

import json

from kernels_jit import cache, loader

RANKS = 4

# Each child imports everything, then waits at a file barrier so that all four call load_module
# at the same moment (imports take a second or more, and vary).
RANK = """
import os, time
barrier = {barrier!r}
open(os.path.join(barrier, str(os.getpid())), "w").close()
deadline = time.monotonic() + 60
while len(os.listdir(barrier)) < {ranks} and time.monotonic() < deadline:
    time.sleep(0.01)
m = load_module(spec)
print(json.dumps({{"sum": int(m.add(2, 3))}}))
"""


def test_four_cold_starts_build_once(sandbox):
    # A compile that takes a while, so that every rank arrives while it is in progress.
    cxx = sandbox.cxx_wrapper(sleep=1.5)
    spec = sandbox.adder(offset=10)
    barrier = sandbox.tmp / "barrier"
    barrier.mkdir()
    code = sandbox.child_code(spec, RANK.format(barrier=str(barrier), ranks=RANKS))
    env = sandbox.env(CXX=str(cxx))
    children = [sandbox.spawn(code, env) for _ in range(RANKS)]
    results = []
    for child in children:
        out, err = child.communicate(timeout=180)
        assert child.returncode == 0, err[-4000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    assert results == [{"sum": 15}] * RANKS
    assert len(sandbox.compiles()) == 1, sandbox.invocations()
    assert len(sandbox.invocations()) == 2  # one compile, one link
    # Exactly one artifact, intact, and no staging directory left over.
    artifacts = list(sandbox.cache.rglob("*.so"))
    assert artifacts == [cache.artifact_path(spec, cache.cache_key(spec))]
    assert loader.is_cached(spec)
    assert not list(sandbox.cache.rglob(".staging-*"))


def test_threads_of_one_process_share_one_build(sandbox, monkeypatch):
    """The flock is per open file, so it also serialises threads (AOT builds from threads)."""
    from concurrent.futures import ThreadPoolExecutor

    monkeypatch.setenv("CXX", str(sandbox.cxx_wrapper(sleep=1)))
    spec = sandbox.adder()
    with ThreadPoolExecutor(4) as pool:
        paths = list(pool.map(lambda _: loader.ensure_built(spec), range(4)))
    assert len(set(paths)) == 1 and paths[0].is_file()
    assert len(sandbox.compiles()) == 1
