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

    # request 0 holds 3 tokens, the last at slot 10 (page 2, offset 2); request 1 is empty
    prefix, seq, last, free = (torch.tensor(x) for x in ([3, 0], [9, 2], [10, -1], [4, 6, 8]))
    out = torch.empty(8, dtype=torch.int64)
    torch.library.opcheck(ALLOC_EXTEND.torch_op, (out, prefix, seq, last, free, 4, None))

    def step(seq, last, free):
        return alloc_decode(seq, last, free, 4)

    # decode: request 0 (9 tokens) opens a page, request 1 (2 tokens) continues after slot 24
    last = torch.tensor([11, 24])
    compiled = torch.compile(step, fullgraph=True)
    assert torch.equal(compiled(seq, last, free), step(seq, last, free))

    def validated(seq, last, free):
        return alloc_decode(seq, last, free, 4, validate=True)

    # validate=True reads values on the host; while tracing it is skipped (no graph break)
    assert torch.equal(
        torch.compile(validated, fullgraph=True)(seq, last, free), step(seq, last, free)
    )


# Issue 12: bad free lists and last locations used to come back as negative or foreign slots,
# which the kvcache ops then skip or write over: KV silently dropped or corrupted. The torch
# reference (the CPU backend) always checks the values; ``validate=True`` checks them before
# dispatch on any device (a host sync on CUDA). Each case runs both ways.
_DECODE_BAD = [
    # (seq_lens, last_loc, free_pages, page_size, message)
    ([1, 1], [-1, -1], [3, -2], 4, r"alloc_decode: free_pages\[1\] = -2 must be >= 0"),
    ([1, 6], [-1, 20], [-7], 4, r"alloc_decode: free_pages\[0\] = -7 must be >= 0"),
    ([1, 1, 1], [-1, -1, -1], [3, 4, 3], 4,
     r"alloc_decode: free_pages\[0\] and free_pages\[2\] are both page 3"),
    ([2, 1], [-3, -1], [5], 4, r"alloc_decode: last_loc\[0\] = -3 must be >= -1"),
    ([1, 6], [-1, -1], [5], 4, r"alloc_decode: last_loc\[1\] = -1 must be a slot \(>= 0\)"),
    ([1, 6], [-1, 22], [5], 4,
     r"alloc_decode: last_loc\[1\] = 22 is at page offset 2, but request 1 \(seq_lens\[1\] = 6\) "
     r"has its last token at offset 0"),
    ([0], [-1], [5], 4, r"alloc_decode: seq_lens\[0\] = 0 must be >= 1"),
    ([1, 5, 9], [-1, 3, 7], [1, 2], 4,
     r"alloc_decode: 3 requests need a new page but free_pages holds 2 \(not enough free pages"),
]  # fmt: skip

_EXTEND_BAD = [
    # (prefix_lens, seq_lens, last_loc, free_pages, page_size, message)
    ([0, 0], [4, 4], [-1, -1], [1, -1], 4, r"alloc_extend: free_pages\[1\] = -1 must be >= 0"),
    ([0, 0], [4, 1], [-1, -1], [6, 6, 9], 4,
     r"alloc_extend: free_pages\[0\] and free_pages\[1\] are both page 6"),
    ([0, 2], [4, 3], [-2, 9], [1], 4, r"alloc_extend: last_loc\[0\] = -2 must be >= -1"),
    ([2], [3], [-1], [], 4, r"alloc_extend: last_loc\[0\] = -1 must be a slot \(>= 0\)"),
    ([2], [3], [8], [], 4,
     r"alloc_extend: last_loc\[0\] = 8 is at page offset 0, but request 0 \(prefix_lens\[0\] = 2\) "
     r"has its last token at offset 1"),
    ([1, -1], [3, 2], [4, -1], [7], 4, r"alloc_extend: prefix_lens\[1\] = -1 must be >= 0"),
    ([0, 5], [2, 4], [-1, 4], [7], 4,
     r"alloc_extend: need seq_lens >= prefix_lens, got seq_lens\[1\] = 4 < prefix_lens\[1\] = 5"),
    ([0, 0], [4, 5], [-1, -1], [1, 2], 4,
     r"alloc_extend: the requests need 3 new pages but free_pages holds 2 \(not enough free"),
]  # fmt: skip


@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize(("seq", "last", "free", "ps", "message"), _DECODE_BAD)
def test_alloc_decode_bad_values(seq, last, free, ps, message, validate):
    t = torch.tensor
    free = t(free, dtype=torch.int64)
    with pytest.raises(ValueError, match=message):
        alloc_decode(t(seq), t(last), free, ps, validate=validate)


@pytest.mark.parametrize("validate", [False, True])
@pytest.mark.parametrize(("prefix", "seq", "last", "free", "ps", "message"), _EXTEND_BAD)
def test_alloc_extend_bad_values(prefix, seq, last, free, ps, message, validate):
    t = torch.tensor
    total = sum(s - p for p, s in zip(prefix, seq, strict=True))
    free = t(free, dtype=torch.int64)
    with pytest.raises(ValueError, match=message):
        alloc_extend(
            t(prefix), t(seq), t(last), free, ps, extend_num_tokens=total, validate=validate
        )


def test_validate_checks_before_dispatch(monkeypatch):
    """validate=True raises in the public op, before any backend runs (what a CUDA kernel, which
    reads no values on the host, relies on)."""
    from kernels_memory.ops import alloc_decode as decode_module
    from kernels_memory.ops import alloc_extend as extend_module

    def no_launch(*args, **kwargs):
        raise AssertionError("launched")

    monkeypatch.setattr(decode_module.ALLOC_DECODE, "run", no_launch)
    monkeypatch.setattr(extend_module.ALLOC_EXTEND, "run", no_launch)
    t = torch.tensor
    with pytest.raises(ValueError, match=r"alloc_decode: free_pages\[0\] = -1 must be >= 0"):
        alloc_decode(t([1]), t([-1]), t([-1]), 4, validate=True)
    with pytest.raises(ValueError, match=r"alloc_extend: free_pages\[0\] = -1 must be >= 0"):
        alloc_extend(t([0]), t([1]), t([-1]), t([-1]), 4, extend_num_tokens=1, validate=True)
    with pytest.raises(AssertionError, match="launched"):  # validate=False leaves it to the backend
        alloc_decode(t([1]), t([-1]), t([-1]), 4)


def test_only_the_pages_taken_are_checked():
    """Entries past the pages a call takes are never read (the engine passes its whole free
    list), so a stale -1 or a repeat there is fine."""
    t = torch.tensor
    got = alloc_decode(t([1, 6]), t([-1, 20]), t([3, -1, 3]), 4, validate=True)
    assert got.tolist() == [12, 21]
    got = alloc_extend(
        t([2]), t([9]), t([9]), t([5, 6, -1, 5]), 4, extend_num_tokens=7, validate=True
    )
    assert got.tolist() == [10, 11, 20, 21, 22, 23, 24]


def test_validate_must_be_bool():
    t = torch.tensor
    with pytest.raises(TypeError, match=r"alloc_decode: validate must be a bool, got int 1"):
        alloc_decode(t([1]), t([-1]), t([3]), 4, validate=1)
    with pytest.raises(TypeError, match=r"alloc_extend: validate must be a bool, got str 'yes'"):
        alloc_extend(t([0]), t([1]), t([-1]), t([3]), 4, extend_num_tokens=1, validate="yes")


@pytest.mark.parametrize("ps", [1, 16])
def test_validate_leaves_valid_results_unchanged(ps):
    prefix, seq, last, free = _batch(30, ps, seed=ps)
    args = (torch.tensor(prefix), torch.tensor(seq), torch.tensor(last), torch.tensor(free), ps)
    total = sum(seq) - sum(prefix)
    plain = alloc_extend(*args, extend_num_tokens=total)
    checked = alloc_extend(*args, extend_num_tokens=total, validate=True)
    assert checked.tolist() == plain.tolist() == simulate_extend(prefix, seq, last, free, ps)
    decode_seq = [s + 1 for s in seq]
    decode_last = [
        slot if s > p else (last_ if s > 0 else -1)
        for p, s, last_, slot in zip(
            prefix, seq, last, _last_slots(plain, prefix, seq), strict=True
        )
    ]
    dargs = (torch.tensor(decode_seq), torch.tensor(decode_last), torch.tensor(free[::-1]), ps)
    assert alloc_decode(*dargs, validate=True).tolist() == alloc_decode(*dargs).tolist()


def _last_slots(out: torch.Tensor, prefix, seq):
    """The slot of each request's last extend token in the output of alloc_extend (None if it
    extended nothing)."""
    slots, pos = [], 0
    for p, s in zip(prefix, seq, strict=True):
        pos += s - p
        slots.append(int(out[pos - 1]) if s > p else None)
    return slots


# --- every backend on each device against the reference -----------------------------------------

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]
BACKENDS = {"cpu": ("torch",), "cuda": ("cuda", "torch")}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("ps", [1, 16, 64])
@pytest.mark.parametrize("batch", [1, 32, 33, 1024, 1025, 2048, 3000])
def test_backends_match_simulation(device, dtype, ps, batch):
    prefix, seq, last, free = _batch(batch, ps, seed=batch + ps)
    expected = simulate_extend(prefix, seq, last, free, ps)
    args = [torch.tensor(v, dtype=dtype, device=device) for v in (prefix, seq, last, free)]
    for backend in BACKENDS[device]:
        got = alloc_extend(*args, ps, extend_num_tokens=len(expected), backend=backend)
        assert got.tolist() == expected, backend
    # decode: one token past each request's sequence
    dseq = [s + 1 for s in seq]
    dlast = _last_slots(torch.tensor(expected), prefix, seq)
    dlast = [d if s > p else lt for d, s, p, lt in zip(dlast, seq, prefix, last, strict=True)]
    want = simulate_decode(dseq, dlast, free, ps)
    dargs = [torch.tensor(v, dtype=dtype, device=device) for v in (dseq, dlast, free)]
    for backend in BACKENDS[device]:
        got = alloc_decode(*dargs, ps, backend=backend)
        assert got.tolist() == want, backend


@pytest.mark.parametrize("device", DEVICES)
def test_backends_empty_and_strided(device):
    t = lambda v: torch.tensor(v, device=device)  # noqa: E731
    for backend in BACKENDS[device]:
        assert (
            alloc_extend(
                t([3, 5]), t([3, 5]), t([2, 4]), t([1]), 4, extend_num_tokens=0, backend=backend
            ).numel()
            == 0
        )
        empty = torch.empty(0, dtype=torch.int64, device=device)
        assert alloc_decode(empty, empty, t([1]), 4, backend=backend).numel() == 0
        wide = torch.tensor([[2, 0], [0, 0]], device=device)  # strided columns
        got = alloc_extend(
            wide[:, 0],
            t([7, 1]),
            t([29, -1]),
            t([2, 5, 6]),
            4,
            extend_num_tokens=6,
            backend=backend,
        )
        assert got.tolist() == [30, 31, 8, 9, 10, 20]


@pytest.mark.gpu
def test_cuda_kernel_never_reads_past_the_free_list():
    """Without validate, a CUDA call whose free list is too short gets -1 slots, not a fault."""
    t = lambda v: torch.tensor(v, device="cuda")  # noqa: E731
    got = alloc_decode(t([1, 1, 6]), t([-1, -1, 3]), t([7]), 4, backend="cuda")
    assert got.tolist() == [28, -1, 4]
    got = alloc_extend(t([0]), t([9]), t([-1]), t([7, 2]), 4, extend_num_tokens=9, backend="cuda")
    assert got.tolist() == [28, 29, 30, 31, 8, 9, 10, 11, -1]
    # several warps and chunks: every request needs a page, the list runs out inside a later warp
    for batch, pages in ((100, 40), (1500, 1100), (2500, 2048)):
        seq = torch.ones(batch, dtype=torch.int64, device="cuda")
        free = torch.arange(5, 5 + pages, device="cuda")
        got = alloc_decode(seq, seq - 2, free, 4, backend="cuda").tolist()
        assert got == [4 * (5 + r) for r in range(pages)] + [-1] * (batch - pages)


@pytest.mark.gpu
@pytest.mark.parametrize(("seq", "last", "free", "ps", "message"), _DECODE_BAD)
def test_cuda_validate_raises_before_launch(seq, last, free, ps, message):
    t = lambda v, **k: torch.tensor(v, device="cuda", **k)  # noqa: E731
    with pytest.raises(ValueError, match=message):
        alloc_decode(t(seq), t(last), t(free, dtype=torch.int64), ps, validate=True)


@pytest.mark.gpu
def test_cuda_graph_capture_and_compile():
    prefix, seq, last, free = _batch(200, 16, seed=5)
    expected = simulate_extend(prefix, seq, last, free, 16)
    args = [torch.tensor(v, device="cuda") for v in (prefix, seq, last, free)]
    alloc_extend(*args, 16, extend_num_tokens=len(expected))  # builds before capture
    alloc_decode(args[1] + 1, args[2], args[3], 16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = alloc_extend(*args, 16, extend_num_tokens=len(expected))
    graph.replay()
    torch.cuda.synchronize()
    assert out.tolist() == expected
    compiled = torch.compile(
        lambda p, s, lt, f: alloc_extend(p, s, lt, f, 16, extend_num_tokens=len(expected)) + 0,
        fullgraph=True,
    )
    assert compiled(*args).tolist() == expected


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 64, 1500])
def test_cuda_decode_chain_reads_the_previous_output(batch):
    """Back-to-back alloc_decode calls, each reading the previous call's slots as its last_loc,
    eagerly and in one CUDA graph: programmatic dependent launch lets a call start while the
    previous one runs, and its pdl_wait must still see every slot the previous call wrote."""
    seq = torch.full((batch,), 3, device="cuda")  # (3 - 1) % 16 != 0: last_loc + 1, no page
    free = torch.arange(batch, device="cuda")
    first = torch.arange(batch, device="cuda") * 100
    steps = 40

    def chain(last):
        for _ in range(steps):
            last = alloc_decode(seq, last, free, 16, backend="cuda")
        return last

    assert torch.equal(chain(first), first + steps)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain(first)
    for _ in range(2):
        out.zero_()
        graph.replay()
        assert torch.equal(out, first + steps)
