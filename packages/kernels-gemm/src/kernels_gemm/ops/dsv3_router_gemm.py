"""gemm.dsv3_router_gemm: router logits ``x @ w.T`` for small M (DeepSeek-V3: K = 7168, E = 256),
fp32 out by default because the logits feed sigmoid and top-k routing.

Backends: the pure-torch reference only (fp32 accumulation).
"""

from __future__ import annotations

import torch

from kernels_gemm import reference
from kernels_jit.dispatch import Op
from kernels_jit.validation import check_out, check_same_device, check_tensor

OP_ID = "gemm.dsv3_router_gemm"
OUT_DTYPES = (torch.float32, torch.bfloat16)


def _dsv3_router_gemm_torch(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    out.copy_(reference.dsv3_router_gemm(x, w, out.dtype))


DSV3_ROUTER_GEMM = Op(_dsv3_router_gemm_torch, mutates=("out",), device="x")


def dsv3_router_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    *,
    out_dtype: torch.dtype = torch.float32,
    out: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Router logits ``out = x @ w.T`` with fp32 accumulation, rounded once to ``out_dtype``.

    Parameters
    ----------
    x : [M, K] bfloat16, last dim contiguous (M <= 16 is the latency-optimised case; any M works).
    w : [E, K] bfloat16, last dim contiguous, any row stride.
    out_dtype : torch.float32 (default) or torch.bfloat16.
    out : optional destination [M, E] of ``out_dtype`` (may be a strided view).
    backend : force a backend by name instead of the best eligible one.
    """
    check_tensor(OP_ID, "x", x, dtypes=(torch.bfloat16,), ndim=2, last_dim_contiguous=True)
    check_tensor(OP_ID, "w", w, dtypes=(torch.bfloat16,), ndim=2, last_dim_contiguous=True)
    check_same_device(OP_ID, x=x, w=w)
    if x.shape[1] != w.shape[1]:
        raise ValueError(
            f"{OP_ID}: x [M, K] and w [E, K] must share K, got x {tuple(x.shape)} and "
            f"w {tuple(w.shape)}"
        )
    if out_dtype not in OUT_DTYPES:
        raise TypeError(
            f"{OP_ID}: out_dtype must be torch.float32 or torch.bfloat16, got {out_dtype}"
        )
    shape = (x.shape[0], w.shape[0])
    if out is None:
        out = torch.empty(shape, dtype=out_dtype, device=x.device)
    else:
        check_out(OP_ID, out, like=x, shape=shape, dtype=out_dtype)
    if out.numel():
        DSV3_ROUTER_GEMM.run(out, x, w, backend=backend)
    return out


def _dsv3_router_gemm_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls: decode-sized M, the DeepSeek-V3 expert count, an odd K, bf16 out."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cases: list[tuple[tuple, dict]] = []
    for m, e, k in ((1, 256, 1024), (5, 256, 1024), (16, 384, 2048), (3, 7, 100)):
        x = torch.randn(m, k, generator=g).to(torch.bfloat16).to(device)
        w = (torch.randn(e, k, generator=g) * 0.05).to(torch.bfloat16).to(device)
        cases.append(((x, w), {}))
    cases.append(((x, w), {"out_dtype": torch.bfloat16}))
    return cases
