"""The project RNG (OPS.md section 0) against a Python-int oracle: int64 emulation of uint64
wrapping arithmetic must match bit for bit, including seeds with the top bit set."""

from __future__ import annotations

import pytest
import torch

from kernels_jit.rng import fmix, mix, to_int64, uniform

MASK = (1 << 64) - 1


def py_fmix(x: int) -> int:
    x &= MASK
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def py_mix(x: int) -> int:
    return py_fmix(x + 0x9E3779B97F4A7C15)


def py_uniform(seed: int, offset: int, row: int, j: int) -> float:
    h = py_mix(py_mix(py_mix(py_mix(seed) ^ (offset & MASK)) ^ row) ^ j)
    return (h >> 40) * 2.0**-24


VALUES = [0, 1, 2, 12345, 2**63 - 1, 2**63, 2**64 - 1, 0xC0FFEE1234567890, 0x9E3779B97F4A7C15]


def test_fmix_and_mix_match_python_ints():
    t = torch.tensor([to_int64(v) for v in VALUES], dtype=torch.int64)
    assert [v & MASK for v in fmix(t).tolist()] == [py_fmix(v) for v in VALUES]
    assert [v & MASK for v in mix(t).tolist()] == [py_mix(v) for v in VALUES]
    assert py_fmix(0) == 0 and py_mix(0) != 0  # fmix fixes 0, the full step does not


@pytest.mark.parametrize("seed", [0, 42, 2**64 - 5, 0xDEADBEEFCAFEF00D])
@pytest.mark.parametrize("offset", [0, 7, 2**63 + 11])
def test_uniform_matches_python_ints(seed, offset):
    rows = torch.arange(37, dtype=torch.int64)
    seed_t = torch.tensor([to_int64(seed)])
    offset_t = torch.tensor([to_int64(offset)])
    for j in (0, 1, 5):
        got = uniform(seed_t, offset_t, rows, j)
        assert got.dtype == torch.float32
        want = torch.tensor(
            [py_uniform(seed, offset, r, j) for r in range(37)], dtype=torch.float32
        )
        assert torch.equal(got, want)
        assert float(got.min()) >= 0.0 and float(got.max()) < 1.0


def test_uniform_is_roughly_uniform():
    u = uniform(torch.tensor([3]), torch.tensor([0]), torch.arange(100_000), 0)
    counts = torch.histc(u, bins=10, min=0.0, max=1.0)
    assert ((counts - 10_000).abs() < 500).all(), counts  # ~5 sigma
    assert ((u * 2**24) == (u * 2**24).round()).all()  # 24-bit grid
