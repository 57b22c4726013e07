"""gemm.fp8_blockwise_mm: fp8 e4m3 ``a @ b`` with DeepSeek-V3 block scales: 1x128 activation groups
(``scale_a [M, K/128]``) and 128x128 weight blocks (``scale_b [K/128, ceil(N/128)]``), bf16 out.

Backends: CUDA on sm90a (Hopper): CUTLASS 3.x's blockwise-scaled fp8 kernel, each 128-K group's
fp8 MMA sums scaled and promoted into fp32 accumulators (csrc/fp8_blockwise_mm.cuh); the
pure-torch reference (dequantize to fp32, one fp32 product) elsewhere.

Layouts the CUDA path takes (others run on the reference): ``scale_a`` column-major with 16-byte
aligned columns, as ``per_token_group_quant_8bit(x, 128, column_major_scales=True,
scale_tma_aligned=True)`` writes it; ``scale_b`` the transpose view of the checkpoint's
contiguous ``weight_scale_inv [ceil(N/128), K/128]`` (stride 1 along K/128).
"""

from __future__ import annotations

import torch

from kernels_gemm import reference
from kernels_gemm._fp8_cutlass import CUTLASS_HEADERS, FP8, check_fp8_operands, cutlass_gemm_reason
from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_same_device, check_tensor

OP_ID = "gemm.fp8_blockwise_mm"
OUT_DTYPES = (torch.bfloat16, torch.float16)
GROUP = 128  # the K group of scale_a and the square block of scale_b

# One module per tile config: a CUTLASS instantiation compiles for minutes, so each module holds
# one and only the configs a process uses get built (csrc/fp8_blockwise_mm.cuh).
SMALL_M = 128  # M <= SMALL_M: 64x128 ping-pong tiles; above: 128x128 cooperative
FP8_BLOCKWISE_MM_CUDA = {
    config: ModuleSpec(
        name=f"fp8_blockwise_mm_{config}",
        package="kernels_gemm",
        sources=("csrc/fp8_blockwise_mm.cuh",),
        exports=(("fp8_blockwise_mm", f"fp8_blockwise_mm<{index}>"),),
        dist_include_dirs=CUTLASS_HEADERS,
        description=f"CUDA sm90a: CUTLASS blockwise-scaled fp8 GEMM, {config}-M tiles, fp32 "
        "promotion per 128-K group",
    )
    for config, index in (("small", 0), ("large", 1))
}
_KERNELS = {
    config == "large": CompiledFunction(spec, "fp8_blockwise_mm")
    for config, spec in FP8_BLOCKWISE_MM_CUDA.items()
}


def _fp8_blockwise_mm_cuda(
    out: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
) -> None:
    _KERNELS[a.shape[0] > SMALL_M](out, a, b, _scale_a_padded(scale_a), scale_b)


def _scale_a_padded(scale_a: torch.Tensor) -> torch.Tensor:
    """scale_a as the kernel reads it: TMA loads each 16-byte aligned column through row
    ceil(M / 4) * 4, past M where M is not a multiple of 4. Those rows exist inside every column
    but the last; where the storage ends with the last column's M rows, a padded copy (tiny:
    M x K/128 floats) is read instead."""
    m, groups = scale_a.shape
    rows = -(-m // 4) * 4
    ld = scale_a.stride(1) if groups > 1 else rows
    needed = scale_a.storage_offset() + (groups - 1) * ld + rows
    if rows == m or scale_a.untyped_storage().nbytes() // 4 >= needed:
        return scale_a
    padded = torch.empty((groups, rows), dtype=scale_a.dtype, device=scale_a.device).t()[:m]
    return padded.copy_(scale_a)


def _fp8_blockwise_mm_torch(
    out: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
) -> None:
    out.copy_(reference.fp8_blockwise_mm(a, b, scale_a, scale_b, out.dtype))


def _fp8_blockwise_mm_cuda_eligible(
    out: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
) -> str | None:
    """The CUTLASS kernel: sm90, TMA-legal operands, bf16 out, the scale layouts above."""
    if out.dtype != torch.bfloat16:
        return "needs bfloat16 out"
    reason = cutlass_gemm_reason(out, a, b)
    if reason is not None:
        return reason
    m, groups = scale_a.shape
    if (m > 1 and scale_a.stride(0) != 1) or (groups > 1 and scale_a.stride(1) % 4):
        return "needs scale_a column-major with 16-byte aligned columns (scale_tma_aligned)"
    if scale_b.shape[0] > 1 and scale_b.stride(0) != 1:
        return "needs scale_b with stride 1 along K/128 (weight_scale_inv.t())"
    if scale_a.data_ptr() % 16 or scale_b.data_ptr() % 16:
        return "needs 16-byte aligned scale_a and scale_b"
    return None


FP8_BLOCKWISE_MM = Op(_fp8_blockwise_mm_torch, mutates=("out",), device="a")


def fp8_blockwise_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """``out[m, n] = sum_g scale_a[m, g] * scale_b[g, n // 128] * sum_{k in g} a[m, k] b[k, n]``
    over groups g of 128 along K, with fp32 accumulation, rounded once to ``out_dtype``.

    Parameters
    ----------
    a : [M, K] float8_e4m3fn, row-major (stride 1 along K); K a multiple of 128.
    b : [K, N] float8_e4m3fn, column-major (stride 1 along K): ``w.t()`` of a row-major [N, K]
        weight. N need not be a multiple of 128.
    scale_a : float32 [M, K/128], one scale per token and 128-K group (column-major and 16-byte
        aligned for the CUDA path: ``per_token_group_quant_8bit(..., column_major_scales=True,
        scale_tma_aligned=True)``).
    scale_b : float32 [K/128, ceil(N/128)], one scale per 128x128 weight block: the transpose
        ``weight_scale_inv.t()`` of the checkpoint's [ceil(N/128), K/128].
    out_dtype : torch.bfloat16 (default; the CUDA path) or torch.float16.
    backend : force a backend by name instead of the best eligible one.
    """
    m, n, k = check_fp8_operands(OP_ID, a, b)
    if k % GROUP:
        raise ValueError(f"{OP_ID}: K must be a multiple of {GROUP}, got K={k}")
    groups, blocks_n = k // GROUP, -(-n // GROUP)
    check_tensor(OP_ID, "scale_a", scale_a, dtypes=(torch.float32,), ndim=2)
    check_tensor(OP_ID, "scale_b", scale_b, dtypes=(torch.float32,), ndim=2)
    if tuple(scale_a.shape) != (m, groups):
        raise ValueError(
            f"{OP_ID}: scale_a must have shape [M, K/128] = [{m}, {groups}], got "
            f"{list(scale_a.shape)}"
        )
    if tuple(scale_b.shape) != (groups, blocks_n):
        raise ValueError(
            f"{OP_ID}: scale_b must have shape [K/128, ceil(N/128)] = [{groups}, {blocks_n}], "
            f"got {list(scale_b.shape)}"
        )
    if out_dtype not in OUT_DTYPES:
        raise TypeError(
            f"{OP_ID}: out_dtype must be torch.bfloat16 or torch.float16, got {out_dtype}"
        )
    check_same_device(OP_ID, a=a, b=b, scale_a=scale_a, scale_b=scale_b)
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if out.numel():
        FP8_BLOCKWISE_MM.run(out, a, b, scale_a, scale_b, backend=backend)
    return out


def _fp8_blockwise_mm_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls: decode and prefill M, N not a multiple of 128, both scale layouts."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cases: list[tuple[tuple, dict]] = []
    for m, n, k in ((1, 128, 128), (5, 144, 256), (130, 272, 384)):
        a = (torch.randn(m, k, generator=g) * 8).to(FP8).to(device)
        b = (torch.randn(n, k, generator=g) * 8).to(FP8).to(device).t()
        groups, blocks_n = k // GROUP, -(-n // GROUP)
        rows = -(-m // 4) * 4  # scale_a: column-major, 16-byte aligned columns
        sa = torch.rand(groups, rows, generator=g).add(0.01).mul(0.05).to(device).t()[:m]
        sb = torch.rand(blocks_n, groups, generator=g).add(0.01).mul(0.05).to(device).t()
        cases.append(((a, b, sa, sb), {}))
    cases.append(((a, b, sa.contiguous(), sb.contiguous(), torch.float16), {}))
    return cases
