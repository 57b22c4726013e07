"""memory.get_last_loc and memory.write_req_to_token_pool against explicit Python loops over the
request-to-token table: random batches, empty prefixes and extends, radix-cache prefixes, dtypes,
empty batches, bad input, opcheck and torch.compile."""

from __future__ import annotations

import random

import pytest
import torch

from kernels_memory import get_last_loc, write_req_to_token_pool


def _table(rows: int, cols: int, seed: int, dtype=torch.int32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 1 << 20, (rows, cols), generator=g, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize(("rows", "cols", "batch"), [(1, 1, 1), (8, 33, 5), (64, 1000, 40)])
def test_get_last_loc_matches_loop(dtype, rows, cols, batch):
    rng = random.Random(rows + cols)
    table = _table(rows, cols, seed=cols)
    idx = [rng.randrange(rows) for _ in range(batch)]
    prefix = [rng.choice([0, cols, rng.randrange(cols + 1)]) for _ in range(batch)]
    got = get_last_loc(table, torch.tensor(idx), torch.tensor(prefix, dtype=dtype))
    assert got.dtype == dtype
    want = [table[r, p - 1].item() if p > 0 else -1 for r, p in zip(idx, prefix, strict=True)]
    assert got.tolist() == want


def test_get_last_loc_empty_and_errors():
    table = _table(4, 8, seed=0)
    empty = torch.empty(0, dtype=torch.int64)
    assert get_last_loc(table, empty, empty).shape == (0,)
    with pytest.raises(ValueError, match=r"get_last_loc: prefix_lens must have 2 entries .* got 3"):
        get_last_loc(table, torch.tensor([0, 1]), torch.tensor([1, 2, 3]))
    with pytest.raises(ValueError, match=r"prefix_lens values must lie in \[0, 9\), got values in"):
        get_last_loc(table, torch.tensor([0]), torch.tensor([9]))
    with pytest.raises(ValueError, match=r"req_pool_indices values must lie in \[0, 4\)"):
        get_last_loc(table, torch.tensor([4]), torch.tensor([1]))
    with pytest.raises(TypeError, match=r"req_to_token must have dtype in \(int32, int64\)"):
        get_last_loc(table.float(), torch.tensor([0]), torch.tensor([1]))


def _write_oracle(table, idx, starts, ends, slots, prefixes=None):
    out = table.clone()
    for i, r in enumerate(idx):
        if prefixes is not None:
            for c, v in enumerate(prefixes[i]):
                out[r, c] = v
    pos = 0
    for r, s, e in zip(idx, starts, ends, strict=True):
        for c in range(s, e):
            out[r, c] = slots[pos]
            pos += 1
    return out


@pytest.mark.parametrize(("rows", "cols", "batch"), [(2, 1, 1), (16, 40, 7), (64, 500, 33)])
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64], ids=str)
def test_write_matches_loop(rows, cols, batch, slot_dtype):
    rng = random.Random(rows * cols)
    table = _table(rows, cols, seed=rows)
    idx = rng.sample(range(rows), batch)
    starts = [rng.randrange(cols + 1) for _ in range(batch)]
    ends = [rng.choice([s, rng.randrange(s, cols + 1)]) for s in starts]
    n = sum(e - s for s, e in zip(starts, ends, strict=True))
    slots = [rng.randrange(1 << 30) for _ in range(n)]
    expected = _write_oracle(table, idx, starts, ends, slots)
    write_req_to_token_pool(
        table,
        torch.tensor(idx),
        torch.tensor(starts),
        torch.tensor(ends),
        torch.tensor(slots, dtype=slot_dtype),
    )
    assert torch.equal(table, expected)


def test_write_with_prefixes():
    table = torch.zeros(4, 12, dtype=torch.int32)
    idx, starts, ends = [3, 1], [2, 0], [5, 4]
    prefixes = [[70, 71], []]
    slots = list(range(100, 107))
    expected = _write_oracle(table, idx, starts, ends, slots, prefixes)
    write_req_to_token_pool(
        table,
        torch.tensor(idx),
        torch.tensor(starts),
        torch.tensor(ends),
        torch.tensor(slots),
        prefixes=[torch.tensor(p, dtype=torch.int64) for p in prefixes],
    )
    assert torch.equal(table, expected)
    assert table[3].tolist()[:6] == [70, 71, 100, 101, 102, 0]


def test_write_empty_leaves_table_untouched():
    table = _table(3, 5, seed=1)
    before = table.clone()
    empty = torch.empty(0, dtype=torch.int64)
    write_req_to_token_pool(table, empty, empty, empty, empty)
    write_req_to_token_pool(table, torch.tensor([1]), torch.tensor([2]), torch.tensor([2]), empty)
    assert torch.equal(table, before)


def test_write_errors():
    table = _table(3, 5, seed=2)
    one = torch.tensor([1])
    with pytest.raises(
        ValueError, match=r"out_cache_loc must hold sum\(ends - starts\) = 3 slots, got 2"
    ):
        write_req_to_token_pool(
            table, one, torch.tensor([0]), torch.tensor([3]), torch.ones(2).long()
        )
    with pytest.raises(TypeError, match=r"out_cache_loc must have dtype in \(int32, int64\)"):
        write_req_to_token_pool(table, one, torch.tensor([0]), torch.tensor([2]), torch.ones(2))
    with pytest.raises(ValueError, match=r"need 0 <= starts <= ends <= L = 5"):
        write_req_to_token_pool(
            table, one, torch.tensor([3]), torch.tensor([2]), torch.ones(0).long()
        )
    with pytest.raises(ValueError, match=r"need 0 <= starts <= ends <= L = 5"):
        write_req_to_token_pool(
            table, one, torch.tensor([4]), torch.tensor([6]), torch.ones(2).long()
        )
    with pytest.raises(ValueError, match=r"prefixes must hold one tensor per request \(1\), got 2"):
        write_req_to_token_pool(table, one, one, one, torch.ones(0).long(), prefixes=[one, one])


def test_opcheck_and_compile():
    from kernels_memory.ops.get_last_loc import GET_LAST_LOC
    from kernels_memory.ops.write_req_to_token_pool import WRITE_REQ_TO_TOKEN_POOL

    table = _table(5, 10, seed=3)
    idx, starts, ends = torch.tensor([4, 0]), torch.tensor([1, 3]), torch.tensor([4, 5])
    slots = torch.arange(5, dtype=torch.int64)
    torch.library.opcheck(
        WRITE_REQ_TO_TOKEN_POOL.torch_op,
        (table.clone(), idx, starts, ends, slots, [torch.tensor([9])] * 2, None),
    )
    torch.library.opcheck(GET_LAST_LOC.torch_op, (torch.empty(2).long(), table, idx, ends, None))

    def step(table, idx, starts, ends, slots):
        write_req_to_token_pool(table, idx, starts, ends, slots)
        return get_last_loc(table, idx, ends)

    eager_table, compiled_table = table.clone(), table.clone()
    want = step(eager_table, idx, starts, ends, slots)
    got = torch.compile(step, fullgraph=True)(compiled_table, idx, starts, ends, slots)
    assert torch.equal(got, want) and torch.equal(compiled_table, eager_table)
    assert got.tolist() == [2, 4]
