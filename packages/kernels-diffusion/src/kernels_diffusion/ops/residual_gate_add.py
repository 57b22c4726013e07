"""diffusion.residual_gate_add: ``r + gate * x``, the gated residual of adaLN-zero blocks.

Backends: CUDA (one 16-byte pack per thread over any B and L strides, gate in r's dtype or
float32; out may be r) and the pure-torch reference (fp32 math, rounded once).
"""

from __future__ import annotations

import torch

from kernels_diffusion import reference
from kernels_diffusion._checks import FLOATS, check_modulation
from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_out, check_tensor, compiled_path, last_dim_contiguous

OP_ID = "diffusion.residual_gate_add"

RESIDUAL_GATE_ADD_CUDA = ModuleSpec(
    name="residual_gate_add",
    package="kernels_diffusion",
    sources=("csrc/residual_gate_add.cuh",),
    exports=(("residual_gate_add", "residual_gate_add"),),
    description="CUDA: r + gate * x, per-sample or per-token gate, any B/L strides",
)

_residual_gate_add_cuda = CompiledFunction(RESIDUAL_GATE_ADD_CUDA, "residual_gate_add")


def _check_args(r: object, x: object, gate: object, out: object | None) -> None:
    check_tensor(OP_ID, "r", r, dtypes=FLOATS, ndim=3)
    check_tensor(OP_ID, "x", x, dtypes=FLOATS, ndim=3, device=r.device)
    if x.shape != r.shape:
        raise ValueError(
            f"{OP_ID}: x must have the shape of r {tuple(r.shape)}, got {tuple(x.shape)}"
        )
    check_modulation(OP_ID, "gate", gate, r)
    if out is not None:
        check_out(OP_ID, out, like=r)


def _residual_gate_add_torch(
    out: torch.Tensor, r: torch.Tensor, x: torch.Tensor, gate: torch.Tensor
) -> None:
    # Checked here as well: the public function leaves the checks of a CUDA call to C++.
    _check_args(r, x, gate, out)
    out.copy_(reference.residual_gate_add(r, x, gate))


def _residual_gate_add_cuda_eligible(
    out: torch.Tensor, r: torch.Tensor, x: torch.Tensor, gate: torch.Tensor
) -> str | None:
    if x.dtype != r.dtype:
        return "needs x in r's dtype"
    if gate.dtype not in (r.dtype, torch.float32):
        return "needs gate in r's dtype or float32"
    contiguous = last_dim_contiguous
    if not (contiguous(r) and contiguous(x) and contiguous(out) and contiguous(gate)):
        return "needs contiguous last dims"
    return None


RESIDUAL_GATE_ADD = Op(_residual_gate_add_torch, mutates=("out",), device="r")


def residual_gate_add(
    r: torch.Tensor,
    x: torch.Tensor,
    gate: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """``r + gate * x`` in fp32, rounded once to the dtype of r.

    Parameters
    ----------
    r : [B, L, H] float32, float16 or bfloat16 (the residual stream).
    x : [B, L, H] (the block output), any of those dtypes.
    gate : [B, H] or [B, 1, H] (per sample) or [B, L, H] (per token).
    out : optional destination like r; may be r itself (in place).
    backend : force ``cuda`` or ``torch`` instead of the best eligible one.

    The CUDA backend takes x in r's dtype and gate in r's dtype or float32, with contiguous last
    dims (any B and L strides); other calls run on the reference.
    """
    if not compiled_path(backend, r, FLOATS):  # a CUDA call is checked in C++
        _check_args(r, x, gate, out)
    elif type(x) is not torch.Tensor or type(gate) is not torch.Tensor:
        _check_args(r, x, gate, out)  # raises: not a tensor
    if out is None:
        out = torch.empty_like(r, memory_format=torch.contiguous_format)
    elif type(out) is not torch.Tensor:
        check_out(OP_ID, out, like=r)  # raises: not a tensor
    if r.numel():
        RESIDUAL_GATE_ADD.run(out, r, x, gate, backend=backend)
    return out


def _residual_gate_add_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: every dtype, each gate layout, gates in r's
    dtype and fp32, an odd width (the scalar kernel)."""
    g = torch.Generator().manual_seed(0)
    cases: list[tuple[tuple, dict]] = []
    for dtype in FLOATS:
        r = torch.randn(2, 9, 40, generator=g).to(dtype).to(device)
        x = torch.randn(2, 9, 40, generator=g).to(dtype).to(device)
        cases.append(((r, x, torch.randn(2, 40, generator=g).to(device)), {}))
        cases.append(((r, x, torch.randn(2, 1, 40, generator=g).to(dtype).to(device)), {}))
        cases.append(((r, x, torch.randn(2, 9, 40, generator=g).to(device)), {}))
    odd = torch.randn(2, 3, 37, generator=g).to(torch.float16).to(device)
    cases.append(((odd, odd, odd[:, 0]), {}))
    return cases
