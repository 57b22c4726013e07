"""quantization.per_tensor_quant_fp8: one fp32 scale for the whole tensor (dynamic absmax / 448,
or a static scale), ``q = cvt(x / s)``."""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_out, check_tensor
from kernels_quantization import reference
from kernels_quantization._checks import ACTIVATION_DTYPES, check_scale

OP_ID = "quantization.per_tensor_quant_fp8"

PER_TENSOR_QUANT_FP8_CUDA = ModuleSpec(
    name="per_tensor_quant_fp8",
    package="kernels_quantization",
    sources=("csrc/per_tensor_quant_fp8.cuh",),
    exports=(
        ("per_tensor_quant_fp8", "per_tensor_quant_fp8"),
        ("per_tensor_quant_fp8_skip_paths", "per_tensor_quant_fp8_skip_paths"),
        ("per_tensor_quant_fp8_limits", "per_tensor_quant_fp8_limits"),
    ),
    description="CUDA: one fused block (small); one thread-block cluster holding x in registers "
    "(mid); one cooperative launch (one chunk per CTA; where no cluster launches); past the SMs' "
    "shared memory one cooperative launch keeping a chunk per CTA there across the grid barrier; "
    "else an absmax sweep + a reversed quantize pass",
)

_per_tensor_quant_fp8_cuda = CompiledFunction(PER_TENSOR_QUANT_FP8_CUDA, "per_tensor_quant_fp8")


def _per_tensor_quant_fp8_torch(
    q: torch.Tensor, s: torch.Tensor, x: torch.Tensor, is_static: bool
) -> None:
    q_ref, s_ref = reference.per_tensor_quant_fp8(x, s if is_static else None)
    q.copy_(q_ref)
    if not is_static:
        s.copy_(s_ref)


def _row_levels(*tensors: torch.Tensor) -> int:
    """Levels of rows the leading dims of same-shaped ``tensors`` merge into (as
    kernels::collapse_rows does; size-1 dims are skipped)."""
    levels, prev = 0, None
    for d, size in enumerate(tensors[0].shape[:-1]):
        if size == 1:
            continue
        strides = [t.stride(d) for t in tensors]
        if prev is None or any(p != st * size for p, st in zip(prev, strides, strict=True)):
            levels += 1
        prev = strides
    return levels


def _per_tensor_quant_fp8_cuda_eligible(
    q: torch.Tensor, s: torch.Tensor, x: torch.Tensor, is_static: bool
) -> str | None:
    """Contiguous x and q stream as one flat row; strided views need rows of one or two levels
    and fewer than 2^31 elements."""
    if x.is_contiguous() and q.is_contiguous():
        return None
    if x.dim() > 3 and _row_levels(x, q) > 2:
        return "needs x and out whose leading dims merge into (outer, inner) rows"
    if x.numel() >= 2**31:
        return "needs contiguous x and out above 2^31 elements"
    return None


PER_TENSOR_QUANT_FP8 = Op(_per_tensor_quant_fp8_torch, mutates=("q", "s"), device="x")


def per_tensor_quant_fp8(
    x: torch.Tensor,
    *,
    scale: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor FP8 quantization: ``s = max(absmax(x), 1e-10) / 448`` (dynamic) or ``s = scale``
    (static), ``q = cvt_satfinite_rne(x / s)``.

    Parameters
    ----------
    x : any shape; float16, bfloat16 or float32; last dim contiguous.
    scale : optional static scale, fp32 with one element (shape [1]); returned as s, never modified.
    out : optional destination for q, the shape of x, float8_e4m3fn (may be a strided view).
    backend : force a backend by name instead of the best eligible one.

    Returns
    -------
    (q float8_e4m3fn like x, s float32 [1])
    """
    check_tensor(OP_ID, "x", x, dtypes=ACTIVATION_DTYPES, last_dim_contiguous=True)
    if scale is not None:
        check_scale(OP_ID, "scale", scale, x)
    if out is None:
        out = torch.empty(x.shape, dtype=reference.FP8_DTYPE, device=x.device)
    else:
        check_out(OP_ID, out, like=x, dtype=reference.FP8_DTYPE)
    if scale is not None:
        if x.numel():
            PER_TENSOR_QUANT_FP8.run(out, scale, x, True, backend=backend)
        return out, scale
    if not x.numel():
        floor = reference.DEFAULT_EPS / reference.FP8_MAX
        return out, torch.full((1,), floor, dtype=torch.float32, device=x.device)
    s = torch.empty(1, dtype=torch.float32, device=x.device)
    PER_TENSOR_QUANT_FP8.run(out, s, x, False, backend=backend)
    return out, s


def _per_tensor_quant_fp8_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls: every activation dtype, dynamic and static, a 3-D input."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cases: list[tuple[tuple, dict]] = []
    for dtype in ACTIVATION_DTYPES:
        x = (torch.randn(9, 257, generator=g) * 5).to(dtype).to(device)
        cases.append(((x,), {}))
        cases.append(((x,), {"scale": torch.tensor([0.02], device=device)}))
    cases.append(((torch.randn(2, 3, 64, generator=g).to(device),), {}))
    return cases
