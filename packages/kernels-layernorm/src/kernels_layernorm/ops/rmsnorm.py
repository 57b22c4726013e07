"""layernorm.rmsnorm, gemma_rmsnorm, fused_add_rmsnorm and gemma_fused_add_rmsnorm.

``y = x * rsqrt(mean(x^2) + eps) * w`` over the last dim (Gemma: ``* (1 + w)``), statistics in
fp32, output rounded once to the input dtype. The fused ops are in place, as in FlashInfer and
SGLang: ``residual += x`` (the sum formed in fp32 and stored rounded to the dtype), then
``x = rmsnorm(residual) * w`` computed from that *rounded* sum, so a fused call equals the unfused
pair of ops bit for bit in the residual and up to the last rounding in ``x``.

One compiled module serves the whole RMSNorm family (qk_rmsnorm included): its kernels are
templates on the vector count per thread, chosen at run time, so it builds once for every shape.
"""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import (
    check_disjoint,
    check_eps,
    check_like,
    check_param,
    check_pdl,
    check_rows,
    compiled_path,
    eps_ok,
)
from kernels_layernorm import reference

RMSNORM_CUDA = ModuleSpec(
    name="rmsnorm",
    package="kernels_layernorm",
    sources=("csrc/rmsnorm.cuh",),
    exports=(
        ("rmsnorm", "rmsnorm"),
        ("gemma_rmsnorm", "gemma_rmsnorm"),
        ("fused_add_rmsnorm", "fused_add_rmsnorm"),
        ("gemma_fused_add_rmsnorm", "gemma_fused_add_rmsnorm"),
        ("qk_rmsnorm", "qk_rmsnorm"),
    ),
    description="CUDA: the RMSNorm family (register-resident rows, 16-byte vectors or scalars)",
)

_rmsnorm_cuda = CompiledFunction(RMSNORM_CUDA, "rmsnorm")
_gemma_rmsnorm_cuda = CompiledFunction(RMSNORM_CUDA, "gemma_rmsnorm")
_fused_add_rmsnorm_cuda = CompiledFunction(RMSNORM_CUDA, "fused_add_rmsnorm")
_gemma_fused_add_rmsnorm_cuda = CompiledFunction(RMSNORM_CUDA, "gemma_fused_add_rmsnorm")


def _rmsnorm_torch(
    out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, eps: float
) -> None:
    out.copy_(reference.rmsnorm(input, weight, eps))


def _gemma_rmsnorm_torch(
    out: torch.Tensor, input: torch.Tensor, weight: torch.Tensor, eps: float
) -> None:
    out.copy_(reference.gemma_rmsnorm(input, weight, eps))


def _fused_add_rmsnorm_torch(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> None:
    y, s = reference.fused_add_rmsnorm(input, residual, weight, eps)
    residual.copy_(s)
    input.copy_(y)


def _gemma_fused_add_rmsnorm_torch(
    input: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
) -> None:
    y, s = reference.gemma_fused_add_rmsnorm(input, residual, weight, eps)
    residual.copy_(s)
    input.copy_(y)


_PDL = {"enable_pdl": -1}  # a launch knob of the compiled backends, not part of the schema
RMSNORM = Op(_rmsnorm_torch, mutates=("out",), device="input", knobs=_PDL)
GEMMA_RMSNORM = Op(_gemma_rmsnorm_torch, mutates=("out",), device="input", knobs=_PDL)
FUSED_ADD_RMSNORM = Op(
    _fused_add_rmsnorm_torch, mutates=("input", "residual"), device="input", knobs=_PDL
)
GEMMA_FUSED_ADD_RMSNORM = Op(
    _gemma_fused_add_rmsnorm_torch, mutates=("input", "residual"), device="input", knobs=_PDL
)
DTYPES = RMSNORM.dtypes


def _normalize(
    op: Op,
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    out: torch.Tensor | None,
    backend: str | None,
    enable_pdl: bool | None,
) -> torch.Tensor:
    # The common case costs a few attribute reads (kernels_jit.validation says why).
    if not eps_ok(eps):
        eps = check_eps(op.id, eps)
    if not compiled_path(backend, input, DTYPES):
        check_rows(op.id, "input", input, dtypes=DTYPES)
        check_param(op.id, "weight", weight, input.shape[-1], ref=input)
        if out is not None:
            check_like(op.id, "out", out, input)
    pdl = -1 if enable_pdl is None else check_pdl(op.id, enable_pdl)
    if out is None:
        out = torch.empty_like(input, memory_format=torch.contiguous_format)
    op.run(out, input, weight, eps, pdl, backend=backend)
    return out


def _fused_add(
    op: Op,
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    *,
    backend: str | None,
    enable_pdl: bool | None,
) -> None:
    if not eps_ok(eps):
        eps = check_eps(op.id, eps)
    if not compiled_path(backend, input, DTYPES):
        check_rows(op.id, "input", input, dtypes=DTYPES)
        check_like(op.id, "residual", residual, input)
        check_param(op.id, "weight", weight, input.shape[-1], ref=input)
        check_disjoint(op.id, "input", input, "residual", residual)
    pdl = -1 if enable_pdl is None else check_pdl(op.id, enable_pdl)
    op.run(input, residual, weight, eps, pdl, backend=backend)


def rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    out: torch.Tensor | None = None,
    backend: str | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """RMSNorm over the last dim: ``input * rsqrt(mean(input^2) + eps) * weight``.

    Parameters
    ----------
    input : [..., H] float32, float16 or bfloat16; the last dim contiguous, the leading dims may
        be strided (row-strided [T, H] views, head-strided [T, heads, H] views).
    weight : [H], the dtype and device of ``input``.
    eps : added to the mean square, a float >= 0.
    out : optional [..., H] destination like ``input`` (any row strides); may be ``input`` itself.
    backend : force ``cuda`` or ``torch`` instead of the best eligible one.
    enable_pdl : programmatic dependent launch (overlaps this kernel's launch with the previous
        kernel's tail); None: on for grids of at most 8 waves on sm_90+ (larger grids run
        faster without it); True: always; False: never.
    """
    return _normalize(RMSNORM, input, weight, eps, out=out, backend=backend, enable_pdl=enable_pdl)


def gemma_rmsnorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    out: torch.Tensor | None = None,
    backend: str | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """Gemma's RMSNorm: ``input * rsqrt(mean(input^2) + eps) * (1 + weight)``.

    Parameters as for :func:`rmsnorm`.
    """
    return _normalize(
        GEMMA_RMSNORM, input, weight, eps, out=out, backend=backend, enable_pdl=enable_pdl
    )


def fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    backend: str | None = None,
    enable_pdl: bool | None = None,
) -> None:
    """In place: ``residual = input + residual``; ``input = rmsnorm(residual) * weight``.

    The sum is computed in fp32 and stored rounded to the dtype; the normalisation uses that
    rounded sum (what the unfused ops compute).

    Parameters
    ----------
    input : [..., H] float32, float16 or bfloat16, last dim contiguous; overwritten by the output.
    residual : like ``input`` (its own strides allowed); overwritten by the sum. Must not overlap
        ``input``.
    weight : [H], the dtype and device of ``input``.
    eps, backend, enable_pdl : as for :func:`rmsnorm`.
    """
    _fused_add(
        FUSED_ADD_RMSNORM, input, residual, weight, eps, backend=backend, enable_pdl=enable_pdl
    )


def gemma_fused_add_rmsnorm(
    input: torch.Tensor,
    residual: torch.Tensor,
    weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    backend: str | None = None,
    enable_pdl: bool | None = None,
) -> None:
    """In place: ``residual = input + residual``; ``input = rmsnorm(residual) * (1 + weight)``.

    Parameters and rounding as for :func:`fused_add_rmsnorm`.
    """
    _fused_add(
        GEMMA_FUSED_ADD_RMSNORM,
        input,
        residual,
        weight,
        eps,
        backend=backend,
        enable_pdl=enable_pdl,
    )


def _sample_inputs(device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(x, weight) pairs: every dtype; the vector and scalar paths; a row-strided view; 3-D."""
    g = torch.Generator(device="cpu").manual_seed(0)
    pairs = []
    for dtype in DTYPES:
        for tokens, hidden in ((1, 4096), (7, 127), (33, 1024)):
            x = torch.randn(tokens, hidden, generator=g).to(dtype)
            w = (1.0 + 0.1 * torch.randn(hidden, generator=g)).to(dtype)
            pairs.append((x.to(device), w.to(device)))
    wide = torch.randn(9, 640, generator=g).to(device)
    pairs.append((wide[:, :512], (1 + 0.1 * torch.randn(512, generator=g)).to(device)))
    x3 = torch.randn(2, 3, 256, generator=g, dtype=torch.bfloat16)
    pairs.append((x3.to(device), torch.randn(256, generator=g).to(torch.bfloat16).to(device)))
    return pairs


def _rmsnorm_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    return [((x, w, 1e-6), {}) for x, w in _sample_inputs(device)]


def _gemma_rmsnorm_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    return [((x, w, 1e-6), {}) for x, w in _sample_inputs(device)]


def _fused_add_rmsnorm_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    return [((x, torch.randn_like(x), w, 1e-6), {}) for x, w in _sample_inputs(device)]


def _gemma_fused_add_rmsnorm_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    return [((x, torch.randn_like(x), w, 1e-6), {}) for x, w in _sample_inputs(device)]
