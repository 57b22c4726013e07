"""Exceptions of the JIT utility: each says what failed and what to do about it."""

from __future__ import annotations


class KernelsJitError(RuntimeError):
    """Base class of every error raised by kernels-jit."""


class ToolchainError(KernelsJitError):
    """A compiler or the CUDA toolkit is missing."""


class BuildError(KernelsJitError):
    """A compile or link failed; the message holds the compiler's output and the command."""

    def __init__(self, module: str, command: str, output: str, reason: str = "failed") -> None:
        self.module = module
        self.command = command
        self.output = output
        super().__init__(
            f"building module {module!r} {reason}.\n--- compiler output ---\n{output.strip()}\n"
            f"--- command ---\n{command}"
        )


class ModuleNotBuiltError(KernelsJitError):
    """JIT is off (``KERNELS_NO_JIT=1``) and the module is not in the cache."""


class CacheDirError(KernelsJitError):
    """The cache directory cannot be written where a build is needed."""
