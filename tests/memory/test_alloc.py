"""memory.alloc_extend and memory.alloc_decode against a sequential simulation of a paged
allocator (token by token: a token at a page boundary takes the next free page, any other token
takes the slot after the previous one), plus uniqueness of the slots handed out."""

from __future__ import annotations

import random

import pytest
import torch

from kernels_memory import alloc_decode, alloc_extend


def simulate_extend(prefix, seq, last_loc, free, ps):
    out, next_free = [], 0
    for p, s, last in zip(prefix, seq, last_loc, strict=True):
        prev = last
        for pos in range(p, s):
            if pos % ps == 0:
                prev = free[next_free] * ps
                next_free += 1
            else:
                prev += 1
            out.append(prev)
    return out


def simulate_decode(seq, last_loc, free, ps):
    out, next_free = [], 0
    for s, last in zip(seq, last_loc, strict=True):
        if (s - 1) % ps == 0:
            out.append(free[next_free] * ps)
            next_free += 1
        else:
            out.append(last + 1)
    return out


def _batch(batch: int, ps: int, seed: int):
    """Requests with consistent state: each owns distinct pages; last_loc is its real last slot."""
    rng = random.Random(seed)
    pages = list(range(1, 4 * batch + 400))
    rng.shuffle(pages)
    prefix, seq, last = [], [], []
    for _ in range(batch):
        p = rng.choice([0, ps, rng.randrange(3 * ps + 1)])
        s = p + rng.choice([0, 1, ps - 1, ps, rng.randrange(4 * ps + 1)])
        prefix.append(p)
        seq.append(s)
        last.append(pages.pop() * ps + (p - 1) % ps if p > 0 else -1)
    return prefix, seq, last, pages


@pytest.mark.parametrize("ps", [1, 4, 16, 64])
@pytest.mark.parametrize("batch", [1, 7, 50])
def test_alloc_extend_matches_simulation(ps, batch):
    prefix, seq, last, free = _batch(batch, ps, seed=ps * 100 + batch)
    expected = simulate_extend(prefix, seq, last, free, ps)
    got = alloc_extend(
        torch.tensor(prefix),
        torch.tensor(seq),
        torch.tensor(last),
        torch.tensor(free),
        ps,
        extend_num_tokens=len(expected),
    )
    assert got.dtype == torch.int64
    assert got.tolist() == expected
    assert len(set(expected)) == len(expected)


@pytest.mark.parametrize("ps", [1, 16, 64])
@pytest.mark.parametrize("batch", [1, 9, 100])
def test_alloc_decode_matches_simulation(ps, batch):
    rng = random.Random(ps + batch)
    seq = [rng.randrange(1, 5 * ps + 2) for _ in range(batch)]
    last = [rng.randrange(100, 10_000) * ps + (s - 2) % ps for s in seq]
    free = rng.sample(range(20_000, 30_000), batch)
    got = alloc_decode(torch.tensor(seq), torch.tensor(last), torch.tensor(free), ps)
    assert got.dtype == torch.int64
    assert got.tolist() == simulate_decode(seq, last, free, ps)


def test_int32_inputs_and_hand_example():
    # page_size 4: request 0 has 2 prefix tokens in page 7 (slots 28, 29) and grows to 7 tokens:
    # slots 30, 31 finish page 7, then page 2 (8, 9, 10). Request 1 is empty and takes page 5.
    i32 = torch.int32
    got = alloc_extend(
        torch.tensor([2, 0], dtype=i32),
        torch.tensor([7, 1], dtype=i32),
        torch.tensor([29, -1], dtype=i32),
        torch.tensor([2, 5, 6], dtype=i32),
        4,
        extend_num_tokens=6,
    )
    assert got.tolist() == [30, 31, 8, 9, 10, 20]


def test_empty():
    e = torch.empty(0, dtype=torch.int64)
    assert alloc_extend(e, e, e, e, 16, extend_num_tokens=0).shape == (0,)
    assert alloc_decode(e, e, e, 16).shape == (0,)
    one = torch.tensor([5])
    got = alloc_extend(one, one, one, e, 16, extend_num_tokens=0)
    assert got.shape == (0,)


def test_errors():
    t = torch.tensor
    with pytest.raises(
        ValueError, match=r"alloc_extend: the requests need 2 new pages but free_pages holds 1"
    ):
        alloc_extend(t([0]), t([5]), t([-1]), t([3]), 4, extend_num_tokens=5)
    with pytest.raises(
        ValueError, match=r"extend_num_tokens must equal sum\(seq_lens - prefix_lens\) = 5, got 4"
    ):
        alloc_extend(t([0]), t([5]), t([-1]), t([3, 4]), 4, extend_num_tokens=4)
    with pytest.raises(ValueError, match=r"need seq_lens >= prefix_lens"):
        alloc_extend(t([5]), t([4]), t([-1]), t([3]), 4, extend_num_tokens=0)
    with pytest.raises(ValueError, match=r"alloc_decode: page_size must be >= 1, got 0"):
        alloc_decode(t([1]), t([0]), t([1]), 0)
    with pytest.raises(TypeError, match=r"alloc_decode: page_size must be an int, got float"):
        alloc_decode(t([1]), t([0]), t([1]), 4.0)
    with pytest.raises(
        ValueError, match=r"alloc_decode: 2 requests need a new page but free_pages holds 1"
    ):
        alloc_decode(t([1, 5]), t([0, 0]), t([1]), 4)
    with pytest.raises(ValueError, match=r"alloc_decode: last_loc must have 2 entries"):
        alloc_decode(t([1, 5]), t([0]), t([1]), 4)


def test_opcheck_and_compile():
    from kernels_memory.ops.alloc_extend import ALLOC_EXTEND

    prefix, seq, last, free = (torch.tensor(x) for x in ([3, 0], [9, 2], [11, -1], [4, 6, 8]))
    out = torch.empty(8, dtype=torch.int64)
    torch.library.opcheck(ALLOC_EXTEND.torch_op, (out, prefix, seq, last, free, 4, None))

    def step(seq, last, free):
        return alloc_decode(seq, last, free, 4)

    compiled = torch.compile(step, fullgraph=True)
    assert torch.equal(compiled(seq, last, free), step(seq, last, free))
