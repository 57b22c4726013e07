"""Which machine code a build targets. The arch is part of every cache key and path."""

from __future__ import annotations

import platform

from kernels_jit import settings, toolchain


def normalize_cuda_arch(text: str) -> str:
    """'9.0a', '90a', 'sm_90a' -> 'sm_90a'; a bare sm_90+ gets the arch-specific 'a' suffix."""
    arch = text.strip().lower().removeprefix("sm_").removeprefix("compute_").replace(".", "")
    digits = arch.rstrip("af")
    if not digits.isdigit() or len(digits) < 2:
        raise ValueError(f"not a CUDA arch: {text!r} (expected e.g. 'sm_90a' or '9.0a')")
    suffix = arch[len(digits) :]
    if not suffix and int(digits) >= 90:
        # Hopper and Blackwell features (wgmma, TMA, setmaxnreg) need the 'a' target.
        suffix = "a"
    return f"sm_{digits}{suffix}"


def cuda_archs() -> tuple[str, ...]:
    """Target CUDA archs, sorted: ``KERNELS_CUDA_ARCH`` if set, else the current GPU's."""
    override = settings.cuda_arch_override()
    if override:
        parts = override.replace(";", ",").replace(" ", ",").split(",")
        return tuple(sorted({normalize_cuda_arch(p) for p in parts if p}))
    return (detect_cuda_arch(),)


def detect_cuda_arch() -> str:
    import torch  # only needed here, to read the current GPU

    if not torch.cuda.is_available():
        raise RuntimeError(
            "no CUDA device to detect the arch from: set KERNELS_CUDA_ARCH (e.g. sm_90a)"
        )
    major, minor = torch.cuda.get_device_capability()
    return normalize_cuda_arch(f"{major}{minor}")


def gencode_flags(archs: tuple[str, ...]) -> list[str]:
    return [f"-gencode=arch=compute_{a[3:]},code={a}" for a in archs]


def cpu_arch() -> str:
    return f"cpu_{platform.machine()}"


def arch_tag(device: str) -> str:
    """A path-safe tag for the targets of a build on ``device``."""
    if device == "cuda":
        return "-".join(cuda_archs())
    return cpu_arch()


def nvcc_supports(arch: str) -> bool:
    release = toolchain.nvcc_release()
    if release is None:
        return False
    number = int(arch[3:].rstrip("af"))
    return number < 100 or release >= (12, 8)
