"""elementwise.sigmoid_mul: ``out = x * sigmoid(gate)``, the output gate of gated attention
(Qwen3-Next style): x [T, H, D] (or [T, H * D]), gate [T, H, D] or one gate per head [T, H, 1].

The gate is often a strided view of a fused projection (``q_gate.view(T, H, 2 * D)[..., D:]``):
the CUDA kernel reads any token and head strides as long as the last dim is contiguous.
"""

from __future__ import annotations

import torch

from kernels_elementwise import reference
from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_out, check_tensor, last_dim_contiguous

SIGMOID_MUL_CUDA = ModuleSpec(
    name="sigmoid_mul",
    package="kernels_elementwise",
    sources=("csrc/sigmoid_mul.cuh",),
    exports=(("sigmoid_mul", "sigmoid_mul"),),
    description="CUDA: x * sigmoid(gate), full or per-head gate, any token/head strides",
)

_sigmoid_mul_cuda = CompiledFunction(SIGMOID_MUL_CUDA, "sigmoid_mul")


def _check_gate(x: torch.Tensor, gate: torch.Tensor) -> None:
    name = "elementwise.sigmoid_mul"
    if gate.dim() == 3 and x.dim() in (2, 3):
        tokens, heads, width = gate.shape
        if x.dim() == 3:
            ok = x.shape[:2] == gate.shape[:2] and width in (x.shape[2], 1)
        else:
            ok = x.shape[0] == tokens and (
                x.shape[1] == heads * width or (width == 1 and heads and x.shape[1] % heads == 0)
            )
        if ok:
            return
    elif gate.dim() == 2 and x.dim() == 2 and gate.shape == x.shape:
        return
    raise ValueError(
        f"{name}: gate must be [T, H, D] or [T, H, 1] for x [T, H, D] or [T, H * D] (or x's "
        f"shape), got x {tuple(x.shape)} and gate {tuple(gate.shape)}"
    )


def _sigmoid_mul_torch(out: torch.Tensor, x: torch.Tensor, gate: torch.Tensor) -> None:
    # The operands are checked by the backend that runs (here; in C++ for the compiled kernel),
    # which keeps ~2 us of checks off the public function's eager path.
    name = "elementwise.sigmoid_mul"
    check_tensor(name, "x", x, dtypes=DTYPES, ndim=(2, 3))
    check_tensor(name, "gate", gate, dtypes=(x.dtype,), ndim=(2, 3), device=x.device)
    _check_gate(x, gate)
    check_out(name, out, like=x)
    out.copy_(reference.sigmoid_mul(x, gate))


def _sigmoid_mul_cuda_eligible(
    out: torch.Tensor, x: torch.Tensor, gate: torch.Tensor
) -> str | None:
    contiguous = last_dim_contiguous
    if not (contiguous(x) and contiguous(out) and contiguous(gate)):
        return "needs contiguous last dims"
    return None


SIGMOID_MUL = Op(_sigmoid_mul_torch, mutates=("out",), device="x")
DTYPES = SIGMOID_MUL.dtypes


def sigmoid_mul(
    x: torch.Tensor,
    gate: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """``x * sigmoid(gate)``, computed in fp32, rounded once; the result has x's shape.

    Parameters
    ----------
    x : [T, H, D] or [T, H * D], float32/float16/bfloat16; token and head strides arbitrary.
    gate : [T, H, D] (may be a strided view) or [T, H, 1] (one gate per head), x's dtype;
        or, for a 2-D x, x's shape.
    out : optional destination of x's shape, dtype and device; may be ``x`` (in place).
    backend : force ``cuda`` or ``torch`` instead of the best eligible one.
    """
    if type(x) is not torch.Tensor or x.dtype not in DTYPES:
        check_tensor("elementwise.sigmoid_mul", "x", x, dtypes=DTYPES)  # raises, naming why
    if type(gate) is not torch.Tensor:
        check_tensor("elementwise.sigmoid_mul", "gate", gate)  # raises: not a tensor
    if gate.dim() == 2 and x.dim() == 2:  # the plain elementwise form: one "head" per row
        gate = gate.unsqueeze(1)
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    elif type(out) is not torch.Tensor:
        check_out("elementwise.sigmoid_mul", out, like=x)  # raises: not a tensor
    SIGMOID_MUL.run(out, x, gate, backend=backend)
    return out


def _sigmoid_mul_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: full and per-head gates, a strided gate
    view, a 2-D x, scalar-path widths, every dtype."""
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape: int, dtype: torch.dtype) -> torch.Tensor:
        return (torch.randn(shape, generator=g) * 3).to(dtype).to(device)

    cases: list[tuple[tuple, dict]] = []
    for dtype in DTYPES:
        cases.append(((rand(5, 4, 64, dtype=dtype), rand(5, 4, 64, dtype=dtype)), {}))
        cases.append(((rand(5, 4, 64, dtype=dtype), rand(5, 4, 1, dtype=dtype)), {}))
    fused = rand(6, 3, 256, dtype=torch.bfloat16)
    cases.append(((rand(6, 3, 128, dtype=torch.bfloat16), fused[..., 128:]), {}))
    cases.append(((rand(6, 3 * 128, dtype=torch.bfloat16), fused[..., 128:]), {}))
    cases.append(((rand(3, 2, 37, dtype=torch.float16), rand(3, 2, 37, dtype=torch.float16)), {}))
    return cases
