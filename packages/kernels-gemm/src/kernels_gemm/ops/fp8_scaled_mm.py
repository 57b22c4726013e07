"""gemm.fp8_scaled_mm: fp8 e4m3 ``a @ b`` with per-token / per-channel or per-tensor fp32 scales and
an optional bias, bf16 or fp16 out (the W8A8 linear layer).

Backends: CUDA on sm90a (Hopper): CUTLASS 3.x warp-specialized TMA kernels with fp32 accumulators
promoted every 128 K and the scales and bias applied in the epilogue (csrc/fp8_scaled_mm.cuh);
four tile configs by M, swap AB (the weight as the MMA's M) at M <= 64; the pure-torch reference
(fp32 accumulation) elsewhere.
"""

from __future__ import annotations

import torch

from kernels_gemm import reference
from kernels_gemm._fp8_cutlass import CUTLASS_HEADERS, FP8, check_fp8_operands, cutlass_gemm_reason
from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_same_device, check_tensor

OP_ID = "gemm.fp8_scaled_mm"
OUT_DTYPES = (torch.bfloat16, torch.float16)

# One module per (out dtype, tile config): a CUTLASS instantiation compiles for minutes, so each
# module holds one and only the buckets a process uses get built (csrc/fp8_scaled_mm.cuh). Each
# config: (name, the C++ Config index, the largest M it takes; None = any).
#   m16, m64: swap AB (out^T = b^T a^T: the weight's rows fill the 64-row MMA, the tokens are its
#             N), 64x16 / 64x64 tiles of out^T, clusters of 2 along the weight: the decode path
#             streams the weight over N/64 CTAs;
#   m128:     64x128 ping-pong, clusters of 2 along M (the weight tile multicast to both halves);
#   large:    128x128 cooperative, persistent, clusters of 2 along M.
_CONFIGS = (("m16", 0, 16), ("m64", 1, 64), ("m128", 2, 128), ("large", 3, None))
_OUTS = (
    (torch.bfloat16, "bf16", "cutlass::bfloat16_t"),
    (torch.float16, "fp16", "cutlass::half_t"),
)
FP8_SCALED_MM_CUDA = {
    (dtype, config): ModuleSpec(
        name=f"fp8_scaled_mm_{tag}_{config}",
        package="kernels_gemm",
        sources=("csrc/fp8_scaled_mm.cuh",),
        exports=(("fp8_scaled_mm", f"fp8_scaled_mm<{cxx}, {index}>"),),
        dist_include_dirs=CUTLASS_HEADERS,
        description=f"CUDA sm90a: CUTLASS TMA warp-specialized fp8 GEMM, {config} tile config, "
        f"{tag} out, scales and bias in the epilogue",
    )
    for dtype, tag, cxx in _OUTS
    for config, index, _ in _CONFIGS
}
_KERNELS = {
    key: CompiledFunction(spec, "fp8_scaled_mm") for key, spec in FP8_SCALED_MM_CUDA.items()
}


def _config(m: int) -> str:
    """The tile config that takes M rows: the first whose M bound holds."""
    for config, _, max_m in _CONFIGS:
        if max_m is None or m <= max_m:
            return config
    raise AssertionError("unreachable: the last config takes any M")


def _fp8_scaled_mm_cuda(
    out: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None,
) -> None:
    _KERNELS[out.dtype, _config(a.shape[0])](out, a, b, scale_a, scale_b, bias)


def _fp8_scaled_mm_torch(
    out: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None,
) -> None:
    out.copy_(reference.fp8_scaled_mm(a, b, scale_a, scale_b, out.dtype, bias))


def _fp8_scaled_mm_cuda_eligible(
    out: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    bias: torch.Tensor | None,
) -> str | None:
    """The CUTLASS kernels: sm90, TMA-legal operands (16-byte rows), contiguous scales. Every
    config takes any M >= 1: M is a TMA box bound, never a stride (swapped, the tokens are the
    MMA's N and out^T's columns, ld = N), and can_implement checks only K, N and the fp8
    promotion interval, which these rules and the 128-deep K tiles meet."""
    reason = cutlass_gemm_reason(out, a, b)
    if reason is not None:
        return reason
    if not (scale_a.is_contiguous() and scale_b.is_contiguous()):
        return "needs contiguous scale_a and scale_b"
    if scale_b.data_ptr() % 16 or (bias is not None and bias.data_ptr() % 16):
        return "needs 16-byte aligned scale_b and bias"
    if bias is not None and not bias.is_contiguous():
        return "needs a contiguous bias"
    return None


FP8_SCALED_MM = Op(_fp8_scaled_mm_torch, mutates=("out",), device="a")


def _check_scale(arg: str, scale: torch.Tensor, allowed: tuple[tuple[int, ...], ...]) -> None:
    check_tensor(OP_ID, arg, scale, dtypes=(torch.float32,))
    if tuple(scale.shape) not in allowed:
        shapes = " or ".join(str(list(s)) for s in allowed)
        raise ValueError(f"{OP_ID}: {arg} must have shape {shapes}, got {list(scale.shape)}")


def fp8_scaled_mm(
    a: torch.Tensor,
    b: torch.Tensor,
    scale_a: torch.Tensor,
    scale_b: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    bias: torch.Tensor | None = None,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """``out[m, n] = (sum_k a[m, k] * b[k, n]) * scale_a[m] * scale_b[n] + bias[n]`` with fp32
    accumulation, rounded once to ``out_dtype``.

    Parameters
    ----------
    a : [M, K] float8_e4m3fn, row-major (stride 1 along K).
    b : [K, N] float8_e4m3fn, column-major (stride 1 along K): ``w.t()`` of a row-major [N, K]
        weight.
    scale_a : float32 [M, 1] (per token) or [1] (per tensor).
    scale_b : float32 [N] or [1, N] (per channel) or [1] (per tensor).
    out_dtype : torch.bfloat16 (default) or torch.float16.
    bias : optional [N] of ``out_dtype``.
    backend : force a backend by name instead of the best eligible one.
    """
    m, n, _ = check_fp8_operands(OP_ID, a, b)
    _check_scale("scale_a", scale_a, ((m, 1), (1,)))
    _check_scale("scale_b", scale_b, ((n,), (1, n), (1,)))
    if out_dtype not in OUT_DTYPES:
        raise TypeError(
            f"{OP_ID}: out_dtype must be torch.bfloat16 or torch.float16, got {out_dtype}"
        )
    tensors = {"a": a, "b": b, "scale_a": scale_a, "scale_b": scale_b}
    if bias is not None:
        check_tensor(OP_ID, "bias", bias, dtypes=(out_dtype,), ndim=1)
        if bias.shape[0] != n:
            raise ValueError(f"{OP_ID}: bias must have shape [{n}] (N), got {list(bias.shape)}")
        tensors["bias"] = bias
    check_same_device(OP_ID, **tensors)
    out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    if out.numel():
        FP8_SCALED_MM.run(out, a, b, scale_a, scale_b, bias, backend=backend)
    return out


def _fp8_scaled_mm_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls: per-token x per-channel and per-tensor scales, bias, both out dtypes."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cases: list[tuple[tuple, dict]] = []
    for m, n, k in ((1, 64, 128), (7, 48, 96), (16, 256, 512)):
        a = (torch.randn(m, k, generator=g) * 8).to(FP8).to(device)
        b = (torch.randn(n, k, generator=g) * 8).to(FP8).to(device).t()
        sa = torch.rand(m, 1, generator=g).add(0.01).mul(0.05).to(device)
        sb = torch.rand(n, generator=g).add(0.01).mul(0.05).to(device)
        cases.append(((a, b, sa, sb), {}))
        bias = torch.randn(n, generator=g).to(torch.float16).to(device)
        cases.append(((a, b, sa[:1, 0], sb[:1], torch.float16, bias), {}))
    return cases
