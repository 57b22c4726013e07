"""Pure-torch references of the GEMM ops: fp32 accumulation, the result rounded once."""

from __future__ import annotations

import torch


def dsv3_router_gemm(
    x: torch.Tensor, w: torch.Tensor, out_dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Router logits ``x @ w.T``: x [M, K], w [E, K] -> [M, E] in ``out_dtype``."""
    return (x.float() @ w.float().t()).to(out_dtype)


def dsv3_fused_a_gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """DeepSeek-V3's fused q_a/kv_a projection ``a @ b`` in bf16: a [M, K], b [K, N] (the
    column-major ``w.t()`` view of a row-major [N, K] weight) -> [M, N]."""
    return (a.float() @ b.float()).to(torch.bfloat16)


def fp8_scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``(a @ b) * scale_a[m] * scale_b[n] + bias[n]``, dequantized to fp32 (a [M, K], b [K, N]
    fp8; scale_a [M, 1] or [1]; scale_b [N], [1, N] or [1]; bias [N])."""
    acc = a.float() @ b.float()
    acc = acc * scale_a.float().reshape(-1, 1) * scale_b.float().reshape(1, -1)
    if bias is not None:
        acc = acc + bias.float()
    return acc.to(out_dtype)


def fp8_blockwise_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """``out[m, n] = sum_g scale_a[m, g] * scale_b[g, n // 128] * sum_{k in g} a[m, k] b[k, n]``
    over groups g of 128 along K (a [M, K], b [K, N] fp8, K % 128 == 0; scale_a [M, K/128];
    scale_b [K/128, ceil(N/128)]): both operands dequantized to fp32, one fp32 product."""
    n = b.shape[1]
    sa = scale_a.float().repeat_interleave(128, dim=1)  # [M, K]
    sb = scale_b.float().repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)[:, :n]
    return ((a.float() * sa) @ (b.float() * sb)).to(out_dtype)
