"""diffusion.layernorm_scale_shift: adaLN modulation ``LN(x) * (1 + scale) + shift``.

Backends: CUDA (the row engine: the row held in registers between its statistics and the
output, scale/shift per sample or per token, any B/L strides) and the pure-torch reference (fp32
math, rounded once).
"""

from __future__ import annotations

import torch

from kernels_diffusion import reference
from kernels_diffusion._checks import FLOATS, check_float, check_modulation
from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_tensor, compiled_path, last_dim_contiguous

OP_ID = "diffusion.layernorm_scale_shift"

LAYERNORM_SCALE_SHIFT_CUDA = ModuleSpec(
    name="layernorm_scale_shift",
    package="kernels_diffusion",
    sources=("csrc/layernorm_scale_shift.cuh",),
    exports=(("layernorm_scale_shift", "layernorm_scale_shift"),),
    description="CUDA: LN(x) * (1 + scale) + shift on the row engine (per-sample/token scale)",
)

_layernorm_scale_shift_cuda = CompiledFunction(LAYERNORM_SCALE_SHIFT_CUDA, "layernorm_scale_shift")


def _check_args(
    x: object,
    scale: object,
    shift: object,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
) -> None:
    check_tensor(OP_ID, "x", x, dtypes=FLOATS, ndim=3)
    check_modulation(OP_ID, "scale", scale, x)
    check_modulation(OP_ID, "shift", shift, x)
    for name, v in (("weight", weight), ("bias", bias)):
        if v is not None:
            check_tensor(OP_ID, name, v, dtypes=FLOATS, ndim=1, device=x.device)
            if v.shape[0] != x.shape[2]:
                raise ValueError(
                    f"{OP_ID}: {name} must have H = {x.shape[2]} entries, got {v.shape[0]}"
                )


def _layernorm_scale_shift_torch(
    out: torch.Tensor,
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> None:
    # Checked here as well: the public function leaves the checks of a CUDA call to C++.
    _check_args(x, scale, shift, weight, bias)
    out.copy_(reference.layernorm_scale_shift(x, scale, shift, weight, bias, eps))


def _layernorm_scale_shift_cuda_eligible(
    out: torch.Tensor,
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    weight: torch.Tensor | None,
    bias: torch.Tensor | None,
    eps: float,
) -> str | None:
    mod = scale.dtype
    if shift.dtype != mod or (mod not in (x.dtype, torch.float32)):
        return "needs scale and shift of one dtype, x's or float32"
    if (weight is not None and weight.dtype != mod) or (bias is not None and bias.dtype != mod):
        return "needs weight and bias in the dtype of scale"
    if weight is not None and weight.shape[0] > 1 and weight.stride(0) != 1:
        return "needs a contiguous weight"
    if bias is not None and bias.shape[0] > 1 and bias.stride(0) != 1:
        return "needs a contiguous bias"
    contiguous = last_dim_contiguous
    if not (contiguous(x) and contiguous(out) and contiguous(scale) and contiguous(shift)):
        return "needs contiguous last dims"
    return None


LAYERNORM_SCALE_SHIFT = Op(_layernorm_scale_shift_torch, mutates=("out",), device="x")


def layernorm_scale_shift(
    x: torch.Tensor,
    scale: torch.Tensor,
    shift: torch.Tensor,
    *,
    weight: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
    eps: float = 1e-6,
    backend: str | None = None,
) -> torch.Tensor:
    """``LN(x) * (1 + scale) + shift`` with LN over H (fp32 mean and biased variance), affine
    only when weight/bias are given (DiT and Flux use none); rounded once to the dtype of x.

    Parameters
    ----------
    x : [B, L, H] float32, float16 or bfloat16.
    scale, shift : [B, H] or [B, 1, H] (per sample) or [B, L, H] (per token).
    weight, bias : optional [H].
    eps : added to the variance.
    backend : force ``cuda`` or ``torch`` instead of the best eligible one.

    The CUDA backend takes scale and shift of one dtype (x's or float32) and weight/bias in that
    dtype, with contiguous last dims (any B and L strides); other calls run on the reference.
    """
    if not compiled_path(backend, x, FLOATS) or not all(
        type(v) is torch.Tensor for v in (scale, shift)
    ):
        _check_args(x, scale, shift, weight, bias)  # a CUDA call is checked in C++
    eps = check_float(OP_ID, "eps", eps)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    if x.numel():
        LAYERNORM_SCALE_SHIFT.run(out, x, scale, shift, weight, bias, eps, backend=backend)
    return out


def _layernorm_scale_shift_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: every dtype, each layout, modulation in x's
    dtype and fp32, with and without affine, an odd width (the scalar loop kernel)."""
    g = torch.Generator().manual_seed(0)
    cases: list[tuple[tuple, dict]] = []
    for dtype in FLOATS:
        x = torch.randn(2, 7, 96, generator=g).to(dtype).to(device)
        scale = (torch.randn(2, 96, generator=g) * 0.1).to(device)
        shift = torch.randn(2, 1, 96, generator=g).to(device)
        tok = torch.randn(2, 7, 96, generator=g).to(dtype).to(device)
        weight = torch.randn(96, generator=g).to(dtype).to(device)
        bias = torch.randn(96, generator=g).to(dtype).to(device)
        cases.append(((x, scale, shift), {}))
        cases.append(((x, tok, tok[:, :1]), {"weight": weight, "bias": bias, "eps": 1e-5}))
    odd = torch.randn(3, 5, 65, generator=g).to(torch.bfloat16).to(device)
    cases.append(((odd, odd[:, 0], odd), {}))
    return cases
