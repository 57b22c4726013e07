"""Which machine code a build targets. The arch is part of every cache key and path."""

from __future__ import annotations

import contextvars
import platform
import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from kernels_jit import settings, toolchain
from kernels_jit.errors import ToolchainError

# 'sm_90a', 'sm90a', 'compute_90a', '90a', '9.0a', '10.0f', 'SM_100A'.
_ARCH = re.compile(r"(?:sm_?|compute_?)?(?:(\d+)\.(\d)|(\d{2,3}))([af]?)")

# Targets set by AOT builds for the current thread (env vars are process-wide; AOT builds several
# archs at once). None: use KERNELS_CUDA_ARCH, else detect.
_TARGETS: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar(
    "kernels_cuda_archs", default=None
)


def normalize_cuda_arch(text: str) -> str:
    """'9.0a', '90a', 'sm_90a' -> 'sm_90a'; a bare sm_90+ gets the arch-specific 'a' suffix.

    'f' (family-specific, Blackwell and later) is kept as given; it needs sm_100 or newer.
    """
    match = _ARCH.fullmatch(text.strip().lower())
    if match is None:
        raise ValueError(f"not a CUDA arch: {text!r} (expected e.g. 'sm_90a', '90a' or '9.0a')")
    major, minor, compact, suffix = match.groups()
    digits = f"{major}{minor}" if compact is None else compact
    number = int(digits)
    if number < 10:
        raise ValueError(f"not a CUDA arch: {text!r} (expected e.g. 'sm_90a', '90a' or '9.0a')")
    if suffix == "a" and number < 90:
        raise ValueError(f"CUDA arch {text!r}: the 'a' targets start at sm_90a")
    if suffix == "f" and number < 100:
        raise ValueError(f"CUDA arch {text!r}: the 'f' (family) targets start at sm_100f")
    if not suffix and number >= 90:
        # Hopper and Blackwell features (wgmma, TMA, setmaxnreg) need the 'a' target.
        suffix = "a"
    return f"sm_{number}{suffix}"


def parse_cuda_archs(text: str) -> tuple[str, ...]:
    """A list of archs separated by commas, semicolons or spaces, normalised, sorted, unique."""
    parts = [p for p in re.split(r"[,; ]+", text.strip()) if p]
    if not parts:
        raise ValueError(f"no CUDA arch in {text!r} (expected e.g. 'sm_90a' or '9.0a,10.0a')")
    return tuple(sorted({normalize_cuda_arch(p) for p in parts}))


def cuda_archs() -> tuple[str, ...]:
    """Target CUDA archs, sorted: an AOT target, else ``KERNELS_CUDA_ARCH``, else the GPU's."""
    targets = _TARGETS.get()
    if targets is not None:
        return targets
    override = settings.cuda_arch_override()
    if override:
        try:
            return parse_cuda_archs(override)
        except ValueError as exc:
            raise ValueError(f"KERNELS_CUDA_ARCH: {exc}") from None
    return (detect_cuda_arch(),)


@contextmanager
def targeting(archs: Iterable[str]) -> Iterator[tuple[str, ...]]:
    """Build for ``archs`` in this thread (or task) only, whatever KERNELS_CUDA_ARCH says."""
    normalized = tuple(sorted({normalize_cuda_arch(a) for a in archs}))
    if not normalized:
        raise ValueError("targeting() needs at least one CUDA arch")
    token = _TARGETS.set(normalized)
    try:
        yield normalized
    finally:
        _TARGETS.reset(token)


def detect_cuda_arch() -> str:
    try:
        import torch  # only needed here, to read the current GPU
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        raise ToolchainError(
            "no CUDA device to detect the arch from: set KERNELS_CUDA_ARCH (e.g. sm_90a)"
        )
    major, minor = torch.cuda.get_device_capability()
    return normalize_cuda_arch(f"{major}.{minor}")


def gencode_flags(archs: tuple[str, ...]) -> list[str]:
    return [f"-gencode=arch=compute_{a[3:]},code={a}" for a in archs]


def cpu_arch() -> str:
    return f"cpu_{platform.machine()}"


def arch_tag(device: str) -> str:
    """A path-safe tag for the targets of a build on ``device``."""
    if device == "cuda":
        return "-".join(cuda_archs())
    return cpu_arch()


# The first and last nvcc release that compiles each arch (None: not dropped yet).
_NVCC_RANGE: dict[int, tuple[tuple[int, int], tuple[int, int] | None]] = {
    50: ((6, 0), (12, 9)),  # CUDA 13 dropped Maxwell, Pascal and Volta
    52: ((7, 0), (12, 9)),
    53: ((7, 0), (12, 9)),
    60: ((8, 0), (12, 9)),
    61: ((8, 0), (12, 9)),
    62: ((8, 0), (12, 9)),
    70: ((9, 0), (12, 9)),
    72: ((10, 0), (12, 9)),
    75: ((10, 0), None),
    80: ((11, 0), None),
    86: ((11, 1), None),
    87: ((11, 4), None),
    89: ((11, 8), None),
    90: ((12, 0), None),
    100: ((12, 8), None),
    101: ((12, 8), (12, 9)),  # renamed sm_110 in CUDA 13
    103: ((12, 9), None),
    110: ((13, 0), None),
    120: ((12, 8), None),
    121: ((12, 9), None),
}


def nvcc_supports(arch: str) -> bool:
    """Whether the nvcc found here can compile for ``arch`` (any spelling)."""
    release = toolchain.nvcc_release()
    if release is None:
        return False
    name = normalize_cuda_arch(arch)
    supported = _NVCC_RANGE.get(int(name[3:].rstrip("af")))
    if supported is None:
        return False
    first, last = supported
    if name.endswith("f"):
        first = max(first, (12, 9))
    return release >= first and (last is None or release <= last)


def nvcc_archs() -> tuple[str, ...]:
    """The archs the nvcc found here compiles, normalised ('sm_90a'); () without nvcc."""
    return tuple(normalize_cuda_arch(str(n)) for n in _NVCC_RANGE if nvcc_supports(str(n)))
