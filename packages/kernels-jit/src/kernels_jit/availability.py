"""Whether a backend can run on this machine, decided without importing torch (for `list`)."""

from __future__ import annotations

import importlib.util
import os
import shutil
from functools import cache

from kernels_jit import settings, toolchain
from kernels_jit.errors import ToolchainError
from kernels_jit.registry import Backend


@cache
def gpu_present() -> bool:
    return os.path.exists("/dev/nvidiactl") or shutil.which("nvidia-smi") is not None


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _compiler_reason(device: str) -> str | None:
    if settings.no_jit():
        return None  # runs from a prebuilt cache or fails with a clear ModuleNotBuiltError
    try:
        toolchain.nvcc_path() if device == "cuda" else toolchain.cxx_path()
    except ToolchainError as exc:
        return str(exc).split(":")[0]
    return None


def unavailable_reason(backend: Backend) -> str | None:
    """Why ``backend`` cannot run anywhere on this machine, or None if it can run somewhere."""
    if not _importable("torch"):
        return "torch is not installed"
    reasons = []
    for device in backend.devices:
        if device == "cuda" and not gpu_present():
            reasons.append("no CUDA GPU")
            continue
        if backend.name == "triton" and not _importable("triton"):
            reasons.append("triton is not installed")
            continue
        if backend.name in ("cuda", "cpu"):
            reason = _compiler_reason(device)
            if reason:
                reasons.append(reason)
                continue
        return None
    return "; ".join(reasons) or "no device"
