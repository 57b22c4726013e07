"""Building one module: an OS lock, a private staging directory, ninja, an atomic publish.

Many processes (e.g. 8 tensor-parallel ranks) asking for the same cold module build it once: the
first takes ``fcntl.flock`` on the key's lock file, the others wait on it and then load what it
published. The kernel drops a flock when its holder dies, so a SIGKILLed builder leaves no stuck
lock; it builds in ``.staging-<uuid>`` and publishes with ``os.replace`` (record first, then the
``.so``), so it leaves no partial artifact either. Its ninja gets SIGTERM when it dies (Linux
``PR_SET_PDEATHSIG``) and stops the compilers; a timeout kills the whole process tree.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from kernels_jit import arch, cache, settings, toolchain
from kernels_jit.errors import BuildError, CacheDirError
from kernels_jit.module import ModuleSpec

_LOCK_POLL_S = 0.05


def _writable_dir(path: Path, spec: ModuleSpec, reason: str = "not in the cache") -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".probe-{uuid.uuid4().hex}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise CacheDirError(
            f"module {spec.uri!r} must be built ({reason}) but the cache directory "
            f"{settings.cache_dir()} is not writable: {path}: "
            f"{os.strerror(exc.errno or errno.EACCES)}. Point KERNELS_CACHE_DIR at a writable "
            "directory, or prebuild the module there with `kernels-jit build`."
        ) from exc


@contextmanager
def build_lock(spec: ModuleSpec, key: str, reason: str = "not in the cache") -> Iterator[None]:
    """Hold the key's flock; waits at most KERNELS_BUILD_TIMEOUT for another builder.

    ``reason`` (why a build is needed) goes into the error raised when the cache is read-only.
    """
    directory = cache.module_dir(spec)
    _writable_dir(directory, spec, reason)
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
                        reason=(
                            f"timed out after {settings.build_timeout():g} s waiting for another "
                            "process's build (KERNELS_BUILD_TIMEOUT)"
                        ),
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


def _esc(text: str) -> str:
    """Escape ``text`` for a ninja variable or command (``$`` is ninja's only metacharacter)."""
    return text.replace("$", "$$")


def _sh(word: str) -> str:
    return _esc(shlex.quote(word))


def ninja_file(spec: ModuleSpec, staging: Path) -> str:
    includes = [f"-I{d}" for d in [*cache.include_dirs(spec), *cache.dist_include_dirs(spec)]]
    from tvm_ffi import libinfo

    includes += [f"-I{libinfo.find_include_path()}", f"-I{libinfo.find_dlpack_include_path()}"]
    flags = " ".join(_sh(f) for f in [*cache.compile_flags(spec), *includes])
    lib_dir = _sh(f"-L{Path(libinfo.find_libtvm_ffi()).parent}")
    if spec.device == "cuda":
        compiler = _sh(str(toolchain.nvcc_path()))
        host = _sh(f"-ccbin={toolchain.cxx_path()}")
        compile_cmd = (
            f"{compiler} {host} --generate-dependencies-with-compile --dependency-output $out.d "
            "$flags -c $in -o $out"
        )
        link_cmd = f"{compiler} {host} -shared $in -o $out {lib_dir} -ltvm_ffi"
        binding = "binding.cu"
    else:
        compiler = _sh(toolchain.cxx_path())
        compile_cmd = f"{compiler} -MMD -MF $out.d $flags -c $in -o $out"
        link_cmd = f"{compiler} -shared $in -o $out {lib_dir} -ltvm_ffi"
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


# Runs ninja with PR_SET_PDEATHSIG=SIGTERM: if the building process dies (even by SIGKILL), ninja
# is told to stop, and it stops its compilers. Done in a tiny exec'd shim rather than preexec_fn,
# which is unsafe in threaded programs (AOT builds from threads).
_PDEATHSIG_SHIM = (
    "import ctypes, os, signal, sys\n"
    "ctypes.CDLL(None).prctl(1, int(signal.SIGTERM), 0, 0, 0)\n"
    "if os.getppid() != int(sys.argv[1]):\n"
    "    sys.exit(128 + int(signal.SIGTERM))\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def _launch(command: list[str]) -> list[str]:
    if sys.platform.startswith("linux") and sys.executable:
        return [sys.executable, "-I", "-S", "-c", _PDEATHSIG_SHIM, str(os.getpid()), *command]
    return command


def _run_ninja(spec: ModuleSpec, staging: Path) -> None:
    command = [_ninja(), "-v", "-C", str(staging), "-j", str(settings.max_jobs())]
    timeout = settings.build_timeout()
    process = subprocess.Popen(
        _launch(command),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        errors="replace",
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        running = _kill_tree(process.pid)
        output = _drain(process)
        raise BuildError(
            spec.uri,
            "\n".join(running) or _running_command(output, command),
            _compiler_output(output),
            reason=(
                f"timed out after {timeout:g} s (KERNELS_BUILD_TIMEOUT={timeout:g}); "
                "the compiler was killed"
            ),
        ) from None
    except BaseException:  # KeyboardInterrupt and the like: leave no compiler behind
        _kill_tree(process.pid)
        _drain(process)
        raise
    if process.returncode != 0:
        raise BuildError(spec.uri, _failed_command(output, command), _compiler_output(output))


def _drain(process: subprocess.Popen) -> str:
    try:
        output, _ = process.communicate(timeout=10)
    except subprocess.TimeoutExpired:  # a writer outside the tree still holds the pipe
        process.kill()
        process.wait()
        return ""
    return output or ""


def _processes() -> list[tuple[int, int, int]]:
    """(pid, ppid, pgid) of every process (Linux /proc; empty elsewhere)."""
    found = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as handle:
                stat = handle.read()
        except OSError:
            continue
        fields = stat[stat.rindex(b")") + 2 :].split()
        found.append((int(entry), int(fields[1]), int(fields[2])))
    return found


def _command_of(pid: int) -> str | None:
    """The command line of ``pid``; for ninja's ``/bin/sh -c CMD`` jobs, CMD."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            argv = handle.read().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return None
    if len(argv) >= 3 and argv[0].endswith("sh") and argv[1] == "-c":
        return argv[2]
    return " ".join(shlex.quote(a) for a in argv) or None


def _kill_tree(pid: int) -> list[str]:
    """SIGKILL ninja and every process under it; returns the commands ninja was running.

    ninja puts each job in a process group of its own, so killing ninja's group alone would leave
    the compilers running. ninja is stopped first (it can start nothing new), then every group
    that holds one of its descendants is killed, then ninja.
    """
    with suppress(OSError):
        os.killpg(pid, signal.SIGSTOP)
    children: dict[int, list[tuple[int, int]]] = {}
    for child, parent, group in _processes():
        children.setdefault(parent, []).append((child, group))
    running = [c for c in (_command_of(child) for child, _ in children.get(pid, [])) if c]
    own_group = os.getpgrp()
    stack, victims, groups = [pid], [], set()
    while stack:
        for child, group in children.get(stack.pop(), []):
            victims.append(child)
            groups.add(group)
            stack.append(child)
    for group in groups - {own_group}:
        with suppress(OSError):
            os.killpg(group, signal.SIGKILL)
    for victim in victims:
        with suppress(OSError):
            os.kill(victim, signal.SIGKILL)
    with suppress(OSError):
        os.killpg(pid, signal.SIGKILL)
    return running


_PROGRESS = re.compile(r"^\[\d+/\d+\] ")


def _failed_command(output: str, fallback: list[str]) -> str:
    """The command ninja reports after ``FAILED:`` (the compiler's own command line)."""
    lines = output.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("FAILED:") and i + 1 < len(lines):
            return lines[i + 1].strip()
    return " ".join(shlex.quote(c) for c in fallback)


def _running_command(output: str, fallback: list[str]) -> str:
    """The last command ninja started (what was running when the build was stopped)."""
    started = [_PROGRESS.sub("", ln) for ln in output.splitlines() if _PROGRESS.match(ln)]
    return started[-1].strip() if started else " ".join(shlex.quote(c) for c in fallback)


def _compiler_output(output: str) -> str:
    """ninja's log minus its own chatter (progress lines, FAILED: and the command after it)."""
    keep = []
    skip_next = False
    for line in output.splitlines():
        if skip_next:
            skip_next = False
            continue
        if line.startswith("FAILED:"):
            skip_next = True
            continue
        if _PROGRESS.match(line) or line.startswith("ninja: "):
            continue
        keep.append(line)
    return "\n".join(keep).strip()


_STAGING_GRACE_S = 60.0


def _sweep_staging(directory: Path) -> None:
    """Remove staging dirs whose builder is dead (killed mid-build).

    A live builder holds an flock on its ``.owner`` file for the whole build, so the sweeper
    takes it only from a dead one (whatever their timeouts, on this host or another over NFS).
    Young dirs are left alone: their builder may not have taken its lock yet.
    """
    horizon = time.time() - _STAGING_GRACE_S
    for stale in directory.glob(".staging-*"):
        try:
            if stale.stat().st_mtime > horizon:
                continue
            with open(stale / ".owner", "a+") as owner:
                fcntl.flock(owner.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:  # held (BlockingIOError): a live build; or already gone
            continue


def _fsync(path: Path) -> None:
    with open(path, "rb") as handle:
        os.fsync(handle.fileno())


def build(spec: ModuleSpec, key: str) -> Path:
    """Compile ``spec`` into a staging dir and publish it at its artifact path (lock held).

    Publishing moves the record (``<uri>.meta.json``: size, sha256, keys) into place first, then
    the ``.so``, each with an atomic ``os.replace``: a reader sees either no artifact, the
    previous one, or the complete new one, and checks it against the record before loading.
    """
    directory = cache.module_dir(spec)
    _sweep_staging(directory)
    staging = directory / f".staging-{uuid.uuid4().hex}"
    staging.mkdir(parents=True)
    owner = open(staging / ".owner", "a+")  # noqa: SIM115 (held for the whole build)
    try:
        fcntl.flock(owner.fileno(), fcntl.LOCK_EX)
        (staging / ("binding.cu" if spec.device == "cuda" else "binding.cc")).write_text(
            spec.binding_source()
        )
        (staging / "build.ninja").write_text(ninja_file(spec, staging))
        started = time.monotonic()
        print(
            f"kernels-jit: building {spec.uri} for {arch.arch_tag(spec.device)} ...",
            file=sys.stderr,
            flush=True,
        )
        _run_ninja(spec, staging)
        built = staging / f"{spec.uri}.so"
        _fsync(built)
        record = staging / "meta.json"
        record.write_text(json.dumps(cache.artifact_record(spec, key, built), indent=1) + "\n")
        _fsync(record)
        target = cache.artifact_path(spec, key)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / "build.ninja", target.parent / "build.ninja")
        os.replace(record, cache.meta_path(target))
        os.replace(built, target)
        cache.fsync_dir(target.parent)
        if settings.verbose():
            print(
                f"kernels-jit: built {spec.uri} in {time.monotonic() - started:.1f} s -> {target}",
                file=sys.stderr,
            )
        return target
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        owner.close()
