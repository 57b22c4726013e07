"""Exceptions of the JIT utility: each says what failed and what to do about it."""

from __future__ import annotations


class KernelsJitError(RuntimeError):
    """Base class of every error raised by kernels-jit."""


class ToolchainError(KernelsJitError):
    """A compiler or the CUDA toolkit is missing, or the target arch cannot be determined."""


class BuildError(KernelsJitError):
    """A compile or link failed; the message holds the compiler's output and the command."""

    def __init__(self, module: str, command: str, output: str, reason: str = "failed") -> None:
        self.module = module
        self.command = command
        self.output = output
        self.reason = reason
        super().__init__(
            f"building module {module!r} {reason}.\n--- compiler output ---\n"
            f"{output.strip() or '(none)'}\n--- command ---\n{command}"
        )

    def __reduce__(self):  # picklable, e.g. across a process pool
        return (type(self), (self.module, self.command, self.output, self.reason))


class ModuleNotBuiltError(KernelsJitError):
    """JIT is off (``KERNELS_NO_JIT=1``) and the module is not in the cache."""


class CacheDirError(KernelsJitError):
    """The cache directory cannot be written where a build is needed."""


class LoadError(KernelsJitError):
    """A module was just built but its shared object does not load."""


class PrecompileError(KernelsJitError):
    """Some modules of an AOT precompilation failed; ``failures`` holds (what, exception)."""

    def __init__(self, failures: list[tuple[str, BaseException]]) -> None:
        self.failures = failures
        details = "\n\n".join(f"=== {what}\n{exc}" for what, exc in failures)
        super().__init__(f"{len(failures)} module build(s) failed:\n\n{details}")


class KernelsFallbackWarning(UserWarning):
    """A GPU tensor ran on the torch reference because the op's fast backend cannot take this
    call (the message says why). Emitted once per op and reason; filter it with
    ``warnings.filterwarnings("ignore", category=KernelsFallbackWarning)``, or make it an error
    with ``KERNELS_STRICT=1``."""


class FallbackError(KernelsJitError, ValueError):
    """``KERNELS_STRICT=1`` and a GPU call would fall back to the torch reference."""
