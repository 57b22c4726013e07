"""kv_canary.kv_canary_write and kv_canary.kv_canary_verify against a Python-int oracle of
OPS.md section 15 (uint64 arithmetic on Python ints, KV words assembled with int.from_bytes):
paged bf16 K/V, a partially read fp8 MLA cache, chains continued across calls, skipped slots,
then every failure bit: corrupted bytes, moved positions, wrong tokens, broken and misrouted
chains, skip_slot; empty work, bad input, opcheck and torch.compile."""

from __future__ import annotations

import pytest
import torch

from kernels_kv_canary import KVSource, kv_canary_verify, kv_canary_write
from kernels_kv_canary.ops.kv_canary_write import example_sources

MASK = (1 << 64) - 1


def fmix(x: int) -> int:
    x &= MASK
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def mix3(a: int, b: int, c: int) -> int:
    return fmix(fmix(fmix(a) ^ (b & MASK)) ^ (c & MASK))


ANCHOR = fmix(0xC0FFEE1234567890)


def u64(v: int) -> int:
    return v & MASK


def py_kv_hash(sources, slot: int) -> int:
    acc = 0
    for cache, page_size, per_token, read in sources:
        raw = bytes(cache.contiguous().view(torch.uint8).reshape(-1).tolist())
        row_bytes = len(raw) // cache.shape[0]
        start = (slot // page_size) * row_bytes + (slot % page_size) * per_token
        data = raw[start : start + read]
        data += b"\0" * (-len(data) % 8)
        h = 0
        for i in range(0, len(data), 8):
            h = fmix(h ^ int.from_bytes(data[i : i + 8], "little"))
        acc = fmix(acc ^ h)
    return acc


def py_slot_hash(canary: list[list[int]], slot: int) -> int:
    if slot < 0:
        return ANCHOR
    token, position, prev, _ = canary[slot]
    return mix3(u64(prev), token, position)


def py_write(canary, sources, slots, tokens, positions, indptr, seeds):
    before = [row[:] for row in canary]
    for r in range(len(indptr) - 1):
        run = py_slot_hash(before, seeds[r])
        for i in range(indptr[r], indptr[r + 1]):
            if slots[i] < 0:
                continue
            canary[slots[i]] = [tokens[i], positions[i], run, py_kv_hash(sources, slots[i])]
            run = mix3(run, tokens[i], positions[i])


def as_u64(canary: torch.Tensor) -> list[list[int]]:
    return [[u64(v) for v in row] for row in canary.tolist()]


def _scenario(seed: int = 0):
    sources = example_sources(pages=8, page_size=4, seed=seed)
    # Rows of earlier steps hold arbitrary hashes: random bits, so a zero row proves nothing.
    g = torch.Generator().manual_seed(seed)
    canary = torch.randint(-(2**63), 2**63 - 1, (32, 4), generator=g, dtype=torch.int64)
    # Request 0: a fresh chain; request 1 continues after slot 2 (written by an earlier step);
    # request 2 has a skipped slot. (A seed slot written in the same call would race.)
    slots = [4, 5, 6, 7, 3, 8, 9, 20, -1, 21]
    tokens = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    positions = [0, 1, 2, 3, 4, 5, 6, 0, 1, 2]
    indptr, seeds = [0, 4, 7, 10], [-1, 2, -1]
    return sources, canary, slots, tokens, positions, indptr, seeds


def _write(canary, sources, slots, tokens, positions, indptr, seeds):
    kv_canary_write(
        canary,
        sources,
        torch.tensor(slots),
        torch.tensor(tokens, dtype=torch.int32),
        torch.tensor(positions),
        torch.tensor(indptr, dtype=torch.int32),
        torch.tensor(seeds),
    )


def test_write_matches_python_oracle_bit_for_bit():
    sources, canary, slots, tokens, positions, indptr, seeds = _scenario()
    expected = as_u64(canary)
    _write(canary, sources, slots, tokens, positions, indptr, seeds)
    py_write(expected, sources, slots, tokens, positions, indptr, seeds)
    assert as_u64(canary) == expected
    # A second call continues request 0's chain from its last slot (7).
    more = ([10, 11], [21, 22], [4, 5], [0, 2], [7])
    _write(canary, sources, *more)
    py_write(expected, sources, *more)
    assert as_u64(canary) == expected
    assert expected[10][2] == py_slot_hash(expected, 7)
    assert expected[4][2] == ANCHOR


def test_kv_hash_reads_only_read_bytes():
    sources, canary, *rest = _scenario(seed=1)
    _write(canary, sources, *rest)
    mla = sources[2].cache
    mla.view(torch.uint8)[4, 0, 13:] ^= 0xFF  # past read_bytes = 13: ignored
    ok = kv_canary_verify(canary, sources, torch.tensor([4]), torch.tensor([-1]), torch.tensor([0]))
    assert ok.tolist() == [0]
    mla.view(torch.uint8)[4, 0, 12] ^= 1
    bad = kv_canary_verify(
        canary, sources, torch.tensor([4]), torch.tensor([-1]), torch.tensor([0])
    )
    assert bad.tolist() == [4]


def test_verify_reports_every_failure():
    sources, canary, slots, tokens, positions, indptr, seeds = _scenario(seed=2)
    _write(canary, sources, slots, tokens, positions, indptr, seeds)
    check = torch.tensor([4, 5, 6, 7, 3, 8, 9, 20, 21, -1, 0])
    prev = torch.tensor([-1, 4, 5, 6, 2, 3, 8, -1, 20, -1, -1])
    pos = torch.tensor([0, 1, 2, 3, 4, 5, 6, 0, 2, 0, 0])
    toks = torch.tensor([11, 12, 13, 14, 15, 16, 17, 18, 20, -1, -1])
    clean = kv_canary_verify(canary, sources, check, prev, pos, toks, skip_slot=0)
    assert clean.tolist() == [0] * 11
    # Slot 21 followed a skipped slot: its chain comes from slot 20.
    sources[1].cache.view(torch.uint8).view(-1)[6 * 32] ^= 0x80  # V bytes of slot 6
    canary[8, 0] = 99  # token of slot 8
    wrong_pos = pos.clone()
    wrong_pos[1] = 9
    wrong_prev = prev.clone()
    wrong_prev[3] = 4  # misrouted: slot 7 does not follow slot 4
    toks[5] = 16
    got = kv_canary_verify(canary, sources, check, wrong_prev, wrong_pos, toks, skip_slot=0)
    # slot 8's token change also breaks slot 9's chain link (slot_hash(8) changed).
    assert got.tolist() == [0, 2, 4, 1, 0, 8, 1, 0, 0, 0, 0]
    no_tokens = kv_canary_verify(canary, sources, check, prev, pos, skip_slot=0)
    assert no_tokens.tolist() == [0, 0, 4, 0, 0, 0, 1, 0, 0, 0, 0]
    # Without skip_slot the padding slot 0 (never written: random bits) is checked like any other.
    assert kv_canary_verify(canary, sources, check, prev, pos)[10] == 2 | 4


def test_chain_break_when_a_slot_is_rewritten():
    sources, canary, slots, tokens, positions, indptr, seeds = _scenario(seed=3)
    _write(canary, sources, slots, tokens, positions, indptr, seeds)
    # Another request overwrites slot 5 (KV and canary): slot 6 no longer chains to it.
    _write(canary, sources, [5], [77], [40], [0, 1], [-1])
    got = kv_canary_verify(
        canary, sources, torch.tensor([5, 6]), torch.tensor([4, 5]), torch.tensor([1, 2])
    )
    assert got.tolist() == [1 | 2, 1]


def test_empty_work():
    sources, canary, *_ = _scenario()
    before = canary.clone()
    e = torch.empty(0, dtype=torch.int64)
    kv_canary_write(canary, sources, e, e, e, torch.zeros(1, dtype=torch.int32), e)
    assert torch.equal(canary, before)
    assert kv_canary_verify(canary, sources, e, e, e).shape == (0,)
    kv_canary_write(canary, [], torch.tensor([1]), torch.tensor([1]), torch.tensor([1]),
                    torch.tensor([0, 1], dtype=torch.int32), torch.tensor([-1]))  # fmt: skip
    assert canary[1].tolist()[:2] == [1, 1] and canary[1, 3] == 0  # no sources: kv_hash 0


def test_bad_input():
    sources, canary, *_ = _scenario()
    one = torch.tensor([1])
    indptr = torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"kv_canary_write: canary must be \[S, 4\] int64"):
        kv_canary_write(canary[:, :3], sources, one, one, one, indptr, one)
    with pytest.raises(ValueError, match=r"kv_canary_write: slots must be < S = 32, got 40"):
        kv_canary_write(canary, sources, one * 40, one, one, indptr, one)
    with pytest.raises(
        ValueError, match=r"kv_sources\[0\] reads up to byte 200 of a row, but its rows have 128"
    ):
        kv_canary_write(canary, [KVSource(sources[0].cache, 4, 64, 8)], one, one, one, indptr, one)
    with pytest.raises(ValueError, match=r"at most 4 kv_sources, got 5"):
        kv_canary_write(canary, sources + sources[:2], one, one, one, indptr, one)
    with pytest.raises(TypeError, match=r"kv_sources must be a list of KVSource"):
        kv_canary_write(canary, sources[0], one, one, one, indptr, one)
    with pytest.raises(ValueError, match=r"seed_slots must have N = 1 entries like slots, got 2"):
        kv_canary_write(canary, sources, one, one, one, indptr, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=r"kv_canary_verify: prev_slots must have N = 1 entries"):
        kv_canary_verify(canary, sources, one, torch.tensor([1, 2]), one)
    with pytest.raises(ValueError, match=r"slot 35 is page 8, but kv_sources\[0\] has 8 pages"):
        kv_canary_verify(torch.zeros(64, 4, dtype=torch.int64), sources, one * 35, one, one)


def test_opcheck_and_compile():
    from kernels_kv_canary.ops.kv_canary_verify import KV_CANARY_VERIFY
    from kernels_kv_canary.ops.kv_canary_write import KV_CANARY_WRITE

    sources, canary, slots, tokens, positions, indptr, seeds = _scenario(seed=4)
    # opcheck's schema test runs arithmetic on every tensor argument; CPU has none for fp8.
    lists = ([s.cache for s in sources[:2]], [4, 4], [32, 32], [32, 32])
    t = torch.tensor
    write_args = (canary, *lists, t(slots), t(tokens), t(positions), t(indptr), t(seeds), None)
    torch.library.opcheck(KV_CANARY_WRITE.torch_op, write_args)
    check = t([4, 5, 6])
    verify_args = (
        torch.empty(3, dtype=torch.int32),
        canary,
        *lists,
        check,
        t([-1, 4, 5]),
        t([0, 1, 2]),
        None,
        -1,
        None,
    )
    torch.library.opcheck(KV_CANARY_VERIFY.torch_op, verify_args)

    def verify(canary, slots, prev, pos):
        return kv_canary_verify(canary, sources, slots, prev, pos)

    compiled = torch.compile(verify, fullgraph=True)
    args = (canary, check, t([-1, 4, 5]), t([0, 1, 2]))
    assert torch.equal(compiled(*args), verify(*args))


# ---- every backend against the reference (the CUDA kernels on the GPU) ----

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _realistic(entries: int, device: str, page_size: int = 16, seed: int = 0, odd=False):
    """K and V caches of 8 heads x 128 bf16 per token (2 KiB each); ``odd=True`` adds an fp8 cache
    read 13 bytes at a time at a 20-byte pitch (the unaligned, direct-load path) as a third
    source; ``odd="mixed"`` a bf16 cache read 1040 of its 1056 bytes per token (16-byte aligned:
    the staged path, with a source shorter than the others and a partial last 128-byte chunk)."""
    g = torch.Generator().manual_seed(seed)
    slots_total = max(4 * entries, 64)
    pages = (slots_total + page_size - 1) // page_size
    k = torch.randn(pages, page_size, 8, 128, generator=g).to(torch.bfloat16).to(device)
    v = torch.randn(pages, page_size, 8, 128, generator=g).to(torch.bfloat16).to(device)
    sources = [KVSource(k, page_size, 2048, 2048), KVSource(v, page_size, 2048, 2048)]
    if odd == "mixed":
        mla = torch.randn(pages * page_size, 528, generator=g).to(torch.bfloat16)
        sources.append(KVSource(mla.to(device), 1, 1056, 1040))
    elif odd:
        mla = torch.randn(pages * page_size, 20, generator=g).to(torch.float8_e4m3fn)
        sources.append(KVSource(mla.to(device), 1, 20, 13))
    canary = torch.randint(
        -(2**63), 2**63 - 1, (pages * page_size, 4), generator=g, dtype=torch.int64
    ).to(device)
    perm = torch.randperm(pages * page_size, generator=g)
    slots = perm[:entries].clone()
    slots[torch.rand(entries, generator=g) < 0.1] = -1
    seeds_pool = perm[entries:]
    cuts = torch.sort(torch.randint(0, entries + 1, (max(entries // 5, 1),), generator=g)).values
    indptr = torch.cat([torch.tensor([0]), cuts, torch.tensor([entries])]).to(torch.int32)
    requests = indptr.shape[0] - 1
    seeds = seeds_pool[:requests].clone()
    seeds[::3] = -1
    tokens = torch.randint(0, 150_000, (entries,), generator=g)
    positions = torch.randint(0, 8192, (entries,), generator=g).to(torch.int32)
    dev = lambda t: t.to(device)  # noqa: E731
    return (
        canary,
        sources,
        dev(slots),
        dev(tokens),
        dev(positions),
        dev(indptr),
        dev(seeds),
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("entries", [1, 7, 64, 128, 129, 1000])
@pytest.mark.parametrize("odd", [False, True, "mixed"])
def test_backends_match_reference_bit_for_bit(device, entries, odd):
    canary, sources, slots, tokens, positions, indptr, seeds = _realistic(
        entries, device, page_size=1 if odd else 16, seed=entries, odd=odd
    )
    want = canary.clone()
    kv_canary_write(want, sources, slots, tokens, positions, indptr, seeds, backend="torch")
    got = canary.clone()
    kv_canary_write(got, sources, slots, tokens, positions, indptr, seeds)
    assert torch.equal(got, want)
    # Verify: corrupt some KV bytes, a position and a token; both backends report the same bits.
    live = slots[slots >= 0]
    prev = torch.full_like(slots, -1)
    prev[1:] = slots[:-1]
    k_bytes = sources[0].cache.view(torch.uint8).view(-1)
    if live.numel():
        k_bytes[int(live[0]) * 2048 + 17] ^= 4
        got[int(live[-1]), 1] += 1
    expected_tokens = torch.where(torch.arange(entries, device=device) % 2 == 0, tokens, -1)
    for skip in (-1, int(live[0]) if live.numel() else 0):
        a = kv_canary_verify(
            got, sources, slots, prev, positions, expected_tokens, skip_slot=skip, backend="torch"
        )
        b = kv_canary_verify(got, sources, slots, prev, positions, expected_tokens, skip_slot=skip)
        assert torch.equal(a, b)
        if live.numel() and skip == -1:
            assert b.count_nonzero() > 0


@pytest.mark.gpu
def test_cuda_write_reads_every_seed_before_writing():
    # Request 1's seed is slot 5, which request 0 writes in the same call: the reference reads the
    # old row; so must the kernels (both the one-launch and the two-launch paths).
    for entries in (4, 300):
        canary, sources, slots, tokens, positions, indptr, seeds = _realistic(entries, "cuda")
        used = set(slots.tolist())
        slots[0] = next(i for i in range(canary.shape[0]) if i not in used)
        indptr = torch.tensor([0, 2, entries], dtype=torch.int32, device="cuda")
        seeds = torch.tensor([-1, int(slots[0])], device="cuda")
        want = canary.clone()
        kv_canary_write(want, sources, slots, tokens, positions, indptr, seeds, backend="torch")
        kv_canary_write(canary, sources, slots, tokens, positions, indptr, seeds)
        assert torch.equal(canary, want)


@pytest.mark.gpu
def test_cuda_graph_capture_and_compile():
    canary, sources, slots, tokens, positions, indptr, seeds = _realistic(200, "cuda")
    want = canary.clone()
    kv_canary_write(want, sources, slots, tokens, positions, indptr, seeds, backend="torch")
    got = canary.clone()
    kv_canary_write(canary.clone(), sources, slots, tokens, positions, indptr, seeds)  # build
    prev = torch.full_like(slots, -1)
    kv_canary_verify(want, sources, slots, prev, positions)  # build
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kv_canary_write(got, sources, slots, tokens, positions, indptr, seeds)
        bits = kv_canary_verify(got, sources, slots, prev, positions)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(got, want) and bits.count_nonzero() == 0

    def verify(canary, slots, prev, pos):
        return kv_canary_verify(canary, sources, slots, prev, pos)

    compiled = torch.compile(verify, fullgraph=True)
    assert torch.equal(compiled(got, slots, prev, positions), verify(got, slots, prev, positions))
