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


# Issue 12: a decreasing input_indptr used to reach torch.empty as a negative size ("negative
# dimension"), and a huge one the allocator. With out=None the pointers are read on the host
# anyway (to size y), so they are checked there, before allocating; with out given they are
# checked by the torch reference, or before dispatch with validate=True.
_I32 = torch.int32
_WITHIN = r"input_indptr must be non-decreasing within \[0, 16\], got "
_BAD_INDPTR = [
    ([0, 9, 4], _WITHIN + r"input_indptr\[2\] = 4 < input_indptr\[1\] = 9"),
    ([-8, 0, 16], _WITHIN + r"input_indptr\[0\] = -8"),
    ([0, 8, 2**31 - 1], _WITHIN + r"input_indptr\[2\] = 2147483647 \(x has 16 elements\)"),
]


@pytest.mark.parametrize(("indptr", "message"), _BAD_INDPTR)
def test_bad_input_indptr_is_named_before_allocating(indptr, message):
    x, _ = _case([8, 8], seed=8)
    with pytest.raises(ValueError, match=r"speculative\.segment_packbits: " + message):
        segment_packbits(x, torch.tensor(indptr, dtype=_I32))
    with pytest.raises(ValueError, match=message):  # the functional reference too
        reference.segment_packbits(x, torch.tensor(indptr, dtype=_I32))


def test_huge_int64_indptr_never_reaches_the_allocator():
    x, _ = _case([8, 8], seed=9)
    huge = torch.tensor([0, 2**62], dtype=torch.int64)
    with pytest.raises(ValueError, match=r"got input_indptr\[1\] = 4611686018427387904"):
        segment_packbits(x, huge)
    good = torch.tensor([0, 16], dtype=torch.int64)
    with pytest.raises(
        ValueError,
        match=r"output_indptr must give each segment ceil\(len/8\) bytes, got output_indptr\[1\] "
        r"- output_indptr\[0\] = 1099511627776 for segment 0 of length 16 \(ceil\(len/8\) = 2\)",
    ):
        segment_packbits(x, good, output_indptr=torch.tensor([0, 2**40], dtype=torch.int64))


def test_output_indptr_must_start_at_zero_when_y_is_allocated():
    """Otherwise y's leading bytes would be uninitialised memory returned to the caller."""
    x, indptr = _case([9, 3], seed=10)
    with pytest.raises(ValueError, match=r"output_indptr\[0\] must be 0 when out is None .*got 1"):
        segment_packbits(x, indptr, output_indptr=torch.tensor([1, 3, 4], dtype=_I32))
    with pytest.raises(ValueError, match=r"output_indptr\[0\] must be >= 0, got -1"):
        segment_packbits(
            x,
            indptr,
            output_indptr=torch.tensor([-1, 1, 2], dtype=_I32),
            out=torch.zeros(4, dtype=torch.uint8),
        )


@pytest.mark.parametrize("validate", [False, True])
def test_bad_pointers_with_caller_output(validate):
    x, _ = _case([8, 8], seed=11)
    out = torch.zeros(4, dtype=torch.uint8)
    ptr = torch.tensor([0, 1, 2], dtype=_I32)
    with pytest.raises(ValueError, match=r"got input_indptr\[2\] = 4 < input_indptr\[1\] = 9"):
        segment_packbits(
            x, torch.tensor([0, 9, 4], dtype=_I32), output_indptr=ptr, out=out, validate=validate
        )
    with pytest.raises(ValueError, match=r"out has 1 bytes, output_indptr needs 2"):
        segment_packbits(
            x,
            torch.tensor([0, 8, 16], dtype=_I32),
            output_indptr=ptr,
            out=torch.zeros(1, dtype=torch.uint8),
            validate=validate,
        )


def test_validate_checks_before_dispatch(monkeypatch):
    from kernels_speculative.ops import segment_packbits as module

    def no_launch(*args, **kwargs):
        raise AssertionError("launched")

    monkeypatch.setattr(module.SEGMENT_PACKBITS, "run", no_launch)
    x, _ = _case([8, 8], seed=12)
    bad = torch.tensor([0, 9, 4], dtype=_I32)
    out = torch.zeros(4, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"input_indptr must be non-decreasing"):
        segment_packbits(x, bad, out=out, validate=True)
    with pytest.raises(ValueError, match=r"input_indptr must be non-decreasing"):
        segment_packbits(x, bad)  # out=None: always checked on the host
    with pytest.raises(AssertionError, match="launched"):  # device-only path, no host read
        segment_packbits(x, bad, out=out)


def test_validate_must_be_bool():
    x, indptr = _case([8], seed=13)
    with pytest.raises(TypeError, match=r"segment_packbits: validate must be a bool, got int 1"):
        segment_packbits(x, indptr, validate=1)


@pytest.mark.parametrize("lens", LENGTHS, ids=str)
def test_valid_input_unchanged_by_validate(lens):
    x, indptr = _case(lens, seed=len(lens))
    y, ptr = segment_packbits(x, indptr)
    out = torch.full((y.shape[0] + 2,), 0xCD, dtype=torch.uint8)
    y2, ptr2 = segment_packbits(x, indptr, output_indptr=ptr, out=out, validate=True)
    assert y2 is out and ptr2 is ptr
    assert y.tolist() == oracle(x.tolist(), lens, "little") == y2[: y.shape[0]].tolist()
    assert y2[y.shape[0] :].tolist() == [0xCD, 0xCD]


# ---- every backend against the reference (the CUDA kernel on the GPU) ----

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
BACKEND_LENGTHS = [
    *LENGTHS,
    [4096] * 64,
    [31, 32, 33, 4095, 4097, 0, 1, 7],
    [3] * 500,
    [2, 0, 9] * 500,  # 1500 segments: the pointers are read from global memory
    [100_003, 5, 70_001],
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("lens", BACKEND_LENGTHS, ids=lambda v: str(v)[:40])
@pytest.mark.parametrize("bitorder", ["little", "big"])
@pytest.mark.parametrize("shift", [0, 5])  # shift: segments start off every alignment
@pytest.mark.parametrize("ptr_dtype", [torch.int32, torch.int64], ids=str)
def test_backend_matches_reference(device, lens, bitorder, shift, ptr_dtype):
    x, indptr = _case(lens, seed=len(lens))
    x = torch.cat([torch.ones(shift, dtype=torch.bool), x]).to(device)
    indptr = (indptr.long() + shift).to(device=device, dtype=ptr_dtype)
    want, want_ptr = segment_packbits(x, indptr, bitorder=bitorder, backend="torch")
    got, got_ptr = segment_packbits(x, indptr, bitorder=bitorder)
    assert torch.equal(got, want) and torch.equal(got_ptr, want_ptr)
    # Device-only path into a poisoned buffer with one guard byte on each side.
    out = torch.full((want.shape[0] + 2,), 0xAB, dtype=torch.uint8, device=device)
    ptr = (want_ptr.long() + 1).to(ptr_dtype)
    y, _ = segment_packbits(x, indptr, output_indptr=ptr, out=out, bitorder=bitorder)
    assert y[0].item() == 0xAB and y[-1].item() == 0xAB and torch.equal(y[1:-1], want)


@pytest.mark.gpu
def test_cuda_skips_inconsistent_pointers_without_faulting():
    x, indptr = _case([9, 16, 5], seed=11)
    x, indptr = x.cuda(), indptr.cuda()
    out = torch.full((4,), 0xAB, dtype=torch.uint8, device="cuda")
    bad = torch.tensor([0, 2, 4, 1000], dtype=torch.int32, device="cuda")  # segment 1: 2 bytes ok
    segment_packbits(x, indptr, output_indptr=bad, out=out, backend="cuda")
    torch.cuda.synchronize()
    want = oracle(x.tolist(), [9, 16, 5], "little")
    assert out.tolist() == [*want[:4]]


@pytest.mark.gpu
@pytest.mark.parametrize("bitorder", ["little", "big"])
@pytest.mark.parametrize("lens", [[4096] * 8, [31, 4097, 9, 1000]], ids=str)
def test_cuda_counts_every_nonzero_byte_as_set(lens, bitorder):
    """Bool storage bytes other than 0 and 1 (a uint8 buffer viewed as bool) pack as set bits,
    on the aligned 32-byte path and on the byte path."""
    g = torch.Generator().manual_seed(15)
    raw = torch.randint(0, 256, (sum(lens),), generator=g, dtype=torch.uint8)
    raw[torch.rand(raw.shape, generator=g) < 0.4] = 0
    raw[:64:3] = torch.tensor([1, 2, 0x7F, 0x80, 0xFF, 0x40], dtype=torch.uint8).repeat(4)[:22]
    indptr = torch.zeros(len(lens) + 1, dtype=torch.int32)
    indptr[1:] = torch.tensor(lens).cumsum(0)
    want = oracle((raw != 0).tolist(), lens, bitorder)
    got, _ = segment_packbits(
        raw.cuda().view(torch.bool), indptr.cuda(), bitorder=bitorder, backend="cuda"
    )
    assert got.tolist() == want


@pytest.mark.gpu
def test_cuda_skips_int64_pointers_past_int32():
    """The staged pointers are int32: an int64 pointer of 2^32 + 4 must stay out of range (a
    truncation would read it as 4 and make segment 1 look valid)."""
    x, indptr = _case([9, 16, 5], seed=14)
    x, indptr = x.cuda(), indptr.cuda().long()
    out = torch.full((5,), 0xAB, dtype=torch.uint8, device="cuda")
    bad = torch.tensor([0, 2, 2**32 + 4, 5], dtype=torch.int64, device="cuda")
    segment_packbits(x, indptr, output_indptr=bad, out=out, backend="cuda")
    torch.cuda.synchronize()
    want = oracle(x.tolist(), [9, 16, 5], "little")
    assert out.tolist() == [*want[:2], 0xAB, 0xAB, 0xAB]


@pytest.mark.gpu
def test_cuda_graph_capture():
    lens = [4096] * 64
    x, indptr = _case(lens, seed=12)
    x, indptr = x.cuda(), indptr.cuda()
    want, ptr = segment_packbits(x, indptr, backend="torch")
    out = torch.zeros_like(want)
    segment_packbits(x, indptr, output_indptr=ptr, out=torch.zeros_like(want))  # build first
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        segment_packbits(x, indptr, output_indptr=ptr, out=out)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


@pytest.mark.gpu
def test_cuda_compile_fullgraph():
    lens = [5, 11, 0, 8, 300]
    x, indptr = _case(lens, seed=13)
    x, indptr = x.cuda(), indptr.cuda()
    want, ptr = segment_packbits(x, indptr, backend="torch")

    def pack(x, indptr, ptr):
        out = torch.zeros(want.shape[0], dtype=torch.uint8, device="cuda")
        return segment_packbits(x, indptr, output_indptr=ptr, out=out)

    y, _ = torch.compile(pack, fullgraph=True)(x, indptr, ptr)
    assert torch.equal(y, want)
