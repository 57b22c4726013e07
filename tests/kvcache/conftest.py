"""An independent fp8 oracle for the KV-cache tests: every e4m3 value decoded from its bits."""

from __future__ import annotations

import pytest
import torch


def _e4m3_values() -> tuple[torch.Tensor, torch.Tensor]:
    values, codes = [], []
    for code in range(256):
        exponent, mantissa = (code >> 3) & 0xF, code & 0x7
        if exponent == 0xF and mantissa == 0x7:
            continue  # NaN
        magnitude = (
            mantissa / 8.0 * 2.0**-6
            if exponent == 0
            else (1 + mantissa / 8.0) * 2.0 ** (exponent - 7)
        )
        values.append(-magnitude if code & 0x80 else magnitude)
        codes.append(code)
    return torch.tensor(values, dtype=torch.float64), torch.tensor(codes)


_VALUES, _CODES = _e4m3_values()


def to_e4m3(v: torch.Tensor, scale: float = 1.0) -> torch.Tensor:
    """``cvt_satfinite_rne(fp32(v / scale))`` as float64: saturate, nearest, ties to even code."""
    flat = (v.double() / scale).float().double().reshape(-1).clamp(-448.0, 448.0)
    dist = (flat[:, None] - _VALUES[None, :]).abs()
    tied = dist == dist.min(dim=1, keepdim=True).values
    even = tied & (_CODES % 2 == 0)[None, :]
    pick = torch.where(even.any(dim=1, keepdim=True), even, tied)
    return _VALUES[pick.float().argmax(dim=1)].reshape(v.shape)


@pytest.fixture
def e4m3():
    return to_e4m3


def _kernels_run(fn) -> str:
    """The names of the kernels run while fn runs (torch.profiler), space-separated."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return " ".join(event.key for event in prof.key_averages())


@pytest.fixture
def ran_bulk():
    """``ran_bulk(fn)``: whether fn's write ran kv_write's bulk kernel (True) or its register
    kernel (False), by the kernel names torch.profiler saw; exactly one of them must run."""

    def check(fn) -> bool:
        names = _kernels_run(fn)
        bulk, register = "bulk_rows_kernel" in names, "write_rows_kernel" in names
        assert bulk != register, names
        return bulk

    return check
