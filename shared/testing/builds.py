"""Compiling a group's CUDA sources for sm_90a through the real JIT pipeline (key, build,
publish, load), so a source that does not compile never lands, even on a machine with no GPU."""

from __future__ import annotations

import importlib
import os
from contextlib import contextmanager

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
