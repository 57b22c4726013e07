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
        "~/.cache/kernels-ops",
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
        "`1` forbids compiling at run time: a cache miss raises an error naming the module.",
    ),
    Variable(
        "KERNELS_BUILD_TIMEOUT",
        "900",
        "Seconds a build (or the wait for another process's build) may take before it fails.",
    ),
    Variable(
        "KERNELS_BACKEND",
        "",
        "Process-wide backend override: `torch` for every op, or `group.op=backend,...` per op.",
    ),
    Variable("KERNELS_VERBOSE", "0", "`1` logs every build, cache hit and rebuild reason."),
    Variable("CUDA_HOME", "dir of `nvcc` on PATH", "CUDA toolkit used for CUDA builds."),
    Variable("CXX", "c++", "Host C++ compiler used for CPU builds and as nvcc's host compiler."),
)


def _get(name: str) -> str | None:
    value = os.environ.get(name)
    return value if value not in (None, "") else None


def cache_dir() -> Path:
    return Path(_get("KERNELS_CACHE_DIR") or "~/.cache/kernels-ops").expanduser()


def cuda_arch_override() -> str | None:
    return _get("KERNELS_CUDA_ARCH")


def max_jobs() -> int:
    value = _get("KERNELS_MAX_JOBS")
    if value is not None:
        jobs = int(value)
        if jobs < 1:
            raise ValueError(f"KERNELS_MAX_JOBS must be a positive integer, got {value!r}")
        return jobs
    return max(1, min(len(os.sched_getaffinity(0)), 8))


def no_jit() -> bool:
    return _get("KERNELS_NO_JIT") in ("1", "true", "yes")


def build_timeout() -> float:
    return float(_get("KERNELS_BUILD_TIMEOUT") or 900)


def backend_override() -> str:
    return _get("KERNELS_BACKEND") or ""


def verbose() -> bool:
    return _get("KERNELS_VERBOSE") in ("1", "true", "yes")


def cxx() -> str:
    return _get("CXX") or "c++"
