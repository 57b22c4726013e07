"""kernels-jit: the shared JIT build utility and op registry of the kernels-ops library.

Importing it is cheap: no torch, no tvm-ffi, no compiler. ``load_module`` builds on first use.
"""

from kernels_jit.errors import (
    BuildError,
    CacheDirError,
    KernelsJitError,
    LoadError,
    ModuleNotBuiltError,
    PrecompileError,
    ToolchainError,
)
from kernels_jit.module import ModuleSpec, declared_modules
from kernels_jit.registry import GROUPS, Backend, OpSpec, register_group
from kernels_jit.version import __version__


def load_module(spec: ModuleSpec):
    """The loaded module of ``spec``, compiled on first use (see :mod:`kernels_jit.loader`)."""
    from kernels_jit import loader

    return loader.load_module(spec)


__all__ = [
    "GROUPS",
    "Backend",
    "BuildError",
    "CacheDirError",
    "KernelsJitError",
    "LoadError",
    "ModuleNotBuiltError",
    "PrecompileError",
    "ModuleSpec",
    "OpSpec",
    "ToolchainError",
    "__version__",
    "declared_modules",
    "load_module",
    "register_group",
]
