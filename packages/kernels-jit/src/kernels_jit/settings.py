"""Every setting of the kernel library, read from ``KERNELS_*`` environment variables.

Read settings through this module (``settings.cache_dir()``), never ``from settings import ...``:
tests and AOT builds override the environment, and each call re-reads it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Variable:
    """One documented environment variable."""

    name: str
    default: str
    meaning: str


VARIABLES: tuple[Variable, ...] = (
    Variable(
        "KERNELS_CACHE_DIR",
        "$XDG_CACHE_HOME/kernels-ops, else ~/.cache/kernels-ops",
        "Root of the compiled-module cache (may be shared, e.g. on NFS, or a shipped AOT cache).",
    ),
    Variable(
        "KERNELS_CUDA_ARCH",
        "detected",
        "Target archs for CUDA builds, e.g. `sm_90a` or `9.0a,10.0a`; overrides detection.",
    ),
    Variable(
        "KERNELS_MAX_JOBS",
        "min(cores, 8)",
        "Upper bound on parallel compiler processes (ninja -j, AOT workers).",
    ),
    Variable(
        "KERNELS_NO_JIT",
        "0",
        "`1` forbids compiling at run time: a cache miss raises an error naming the module "
        "(booleans: 1/true/yes/on or 0/false/no/off).",
    ),
    Variable(
        "KERNELS_PREFER_PREBUILT",
        "0",
        "`1`: where this compiler's artifact is missing, first load an intact one with the same "
        "sources, flags, arch and versions built by another compiler (a shipped AOT cache), "
        "then compile what is still missing (KERNELS_NO_JIT=1 implies the first part).",
    ),
    Variable(
        "KERNELS_BUILD_TIMEOUT",
        "900",
        "Seconds a build (or the wait for another process's build) may take before it fails.",
    ),
    Variable(
        "KERNELS_BACKEND",
        "",
        "Process-wide backend override: `torch` for every op, or `group.op=backend,...` per op "
        "(checked when first read: an unknown op or backend is an error naming the entry).",
    ),
    Variable(
        "KERNELS_STRICT",
        "0",
        "`1` turns a fall-back from a fast backend to torch for a GPU tensor (normally a "
        "`KernelsFallbackWarning`, once per op and reason) into an error.",
    ),
    Variable("KERNELS_VERBOSE", "0", "`1` logs every build, cache hit and rebuild reason."),
    Variable("CUDA_HOME", "dir of `nvcc` on PATH", "CUDA toolkit used for CUDA builds."),
    Variable("CXX", "c++", "Host C++ compiler used for CPU builds and as nvcc's host compiler."),
)


def _get(name: str) -> str | None:
    value = os.environ.get(name)
    if value is None:
        return None
    value = value.strip()
    return value or None


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def _flag(name: str) -> bool:
    """A boolean variable: 1/true/yes/on or 0/false/no/off, any case; anything else is an error
    (a typo must not silently turn a switch such as KERNELS_NO_JIT off)."""
    value = _get(name)
    if value is None:
        return False
    if value.lower() in _TRUE:
        return True
    if value.lower() in _FALSE:
        return False
    raise ValueError(
        f"{name} must be one of {'/'.join(_TRUE)} or {'/'.join(_FALSE)}, got {value!r}"
    )


def cache_dir() -> Path:
    """The cache root, always absolute (a relative value is taken from the current directory)."""
    value = _get("KERNELS_CACHE_DIR")
    if value is None:
        base = _get("XDG_CACHE_HOME") or "~/.cache"
        return (Path(base).expanduser() / "kernels-ops").absolute()
    return Path(value).expanduser().absolute()


def cuda_arch_override() -> str | None:
    return _get("KERNELS_CUDA_ARCH")


def max_jobs() -> int:
    value = _get("KERNELS_MAX_JOBS")
    if value is not None:
        try:
            jobs = int(value)
        except ValueError:
            jobs = 0
        if jobs < 1:
            raise ValueError(f"KERNELS_MAX_JOBS must be a positive integer, got {value!r}")
        return jobs
    return max(1, min(_usable_cpus(), 8))


def _usable_cpus() -> int:
    """CPUs this process may run on (affinity mask where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS
        return os.cpu_count() or 1


def no_jit() -> bool:
    return _flag("KERNELS_NO_JIT")


def prefer_prebuilt() -> bool:
    return _flag("KERNELS_PREFER_PREBUILT")


def build_timeout() -> float:
    value = _get("KERNELS_BUILD_TIMEOUT")
    if value is None:
        return 900.0
    try:
        seconds = float(value)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise ValueError(
            f"KERNELS_BUILD_TIMEOUT must be a positive number of seconds, got {value!r}"
        )
    return seconds


def backend_override() -> str:
    """The raw ``KERNELS_BACKEND`` text ("" when unset); :func:`backend_overrides` parses it."""
    return _get("KERNELS_BACKEND") or ""


def backend_overrides() -> tuple[str | None, dict[str, str]]:
    """``KERNELS_BACKEND`` parsed: (backend for every op or None, {op id: backend}).

    The syntax is checked here; whether each op and backend exists is checked by dispatch,
    which knows the registry. Errors name the variable and the entry."""
    text = backend_override()
    every: str | None = None
    per_op: dict[str, str] = {}
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        if "=" in entry:
            op_id, _, backend = (x.strip() for x in entry.partition("="))
            if op_id.count(".") != 1 or not all(op_id.split(".")) or not backend:
                raise ValueError(
                    f"KERNELS_BACKEND: entry {entry!r} is not <group>.<op>=<backend> (in {text!r})"
                )
            per_op[op_id] = backend
        elif entry == "torch":
            every = entry
        else:
            raise ValueError(
                f"KERNELS_BACKEND: entry {entry!r} is neither 'torch' (the reference for every "
                f"op) nor <group>.<op>=<backend> (in {text!r})"
            )
    return every, per_op


def strict() -> bool:
    return _flag("KERNELS_STRICT")


def verbose() -> bool:
    return _flag("KERNELS_VERBOSE")


def cxx() -> str:
    return _get("CXX") or "c++"
