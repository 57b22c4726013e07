"""moe.moe_align_block_size against a brute-force loop: buckets compared as multisets, everything
else exactly; filtered (-1) slots, empty experts, tiny and large n, many block sizes, int64 ids,
out-of-range ids, empty input, opcheck."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels_moe import moe_align_block_size


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


def _check(ids: torch.Tensor, experts: int, bs: int) -> None:
    sorted_ids, expert_ids, post = moe_align_block_size(ids, experts, bs)
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
def test_matches_brute_force(tokens, k, experts, bs):
    g = torch.Generator().manual_seed(tokens)
    ids = torch.randint(-1, experts, (tokens, k), generator=g, dtype=torch.int32)
    _check(ids, experts, bs)


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
def test_random(tokens, k, experts, bs, filtered, wide, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(-1 if filtered else 0, experts, (tokens, k), generator=g)
    _check(ids if wide else ids.int(), experts, bs)


def test_vllm_docstring_example():
    """VLLM's example, one bucket per expert: [[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]] with
    block 4 puts expert 1's slots {3, 6, 9} first among the experts."""
    ids = torch.tensor([[2, 3, 4], [1, 2, 4], [1, 3, 4], [1, 2, 3]], dtype=torch.int32)
    sorted_ids, expert_ids, post = moe_align_block_size(ids, 5, 4)
    assert post.item() == 16
    assert expert_ids[:4].tolist() == [1, 2, 3, 4]
    assert sorted_ids[:16].tolist() == [3, 6, 9, 12, 0, 4, 10, 12, 1, 7, 11, 12, 2, 5, 8, 12]


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
