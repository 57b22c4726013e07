"""`doctor`: toolchain, arch, cache and versions, and which backends can run here (or why not)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys

from kernels_jit import arch, availability, settings, toolchain
from kernels_jit.errors import ToolchainError
from kernels_jit.registry import all_ops


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _dir_size(path) -> tuple[int, int]:
    files = size = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                size += os.path.getsize(os.path.join(root, name))
                files += 1
            except OSError:
                pass
    return files, size


def sections() -> list[tuple[str, list[tuple[str, str]]]]:
    """(title, [(key, value)]) sections; the CLI renders them as tables."""
    env = [("python", sys.version.split()[0]), ("platform", platform.platform())]
    for dist in ("kernels-jit", "apache-tvm-ffi", "torch", "triton", "ninja"):
        env.append((dist, _version(dist)))
    tools = []
    try:
        nvcc = toolchain.nvcc_path()
        release = toolchain.nvcc_release()
        tools.append(("nvcc", f"{nvcc} ({'.'.join(map(str, release)) if release else '?'})"))
    except ToolchainError as exc:
        tools.append(("nvcc", f"missing: {exc}"))
    try:
        tools.append(("c++", f"{toolchain.cxx_path()}"))
    except ToolchainError as exc:
        tools.append(("c++", f"missing: {exc}"))
    tools.append(("gpu present", str(availability.gpu_present())))
    try:
        tools.append(("cuda arch", ", ".join(arch.cuda_archs())))
    except Exception as exc:  # no GPU and no override
        tools.append(("cuda arch", f"undetermined ({exc})"))
    tools.append(("cpu arch", arch.cpu_arch()))
    cache_dir = settings.cache_dir()
    files, size = _dir_size(cache_dir) if cache_dir.exists() else (0, 0)
    writable = os.access(cache_dir if cache_dir.exists() else cache_dir.parent, os.W_OK)
    cache = [
        ("cache dir", str(cache_dir)),
        ("cache size", f"{size / 2**20:.1f} MiB in {files} files"),
        ("writable", str(writable)),
        ("KERNELS_NO_JIT", str(settings.no_jit())),
        ("max jobs", str(settings.max_jobs())),
    ]
    backends = []
    for spec in all_ops():
        for backend in spec.backends:
            reason = availability.unavailable_reason(backend)
            backends.append((f"{spec.id} [{backend.name}]", "ok" if reason is None else reason))
    return [("environment", env), ("toolchain", tools), ("cache", cache), ("backends", backends)]
