"""quantization.per_token_quant_fp8: one dynamic fp32 scale per row, ``q = cvt(x / s)``.

Order of an op file: backends (destination-passing, same signature), the registered
:class:`~kernels_jit.dispatch.Op`, then the public function that validates, allocates and
dispatches.
"""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_out, check_tensor
from kernels_quantization import reference
from kernels_quantization._checks import ACTIVATION_DTYPES

OP_ID = "quantization.per_token_quant_fp8"

PER_TOKEN_QUANT_FP8_CUDA = ModuleSpec(
    name="per_token_quant_fp8",
    package="kernels_quantization",
    sources=("csrc/per_token_quant_fp8.cuh",),
    exports=(("per_token_quant_fp8", "per_token_quant_fp8"),),
    description="CUDA: one pass, the row in registers (16-element pieces: 16-byte loads and fp8 "
    "stores)",
)

_per_token_quant_fp8_cuda = CompiledFunction(PER_TOKEN_QUANT_FP8_CUDA, "per_token_quant_fp8")


def _per_token_quant_fp8_torch(q: torch.Tensor, s: torch.Tensor, x: torch.Tensor) -> None:
    q_ref, s_ref = reference.per_token_quant_fp8(x)
    q.copy_(q_ref)
    s.copy_(s_ref)


PER_TOKEN_QUANT_FP8 = Op(_per_token_quant_fp8_torch, mutates=("q", "s"), device="x")


def per_token_quant_fp8(
    x: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token dynamic FP8 quantization: ``s[t] = max(absmax(x[t]), 1e-10) / 448``,
    ``q[t] = cvt_satfinite_rne(x[t] / s[t])``.

    Parameters
    ----------
    x : [T, K] float16, bfloat16 or float32; last dim contiguous, any row stride.
    out : optional destination for q, [T, K] float8_e4m3fn (may be a strided view).
    backend : force a backend by name instead of the best eligible one.

    Returns
    -------
    (q [T, K] float8_e4m3fn, s [T, 1] float32)
    """
    check_tensor(OP_ID, "x", x, dtypes=ACTIVATION_DTYPES, ndim=2, last_dim_contiguous=True)
    if out is None:
        out = torch.empty(x.shape, dtype=reference.FP8_DTYPE, device=x.device)
    else:
        check_out(OP_ID, out, like=x, dtype=reference.FP8_DTYPE)
    if x.shape[1] == 0:
        # No elements to reduce: every row's absmax is 0, so its scale is the floor.
        s = torch.full(
            (x.shape[0], 1),
            reference.DEFAULT_EPS / reference.FP8_MAX,
            dtype=torch.float32,
            device=x.device,
        )
        return out, s
    s = torch.empty((x.shape[0], 1), dtype=torch.float32, device=x.device)
    if x.shape[0]:
        PER_TOKEN_QUANT_FP8.run(out, s, x, backend=backend)
    return out, s


def _per_token_quant_fp8_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls: every activation dtype, an odd width, a row-strided view."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cases: list[tuple[tuple, dict]] = []
    for dtype in ACTIVATION_DTYPES:
        for t, k in ((1, 128), (7, 333)):
            x = (torch.randn(t, k, generator=g) * 3).to(dtype)
            cases.append(((x.to(device),), {}))
    wide = torch.randn(5, 200, generator=g).to(device)
    cases.append(((wide[:, 8:136],), {}))
    return cases
