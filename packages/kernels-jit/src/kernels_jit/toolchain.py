"""Locating the compilers and reading their versions (both feed the cache key)."""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path

from kernels_jit import settings
from kernels_jit.errors import ToolchainError


def cuda_home() -> Path | None:
    """The CUDA toolkit: ``$CUDA_HOME``, else the parent of ``nvcc`` on PATH, else
    /usr/local/cuda."""
    env = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if env:
        return Path(env)
    nvcc = shutil.which("nvcc")
    if nvcc:
        return Path(nvcc).resolve().parent.parent
    default = Path("/usr/local/cuda")
    return default if (default / "bin" / "nvcc").exists() else None


def nvcc_path() -> Path:
    env = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    home = cuda_home()
    if home is None or not (home / "bin" / "nvcc").is_file():
        where = f"CUDA_HOME={env} has no bin/nvcc" if env else "nvcc was not found"
        raise ToolchainError(
            f"{where}: set CUDA_HOME to a CUDA toolkit or put nvcc on PATH "
            "(or use a prebuilt cache with KERNELS_CACHE_DIR and KERNELS_NO_JIT=1)"
        )
    return home / "bin" / "nvcc"


def cxx_path() -> str:
    found = shutil.which(settings.cxx())
    if found is None:
        raise ToolchainError(f"host C++ compiler {settings.cxx()!r} not found: set CXX")
    return found


@functools.cache
def _version_of(executable: str) -> str:
    try:
        out = subprocess.run(
            [executable, "--version"],
            capture_output=True,
            text=True,
            errors="replace",
            timeout=60,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ToolchainError(f"cannot run {executable} --version: {exc}") from exc
    text = out.stdout.strip() or out.stderr.strip()
    if out.returncode != 0 or not text:
        raise ToolchainError(
            f"{executable} --version failed (exit {out.returncode}): {text or 'no output'}"
        )
    return text


def compiler_version(device: str) -> str:
    """Full ``--version`` text of the compiler for ``device`` ('cuda' or 'cpu')."""
    if device == "cuda":
        return _version_of(str(nvcc_path())) + "\n" + _version_of(cxx_path())
    return _version_of(cxx_path())


def nvcc_release() -> tuple[int, int] | None:
    """(major, minor) of nvcc, or None when nvcc is missing."""
    try:
        text = _version_of(str(nvcc_path()))
    except ToolchainError:
        return None
    for token in text.replace(",", " ").split():
        if token.startswith("V") and token[1:2].isdigit():
            major, minor = token[1:].split(".")[:2]
            return int(major), int(minor)
    return None
