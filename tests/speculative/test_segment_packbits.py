"""speculative.segment_packbits against explicit per-bit loops (and numpy.packbits when numpy is
importable): odd segment lengths, empty segments, both bit orders, a caller-owned output with
gaps that must stay untouched, the device-only path, bad input."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from kernels_speculative import reference, segment_packbits


def oracle(bits: list[bool], lens: list[int], bitorder: str) -> list[int]:
    out, pos = [], 0
    for n in lens:
        seg = bits[pos : pos + n]
        pos += n
        for j in range(0, n, 8):
            byte = 0
            for t, bit in enumerate(seg[j : j + 8]):
                if bit:
                    byte |= 1 << (t if bitorder == "little" else 7 - t)
            out.append(byte)
    return out


def _case(lens: list[int], seed: int):
    g = torch.Generator().manual_seed(seed)
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.tensor(lens, dtype=torch.int64).cumsum(0)
    x = torch.rand(int(sum(lens)), generator=g) < 0.5
    return x, indptr


LENGTHS = [[0], [1], [7, 8, 9], [0, 0, 3, 0], [64, 1, 15, 16, 17], [1000, 333]]


@pytest.mark.parametrize("lens", LENGTHS, ids=str)
@pytest.mark.parametrize("bitorder", ["little", "big"])
def test_matches_oracle(lens, bitorder):
    x, indptr = _case(lens, seed=sum(lens))
    y, out_indptr = segment_packbits(x, indptr, bitorder=bitorder)
    assert y.dtype == torch.uint8 and out_indptr.dtype == torch.int32
    assert y.tolist() == oracle(x.tolist(), lens, bitorder)
    expected_ptr = [0]
    for n in lens:
        expected_ptr.append(expected_ptr[-1] + (n + 7) // 8)
    assert out_indptr.tolist() == expected_ptr


@pytest.mark.skipif(importlib.util.find_spec("numpy") is None, reason="numpy not installed")
def test_agrees_with_numpy_packbits():
    import numpy as np

    lens = [13, 0, 40, 7]
    x, indptr = _case(lens, seed=3)
    for bitorder in ("little", "big"):
        y, ptr = segment_packbits(x, indptr, bitorder=bitorder)
        for b in range(len(lens)):
            seg = x[int(indptr[b]) : int(indptr[b + 1])].numpy()
            want = np.packbits(seg, bitorder=bitorder).tolist()
            assert y[int(ptr[b]) : int(ptr[b + 1])].tolist() == want


def test_caller_output_with_gaps_is_only_written_inside_segments():
    lens = [9, 3]
    x, indptr = _case(lens, seed=4)
    out_indptr = torch.tensor([1, 3, 4], dtype=torch.int32)
    out = torch.full((6,), 0xAB, dtype=torch.uint8)
    y, ptr = segment_packbits(x, indptr, output_indptr=out_indptr, out=out)
    assert y is out and ptr is out_indptr
    packed = oracle(x.tolist(), lens, "little")
    assert y.tolist() == [0xAB, *packed, 0xAB, 0xAB]


def test_device_only_path_under_compile():
    lens = [5, 11, 0, 8]
    x, indptr = _case(lens, seed=5)
    ptr = torch.tensor([0, 1, 3, 3, 4], dtype=torch.int32)

    def pack(x, indptr, ptr):
        return segment_packbits(x, indptr, output_indptr=ptr, out=torch.zeros(4, dtype=torch.uint8))

    y, _ = torch.compile(pack, fullgraph=True)(x, indptr, ptr)
    assert y.tolist() == oracle(x.tolist(), lens, "little")


def test_empty():
    y, ptr = segment_packbits(torch.empty(0, dtype=torch.bool), torch.zeros(1, dtype=torch.int32))
    assert y.shape == (0,) and ptr.tolist() == [0]
    y, ptr = segment_packbits(torch.empty(0, dtype=torch.bool), torch.zeros(4, dtype=torch.int32))
    assert y.shape == (0,) and ptr.tolist() == [0, 0, 0, 0]


def test_bad_input():
    x, indptr = _case([8, 8], seed=6)
    with pytest.raises(
        TypeError, match=r"segment_packbits: x must have dtype in \(bool\), got uint8"
    ):
        segment_packbits(x.to(torch.uint8), indptr)
    with pytest.raises(ValueError, match=r"bitorder must be one of \('little', 'big'\), got 'lsb'"):
        segment_packbits(x, indptr, bitorder="lsb")
    with pytest.raises(
        ValueError, match=r"output_indptr must give each segment ceil\(len/8\) bytes"
    ):
        segment_packbits(x, indptr, output_indptr=torch.tensor([0, 2, 3], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"input_indptr must be non-decreasing within \[0, 16\]"):
        segment_packbits(x, torch.tensor([0, 9, 20], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"out has 1 bytes, output_indptr needs 2"):
        segment_packbits(x, indptr, out=torch.empty(1, dtype=torch.uint8))


def test_reference_functional_form():
    x, indptr = _case([3, 20], seed=7)
    y, ptr = reference.segment_packbits(x, indptr, bitorder="big")
    assert y.tolist() == oracle(x.tolist(), [3, 20], "big") and ptr.tolist() == [0, 1, 4]
