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


# --- every backend on each device against the loops ---------------------------------------------

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]
BACKENDS = {"cpu": ("torch",), "cuda": ("cuda", "torch")}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("table_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("batch", [1, 129, 1024])
def test_backends_get_last_loc(device, table_dtype, index_dtype, batch):
    rng = random.Random(batch)
    wide = _table(64, 1010, seed=batch, dtype=table_dtype).to(device)
    table = wide[:, :1000]  # row-strided
    idx = [rng.randrange(64) for _ in range(batch)]
    prefix = [rng.choice([0, 1000, rng.randrange(1001)]) for _ in range(batch)]
    want = [table[r, p - 1].item() if p > 0 else -1 for r, p in zip(idx, prefix, strict=True)]
    for backend in BACKENDS[device]:
        got = get_last_loc(
            table,
            torch.tensor(idx, dtype=index_dtype, device=device),
            torch.tensor(prefix, dtype=index_dtype, device=device),
            backend=backend,
        )
        assert got.dtype == index_dtype
        assert got.tolist() == want, backend


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("table_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("slot_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize(("batch", "cols"), [(1, 70000), (7, 40), (256, 600), (1024, 300)])
def test_backends_write(device, table_dtype, slot_dtype, batch, cols):
    rng = random.Random(batch * cols)
    rows = batch + 3
    base = _table(rows, cols, seed=batch, dtype=table_dtype)
    idx = rng.sample(range(rows), batch)
    starts = [rng.randrange(cols + 1) for _ in range(batch)]
    ends = [rng.choice([s, cols, rng.randrange(s, cols + 1)]) for s in starts]
    n = sum(e - s for s, e in zip(starts, ends, strict=True))
    slots = torch.randint(0, 1 << 30, (n,), dtype=slot_dtype)
    expected = _write_oracle(base, idx, starts, ends, slots.tolist())
    for backend in BACKENDS[device]:
        table = base.to(device)
        write_req_to_token_pool(
            table,
            torch.tensor(idx, device=device),
            torch.tensor(starts, device=device, dtype=torch.int32),
            torch.tensor(ends, device=device),
            slots.to(device),
            backend=backend,
        )
        assert torch.equal(table.cpu(), expected), backend


@pytest.mark.gpu
def test_cuda_skips_out_of_range_values():
    table = _table(4, 10, seed=1).cuda()
    got = get_last_loc(
        table,
        torch.tensor([5, -1, 1, 1], device="cuda"),
        torch.tensor([3, 3, 11, 10], device="cuda"),
        backend="cuda",
    )
    assert got.tolist() == [-1, -1, -1, table[1, 9].item()]
    before = table.clone()
    write_req_to_token_pool(
        table,
        torch.tensor([7, 0], device="cuda"),
        torch.tensor([0, 8], device="cuda"),
        torch.tensor([2, 12], device="cuda"),
        torch.arange(6, device="cuda"),
        backend="cuda",
    )
    assert torch.equal(table, before)  # row 7 and the range [8, 12) are out of bounds: skipped


@pytest.mark.gpu
def test_cuda_graph_capture_and_compile():
    table = _table(32, 100, seed=3).cuda()
    idx = torch.arange(31, -1, -1, device="cuda")
    starts = torch.randint(0, 50, (32,), device="cuda")
    ends = starts + torch.randint(0, 50, (32,), device="cuda")
    n = int((ends - starts).sum())
    slots = torch.randint(0, 1 << 20, (n,), device="cuda")
    expected = _write_oracle(
        table.cpu(), idx.tolist(), starts.tolist(), ends.tolist(), slots.tolist()
    )
    write_req_to_token_pool(table.clone(), idx, starts, ends, slots)  # builds before capture
    get_last_loc(table, idx, ends)
    graph = torch.cuda.CUDAGraph()
    work = table.clone()
    with torch.cuda.graph(graph):
        write_req_to_token_pool(work, idx, starts, ends, slots)
        last = get_last_loc(work, idx, ends)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(work.cpu(), expected)
    want = [
        expected[r, e - 1].item() if e > 0 else -1
        for r, e in zip(idx.tolist(), ends.tolist(), strict=True)
    ]
    assert last.tolist() == want
    compiled = torch.compile(lambda t, i, p: get_last_loc(t, i, p) + 0, fullgraph=True)
    assert compiled(work, idx, ends).tolist() == want


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("batch", [2, 7, 450])
def test_backends_write_with_prefixes(device, batch):
    """Radix-cache prefixes in the same launch (more than 200 requests: extra prefix launches),
    int32 and int64 prefixes, prefixes overlapping the new range (the new slots win), none."""
    rng = random.Random(batch)
    rows, cols = batch + 5, 300
    base = _table(rows, cols, seed=batch)
    idx = rng.sample(range(rows), batch)
    starts = [rng.randrange(cols) for _ in range(batch)]
    ends = [rng.randrange(s, cols + 1) for s in starts]
    plens = [rng.choice([0, s, min(s + 3, cols)]) for s in starts]
    prefixes = [
        torch.randint(0, 1 << 20, (n,), dtype=rng.choice([torch.int32, torch.int64])) for n in plens
    ]
    n = sum(e - s for s, e in zip(starts, ends, strict=True))
    slots = torch.randint(0, 1 << 30, (n,))
    expected = _write_oracle(
        base, idx, starts, ends, slots.tolist(), [q.tolist() for q in prefixes]
    )
    for backend in BACKENDS[device]:
        table = base.to(device)
        write_req_to_token_pool(
            table,
            torch.tensor(idx, device=device),
            torch.tensor(starts, device=device),
            torch.tensor(ends, device=device),
            slots.to(device),
            prefixes=[q.to(device) for q in prefixes],
            backend=backend,
        )
        assert torch.equal(table.cpu(), expected), backend
