"""moe.moe_align_block_size against a brute-force loop: buckets compared as multisets, everything
else exactly; filtered (-1) slots, empty experts, tiny and large n, many block sizes, int64 ids,
out-of-range ids, empty input, opcheck; every backend on CPU and GPU (the one-block, the
bucket-owning blocks and the count / scan / scatter paths, out-of-range ids skipped by the
kernel, CUDA graphs, compile)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels_moe import moe_align_block_size, reference
from kernels_moe.ops.moe_align_block_size import SMALL_SLOTS

BACKENDS = {"cpu": ("torch",), "cuda": ("cuda", "torch")}

# The kernel's kOneBlockMaxEntries: small n runs one block up to this many entries P of
# sorted_token_ids, blocks that own buckets above (test_one_block_threshold_matches_source).
ONE_BLOCK_MAX_ENTRIES = 8192


def _device_params():
    return [
        pytest.param("cpu", id="cpu"),
        pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
    ]


def _brute_force(ids: torch.Tensor, experts: int, bs: int):
    """Buckets [-1, 0, ..., E-1] walked by hand: (list of (bucket, slots) per bucket, blocks,
    total)."""
    flat = ids.reshape(-1).tolist()
    layout, blocks, total = [], [], 0
    for bucket in range(-1, experts):
        slots = [i for i, e in enumerate(flat) if e == bucket]
        size = -(-len(slots) // bs) * bs
        layout.append((total, slots, size))
        blocks += [bucket] * (size // bs)
        total += size
    return layout, blocks, total


def _check(ids: torch.Tensor, experts: int, bs: int, backend: str | None = None) -> None:
    sorted_ids, expert_ids, post = moe_align_block_size(ids, experts, bs, backend=backend)
    sorted_ids, expert_ids, post, ids = sorted_ids.cpu(), expert_ids.cpu(), post.cpu(), ids.cpu()
    n = ids.numel()
    p = min(n + (experts + 1) * (bs - 1), n * bs)
    assert sorted_ids.dtype == expert_ids.dtype == post.dtype == torch.int32
    assert sorted_ids.shape == (p,) and expert_ids.shape == (-(-p // bs),) and post.shape == (1,)
    layout, blocks, total = _brute_force(ids, experts, bs)
    assert post.item() == total
    for start, slots, size in layout:
        run = sorted_ids[start : start + size].tolist()
        assert sorted(run[: len(slots)]) == slots  # the bucket's slots, in any order
        assert run[len(slots) :] == [n] * (size - len(slots))  # then padding
    assert sorted_ids[total:].tolist() == [n] * (p - total)
    assert expert_ids[: len(blocks)].tolist() == blocks


@pytest.mark.parametrize(
    ("tokens", "k", "experts", "bs"),
    [
        (1, 1, 1, 16),
        (3, 2, 8, 16),
        (5, 8, 256, 64),
        (100, 4, 60, 32),
        (333, 8, 32, 128),
        (17, 3, 7, 4),
        (9, 2, 5, 1),
    ],
)
@pytest.mark.parametrize("device", _device_params())
def test_matches_brute_force(device, tokens, k, experts, bs):
    g = torch.Generator().manual_seed(tokens)
    ids = torch.randint(-1, experts, (tokens, k), generator=g, dtype=torch.int32).to(device)
    for backend in BACKENDS[device]:
        _check(ids, experts, bs, backend)


@settings(max_examples=40, deadline=None)
@given(
    tokens=st.integers(0, 40),
    k=st.integers(1, 8),
    experts=st.integers(1, 20),
    bs=st.sampled_from((1, 2, 4, 16, 64)),
    filtered=st.booleans(),
    wide=st.booleans(),
    seed=st.integers(0, 2**16),
)
@pytest.mark.parametrize("device", _device_params())
def test_random(device, tokens, k, experts, bs, filtered, wide, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(-1 if filtered else 0, experts, (tokens, k), generator=g)
    ids = (ids if wide else ids.int()).to(device)
    for backend in BACKENDS[device]:
        _check(ids, experts, bs, backend)


@pytest.mark.parametrize("device", _device_params())
def test_vllm_docstring_example(device):
    """VLLM's example, one bucket per expert: [[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]] with
    block 4 puts expert 1's slots {3, 6, 9} first among the experts."""
    ids = torch.tensor([[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]], dtype=torch.int32)
    for backend in BACKENDS[device]:
        sorted_ids, expert_ids, post = moe_align_block_size(ids.to(device), 5, 4, backend=backend)
        assert post.item() == 16
        assert expert_ids[:4].tolist() == [1, 2, 3, 4]
        runs = sorted_ids[:16].view(4, 4).tolist()
        assert [sorted(r[:3]) + r[3:] for r in runs] == [
            [3, 6, 9, 12],
            [0, 4, 10, 12],
            [1, 7, 11, 12],
            [2, 5, 8, 12],
        ]


def test_out_of_range_ids_raise():
    with pytest.raises(
        ValueError, match=r"moe_align_block_size: topk_ids must lie in \[-1, 4\).*found 4"
    ):
        moe_align_block_size(torch.tensor([[0, 4]], dtype=torch.int32), 4, 16)
    with pytest.raises(ValueError, match="found -2"):
        moe_align_block_size(torch.tensor([[-2, 1]], dtype=torch.int32), 4, 16)


def test_empty_and_bad_arguments():
    sorted_ids, expert_ids, post = moe_align_block_size(
        torch.empty(0, 8, dtype=torch.int32), 16, 64
    )
    assert sorted_ids.shape == (0,) and expert_ids.shape == (0,) and post.tolist() == [0]
    ids = torch.zeros(2, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match="block_size must be >= 1, got 0"):
        moe_align_block_size(ids, 4, 0)
    with pytest.raises(TypeError, match="num_experts must be a Python int"):
        moe_align_block_size(ids, torch.tensor(4), 16)
    with pytest.raises(TypeError, match="topk_ids must have dtype in .*got float32"):
        moe_align_block_size(ids.float(), 4, 16)


def test_opcheck():
    from kernels_moe.ops.moe_align_block_size import MOE_ALIGN_BLOCK_SIZE

    ids = torch.randint(
        -1, 6, (5, 2), dtype=torch.int32, generator=torch.Generator().manual_seed(1)
    )
    p = min(10 + 7 * 3, 40)
    args = (
        torch.empty(p, dtype=torch.int32),
        torch.empty(-(-p // 4), dtype=torch.int32),
        torch.empty(1, dtype=torch.int32),
        ids,
        6,
        4,
        True,
        None,
    )
    torch.library.opcheck(MOE_ALIGN_BLOCK_SIZE.torch_op, args)


def _check_against_reference(ids: torch.Tensor, experts: int, bs: int, backend: str) -> None:
    """Large n, vectorised: the same layout as the reference, each bucket's run the same
    multiset (sorting by (bucket of the position, value) makes both ascending)."""
    sorted_ids, expert_ids, post = moe_align_block_size(ids, experts, bs, backend=backend)
    ref_sorted, ref_experts, ref_post = reference.moe_align_block_size(ids, experts, bs)
    assert post.item() == ref_post.item()
    used = ref_post.item() // bs
    assert torch.equal(expert_ids[:used], ref_experts[:used])
    n = ids.numel()
    region = torch.repeat_interleave(ref_experts[:used].long() + 1, bs)  # bucket per position
    total = ref_post.item()
    assert torch.equal(sorted_ids[total:], ref_sorted[total:])
    for got in (sorted_ids, ref_sorted):
        assert got.dtype == torch.int32
    ours = torch.sort(region * (n + 1) + sorted_ids[:total].long()).values
    theirs = region * (n + 1) + ref_sorted[:total].long()
    assert torch.equal(ours, theirs)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("tokens", "k", "experts", "bs"),
    [
        (1, 8, 256, 64),
        (64, 8, 256, 64),
        (512, 8, 256, 64),  # n = 4096: the largest one-block call
        (513, 8, 256, 64),  # the count / scan / scatter path from here on
        (8192, 8, 256, 64),
        (16384, 8, 256, 128),
        (3000, 2, 8, 16),  # Mixtral: few buckets, many slots each
        (4096, 6, 1024, 32),  # the widest E
        (20000, 1, 3, 1),
    ],
)
@pytest.mark.parametrize("wide", (False, True))
def test_cuda_paths_match_reference(tokens, k, experts, bs, wide):
    g = torch.Generator().manual_seed(tokens + experts)
    ids = torch.randint(-1, experts, (tokens, k), generator=g, dtype=torch.int32).cuda()
    _check_against_reference(ids.long() if wide else ids, experts, bs, "cuda")


def test_one_block_threshold_matches_source():
    import kernels_moe

    source = Path(kernels_moe.__file__).parent / "csrc" / "moe_align_block_size.cuh"
    found = re.search(r"kOneBlockMaxEntries = (\d+);", source.read_text())
    assert found and int(found.group(1)) == ONE_BLOCK_MAX_ENTRIES


def _entries(tokens: int, k: int, experts: int, bs: int) -> int:
    return reference.moe_align_block_size_sizes(tokens * k, experts, bs)[0]


# (tokens, k, experts, bs) around P = ONE_BLOCK_MAX_ENTRIES: E 256 top-8 bs 64 (P = 64 n up to
# n = 258), where T = 16 is the threshold itself, and E 100 bs 64 (P = n + 101 * 63 from n = 108),
# where n = 1829 is; then the far side (E 1024: 32 blocks; E 1: 2 blocks; E 13: 14 blocks).
AROUND_THRESHOLD = [
    (15, 8, 256, 64),
    (16, 8, 256, 64),
    (17, 8, 256, 64),
    (64, 8, 256, 64),
    (128, 8, 256, 64),
    (1828, 1, 100, 64),
    (1829, 1, 100, 64),
    (1830, 1, 100, 64),
    (500, 8, 1024, 32),
    (4096, 1, 1, 4096),
    (371, 7, 13, 1024),
]


def test_around_threshold_sizes():
    sides = [_entries(*case) - ONE_BLOCK_MAX_ENTRIES for case in AROUND_THRESHOLD]
    assert [(s > 0) - (s < 0) for s in sides[:8]] == [-1, 0, 1, 1, 1, -1, 0, 1]
    assert all(s > 0 for s in sides[8:])
    assert all(t * k <= SMALL_SLOTS for t, k, _, _ in AROUND_THRESHOLD)


@pytest.mark.gpu
@pytest.mark.parametrize(("tokens", "k", "experts", "bs"), AROUND_THRESHOLD)
@pytest.mark.parametrize("wide", (False, True))
def test_cuda_small_paths_around_threshold(tokens, k, experts, bs, wide):
    """Both small paths and the threshold between them: random ids with filtered slots; the
    outputs' memory is poisoned first where the caching allocator reuses it (a freed 1 MiB
    block of the small pool)."""
    g = torch.Generator().manual_seed(tokens * 7 + experts)
    ids = torch.randint(-1, experts, (tokens, k), generator=g, dtype=torch.int32).cuda()
    torch.full((1 << 18,), -777, dtype=torch.int32, device="cuda")
    _check(ids.long() if wide else ids, experts, bs, "cuda")
    _check_against_reference(ids, experts, bs, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", (16, 17, 64))
def test_cuda_small_paths_one_expert_and_all_filtered(tokens):
    """Every slot in one bucket: one block of the spread path owns all the slots."""
    for value in (200, -1):
        ids = torch.full((tokens, 8), value, dtype=torch.int32, device="cuda")
        _check(ids, 256, 64, "cuda")


@pytest.mark.gpu
def test_cuda_all_slots_in_one_expert():
    ids = torch.full((5000, 8), 7, dtype=torch.int32, device="cuda")
    _check_against_reference(ids, 256, 64, "cuda")
    ids = torch.full((100, 8), -1, dtype=torch.int32, device="cuda")
    _check_against_reference(ids, 256, 64, "cuda")


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", (5, 1100))  # one block; count / scan / scatter
def test_cuda_skips_out_of_range_ids(tokens):
    """OPS.md: ids outside [-1, E) raise in the reference and are skipped by the kernel."""
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(-3, 12, (tokens, 4), generator=g, dtype=torch.int32)
    _check(ids.cuda(), 10, 16, "cuda")


@pytest.mark.gpu
def test_cuda_graph_and_compile():
    from kernels_moe.ops.moe_align_block_size import MOE_ALIGN_BLOCK_SIZE

    for tokens in (16, 8192):
        g = torch.Generator().manual_seed(tokens)
        ids = torch.randint(-1, 256, (tokens, 8), generator=g, dtype=torch.int32).cuda()
        n = ids.numel()
        p, blocks = reference.moe_align_block_size_sizes(n, 256, 64)
        outs = (
            torch.empty(p, dtype=torch.int32, device="cuda"),
            torch.empty(blocks, dtype=torch.int32, device="cuda"),
            torch.empty(1, dtype=torch.int32, device="cuda"),
        )
        args = (*outs, ids, 256, 64, True)
        MOE_ALIGN_BLOCK_SIZE.run(*args)  # builds and loads before capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            MOE_ALIGN_BLOCK_SIZE.run(*args)
        for t in outs:
            t.fill_(-12345)
        graph.replay()
        torch.cuda.synchronize()
        ref_sorted, ref_experts, ref_post = reference.moe_align_block_size(ids, 256, 64)
        assert outs[2].item() == ref_post.item()
        used = ref_post.item() // 64
        assert torch.equal(outs[1][:used], ref_experts[:used])
        assert torch.equal(torch.sort(outs[0]).values, torch.sort(ref_sorted).values)
        torch.library.opcheck(MOE_ALIGN_BLOCK_SIZE.torch_op, (*args, None))

    def align(x):
        return moe_align_block_size(x + 0, 256, 64)

    ids = torch.randint(-1, 256, (64, 8), dtype=torch.int32, device="cuda")
    sorted_ids, _, post = torch.compile(align, fullgraph=True)(ids)
    ref_sorted, _, ref_post = reference.moe_align_block_size(ids, 256, 64)
    assert post.item() == ref_post.item()
    assert torch.equal(torch.sort(sorted_ids).values, torch.sort(ref_sorted).values)
