"""Compiling a group's CUDA sources for sm_90a through the real JIT pipeline (key, build,
publish, load), so a source that does not compile never lands, even on a machine with no GPU."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import textwrap
from contextlib import contextmanager
from pathlib import Path

from kernels_jit import ModuleSpec, declared_modules, load_module
from kernels_jit.registry import resolve_target

TARGET_ARCH = "sm_90a"


def group_modules(group: str, device: str = "cuda") -> list[ModuleSpec]:
    """Every module a group declares: importing its op files declares them."""
    package = importlib.import_module(f"kernels_{group}")
    for spec in package.OPS:
        resolve_target(spec.public)
    extra = getattr(package, "AOT_MODULES", None)
    if extra:
        resolve_target(extra)()
    return [m for m in declared_modules(f"kernels_{group}") if m.device == device]


@contextmanager
def cuda_arch(arch: str = TARGET_ARCH):
    old = os.environ.get("KERNELS_CUDA_ARCH")
    os.environ["KERNELS_CUDA_ARCH"] = arch
    try:
        yield
    finally:
        if old is None:
            del os.environ["KERNELS_CUDA_ARCH"]
        else:
            os.environ["KERNELS_CUDA_ARCH"] = old


def compile_group_for_hopper(group: str) -> list[str]:
    """Build (and load) every CUDA module of ``group`` for sm_90a; returns their uris."""
    built = []
    with cuda_arch():
        for module in group_modules(group):
            load_module(module)
            built.append(module.uri)
    return built


def sanitizer_path() -> str | None:
    """compute-sanitizer on PATH or in ``$CUDA_HOME/bin`` (default /usr/local/cuda), or None."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    candidate = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda")) / "bin" / "compute-sanitizer"
    return str(candidate) if candidate.exists() else None


def run_memcheck(group: str, script: str, timeout: float = 1800) -> None:
    """Run ``script`` (Python source that calls every kernel path of ``group`` and prints
    ``done`` last) under compute-sanitizer's memcheck; fail with its report on any error. The
    group's modules are built first, outside the sanitizer, into the same cache. Skips where no
    compute-sanitizer is installed."""
    import pytest

    sanitizer = sanitizer_path()
    if sanitizer is None:
        pytest.skip("compute-sanitizer not found (CUDA_HOME/bin or PATH)")
    compile_group_for_hopper(group)
    result = subprocess.run(
        [sanitizer, "--tool", "memcheck", "--error-exitcode", "3",
         sys.executable, "-c", textwrap.dedent(script)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=timeout,
    )  # fmt: skip
    assert result.returncode == 0 and "done" in result.stdout, (
        result.stdout[-4000:] + result.stderr[-4000:]
    )
