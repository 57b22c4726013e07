"""elementwise.softcap: ``out = cap * tanh(x / cap)`` (logit soft-capping, Gemma 2 / Grok).

In place with ``out=x``; ``out_dtype=torch.float32`` (or a float32 ``out``) keeps fp32 logits
from bf16/fp16 input, the form samplers read.
"""

from __future__ import annotations

import math

import torch

from kernels_elementwise import reference
from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_out, check_tensor, is_row_view

SOFTCAP_CUDA = ModuleSpec(
    name="softcap",
    package="kernels_elementwise",
    sources=("csrc/softcap.cuh",),
    exports=(("softcap", "softcap"),),
    description="CUDA: softcap over rows, 16-byte packs, fp32 or same-dtype output",
)

_softcap_cuda = CompiledFunction(SOFTCAP_CUDA, "softcap")


def _softcap_torch(out: torch.Tensor, x: torch.Tensor, cap: float) -> None:
    # ``out`` is checked by the backend that runs (here; in C++ for the compiled kernel), which
    # keeps ~1 us of checks off the public function's eager path.
    _check_out_dtype(out.dtype, x)
    check_out("elementwise.softcap", out, like=x, dtype=out.dtype)
    out.copy_(reference.softcap(x, cap, out.dtype))


def _check_out_dtype(dtype: torch.dtype, x: torch.Tensor) -> None:
    if dtype not in (x.dtype, torch.float32):
        raise TypeError(
            f"elementwise.softcap: out_dtype must be x's dtype ({x.dtype}) or torch.float32, "
            f"got {dtype}"
        )


def _softcap_cuda_eligible(out: torch.Tensor, x: torch.Tensor, cap: float) -> str | None:
    if not (is_row_view(x) and is_row_view(out)):
        return "needs a contiguous last dim and leading dims that collapse to one row stride"
    return None


SOFTCAP = Op(_softcap_torch, mutates=("out",), device="x")
DTYPES = SOFTCAP.dtypes


def softcap(
    x: torch.Tensor,
    cap: float,
    *,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """``cap * tanh(x / cap)`` elementwise, computed in fp32, rounded once.

    Parameters
    ----------
    x : any shape, float32/float16/bfloat16.
    cap : the soft cap, finite and non-zero (e.g. 30.0 for final logits, 50.0 for attention).
    out : optional destination of x's shape, dtype ``out_dtype`` (default x's) and device; may be
        ``x`` itself (in place).
    out_dtype : x's dtype (default) or torch.float32.
    backend : force ``cuda`` or ``torch`` instead of the best eligible one.
    """
    if type(x) is not torch.Tensor or x.dtype not in DTYPES:
        check_tensor("elementwise.softcap", "x", x, dtypes=DTYPES)  # raises, naming why
    cap = float(cap)
    if cap == 0.0 or not math.isfinite(cap):
        raise ValueError(f"elementwise.softcap: cap must be finite and non-zero, got {cap}")
    if out is None:
        if out_dtype is None:
            out = torch.empty_like(x, memory_format=torch.contiguous_format)
        else:
            _check_out_dtype(out_dtype, x)
            out = torch.empty_like(x, dtype=out_dtype, memory_format=torch.contiguous_format)
    elif type(out) is not torch.Tensor:
        check_out("elementwise.softcap", out, like=x)  # raises: not a tensor
    elif out_dtype is not None and out.dtype != out_dtype:
        raise TypeError(
            f"elementwise.softcap: out must have dtype {str(out_dtype).removeprefix('torch.')}, "
            f"got {str(out.dtype).removeprefix('torch.')}"
        )
    SOFTCAP.run(out, x, cap, backend=backend)
    return out


def _softcap_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: every dtype, fp32 out, a tail, a row slice."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cases: list[tuple[tuple, dict]] = []
    for dtype in DTYPES:
        for shape in ((1, 64), (7, 1003)):
            x = (torch.randn(shape, generator=g) * 40).to(dtype).to(device)
            cases.append(((x, 30.0), {}))
    x = (torch.randn(5, 256, generator=g) * 40).to(torch.bfloat16).to(device)
    cases.append(((x, 50.0), {"out_dtype": torch.float32}))
    wide = (torch.randn(6, 300, generator=g) * 40).to(torch.bfloat16).to(device)
    cases.append(((wide[:, 8:264], 30.0), {}))
    return cases
