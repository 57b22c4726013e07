"""elementwise.fused_dual_residual_rmsnorm: the norm sandwich around a residual add (Grok):

    mid = residual + rms(x) * weight1        (the new residual, rounded once to the dtype)
    out = rms(mid) * weight2                 (normalised from the rounded mid)

with ``rms(v) = v / sqrt(mean(v^2) + eps)`` in fp32. Returns ``(out, mid)``. ``mid=residual``
updates the residual stream in place.
"""

from __future__ import annotations

import torch

from kernels_elementwise import reference
from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_eps, check_out, check_tensor, eps_ok, last_dim_contiguous

FUSED_DUAL_RESIDUAL_RMSNORM_CUDA = ModuleSpec(
    name="fused_dual_residual_rmsnorm",
    package="kernels_elementwise",
    sources=("csrc/fused_dual_residual_rmsnorm.cuh",),
    exports=(("fused_dual_residual_rmsnorm", "fused_dual_residual_rmsnorm"),),
    description="CUDA: the norms' row-wise plan, the row held in registers across both norms",
)

_fused_dual_residual_rmsnorm_cuda = CompiledFunction(
    FUSED_DUAL_RESIDUAL_RMSNORM_CUDA, "fused_dual_residual_rmsnorm"
)


def _fused_dual_residual_rmsnorm_torch(
    out: torch.Tensor,
    mid: torch.Tensor,
    x: torch.Tensor,
    residual: torch.Tensor,
    weight1: torch.Tensor,
    weight2: torch.Tensor,
    eps: float,
) -> None:
    # The operands are checked by the backend that runs (here; in C++ for the compiled kernel),
    # which keeps ~3 us of checks off the public function's eager path.
    _check(out, mid, x, residual, weight1, weight2)
    new_out, new_mid = reference.fused_dual_residual_rmsnorm(x, residual, weight1, weight2, eps)
    mid.copy_(new_mid)
    out.copy_(new_out)


def _check(
    out: torch.Tensor,
    mid: torch.Tensor,
    x: torch.Tensor,
    residual: torch.Tensor,
    weight1: torch.Tensor,
    weight2: torch.Tensor,
) -> None:
    name = "elementwise.fused_dual_residual_rmsnorm"
    check_tensor(name, "x", x, dtypes=DTYPES, ndim=2)
    check_tensor(name, "residual", residual, dtypes=(x.dtype,), ndim=2, device=x.device)
    check_tensor(name, "weight1", weight1, dtypes=(x.dtype,), ndim=1, device=x.device)
    check_tensor(name, "weight2", weight2, dtypes=(x.dtype,), ndim=1, device=x.device)
    if residual.shape != x.shape:
        raise ValueError(
            f"{name}: residual must have x's shape {tuple(x.shape)}, got {tuple(residual.shape)}"
        )
    hidden = x.shape[1]
    for arg, w in (("weight1", weight1), ("weight2", weight2)):
        if w.shape[0] != hidden:
            raise ValueError(f"{name}: {arg} must be [{hidden}] (x's H), got {tuple(w.shape)}")
    check_out(name, out, like=x)
    check_out(name, mid, like=x, arg="mid")


def _fused_dual_residual_rmsnorm_cuda_eligible(
    out: torch.Tensor,
    mid: torch.Tensor,
    x: torch.Tensor,
    residual: torch.Tensor,
    weight1: torch.Tensor,
    weight2: torch.Tensor,
    eps: float,
) -> str | None:
    c = last_dim_contiguous
    if c(x) and c(residual) and c(out) and c(mid) and c(weight1) and c(weight2):
        return None
    return "needs contiguous last dims"


FUSED_DUAL_RESIDUAL_RMSNORM = Op(
    _fused_dual_residual_rmsnorm_torch, mutates=("out", "mid"), device="x"
)
DTYPES = FUSED_DUAL_RESIDUAL_RMSNORM.dtypes


def fused_dual_residual_rmsnorm(
    x: torch.Tensor,
    residual: torch.Tensor,
    weight1: torch.Tensor,
    weight2: torch.Tensor,
    eps: float = 1e-6,
    *,
    out: torch.Tensor | None = None,
    mid: torch.Tensor | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``mid = residual + rms(x) * weight1``; ``out = rms(mid) * weight2``; returns (out, mid).

    Statistics in fp32; mid is rounded once to the dtype before the second norm reads it.

    Parameters
    ----------
    x, residual : [T, H], float32/float16/bfloat16; row strides arbitrary.
    weight1, weight2 : [H], x's dtype.
    eps : added to the mean square of each norm (finite, >= 0).
    out, mid : optional [T, H] destinations (x's dtype and device), distinct buffers; ``mid`` may
        be ``residual`` (in place) and ``out`` may be ``x``.
    backend : force ``cuda`` or ``torch`` instead of the best eligible one.
    """
    name = "elementwise.fused_dual_residual_rmsnorm"
    if type(x) is not torch.Tensor or x.dtype not in DTYPES:
        check_tensor(name, "x", x, dtypes=DTYPES)  # raises, naming why
    if not eps_ok(eps):
        eps = check_eps(name, eps)
    if out is None:
        out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    elif type(out) is not torch.Tensor:
        check_out(name, out, like=x)  # raises: not a tensor
    if mid is None:
        mid = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    elif type(mid) is not torch.Tensor:
        check_out(name, mid, like=x, arg="mid")  # raises: not a tensor
    if out is mid:
        raise ValueError(f"{name}: out and mid must be different buffers")
    for arg, t in (("residual", residual), ("weight1", weight1), ("weight2", weight2)):
        if type(t) is not torch.Tensor:
            check_tensor(name, arg, t)  # raises: not a tensor
    FUSED_DUAL_RESIDUAL_RMSNORM.run(out, mid, x, residual, weight1, weight2, eps, backend=backend)
    return out, mid


def _fused_dual_residual_rmsnorm_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: every dtype, register and loop widths, an odd
    width (scalar path) and row-strided inputs."""
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.randn(shape, generator=g).to(dtype).to(device)

    cases: list[tuple[tuple, dict]] = []
    for dtype in DTYPES:
        for tokens, hidden in ((1, 256), (5, 1000), (3, 4096)):
            args = (rand(tokens, hidden, dtype=dtype), rand(tokens, hidden, dtype=dtype))
            weights = (rand(hidden, dtype=dtype), rand(hidden, dtype=dtype))
            cases.append(((*args, *weights, 1e-6), {}))
    wide = rand(4, 600, dtype=torch.bfloat16)
    weights = (rand(512, dtype=torch.bfloat16), rand(512, dtype=torch.bfloat16))
    cases.append(((wide[:, 8:520], wide[:, 80:592], *weights, 1e-5), {}))
    return cases
