"""speculative.chain_speculative_sampling against an explicit float64 walk of OPS.md's algorithm
fed by a Python-int RNG oracle (rows within rounding of a CDF boundary may differ), plus the
property that makes it exact: emitted tokens follow the target distribution (chi-square)."""

from __future__ import annotations

import bisect
import itertools

import pytest
import torch

from kernels_speculative import chain_speculative_sampling

MASK = (1 << 64) - 1


def _fmix(x: int) -> int:
    x ^= x >> 30
    x = (x * 0xBF58476D1CE4E5B9) & MASK
    x ^= x >> 27
    x = (x * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def _mix(x: int) -> int:
    return _fmix((x + 0x9E3779B97F4A7C15) & MASK)


def py_u(seed: int, offset: int, row: int, j: int) -> float:
    return (_mix(_mix(_mix(_mix(seed & MASK) ^ (offset & MASK)) ^ row) ^ j) >> 40) * 2.0**-24


def _draw(w: list[float], u: float) -> tuple[int, bool]:
    cdf = list(itertools.accumulate(w))
    if not cdf[-1] > 0:
        return 0, False
    t = u * cdf[-1]
    near = min(abs(c - t) for c in cdf) < 1e-5 * cdf[-1]
    return min(bisect.bisect_right(cdf, t), len(w) - 1), near


def oracle(draft, ids, target, seed, offset):
    """(tokens, accepted, emitted, near_boundary) per request, explicit loops in float64."""
    rows = []
    for b in range(len(ids)):
        n = len(ids[b])
        us = [py_u(seed, offset, b, i) for i in range(n + 1)]
        accept = [us[i] * draft[b][i][ids[b][i]] < target[b][i][ids[b][i]] for i in range(n)]
        r = next((i for i, a in enumerate(accept) if not a), n)
        if r < n:
            w = [max(t - d, 0.0) for t, d in zip(target[b][r], draft[b][r], strict=True)]
            if sum(w) <= 0:
                w = target[b][r]
        else:
            w = target[b][n]
        token, near = _draw(w, us[n])
        tokens = ids[b][:r] + [token] + [-1] * (n - r)
        rows.append((tokens, sum(accept), r, near))
    return rows


def _inputs(batch: int, n: int, vocab: int, seed: int, sharp: float = 1.0):
    g = torch.Generator().manual_seed(seed)
    draft = (torch.randn(batch, n, vocab, generator=g) * sharp).softmax(-1)
    target = (torch.randn(batch, n + 1, vocab, generator=g) * sharp).softmax(-1)
    flat = draft.reshape(-1, vocab) if n else torch.ones(1, vocab)
    ids = torch.multinomial(flat, 1, generator=g).reshape(batch, n) if n else None
    if ids is None:
        ids = torch.empty(batch, 0, dtype=torch.int64)
    return draft, ids.to(torch.int32), target


@pytest.mark.parametrize(("batch", "n", "vocab"), [(1, 1, 1), (4, 1, 5), (16, 4, 33), (9, 8, 300)])
@pytest.mark.parametrize(("seed", "offset"), [(0, 0), (77, 5), (2**64 - 1, 123456)])
def test_matches_float64_oracle(batch, n, vocab, seed, offset):
    draft, ids, target = _inputs(batch, n, vocab, seed=batch + n + vocab)
    tokens, accepted, emitted = chain_speculative_sampling(
        draft, ids, target, seed=seed, offset=offset
    )
    assert tokens.dtype == accepted.dtype == emitted.dtype == torch.int32
    expected = oracle(draft.double().tolist(), ids.tolist(), target.double().tolist(), seed, offset)
    for b, (want_tokens, want_acc, want_r, near) in enumerate(expected):
        assert accepted[b].item() == want_acc and emitted[b].item() == want_r
        got = tokens[b].tolist()
        if got != want_tokens:
            assert near and got[:want_r] == want_tokens[:want_r], (b, got, want_tokens)


def test_identical_draft_and_target_accepts_everything():
    draft, ids, target = _inputs(8, 3, 20, seed=1)
    target[:, :3] = draft
    tokens, accepted, emitted = chain_speculative_sampling(draft, ids, target, seed=3)
    assert accepted.tolist() == [3] * 8 and emitted.tolist() == [3] * 8
    assert torch.equal(tokens[:, :3], ids)
    assert (tokens[:, 3] >= 0).all()


def test_zero_residual_falls_back_to_target():
    # Draft puts all mass on token 0 where the target has 0: rejected for sure; the residual
    # relu(target - draft) equals target here, and with target == draft elsewhere it is 0.
    draft = torch.tensor([[[1.0, 0.0, 0.0]]])
    target = torch.tensor([[[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]]])
    ids = torch.tensor([[0]], dtype=torch.int32)
    tokens, accepted, emitted = chain_speculative_sampling(draft, ids, target, seed=9)
    assert accepted.tolist() == [0] and emitted.tolist() == [0]
    assert tokens[0, 0].item() in (1, 2) and tokens[0, 1].item() == -1


def test_emitted_tokens_follow_the_target_distribution():
    batch, n, vocab = 30_000, 2, 6
    g = torch.Generator().manual_seed(0)
    d = (torch.randn(n, vocab, generator=g) * 1.5).softmax(-1)
    t = (torch.randn(n + 1, vocab, generator=g) * 1.5).softmax(-1)
    draft = d.expand(batch, n, vocab).contiguous()
    target = t.expand(batch, n + 1, vocab).contiguous()
    ids = torch.stack([torch.multinomial(d[i], batch, True, generator=g) for i in range(n)], 1)
    tokens, _, emitted = chain_speculative_sampling(draft, ids.to(torch.int32), target, seed=17)
    for pos in range(n):
        emitted_here = emitted >= pos  # position pos holds a token emitted from target row pos
        counts = torch.bincount(tokens[emitted_here, pos].long(), minlength=vocab).double()
        expected = t[pos].double() * emitted_here.sum()
        chi2 = ((counts - expected) ** 2 / expected).sum().item()
        assert chi2 < 25.7, (pos, chi2)  # 5 degrees of freedom: P(chi2 > 25.7) ~ 1e-4


def test_reproducible_per_request_seeds():
    draft, ids, target = _inputs(6, 3, 40, seed=2, sharp=0.3)
    seeds = torch.arange(6, dtype=torch.int64) + 1000
    a = chain_speculative_sampling(draft, ids, target, seed=seeds, offset=torch.tensor([4]))
    b = chain_speculative_sampling(draft, ids, target, seed=seeds, offset=4)
    for x, y in zip(a, b, strict=True):
        assert torch.equal(x, y)
    torch.manual_seed(1)
    c = chain_speculative_sampling(draft, ids, target)
    torch.manual_seed(1)
    assert torch.equal(c[0], chain_speculative_sampling(draft, ids, target)[0])


def test_empty_and_zero_drafts():
    tokens, acc, emi = chain_speculative_sampling(
        torch.empty(0, 3, 10), torch.empty(0, 3, dtype=torch.int32), torch.empty(0, 4, 10), seed=1
    )
    assert tokens.shape == (0, 4) and acc.shape == (0,) and emi.shape == (0,)
    draft, ids, target = _inputs(3, 0, 7, seed=3)
    tokens, acc, emi = chain_speculative_sampling(draft, ids, target, seed=1)
    assert tokens.shape == (3, 1) and acc.tolist() == [0] * 3 and emi.tolist() == [0] * 3


def test_bad_input():
    draft, ids, target = _inputs(2, 3, 10, seed=4)
    with pytest.raises(
        ValueError, match=r"target_probs must have shape \(2, 4, 10\) = \[B, n\+1, V\]"
    ):
        chain_speculative_sampling(draft, ids, target[:, :3], seed=1)
    with pytest.raises(ValueError, match=r"draft_token_ids must have shape \(2, 3\)"):
        chain_speculative_sampling(draft, ids[:, :2], target, seed=1)
    with pytest.raises(TypeError, match=r"draft_token_ids must have dtype in \(int32, int64\)"):
        chain_speculative_sampling(draft, ids.float(), target, seed=1)
    with pytest.raises(ValueError, match=r"draft_token_ids values must lie in \[0, 10\), got"):
        chain_speculative_sampling(draft, ids + 10, target, seed=1)
    with pytest.raises(ValueError, match=r"seed must have shape \(1,\) or \(2,\)"):
        chain_speculative_sampling(draft, ids, target, seed=torch.zeros(3, dtype=torch.int64))


def test_opcheck_and_compile():
    from kernels_speculative.ops.chain_speculative_sampling import CHAIN_SPECULATIVE_SAMPLING

    draft, ids, target = _inputs(3, 2, 16, seed=5)
    outs = (
        torch.empty(3, 3, dtype=torch.int32),
        torch.empty(3, dtype=torch.int32),
        torch.empty(3, dtype=torch.int32),
    )
    seed, offset = torch.tensor([1]), torch.tensor([2])
    args = (*outs, draft, ids, target, seed, offset, True, None)
    torch.library.opcheck(CHAIN_SPECULATIVE_SAMPLING.torch_op, args)
    compiled = torch.compile(
        lambda d, i, t, s: chain_speculative_sampling(d, i, t, seed=s, offset=s), fullgraph=True
    )
    eager = chain_speculative_sampling(draft, ids, target, seed=1, offset=1)
    for got, want in zip(compiled(draft, ids, target, seed), eager, strict=True):
        assert torch.equal(got, want)


# ---- every backend against the reference (the CUDA kernel on the GPU) ----

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _assert_same_draws(got, want, draft, ids, target, seeds, offsets):
    """Equal accept counts and prefixes; a drawn token may differ only where the threshold lies
    within rounding of the CDF between the two tokens (the sums run in another order)."""
    tokens, accepted, emitted = got
    assert torch.equal(accepted, want[1]) and torch.equal(emitted, want[2])
    diff = (tokens != want[0]).any(dim=1).nonzero().flatten().tolist()
    n = ids.shape[1]
    for b in diff:
        r = int(emitted[b])
        assert torch.equal(tokens[b, :r], want[0][b, :r]) and torch.equal(
            tokens[b, r + 1 :], want[0][b, r + 1 :]
        )
        t = target[b, r].double().cpu()
        w = (t - draft[b, r].double().cpu()).clamp(min=0) if r < n else t
        if not w.sum() > 0:
            w = t
        cdf = w.cumsum(0)
        u = py_u(int(seeds[b % len(seeds)]), int(offsets[b % len(offsets)]), b, n)
        lo, hi = sorted((int(tokens[b, r]), int(want[0][b, r])))
        gap = (cdf[lo:hi] - u * cdf[-1]).abs().max().item() if hi > lo else 0.0
        assert gap < 1e-5 * cdf[-1].item(), (b, lo, hi, gap)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("batch", "n", "vocab"),
    [(1, 1, 1), (3, 0, 9), (4, 1, 5), (5, 4, 33), (2, 8, 4096), (3, 8, 128_256), (2, 3, 32_003)],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("sharp", [0.3, 4.0])
def test_backend_matches_reference(device, batch, n, vocab, dtype, sharp):
    draft, ids, target = _inputs(batch, n, vocab, seed=batch * 7 + n + vocab, sharp=sharp)
    draft, ids, target = draft.to(device, dtype), ids.to(device), target.to(device, dtype)
    seeds = torch.arange(batch, dtype=torch.int64, device=device) * 3 + 11
    offsets = torch.tensor([5], dtype=torch.int64, device=device)
    want = chain_speculative_sampling(
        draft, ids, target, seed=seeds, offset=offsets, backend="torch"
    )
    got = chain_speculative_sampling(draft, ids, target, seed=seeds, offset=offsets)
    _assert_same_draws(got, want, draft, ids, target, seeds.tolist(), offsets.tolist())
    # Strided views (rows of a wider buffer, misaligned) and int64 ids take the same draws.
    wide_d = torch.zeros(batch, n, vocab + 3, dtype=dtype, device=device)
    wide_t = torch.zeros(batch, n + 1, vocab + 3, dtype=dtype, device=device)
    wide_d[..., 1 : vocab + 1] = draft
    wide_t[..., 1 : vocab + 1] = target
    got = chain_speculative_sampling(
        wide_d[..., 1 : vocab + 1],
        ids.long(),
        wide_t[..., 1 : vocab + 1],
        seed=seeds,
        offset=offsets,
    )
    _assert_same_draws(got, want, draft, ids, target, seeds.tolist(), offsets.tolist())


@pytest.mark.gpu
def test_cuda_zero_residual_and_rejections():
    draft = torch.tensor([[[1.0, 0.0, 0.0]], [[0.0, 0.5, 0.5]]], device="cuda")
    target = torch.tensor(
        [[[0.0, 0.5, 0.5], [1.0, 0.0, 0.0]], [[0.0, 0.5, 0.5], [0.2, 0.3, 0.5]]], device="cuda"
    )
    ids = torch.tensor([[0], [1]], dtype=torch.int32, device="cuda")
    want = chain_speculative_sampling(draft, ids, target, seed=9, backend="torch")
    got = chain_speculative_sampling(draft, ids, target, seed=9)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


@pytest.mark.gpu
def test_cuda_graph_capture_and_compile():
    draft, ids, target = _inputs(4, 3, 1000, seed=21)
    draft, ids, target = draft.cuda(), ids.cuda(), target.cuda()
    seed, offset = torch.tensor([3], device="cuda"), torch.tensor([4], device="cuda")
    want = chain_speculative_sampling(draft, ids, target, seed=seed, offset=offset, backend="torch")
    chain_speculative_sampling(draft, ids, target, seed=seed, offset=offset)  # build first
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = chain_speculative_sampling(draft, ids, target, seed=seed, offset=offset)
    graph.replay()
    torch.cuda.synchronize()
    _assert_same_draws(got, want, draft, ids, target, [3], [4])
    compiled = torch.compile(
        lambda d, i, t: chain_speculative_sampling(d, i, t, seed=seed, offset=offset),
        fullgraph=True,
    )
    _assert_same_draws(compiled(draft, ids, target), want, draft, ids, target, [3], [4])


# ---- the CUDA kernel's paths: a cluster of C CTAs per request, each over a vocabulary slice ----


def _resident(draft: torch.Tensor, cluster: int) -> int:
    from kernels_speculative.ops import chain_speculative_sampling as m

    return int(m._chain_speculative_sampling_resident_clusters(draft, cluster))


def _expected_cluster(batch: int, vocab: int, like: torch.Tensor | None = None) -> int:
    """The host's choice: the largest C <= 8 whose clusters hold all B requests in one wave (as
    the occupancy API counts them) with slices of >= 4096 elements, else 1."""
    like = torch.empty(1, 1, 4, device="cuda") if like is None else like
    for c in range(8, 1, -1):
        if vocab >= c * 4096 and batch <= _resident(like, c):
            return c
    return 1


def _cluster_of(draft: torch.Tensor) -> int:
    from kernels_speculative.ops import chain_speculative_sampling as m

    return int(m._chain_speculative_sampling_cluster(draft))


def _in_clusters(draft, ids, target, seeds, offsets, cluster):
    """The CUDA kernel with `cluster` CTAs per request instead of the host's choice."""
    from kernels_speculative.ops import chain_speculative_sampling as m

    batch, n, _ = draft.shape
    outs = (
        torch.empty(batch, n + 1, dtype=torch.int32, device="cuda"),
        torch.empty(batch, dtype=torch.int32, device="cuda"),
        torch.empty(batch, dtype=torch.int32, device="cuda"),
    )
    m._chain_speculative_sampling_in_clusters(*outs, draft, ids, target, seeds, offsets, cluster)
    return outs


def _cuda_inputs(batch: int, n: int, vocab: int, seed: int, sharp: float = 2.0):
    """_inputs drawn on the GPU (the large batches of the cluster tests)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    draft = (torch.randn(batch, n, vocab, device="cuda", generator=g) * sharp).softmax(-1)
    target = (torch.randn(batch, n + 1, vocab, device="cuda", generator=g) * sharp).softmax(-1)
    ids = torch.multinomial(draft.reshape(-1, vocab), 1, generator=g).reshape(batch, n)
    return draft, ids.to(torch.int32), target


# (B, n, V): slices of one tile (16384 elements) kept in registers (C = 8 at V = 128256), of
# several tiles (smaller C at larger B), the scalar path (V odd).
CLUSTER_SHAPES = [
    (1, 1, 128_256),
    (1, 8, 128_256),
    (16, 8, 128_256),
    (33, 2, 128_256),
    (65, 1, 128_256),
    (2, 3, 32_003),
    (1, 2, 8192),
    (3, 4, 4096),
]


@pytest.mark.gpu
@pytest.mark.parametrize(("batch", "n", "vocab"), CLUSTER_SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_cuda_cluster_paths_match_reference(batch, n, vocab, dtype):
    draft, ids, target = _inputs(batch, n, vocab, seed=batch + n + vocab, sharp=2.0)
    draft, ids, target = draft.to("cuda", dtype), ids.cuda(), target.to("cuda", dtype)
    assert _cluster_of(draft) == _expected_cluster(batch, vocab, draft)
    for trial in range(6 if batch < 8 else 2):
        seeds = torch.arange(batch, dtype=torch.int64, device="cuda") * 5 + 100 * trial
        offsets = torch.tensor([trial], dtype=torch.int64, device="cuda")
        want = chain_speculative_sampling(
            draft, ids, target, seed=seeds, offset=offsets, backend="torch"
        )
        got = chain_speculative_sampling(draft, ids, target, seed=seeds, offset=offsets)
        _assert_same_draws(got, want, draft, ids, target, seeds.tolist(), offsets.tolist())
        again = chain_speculative_sampling(draft, ids, target, seed=seeds, offset=offsets)
        for x, y in zip(got, again, strict=True):
            assert torch.equal(x, y)  # the same seed draws the same tokens


@pytest.mark.gpu
@pytest.mark.parametrize("vocab", [128_256, 65_536, 32_003])
def test_cuda_draw_lands_in_every_slice(vocab):
    # Every draft accepted (draft == target on row 0), so the bonus comes from target row 1,
    # whose mass lies in one window: the draw must land there whichever CTA's slice holds it.
    base = torch.rand(1, 1, vocab, device="cuda").softmax(-1)
    ids = torch.tensor([[int(base[0, 0].argmax())]], dtype=torch.int32, device="cuda")
    cluster = _cluster_of(base)
    assert cluster == _expected_cluster(1, vocab, base)
    slice_len = -(-vocab // cluster)
    starts = [k * slice_len + 3 for k in range(cluster)] + [0, vocab - 1]
    for start in starts:
        stop = min(start + 40, vocab)
        target = torch.zeros(1, 2, vocab, device="cuda")
        target[:, 0] = base[:, 0]
        target[0, 1, start:stop] = torch.rand(stop - start, device="cuda") + 0.1
        for seed in range(3):
            tokens, accepted, emitted = chain_speculative_sampling(base, ids, target, seed=seed)
            want = chain_speculative_sampling(base, ids, target, seed=seed, backend="torch")
            assert accepted.item() == 1 and emitted.item() == 1
            assert start <= tokens[0, 1].item() < stop
            _assert_same_draws((tokens, accepted, emitted), want, base, ids, target, [seed], [0])


@pytest.mark.gpu
@pytest.mark.parametrize(("cluster", "n"), [(1, 1), (2, 1), (3, 2), (4, 1), (4, 8)])
def test_cuda_draw_in_every_tile_of_a_slice(cluster, n):
    # Forced C at V = 128256: slices of 8 (C = 1), 4, 3 and 2 tiles of 16384. The pass keeps up to
    # three leading tiles' weights in shared memory and the last in registers; the rest (C = 1)
    # are re-read. Row 0 rejected for sure (target 0 at the draft token), so the residual's mass
    # lies in one window: the draw must land there in whichever tile of rank 0's slice holds it.
    vocab, tile = 128_256, 16_384
    slice_len = -(-vocab // cluster)
    draft = torch.rand(1, n, vocab, device="cuda").softmax(-1)
    ids = torch.zeros(1, n, dtype=torch.int32, device="cuda")
    starts = [k * tile + 5 for k in range(-(-slice_len // tile))]
    for start in starts:
        stop = min(start + 64, vocab)
        target = torch.zeros(1, n + 1, vocab, device="cuda")
        target[0, 0, start:stop] = draft[0, 0, start:stop] + torch.rand(stop - start, device="cuda")
        target[:, 1:] = draft[:, :1]
        for seed in range(3):
            seeds = torch.tensor([seed], dtype=torch.int64, device="cuda")
            offsets = torch.tensor([2], dtype=torch.int64, device="cuda")
            got = _in_clusters(draft, ids, target, seeds, offsets, cluster)
            want = chain_speculative_sampling(
                draft, ids, target, seed=seeds, offset=offsets, backend="torch"
            )
            assert got[2].item() == 0 and start <= got[0][0, 0].item() < stop
            _assert_same_draws(got, want, draft, ids, target, [seed], [2])
            again = _in_clusters(draft, ids, target, seeds, offsets, cluster)
            for x, y in zip(got, again, strict=True):
                assert torch.equal(x, y)


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 40])
def test_cuda_zero_residual_at_full_vocab(batch):
    # Draft == target with the draft token's probability zeroed in both: rejected for sure
    # (u * 0 < 0 fails), and relu(target - draft) is 0 everywhere: the draw falls back to the
    # target row, which the drawing CTA re-reads.
    vocab = 128_256
    rows = torch.rand(batch, 1, vocab, device="cuda").softmax(-1)
    ids = torch.randint(0, vocab, (batch, 1), dtype=torch.int32, device="cuda")
    rows.scatter_(2, ids.long()[..., None], 0.0)
    target = torch.cat([rows, torch.rand(batch, 1, vocab, device="cuda").softmax(-1)], dim=1)
    seeds = torch.arange(batch, dtype=torch.int64, device="cuda") + 7
    want = chain_speculative_sampling(rows, ids, target, seed=seeds, offset=1, backend="torch")
    got = chain_speculative_sampling(rows, ids, target, seed=seeds, offset=1)
    assert got[1].tolist() == [0] * batch and got[2].tolist() == [0] * batch
    _assert_same_draws(got, want, rows, ids, target, seeds.tolist(), [1])


@pytest.mark.gpu
def test_cuda_graph_capture_of_the_cluster_launch():
    draft, ids, target = _inputs(1, 8, 128_256, seed=22, sharp=2.0)
    draft, ids, target = draft.cuda(), ids.cuda(), target.cuda()
    seed, offset = torch.tensor([3], device="cuda"), torch.tensor([4], device="cuda")
    assert _cluster_of(draft) == _expected_cluster(1, 128_256, draft)
    want = chain_speculative_sampling(draft, ids, target, seed=seed, offset=offset, backend="torch")
    eager = chain_speculative_sampling(draft, ids, target, seed=seed, offset=offset)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        got = chain_speculative_sampling(draft, ids, target, seed=seed, offset=offset)
    for s in (3, 11, 12):  # a new seed in place: the replay draws with it
        seed.fill_(s)
        graph.replay()
        torch.cuda.synchronize()
        for x, y in zip(
            got, chain_speculative_sampling(draft, ids, target, seed=s, offset=4), strict=True
        ):
            assert torch.equal(x, y)
    seed.fill_(3)
    graph.replay()
    torch.cuda.synchronize()
    for x, y in zip(got, eager, strict=True):
        assert torch.equal(x, y)
    _assert_same_draws(got, want, draft, ids, target, [3], [4])


@pytest.mark.gpu
def test_cuda_cluster_draws_follow_the_target_distribution():
    # The exactness property through the cluster path (B = 16, V = 128256: 8 CTAs per request):
    # six tokens spread over different slices carry all the mass.
    batch, n, vocab, calls = 16, 2, 128_256, 1500
    support = torch.tensor([5, 20_000, 40_001, 70_002, 100_003, 128_250])
    g = torch.Generator().manual_seed(1)
    d6 = (torch.randn(n, 6, generator=g) * 1.5).softmax(-1)
    t6 = (torch.randn(n + 1, 6, generator=g) * 1.5).softmax(-1)
    d = torch.zeros(n, vocab)
    t = torch.zeros(n + 1, vocab)
    d[:, support], t[:, support] = d6, t6
    draft = d.expand(batch, n, vocab).contiguous().cuda()
    target = t.expand(batch, n + 1, vocab).contiguous().cuda()
    assert _cluster_of(draft) == _expected_cluster(batch, vocab, draft)
    picks = torch.stack(
        [torch.multinomial(d6[i], batch * calls, True, generator=g) for i in range(n)], 1
    )
    ids = support[picks].to(torch.int32).cuda().reshape(calls, batch, n)
    tokens, emitted = [], []
    for c in range(calls):
        seeds = torch.arange(batch, dtype=torch.int64, device="cuda") + c * batch
        out, _, emi = chain_speculative_sampling(draft, ids[c], target, seed=seeds, offset=9)
        tokens.append(out)
        emitted.append(emi)
    tokens, emitted = torch.cat(tokens).cpu(), torch.cat(emitted).cpu()
    index = torch.full((vocab,), -1, dtype=torch.long)
    index[support] = torch.arange(6)
    for pos in range(n):
        here = emitted >= pos
        got = index[tokens[here, pos].long()]
        assert (got >= 0).all()  # only tokens with mass are ever drawn
        counts = torch.bincount(got, minlength=6).double()
        expected = t6[pos].double() * here.sum()
        chi2 = ((counts - expected) ** 2 / expected).sum().item()
        assert chi2 < 25.7, (pos, chi2)  # 5 degrees of freedom: P(chi2 > 25.7) ~ 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("batch", [1, 16, 32, 33, 64, 65, 133])
def test_cuda_cluster_choice_fills_one_wave(batch):
    # The chosen clusters hold the whole batch at once (no second wave of a few clusters), and
    # no larger cluster would.
    draft = torch.empty(batch, 1, 128_256, device="cuda")
    c = _cluster_of(draft)
    assert c == _expected_cluster(batch, 128_256, draft)
    assert 1 <= c <= 8 and _resident(draft, c) > 0
    if c > 1:
        assert batch <= _resident(draft, c)
    assert all(batch > _resident(draft, k) for k in range(c + 1, 9))


@pytest.mark.gpu
@pytest.mark.parametrize("n", [1, 8])
@pytest.mark.parametrize("batch", [1, 32, 33, 64])
def test_cuda_every_cluster_size_matches_reference(batch, n):
    # Every cluster size the host can choose (1..8 CTAs per request: slices of 1 to 8 tiles at
    # V = 128256), each against the reference and reproducible under its seeds.
    vocab = 128_256
    draft, ids, target = _cuda_inputs(batch, n, vocab, seed=batch * 10 + n)
    seeds = torch.arange(batch, dtype=torch.int64, device="cuda") * 7 + 1
    offsets = torch.tensor([3], dtype=torch.int64, device="cuda")
    want = chain_speculative_sampling(
        draft, ids, target, seed=seeds, offset=offsets, backend="torch"
    )
    sizes = [c for c in range(1, 9) if _resident(draft, c) > 0]
    assert sizes[:2] == [1, 2]
    for c in sizes:
        got = _in_clusters(draft, ids, target, seeds, offsets, c)
        _assert_same_draws(got, want, draft, ids, target, seeds.tolist(), offsets.tolist())
        again = _in_clusters(draft, ids, target, seeds, offsets, c)
        for x, y in zip(got, again, strict=True):
            assert torch.equal(x, y)


@pytest.mark.gpu
@pytest.mark.parametrize(("vocab", "cluster"), [(128_256, 1), (128_256, 3), (300_000, 1)])
@pytest.mark.parametrize("residual", [False, True])
def test_cuda_draw_lands_in_every_tile(vocab, cluster, residual):
    # Slices of several tiles (16384 elements): the draw starts at the tile the recorded tile
    # sums point to (past the 16 recorded tiles at V = 300000, C = 1), searched from registers
    # when it is the slice's last. The mass lies in one window; residual: the draft (one-hot on
    # a token the target lacks) is rejected for sure and relu(target - draft) is the window.
    draft = torch.zeros(1, 1, vocab, device="cuda")
    token = vocab // 2 + 1  # outside every window below
    ids = torch.tensor([[token]], dtype=torch.int32, device="cuda")
    seeds, offsets = torch.tensor([0], device="cuda"), torch.tensor([0], device="cuda")
    slice_len = -(-vocab // cluster)
    starts = sorted({k * 8192 + 5 for k in range(vocab // 8192)} | {slice_len - 20, vocab - 30})
    for start in starts:
        stop = min(start + 24, vocab)
        target = torch.zeros(1, 2, vocab, device="cuda")
        row = 0 if residual else 1
        if residual:
            draft[0, 0].zero_()
            draft[0, 0, token] = 1.0
        else:
            draft[0, 0].fill_(1.0 / vocab)
            target[0, 0] = draft[0, 0]
        target[0, row, start:stop] = torch.rand(stop - start, device="cuda") + 0.1
        for seed in range(3):
            seeds.fill_(seed)
            got = _in_clusters(draft, ids, target, seeds, offsets, cluster)
            want = chain_speculative_sampling(
                draft, ids, target, seed=seeds, offset=offsets, backend="torch"
            )
            assert got[2].item() == row
            assert start <= got[0][0, row].item() < stop, (start, seed)
            _assert_same_draws(got, want, draft, ids, target, [seed], [0])


@pytest.mark.gpu
def test_cuda_bad_cluster_size():
    draft, ids, target = _cuda_inputs(2, 1, 4096, seed=1)
    seeds, offsets = torch.tensor([1], device="cuda"), torch.tensor([0], device="cuda")
    for bad in (0, 9):
        with pytest.raises(ValueError, match="cluster size must"):
            _in_clusters(draft, ids, target, seeds, offsets, bad)
