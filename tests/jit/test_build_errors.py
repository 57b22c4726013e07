"""Real errors: a compile error shows the compiler's own message and the command; a build over
KERNELS_BUILD_TIMEOUT fails with "timed out" and leaves no process behind; so does waiting for a
lock that another process holds for too long."""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import time

import pytest

from kernels_jit import BuildError, cache, load_module, loader


def test_compile_error_shows_the_compiler_message_and_the_command(sandbox):
    sandbox.write("csrc/broken.h", "#pragma once\nint broken( {\n")
    spec = sandbox.spec("broken", ("csrc/broken.h",), (("f", "broken"),))
    with pytest.raises(BuildError) as caught:
        load_module(spec)
    error = caught.value
    message = str(error)
    assert "broken.h:2" in message and "error:" in message  # the compiler's own text
    assert error.command.startswith(sandbox.real_cxx) or sandbox.real_cxx in error.command
    assert " -c binding.cc" in error.command and error.command in message
    assert "FAILED:" not in error.output and "ninja: build stopped" not in error.output
    assert not cache.artifact_path(spec, cache.cache_key(spec)).exists()
    assert not list(sandbox.cache.rglob(".staging-*"))
    # The lock was released: a second attempt fails the same way at once.
    started = time.monotonic()
    with pytest.raises(BuildError):
        loader.ensure_built(spec)
    assert time.monotonic() - started < 20


def test_build_timeout_kills_the_compiler(sandbox, monkeypatch):
    monkeypatch.setenv("CXX", str(sandbox.cxx_wrapper("slow-cxx", sleep=120)))
    monkeypatch.setenv("KERNELS_BUILD_TIMEOUT", "2")
    spec = sandbox.adder()
    started = time.monotonic()
    with pytest.raises(BuildError, match="timed out") as caught:
        load_module(spec)
    assert time.monotonic() - started < 30
    assert "KERNELS_BUILD_TIMEOUT" in str(caught.value)
    assert "binding.cc" in caught.value.command  # the command that was running
    pids = sandbox.pids()
    assert len(pids) == 2  # the wrapper shell and its sleep
    try:
        assert sandbox.wait_until(lambda: not any(map(sandbox.pid_alive, pids)), timeout=5)
    finally:
        for pid in pids:
            if sandbox.pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
    assert not list(sandbox.cache.rglob("*.so"))
    assert not list(sandbox.cache.rglob(".staging-*"))


def test_waiting_for_a_held_lock_times_out(sandbox, monkeypatch):
    monkeypatch.setenv("KERNELS_BUILD_TIMEOUT", "1")
    spec = sandbox.adder()
    key = cache.cache_key(spec)
    lock = cache.module_dir(spec) / f"{key}.lock"
    lock.parent.mkdir(parents=True)
    with open(lock, "a+") as holder:  # another "process" (open file) holds the build lock
        fcntl.flock(holder.fileno(), fcntl.LOCK_EX)
        started = time.monotonic()
        with pytest.raises(BuildError, match="timed out.*waiting"):
            loader.ensure_built(spec)
        assert 1 <= time.monotonic() - started < 10


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_nvcc_error_shows_its_message_and_command(sandbox, monkeypatch):
    monkeypatch.setenv("KERNELS_CUDA_ARCH", "sm_90a")
    sandbox.write(
        "csrc/bad.cuh",
        "#pragma once\n__global__ void k(int* p) { p[0] = undeclared_thing; }\n"
        "inline int f() { return 0; }\n",
    )
    spec = sandbox.spec("bad", ("csrc/bad.cuh",), (("f", "f"),), device="cuda")
    with pytest.raises(BuildError) as caught:
        load_module(spec)
    assert 'identifier "undeclared_thing" is undefined' in caught.value.output
    assert "nvcc" in caught.value.command and "code=sm_90a" in caught.value.command
    assert caught.value.command in str(caught.value)
