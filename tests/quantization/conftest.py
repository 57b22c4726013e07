"""Independent float64 oracles for the quantization tests, written without the references."""

from __future__ import annotations

import pytest
import torch


def _e4m3_table() -> tuple[torch.Tensor, torch.Tensor]:
    """Every finite float8_e4m3fn value decoded from its bits by hand, and its code."""
    values, codes = [], []
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        exponent = (code >> 3) & 0xF
        mantissa = code & 0x7
        if exponent == 0xF and mantissa == 0x7:
            continue  # NaN (e4m3fn has no inf)
        if exponent == 0:
            value = mantissa / 8.0 * 2.0**-6
        else:
            value = (1.0 + mantissa / 8.0) * 2.0 ** (exponent - 7)
        values.append(sign * value)
        codes.append(code)
    return torch.tensor(values, dtype=torch.float64), torch.tensor(codes)


_VALUES, _CODES = _e4m3_table()


def nearest_e4m3(v: torch.Tensor) -> torch.Tensor:
    """Saturate to +-448, then the nearest e4m3 value by brute force, ties to the even code."""
    flat = v.double().reshape(-1).clamp(-448.0, 448.0)
    dist = (flat[:, None] - _VALUES[None, :]).abs()
    best = dist.min(dim=1, keepdim=True).values
    tied = dist == best
    even = (_CODES % 2 == 0)[None, :]
    # Prefer an even code among the tied candidates (a lone nearest value is always taken).
    pick = torch.where((tied & even).any(dim=1, keepdim=True), tied & even, tied)
    result = _VALUES[pick.float().argmax(dim=1)]
    result = torch.where(flat.isnan(), torch.full_like(result, float("nan")), result)
    return result.reshape(v.shape)


def nearest_int8(v: torch.Tensor) -> torch.Tensor:
    """Round half to even by hand, then saturate to [-128, 127]."""
    v = v.double()
    low = torch.floor(v)
    frac = v - low
    odd = torch.remainder(low, 2) == 1
    up = (frac > 0.5) | ((frac == 0.5) & odd)
    return (low + up.double()).clamp(-128, 127)


def fp32(v: torch.Tensor) -> torch.Tensor:
    """Round float64 to float32 and back: a correctly rounded fp32 division or product of fp32
    operands, because double rounding from 53 to 24 bits is innocuous for these operations."""
    return v.float().double()


@pytest.fixture
def oracle():
    class Oracle:
        e4m3 = staticmethod(nearest_e4m3)
        int8 = staticmethod(nearest_int8)
        round_fp32 = staticmethod(fp32)

    return Oracle
