"""activation.{silu_and_mul, gelu_and_mul, gelu_tanh_and_mul, relu2}.

The gated ops take the fused gate/up projection ``x [..., 2d]`` and return ``act(x[..., :d]) *
x[..., d:]`` as ``[..., d]``; ``relu2`` keeps the shape. All compute in fp32 and round once.

One compiled module holds the four ops and every dtype (it builds once, whatever the shapes).
Its kernels take rows of a contiguous last dim at any row stride, so slices of wider buffers
run without a copy; other layouts go to the torch backend.
"""

from __future__ import annotations

import torch

from kernels_activation import reference
from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_out, check_pdl, check_tensor, is_row_view

ACTIVATION_CUDA = ModuleSpec(
    name="activation",
    package="kernels_activation",
    sources=("csrc/activation.cuh",),
    exports=(
        ("silu_and_mul", "silu_and_mul"),
        ("gelu_and_mul", "gelu_and_mul"),
        ("gelu_tanh_and_mul", "gelu_tanh_and_mul"),
        ("relu2", "relu2"),
    ),
    description="CUDA: gated activations and relu2, 16-byte packs with a scalar fallback",
)

_silu_and_mul_cuda = CompiledFunction(ACTIVATION_CUDA, "silu_and_mul")
_gelu_and_mul_cuda = CompiledFunction(ACTIVATION_CUDA, "gelu_and_mul")
_gelu_tanh_and_mul_cuda = CompiledFunction(ACTIVATION_CUDA, "gelu_tanh_and_mul")
_relu2_cuda = CompiledFunction(ACTIVATION_CUDA, "relu2")


# The torch backends check ``out`` themselves (the compiled kernels do it in C++), so the public
# functions need not: that keeps ~1 us of checks off the eager host path.


def _gated_out(op: str, out: torch.Tensor, x: torch.Tensor) -> None:
    check_out(op, out, like=x, shape=(*x.shape[:-1], x.shape[-1] // 2))


def _silu_and_mul_torch(out: torch.Tensor, x: torch.Tensor) -> None:
    _gated_out("activation.silu_and_mul", out, x)
    out.copy_(reference.silu_and_mul(x))


def _gelu_and_mul_torch(out: torch.Tensor, x: torch.Tensor) -> None:
    _gated_out("activation.gelu_and_mul", out, x)
    out.copy_(reference.gelu_and_mul(x))


def _gelu_tanh_and_mul_torch(out: torch.Tensor, x: torch.Tensor) -> None:
    _gated_out("activation.gelu_tanh_and_mul", out, x)
    out.copy_(reference.gelu_tanh_and_mul(x))


def _relu2_torch(out: torch.Tensor, x: torch.Tensor) -> None:
    check_out("activation.relu2", out, like=x)
    out.copy_(reference.relu2(x))


def _row_layout(out: torch.Tensor, x: torch.Tensor, enable_pdl: int = -1) -> str | None:
    """Eligibility of the CUDA backend: both tensors are rows (e.g. [T, n] slices of wider
    buffers); a transposed or otherwise permuted view goes to the torch backend."""
    if not (is_row_view(x) and is_row_view(out)):
        return "needs a contiguous last dim and leading dims that collapse to one row stride"
    if x.numel() >= 2**31 and x.shape[-1] >= 2**31:
        return "rows of 2^31 or more elements"
    return None


_silu_and_mul_cuda_eligible = _gelu_and_mul_cuda_eligible = _row_layout
_gelu_tanh_and_mul_cuda_eligible = _relu2_cuda_eligible = _row_layout

_PDL = {"enable_pdl": -1}  # a launch knob of the compiled backends, not part of the schema
SILU_AND_MUL = Op(_silu_and_mul_torch, mutates=("out",), device="x", knobs=_PDL)
GELU_AND_MUL = Op(_gelu_and_mul_torch, mutates=("out",), device="x", knobs=_PDL)
GELU_TANH_AND_MUL = Op(_gelu_tanh_and_mul_torch, mutates=("out",), device="x", knobs=_PDL)
RELU2 = Op(_relu2_torch, mutates=("out",), device="x", knobs=_PDL)
DTYPES = SILU_AND_MUL.dtypes


def _gated(
    op: Op,
    x: torch.Tensor,
    out: torch.Tensor | None,
    backend: str | None,
    enable_pdl: bool | None,
) -> torch.Tensor:
    if type(x) is not torch.Tensor or x.dtype not in DTYPES:
        check_tensor(op.spec.id, "input", x, dtypes=DTYPES)  # raises, naming why
    shape = x.shape
    if not shape or shape[-1] % 2:
        raise ValueError(
            f"{op.spec.id}: input must be [..., 2d] (an even last dim), got shape {tuple(shape)}"
        )
    if out is None:
        out = torch.empty((*shape[:-1], shape[-1] // 2), dtype=x.dtype, device=x.device)
    elif type(out) is not torch.Tensor:
        check_out(op.spec.id, out, like=x)  # raises: not a tensor
    pdl = -1 if enable_pdl is None else check_pdl(op.id, enable_pdl)
    op.run(out, x, pdl, backend=backend)
    return out


def silu_and_mul(
    input: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    backend: str | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """``silu(input[..., :d]) * input[..., d:]`` (SwiGLU), computed in fp32, rounded once.

    Parameters
    ----------
    input : [..., 2d], float32/float16/bfloat16: the fused gate and up projections.
    out : optional [..., d] destination of the input's dtype and device (any row stride).
    backend : force ``cuda`` or ``torch`` instead of the best eligible one.
    enable_pdl : programmatic dependent launch (overlaps this kernel's launch with the previous
        kernel's tail); None: on for small grids on sm_90+; True: always; False: never.
    """
    return _gated(SILU_AND_MUL, input, out, backend, enable_pdl)


def gelu_and_mul(
    input: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    backend: str | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """``gelu(input[..., :d]) * input[..., d:]`` (GeGLU) with the exact erf GELU.

    Parameters as :func:`silu_and_mul`.
    """
    return _gated(GELU_AND_MUL, input, out, backend, enable_pdl)


def gelu_tanh_and_mul(
    input: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    backend: str | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """``gelu_tanh(input[..., :d]) * input[..., d:]`` with GELU's tanh approximation.

    Parameters as :func:`silu_and_mul`.
    """
    return _gated(GELU_TANH_AND_MUL, input, out, backend, enable_pdl)


def relu2(
    input: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    backend: str | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """``relu(input) ** 2`` elementwise, computed in fp32, rounded once.

    Parameters
    ----------
    input : any shape, float32/float16/bfloat16.
    out : optional destination of the same shape, dtype and device; may be ``input`` (in place).
    backend, enable_pdl : as for :func:`silu_and_mul`.
    """
    if type(input) is not torch.Tensor or input.dtype not in DTYPES:
        check_tensor("activation.relu2", "input", input, dtypes=DTYPES)  # raises, naming why
    if out is None:
        out = torch.empty_like(input, memory_format=torch.contiguous_format)
    elif type(out) is not torch.Tensor:
        check_out("activation.relu2", out, like=input)  # raises: not a tensor
    pdl = -1 if enable_pdl is None else check_pdl("activation.relu2", enable_pdl)
    RELU2.run(out, input, pdl, backend=backend)
    return out


def _random(shape: tuple[int, ...], dtype: torch.dtype, g: torch.Generator) -> torch.Tensor:
    return (torch.randn(shape, generator=g) * 2).to(dtype)


def _gated_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: every dtype, packed and scalar widths, a
    3-D input and a row-strided slice."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cases: list[tuple[tuple, dict]] = []
    for dtype in DTYPES:
        for shape in ((1, 256), (7, 2 * 127), (3, 5, 64)):
            cases.append(((_random(shape, dtype, g).to(device),), {}))
    wide = _random((9, 300), torch.bfloat16, g).to(device)
    cases.append(((wide[:, 4:260],), {}))
    return cases


def _relu2_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: every dtype, a tail, a strided view."""
    g = torch.Generator(device="cpu").manual_seed(1)
    cases: list[tuple[tuple, dict]] = []
    for dtype in DTYPES:
        for shape in ((1, 128), (33, 1001)):
            cases.append(((_random(shape, dtype, g).to(device),), {}))
    wide = _random((9, 300), torch.float16, g).to(device)
    cases.append(((wide[:, 3:259],), {}))
    return cases


_silu_and_mul_samples = _gelu_and_mul_samples = _gelu_tanh_and_mul_samples = _gated_samples
