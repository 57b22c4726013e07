"""Pure-torch references of the quantization ops: the correctness oracle and the fallback.

Every reference reads its input, computes in fp32 and rounds once when storing (OPS.md section 0).
"""

from __future__ import annotations

import torch

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
INT8_MAX = 127.0
# Dynamic scales never go below eps / qmax, so an all-zero input quantizes to 0 instead of NaN.
DEFAULT_EPS = 1e-10
MAX_HADAMARD_DIM = 32768


def cvt_fp8(v: torch.Tensor) -> torch.Tensor:
    """``cvt_satfinite_rne``: clamp fp32 ``v`` to +-448, then round to the nearest e4m3 value
    (ties to even). NaN stays NaN."""
    return v.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


def cvt_int8(v: torch.Tensor) -> torch.Tensor:
    """Round fp32 ``v`` to the nearest integer (ties to even), then saturate to [-128, 127]."""
    return torch.round(v).clamp(-128.0, 127.0).to(torch.int8)


def quantize(v: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """fp32 ``v`` (already divided by its scale) stored as ``dtype`` (fp8 e4m3 or int8)."""
    return cvt_fp8(v) if dtype == FP8_DTYPE else cvt_int8(v)


def divide(a: torch.Tensor, divisor: float) -> torch.Tensor:
    """``a / divisor`` rounded as one IEEE division on every device. (On CUDA, torch divides by
    a Python scalar as ``a * (1 / divisor)``, which is 1 ulp off for some ``a``: the scale would
    depend on the device.)"""
    return a / a.new_full((), divisor)


def per_tensor_quant_fp8(
    x: torch.Tensor, scale: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``s = max(absmax(x), 1e-10) / 448`` (or the static ``scale``), ``q = cvt(x / s)``.

    Returns q (the shape of x, fp8) and s (fp32 [1]; the static scale itself when given).
    """
    xf = x.float()
    if scale is None:
        absmax = xf.abs().amax() if xf.numel() else xf.new_zeros(())
        s = divide(absmax.clamp(min=DEFAULT_EPS), FP8_MAX).reshape(1)
    else:
        s = scale
    return cvt_fp8(xf / s.float().reshape(())), s


def per_token_quant_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row of x [T, K]: ``s = max(absmax(row), 1e-10) / 448``, ``q = cvt(row / s)``.

    Returns q [T, K] fp8 and s [T, 1] fp32.
    """
    xf = x.float()
    if xf.shape[-1] == 0:
        absmax = xf.new_zeros(xf.shape[0], 1)
    else:
        absmax = xf.abs().amax(dim=-1, keepdim=True)
    s = divide(absmax.clamp(min=DEFAULT_EPS), FP8_MAX)
    return cvt_fp8(xf / s), s


def ue8m0_round_up(s: torch.Tensor) -> torch.Tensor:
    """``2^ceil(log2 s)`` of positive fp32 ``s``, bit-exactly: the exponent goes up by one when any
    mantissa bit is set, and the mantissa is cleared. inf and NaN pass through unchanged."""
    bits = s.contiguous().view(torch.int32)
    exponent = (bits >> 23) & 0xFF
    mantissa = bits & 0x7FFFFF
    special = exponent == 0xFF
    rounded = (exponent + (mantissa != 0).to(torch.int32)) << 23
    return torch.where(special, bits, rounded).view(torch.float32)


def per_token_group_quant_8bit(
    x: torch.Tensor,
    group_size: int = 128,
    dst_dtype: torch.dtype = FP8_DTYPE,
    eps: float = DEFAULT_EPS,
    scale_ue8m0: bool = False,
    fuse_silu_and_mul: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize groups of ``group_size`` consecutive elements of the last dim of x [..., K]
    (``fuse_silu_and_mul``: of ``silu_and_mul(x)`` for x [..., 2K], see below).

    Per group: ``a = max(eps, max|x|)``, ``s = a / qmax`` (448 for fp8, 127 for int8), rounded up
    to a power of two when ``scale_ue8m0``; ``q = cvt(x / s)``. Returns q (the shape of x,
    ``dst_dtype``) and row-major fp32 scales s [..., K // group_size].
    """
    if fuse_silu_and_mul:
        x = silu_and_mul(x)
    qmax = FP8_MAX if dst_dtype == FP8_DTYPE else INT8_MAX
    *lead, k = x.shape
    groups = k // group_size
    xf = x.float().reshape(*lead, groups, group_size)
    if group_size and xf.numel():
        absmax = xf.abs().amax(dim=-1)
    else:
        absmax = xf.new_zeros(*lead, groups)
    s = divide(absmax.clamp(min=eps), qmax)
    if scale_ue8m0:
        s = ue8m0_round_up(s)
    q = quantize(xf / s.unsqueeze(-1), dst_dtype).reshape(x.shape)
    return q, s


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """``silu(x1) * x2`` for x [..., 2K] (x1 = x[..., :K], x2 = x[..., K:]), computed in fp32
    (silu as torch's: x1 / (1 + exp(-x1))) and rounded once to x's dtype: the output of an unfused
    silu_and_mul, which per_token_group_quant_8bit(fuse_silu_and_mul=True) then quantizes."""
    k = x.shape[-1] // 2
    x1, x2 = x[..., :k].float(), x[..., k:].float()
    return (torch.nn.functional.silu(x1) * x2).to(x.dtype)


def masked_rows(masked_m: torch.Tensor, t_pad: int) -> torch.Tensor:
    """bool [E, T_pad]: row t of expert e is live when t < masked_m[e] (no host sync)."""
    t = torch.arange(t_pad, device=masked_m.device)
    return t.unsqueeze(0) < masked_m.to(torch.int64).unsqueeze(1)


def pack_ue8m0(s: torch.Tensor) -> torch.Tensor:
    """Pack power-of-two fp32 scales s [..., M, G] into int32 [..., M, ceil(G / 4)].

    Byte i (little-endian) of word j holds the biased exponent of group 4j + i, clamped to
    [0, 254]; bytes of groups >= G are 0.
    """
    *lead, groups = s.shape
    words = -(-groups // 4)
    exponent = ((s.contiguous().view(torch.int32) >> 23) & 0xFF).clamp(max=254).to(torch.int64)
    padded = exponent.new_zeros(*lead, words * 4)
    padded[..., :groups] = exponent
    shifts = torch.tensor([0, 8, 16, 24], dtype=torch.int64, device=s.device)
    packed = (padded.reshape(*lead, words, 4) << shifts).sum(dim=-1)
    # Wrap to the signed range: a top byte >= 128 sets the sign bit of the int32 word.
    packed = torch.where(packed >= 2**31, packed - 2**32, packed)
    return packed.to(torch.int32)


def next_power_of_two(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def hadamard_transform(x: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """``scale * (pad0(x, N) @ H_N)[..., :D]`` with ``N = next_pow2(D)`` and the Sylvester matrix
    ``H_N[i, j] = (-1)^popcount(i & j)``. fp32 butterflies, rounded once to the dtype of x."""
    *lead, d = x.shape
    n = next_power_of_two(d)
    y = x.float().reshape(-1, d)
    if n != d:
        y = torch.nn.functional.pad(y, (0, n - d))
    rows = y.shape[0]
    h = 1
    while h < n:
        # Butterfly over bit log2(h): pairs (i, i + h) inside blocks of 2h.
        pairs = y.reshape(rows, n // (2 * h), 2, h)
        a, b = pairs[:, :, 0, :], pairs[:, :, 1, :]
        y = torch.stack((a + b, a - b), dim=2).reshape(rows, n)
        h *= 2
    return (y[:, :d] * scale).reshape(*lead, d).to(x.dtype)
