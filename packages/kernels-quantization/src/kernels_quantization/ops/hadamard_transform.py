"""quantization.hadamard_transform: the (unnormalised) Walsh-Hadamard transform along the last dim,
times ``scale``; the rotation primitive of Hadamard-rotated quantization (QuaRot, SpinQuant).

The CUDA backend (csrc/hadamard_transform.cuh) reads and writes each row once with 16-byte packs,
doing every butterfly in fp32 registers, warp shuffles and (N >= 4096) one shared-memory round
trip; one instantiation per log2 N in one module."""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_tensor, compiled_path, is_row_view, last_dim_contiguous
from kernels_quantization import reference
from kernels_quantization._checks import ACTIVATION_DTYPES

OP_ID = "quantization.hadamard_transform"

HADAMARD_TRANSFORM_CUDA = ModuleSpec(
    name="hadamard_transform",
    package="kernels_quantization",
    sources=("csrc/hadamard_transform.cuh",),
    exports=(("hadamard_transform", "hadamard_transform"),),
    description="CUDA: register butterflies, warp shuffles and one smem round trip per row "
    "(one kernel per log2 N, 16-byte packs when aligned)",
)

_hadamard_transform_cuda = CompiledFunction(HADAMARD_TRANSFORM_CUDA, "hadamard_transform")


def _hadamard_transform_torch(out: torch.Tensor, x: torch.Tensor, scale: float) -> None:
    out.copy_(reference.hadamard_transform(x, scale))


def _hadamard_transform_cuda_eligible(
    out: torch.Tensor, x: torch.Tensor, scale: float
) -> str | None:
    """The kernel indexes rows with one stride: leading dims that do not collapse go to torch."""
    if is_row_view(x) and is_row_view(out):
        return None
    return "needs x and out whose leading dims collapse into one row stride"


HADAMARD_TRANSFORM = Op(_hadamard_transform_torch, mutates=("out",), device="x")
_DTYPES = HADAMARD_TRANSFORM.dtypes


def hadamard_transform(
    x: torch.Tensor, scale: float = 1.0, *, backend: str | None = None
) -> torch.Tensor:
    """``y = scale * (pad0(x, N) @ H_N)[..., :D]``, ``N = next_pow2(D)``, with the Sylvester
    matrix ``H_N[i, j] = (-1)^popcount(i & j)`` (fp32 accumulation, rounded once).

    ``scale = N ** -0.5`` gives the orthonormal transform; the default 1.0 matches
    Dao-AILab/fast-hadamard-transform, so callers pass the scale they want.

    Parameters
    ----------
    x : [..., D] float16, bfloat16 or float32, D <= 32768; last dim contiguous. The leading
        dims may be strided; views whose leading dims do not collapse into one row stride run
        on the torch reference (with a KernelsFallbackWarning) on the GPU.
    scale : a Python float multiplied into the result.
    backend : force a backend by name instead of the best eligible one.

    Returns
    -------
    y : the shape and dtype of x (contiguous).
    """
    # A CUDA tensor of a supported dtype skips the full check (the C++ entry validates again).
    if not compiled_path(backend, x, _DTYPES) or not last_dim_contiguous(x):
        check_tensor(OP_ID, "x", x, dtypes=ACTIVATION_DTYPES, last_dim_contiguous=True)
    if x.dim() == 0:
        raise ValueError(f"{OP_ID}: x must have at least 1 dim [..., D], got a 0-dim tensor")
    d = x.shape[-1]
    if d > reference.MAX_HADAMARD_DIM:
        raise ValueError(
            f"{OP_ID}: the last dim of x pads to {reference.next_power_of_two(d)} > "
            f"{reference.MAX_HADAMARD_DIM} (the largest supported transform), got D = {d}"
        )
    if type(scale) is not float and (
        isinstance(scale, torch.Tensor) or not isinstance(scale, (int, float))
    ):
        raise TypeError(f"{OP_ID}: scale must be a Python float, got {type(scale).__name__}")
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if out.numel():
        HADAMARD_TRANSFORM.run(out, x, float(scale), backend=backend)
    return out


def _hadamard_transform_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls: every dtype, powers of two for both CUDA kernels (N <= 2048: one warp
    per row; N >= 4096: one block per row), a padded width, orthonormal scale."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cases: list[tuple[tuple, dict]] = []
    for dtype in ACTIVATION_DTYPES:
        for d in (128, 100, 4096):
            x = torch.randn(3, 5, d, generator=g).to(dtype).to(device)
            cases.append(((x, reference.next_power_of_two(d) ** -0.5), {}))
    cases.append(((torch.randn(4, 1, generator=g).to(device),), {}))
    return cases
