"""A read-only cache directory (e.g. a shipped AOT cache, or a shared one mounted read-only): a hit
still loads and writes nothing; a miss raises CacheDirError naming the directory and
KERNELS_CACHE_DIR.

As root, ``chmod`` does not stop writes, so there the child runs in a private mount namespace
where the cache is bind-mounted read-only (EROFS for everyone, root included); without that
ability the test is skipped rather than faked.
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import sys

import pytest

from kernels_jit import CacheDirError, load_module, loader

_RO_MOUNT = (
    'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" "$0" && exec "$@"'  # $0: the dir
)


def _can_bind_readonly(directory) -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-m", "sh", "-c", _RO_MOUNT, str(directory), "sh", "-c", "! touch \"$0/x\"",
         str(directory)],
        capture_output=True,
    )  # fmt: skip
    return probe.returncode == 0 and not (directory / "x").exists()


def _readonly_runner(directory):
    """A command prefix under which ``directory`` is read-only, and a cleanup; or skip."""
    if os.geteuid() != 0:
        modes = {}
        for path in [directory, *directory.rglob("*")]:
            modes[path] = path.stat().st_mode
            path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))

        def restore():
            for path, mode in modes.items():
                path.chmod(mode)

        return [], restore
    if _can_bind_readonly(directory):
        return ["unshare", "-m", "sh", "-c", _RO_MOUNT, str(directory)], lambda: None
    pytest.skip("running as root without the right to make a read-only bind mount (unshare -m)")


def _tree(directory):
    return sorted(
        (str(p.relative_to(directory)), p.stat().st_size, p.stat().st_mtime_ns)
        for p in directory.rglob("*")
    )


RESULT = """
try:
    m = load_module(spec)
    print(json.dumps({"sum": int(m.add(2, 3))}))
except errors.KernelsJitError as exc:
    print(json.dumps({"error": type(exc).__name__, "message": str(exc)}))
"""


def test_readonly_cache_hit_loads_and_miss_is_a_clear_error(sandbox):
    built = sandbox.adder("built", offset=5)
    loader.ensure_built(built)
    missing = sandbox.adder("missing")
    before = _tree(sandbox.cache)
    prefix, restore = _readonly_runner(sandbox.cache)
    env = sandbox.env(CXX=str(sandbox.cxx_wrapper()))
    try:
        results = {}
        for spec in (built, missing):
            done = subprocess.run(
                [*prefix, sys.executable, "-c", sandbox.child_code(spec, RESULT)],
                env=env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, done.stderr[-4000:]
            results[spec.name] = __import__("json").loads(done.stdout.strip().splitlines()[-1])
    finally:
        restore()
    assert results["built"] == {"sum": 10}
    assert results["missing"]["error"] == "CacheDirError"
    assert str(sandbox.cache) in results["missing"]["message"]
    assert "KERNELS_CACHE_DIR" in results["missing"]["message"]
    assert sandbox.compiles() == []  # the miss never reached the compiler
    assert _tree(sandbox.cache) == before  # nothing was written, not even a lock file


def test_unwritable_cache_root_is_a_clear_error(sandbox, monkeypatch):
    """In-process variant that holds for root too: a cache root under /proc cannot be created."""
    cache_dir = "/proc/kernels-ops-test-cache"
    monkeypatch.setenv("KERNELS_CACHE_DIR", cache_dir)
    spec = sandbox.adder()
    with pytest.raises(CacheDirError) as caught:
        load_module(spec)
    assert cache_dir in str(caught.value)
    assert "KERNELS_CACHE_DIR" in str(caught.value)
    assert spec.uri in str(caught.value)
