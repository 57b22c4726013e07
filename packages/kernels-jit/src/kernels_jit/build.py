"""Building one module: an OS lock, a private staging directory, ninja, an atomic publish.

Many processes (e.g. 8 tensor-parallel ranks) asking for the same cold module build it once: the
first takes ``fcntl.flock`` on the key's lock file, the others wait on it and then load what it
published. The kernel drops a flock when its holder dies, so a SIGKILLed builder leaves no stuck
lock; it builds in ``.staging-<uuid>`` and publishes with ``os.replace``, so it leaves no partial
artifact either.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kernels_jit import cache, settings, toolchain
from kernels_jit.errors import BuildError, CacheDirError
from kernels_jit.module import ModuleSpec

_LOCK_POLL_S = 0.05


def _writable_dir(path: Path, spec: ModuleSpec) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".probe-{uuid.uuid4().hex}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise CacheDirError(
            f"module {spec.uri!r} is not built and the cache directory {path} is not writable "
            f"({os.strerror(exc.errno or errno.EACCES)}). Point KERNELS_CACHE_DIR at a writable "
            "directory, or prebuild the module there with `kernels-ops build`."
        ) from exc


@contextmanager
def build_lock(spec: ModuleSpec, key: str) -> Iterator[None]:
    """Hold the key's flock; waits at most KERNELS_BUILD_TIMEOUT for another builder."""
    directory = cache.module_dir(spec)
    _writable_dir(directory, spec)
    deadline = time.monotonic() + settings.build_timeout()
    with open(directory / f"{key}.lock", "a+") as handle:
        announced = False
        while True:
            try:
                fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise BuildError(
                        spec.uri,
                        f"flock {directory / f'{key}.lock'}",
                        "another process held the build lock for the whole timeout",
                        reason=f"timed out after {settings.build_timeout():.0f} s waiting",
                    ) from None
                if not announced and settings.verbose():
                    print(
                        f"kernels-jit: waiting for another process to build {spec.uri}",
                        file=sys.stderr,
                    )
                announced = True
                time.sleep(_LOCK_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def ninja_file(spec: ModuleSpec, staging: Path) -> str:
    includes = [f"-I{d}" for d in cache.include_dirs(spec)]
    from tvm_ffi import libinfo

    includes += [f"-I{libinfo.find_include_path()}", f"-I{libinfo.find_dlpack_include_path()}"]
    flags = " ".join(shlex.quote(f) for f in [*cache.compile_flags(spec), *includes])
    lib_dir = Path(libinfo.find_libtvm_ffi()).parent
    if spec.device == "cuda":
        compiler = str(toolchain.nvcc_path())
        host = f"-ccbin={shlex.quote(toolchain.cxx_path())}"
        compile_cmd = (
            f"{compiler} {host} --generate-dependencies-with-compile --dependency-output $out.d "
            "$flags -c $in -o $out"
        )
        link_cmd = f"{compiler} {host} -shared $in -o $out -L{lib_dir} -ltvm_ffi"
        binding = "binding.cu"
    else:
        compiler = toolchain.cxx_path()
        compile_cmd = f"{compiler} -MMD -MF $out.d $flags -c $in -o $out"
        link_cmd = f"{compiler} -shared $in -o $out -L{lib_dir} -ltvm_ffi"
        binding = "binding.cc"
    return "\n".join(
        [
            "ninja_required_version = 1.3",
            f"flags = {flags}",
            "rule compile",
            f"  command = {compile_cmd}",
            "  depfile = $out.d",
            "  deps = gcc",
            "rule link",
            f"  command = {link_cmd}",
            f"build binding.o: compile {binding}",
            f"build {spec.uri}.so: link binding.o",
            "",
        ]
    )


def _ninja() -> str:
    found = shutil.which("ninja")
    if found:
        return found
    try:
        import ninja  # the PyPI wheel carries the binary

        return str(Path(ninja.BIN_DIR) / "ninja")
    except ImportError:
        raise BuildError("ninja", "ninja", "ninja is not installed (pip install ninja)") from None


def _run_ninja(spec: ModuleSpec, staging: Path) -> None:
    command = [_ninja(), "-C", str(staging), "-j", str(settings.max_jobs())]
    process = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=settings.build_timeout())
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        output, _ = process.communicate()
        raise BuildError(
            spec.uri,
            _failed_command(output, command),
            output,
            reason=f"timed out after {settings.build_timeout():.0f} s (KERNELS_BUILD_TIMEOUT)",
        ) from None
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        raise
    if process.returncode != 0:
        raise BuildError(spec.uri, _failed_command(output, command), _compiler_output(output))


def _failed_command(output: str, fallback: list[str]) -> str:
    for line in output.splitlines():
        if line.startswith("FAILED:"):
            continue
        if line.strip().startswith(("/", "nvcc", "c++", "g++")) and " -o " in line:
            return line.strip()
    return " ".join(fallback)


def _compiler_output(output: str) -> str:
    """ninja's log minus its own chatter, so the compiler's message comes first."""
    keep = [
        ln
        for ln in output.splitlines()
        if not ln.startswith(("[", "ninja: build stopped", "FAILED:"))
        and not (" -o " in ln and ln.strip().startswith("/"))
    ]
    return "\n".join(keep) or output


def _sweep_staging(directory: Path) -> None:
    """Remove staging dirs that a killed builder left behind long ago."""
    horizon = time.time() - 2 * settings.build_timeout()
    for stale in directory.glob(".staging-*"):
        try:
            if stale.stat().st_mtime < horizon:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            pass


def build(spec: ModuleSpec, key: str) -> Path:
    """Compile ``spec`` into a staging dir and publish it at its artifact path (lock held)."""
    directory = cache.module_dir(spec)
    _sweep_staging(directory)
    staging = directory / f".staging-{uuid.uuid4().hex}"
    staging.mkdir(parents=True)
    try:
        (staging / ("binding.cu" if spec.device == "cuda" else "binding.cc")).write_text(
            spec.binding_source()
        )
        (staging / "build.ninja").write_text(ninja_file(spec, staging))
        started = time.monotonic()
        print(
            f"kernels-jit: building {spec.uri} for {cache.arch.arch_tag(spec.device)} ...",
            file=sys.stderr,
            flush=True,
        )
        _run_ninja(spec, staging)
        target = cache.artifact_path(spec, key)
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(staging / "build.ninja", target.parent / "build.ninja")
        os.replace(staging / f"{spec.uri}.so", target)
        if settings.verbose():
            print(
                f"kernels-jit: built {spec.uri} in {time.monotonic() - started:.1f} s -> {target}",
                file=sys.stderr,
            )
        return target
    finally:
        shutil.rmtree(staging, ignore_errors=True)
