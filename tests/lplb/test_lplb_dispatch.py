"""lplb.lplb_dispatch: replica shares against hand-solved balancing problems (the optimum max GPU
load is known), feasibility on random EPLB-like layouts, and the dispatch draw: replicas of the
right expert only, frequencies following the shares, reproducibility, -1 for empty slots, the
equal-split fallback, empty input, bad input, opcheck.

The layout rules (phy2log in [0, L), log2phy its exact inverse, every expert placed) are checked by
the reference always and by validate=True; the CUDA backend (one CTA for the LP, a thread per slot
for the draw) is compared with the reference: shares to 1e-5, and the draw bit for bit against
reference.dispatch_draw on the kernel's shares (same fp32 prefix sums, same project RNG)."""

from __future__ import annotations

import warnings

import pytest
import torch

from kernels_lplb import lplb_dispatch, reference
from kernels_lplb.ops import lplb_dispatch as dispatch_module
from kernels_lplb.ops.lplb_dispatch import replicated_layout
from shared.testing.devices import GPU

I32 = torch.int32
DEVICES = [pytest.param("cpu", id="cpu"), GPU]


def gpu_loads(prob, log2phy, num_gpus, physical):
    loads = torch.zeros(num_gpus, dtype=torch.float64)
    per_gpu = physical // num_gpus
    for l, row in enumerate(log2phy.tolist()):
        for c, p in enumerate(row):
            if p >= 0:
                loads[p // per_gpu] += float(prob[l, c])
    return loads


@pytest.mark.parametrize("device", DEVICES)
def test_balanced_split_hand_example(device):
    # GPU 0 holds physical 0..2 (logical 0, 1, 2), GPU 1 holds 3..5 (logical 3, 0, 1).
    phy2log = torch.tensor([0, 1, 2, 3, 0, 1], dtype=I32)
    log2phy = torch.tensor([[0, 4], [1, 5], [2, -1], [3, -1]], dtype=I32)
    counts = torch.tensor([100, 50, 10, 10])
    topk = torch.randint(0, 4, (2000, 2), generator=torch.Generator().manual_seed(0), dtype=I32)
    phys, prob = lplb_dispatch(
        *(t.to(device) for t in (topk, phy2log, log2phy)), 2, counts=counts.to(device), seed=3
    )
    phys, prob = phys.cpu(), prob.cpu()
    t = counts.double() / counts.sum()
    assert torch.allclose(prob.double().sum(dim=1), t, atol=1e-5)
    assert prob[2, 1] == 0 and prob[3, 1] == 0
    assert torch.allclose(
        gpu_loads(prob, log2phy, 2, 6), torch.tensor([0.5, 0.5]).double(), atol=1e-5
    )
    assert torch.equal(phy2log[phys.long()], topk)  # every slot goes to a copy of its expert
    for l in (0, 1):  # frequencies follow the shares (5 sigma)
        slots = topk == l
        on_first = (phys[slots] == log2phy[l, 0]).double().mean().item()
        share = float(prob[l, 0] / prob[l].sum())
        n = int(slots.sum())
        assert abs(on_first - share) < 5 * (share * (1 - share) / n) ** 0.5 + 1e-9


@pytest.mark.parametrize("device", DEVICES)
def test_single_copy_overload_sets_the_optimum(device):
    # Expert 0 (60%) lives only on GPU 0, so the best max load is 0.6: expert 1's replica on
    # GPU 0 must get nothing and its replica on GPU 1 all of expert 1's 30%.
    phy2log = torch.tensor([0, 1, 1, 2], dtype=I32, device=device)
    log2phy = torch.tensor([[0, -1], [1, 2], [3, -1]], dtype=I32, device=device)
    _, prob = lplb_dispatch(
        torch.zeros(1, 1, dtype=I32, device=device),
        phy2log,
        log2phy,
        2,
        counts=torch.tensor([60, 30, 10], device=device),
    )
    prob = prob.cpu()
    assert torch.allclose(prob, torch.tensor([[0.6, 0.0], [0.0, 0.3], [0.1, 0.0]]), atol=1e-5)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("experts", "extra", "gpus"), [(8, 4, 4), (32, 16, 8), (64, 8, 8)])
def test_random_layouts_are_feasible_and_no_worse_than_equal_split(experts, extra, gpus, device):
    phy2log, log2phy = replicated_layout(experts, extra, gpus, seed=experts)
    g = torch.Generator().manual_seed(extra)
    counts = torch.randint(0, 1000, (experts,), generator=g)
    topk = torch.randint(0, experts, (256, 8), generator=g, dtype=I32)
    phys, prob = lplb_dispatch(
        *(t.to(device) for t in (topk, phy2log, log2phy)), gpus, counts=counts.to(device), seed=1
    )
    phys, prob = phys.cpu(), prob.cpu()
    t = counts.double() / counts.sum()
    assert torch.allclose(prob.double().sum(dim=1), t, atol=1e-5)
    assert (prob >= 0).all() and (prob[log2phy < 0] == 0).all()
    copies = (log2phy >= 0).sum(dim=1, keepdim=True)
    equal = torch.where(log2phy >= 0, t[:, None] / copies, 0.0)
    physical = phy2log.shape[0]
    best = gpu_loads(prob, log2phy, gpus, physical).max()
    assert best <= gpu_loads(equal, log2phy, gpus, physical).max() + 1e-5
    assert best >= t.sum() / gpus - 1e-5
    assert torch.equal(phy2log[phys.long()], topk)


@pytest.mark.parametrize("device", DEVICES)
def test_reproducible_negative_slots_and_default_counts(device):
    phy2log, log2phy = replicated_layout(16, 8, 4, seed=2)
    topk = torch.randint(-1, 16, (100, 4), generator=torch.Generator().manual_seed(3), dtype=I32)
    args = [t.to(device) for t in (topk, phy2log, log2phy)]
    a, prob = lplb_dispatch(*args, 4, seed=9)
    b, _ = lplb_dispatch(*args, 4, seed=9)
    c, _ = lplb_dispatch(*args, 4, seed=10)
    a, b, c, prob = a.cpu(), b.cpu(), c.cpu(), prob.cpu()
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert ((a == -1) == (topk < 0)).all()
    counts = torch.bincount(topk[topk >= 0].long(), minlength=16)
    assert torch.allclose(prob.sum(dim=1).double(), counts.double() / counts.sum(), atol=1e-5)


def test_zero_load_and_lp_failure_fallback(monkeypatch):
    phy2log = torch.tensor([0, 1, 0, 1], dtype=I32)
    log2phy = torch.tensor([[0, 2], [1, 3]], dtype=I32)
    topk = torch.tensor([[0, 1]], dtype=I32)
    phys, prob = lplb_dispatch(topk, phy2log, log2phy, 2, counts=torch.tensor([0, 0]))
    assert not prob.any() and phys.tolist() == [[0, 1]]  # no load anywhere: column 0

    def not_converged(a, b, c, **kwargs):
        return torch.zeros(a.shape[0], a.shape[2]), torch.ones(a.shape[0], dtype=I32)

    monkeypatch.setattr(reference, "solve_lp", not_converged)
    _, prob = lplb_dispatch(topk, phy2log, log2phy, 2, counts=torch.tensor([30, 10]))
    assert torch.allclose(prob, torch.tensor([[0.375, 0.375], [0.125, 0.125]]))


@pytest.mark.parametrize("device", DEVICES)
def test_empty_and_bad_input(device):
    phy2log, log2phy = replicated_layout(8, 4, 4, seed=4)
    phy2log, log2phy = phy2log.to(device), log2phy.to(device)
    phys, prob = lplb_dispatch(torch.empty(0, 8, dtype=I32, device=device), phy2log, log2phy, 4)
    assert phys.shape == (0, 8) and prob.shape == log2phy.shape
    topk = torch.zeros(3, 2, dtype=I32, device=device)
    v = {"validate": True}
    with pytest.raises(ValueError, match=r"num_gpus must be >= 1 and divide Pe = 12, got 5"):
        lplb_dispatch(topk, phy2log, log2phy, 5)
    with pytest.raises(ValueError, match=r"topk_ids must be < L = 8 \(or negative\), got 8"):
        lplb_dispatch(topk + 8, phy2log, log2phy, 4, **v)
    with pytest.raises(ValueError, match=r"counts must have L = 8 entries, got 3"):
        lplb_dispatch(topk, phy2log, log2phy, 4, counts=torch.ones(3, device=device))
    with pytest.raises(ValueError, match=r"log2phy must hold physical ids in \[0, 12\) or -1"):
        lplb_dispatch(topk, phy2log, log2phy + 20, 4, **v)
    with pytest.raises(TypeError, match=r"topk_ids must have dtype"):
        lplb_dispatch(topk.float(), phy2log, log2phy, 4)
    with pytest.raises(ValueError, match=r"phy2log must have 1 dim"):
        lplb_dispatch(topk, phy2log[None], log2phy, 4)
    with pytest.raises(TypeError, match=r"validate must be a bool"):
        lplb_dispatch(topk, phy2log, log2phy, 4, validate=1)


def _bad_layouts():
    """(phy2log, log2phy, message) triples that break one layout rule each (L = 3, Pe = 4)."""
    good_p2l = torch.tensor([0, 1, 1, 2], dtype=I32)
    good_l2p = torch.tensor([[0, -1], [1, 2], [3, -1]], dtype=I32)
    return [
        (torch.tensor([0, -1, 1, 2], dtype=I32), good_l2p, r"phy2log must hold logical ids"),
        (torch.tensor([0, 1, 7, 2], dtype=I32), good_l2p, r"phy2log\[2\] = 7"),
        # A permuted phy2log (log2phy left as it was): the maps disagree.
        (torch.tensor([1, 0, 1, 2], dtype=I32), good_l2p, r"log2phy and phy2log disagree"),
        # Slot 3 listed twice, slot 0 never.
        (good_p2l, torch.tensor([[3, -1], [1, 2], [3, -1]], dtype=I32), r"exactly once"),
        # Expert 2 has no slot (slot 3 belongs to expert 0).
        (
            torch.tensor([0, 1, 1, 0], dtype=I32),
            torch.tensor([[0, 3], [1, 2], [-1, -1]], dtype=I32),
            r"logical expert 2 has no physical slot",
        ),
    ]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", range(5))
def test_layout_is_validated(device, case):
    phy2log, log2phy, message = _bad_layouts()[case]
    topk = torch.zeros(4, 2, dtype=I32, device=device)
    args = (topk, phy2log.to(device), log2phy.to(device), 2)
    with pytest.raises(ValueError, match=message):
        lplb_dispatch(*args, validate=True)
    with pytest.raises(ValueError, match=message):  # the reference always checks
        lplb_dispatch(*args, backend="torch")


@pytest.mark.gpu
@pytest.mark.parametrize("case", range(5))
def test_cuda_bad_layout_without_validate_is_loud(case):
    # No host sync on the CUDA path: the kernel finds the broken layout itself and poisons the
    # outputs (NaN shares, -1 ids) instead of reading out of bounds or returning plausible ids.
    phy2log, log2phy, _ = _bad_layouts()[case]
    topk = torch.tensor([[0, 1], [2, -1]], dtype=I32, device="cuda")
    phys, prob = lplb_dispatch(topk, phy2log.cuda(), log2phy.cuda(), 2, backend="cuda")
    assert prob.isnan().all() and (phys == -1).all()


@pytest.mark.parametrize("device", DEVICES)
def test_phy2log_decides_the_gpu_loads(device):
    # The same experts, placed differently: in layout A expert 0's only slot shares GPU 0 with a
    # copy of expert 1; in layout B (a consistent relabelling of the slots) expert 0 sits with
    # expert 2 on GPU 1, and expert 1 has one copy per GPU. The optimum follows phy2log.
    counts = torch.tensor([60, 30, 10], device=device)
    topk = torch.zeros(1, 1, dtype=I32, device=device)
    a_p2l = torch.tensor([0, 1, 1, 2], dtype=I32, device=device)
    a_l2p = torch.tensor([[0, -1], [1, 2], [3, -1]], dtype=I32, device=device)
    _, prob_a = lplb_dispatch(topk, a_p2l, a_l2p, 2, counts=counts)
    assert torch.allclose(
        prob_a.cpu(), torch.tensor([[0.6, 0.0], [0.0, 0.3], [0.1, 0.0]]), atol=1e-5
    )
    b_p2l = torch.tensor([1, 1, 0, 2], dtype=I32, device=device)  # GPU 0: 1, 1; GPU 1: 0, 2
    b_l2p = torch.tensor([[2, -1], [0, 1], [3, -1]], dtype=I32, device=device)
    _, prob_b = lplb_dispatch(topk, b_p2l, b_l2p, 2, counts=counts)
    assert torch.allclose(prob_b.cpu().sum(dim=1), torch.tensor([0.6, 0.3, 0.1]), atol=1e-5)
    assert torch.allclose(prob_b.cpu()[0], torch.tensor([0.6, 0.0]), atol=1e-5)


def test_opcheck():
    from kernels_lplb.ops.lplb_dispatch import LPLB_DISPATCH

    phy2log, log2phy = replicated_layout(8, 4, 4, seed=5)
    topk = torch.randint(0, 8, (16, 2), generator=torch.Generator().manual_seed(0), dtype=I32)
    args = (
        torch.empty(16, 2, dtype=I32),
        torch.empty(log2phy.shape),
        topk,
        phy2log,
        log2phy,
        4,
        None,
        None,
        7,
        None,
    )
    torch.library.opcheck(LPLB_DISPATCH.torch_op, args)
    shares, _ = reference.replica_shares(phy2log, log2phy, 4, torch.ones(8))
    with_shares = (*args[:7], shares, 7, None)
    torch.library.opcheck(LPLB_DISPATCH.torch_op, with_shares)


def _case(experts, extra, gpus, tokens, k, seed, index_dtype=I32):
    phy2log, log2phy = replicated_layout(experts, extra, gpus, seed=seed)
    g = torch.Generator().manual_seed(seed)
    topk = torch.randint(-1, experts, (tokens, k), generator=g, dtype=I32)
    counts = torch.randint(0, 5000, (experts,), generator=g)
    return topk.to(index_dtype), phy2log.to(index_dtype), log2phy.to(index_dtype), counts


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("experts", "extra", "gpus", "tokens", "k"),
    [
        (256, 32, 8, 8192, 8),  # DeepSeek-V3 EP intra-node, T k = 64K
        (256, 32, 8, 1, 8),
        (256, 32, 32, 64, 8),
        (16, 8, 4, 1, 1),
        (64, 8, 8, 100, 6),
        (96, 60, 3, 33, 5),  # odd sizes, three copies of some experts
        (128, 64, 16, 1000, 3),
    ],
)
@pytest.mark.parametrize("counts_kind", ["none", "int64", "int32", "float32"])
def test_cuda_matches_reference(experts, extra, gpus, tokens, k, counts_kind):
    topk, phy2log, log2phy, counts = _case(experts, extra, gpus, tokens, k, seed=experts + k)
    given = None if counts_kind == "none" else counts.to(getattr(torch, counts_kind))
    want_phys, want_prob = lplb_dispatch(
        topk, phy2log, log2phy, gpus, counts=given, seed=5, backend="torch"
    )
    phys = torch.full((tokens, k), -7, dtype=I32, device="cuda")
    prob = torch.full(log2phy.shape, float("nan"), device="cuda")
    dispatch_module._lplb_dispatch_cuda(
        phys, prob, topk.cuda(), phy2log.cuda(), log2phy.cuda(), gpus,
        None if given is None else given.cuda(), None, 5,
    )  # fmt: skip
    prob, phys = prob.cpu(), phys.cpu()
    assert torch.allclose(prob, want_prob, atol=1e-5, rtol=0)
    assert (prob[log2phy < 0] == 0).all()
    # The draw on the kernel's own shares is bit for bit the reference's.
    assert torch.equal(phys, reference.dispatch_draw(topk, log2phy, prob, 5))
    assert torch.equal(phys == -1, topk < 0)
    assert torch.equal(phy2log.long()[phys[topk >= 0].long()], topk[topk >= 0].long())
    # Shares close to the reference's: the draws agree but for slots near a CDF boundary.
    assert (phys != want_phys).double().mean() < 1e-2


@pytest.mark.gpu
def test_cuda_int64_indices_and_out_of_range_ids():
    topk, phy2log, log2phy, counts = _case(32, 8, 4, 50, 4, seed=3, index_dtype=torch.int64)
    _, want_prob = lplb_dispatch(topk, phy2log, log2phy, 4, counts=counts, seed=2)
    topk_c = topk.cuda()
    phys, prob = lplb_dispatch(
        topk_c, phy2log.cuda(), log2phy.cuda(), 4, counts=counts.cuda(), seed=2
    )
    assert torch.allclose(prob.cpu(), want_prob, atol=1e-5, rtol=0)
    assert torch.equal(phys.cpu(), reference.dispatch_draw(topk, log2phy, prob.cpu(), 2))
    topk_c[0, 0] = 32  # >= L without validate: that slot gets -1, no fault
    phys, _ = lplb_dispatch(topk_c, phy2log.cuda(), log2phy.cuda(), 4, counts=counts.cuda(), seed=2)
    assert phys[0, 0] == -1


def _check_graph_and_compile(dispatch, args, want) -> None:
    """``dispatch(*args)`` captured in a CUDA graph and under torch.compile(fullgraph=True) gives
    ``want`` (ids and shares) exactly."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        phys, prob = dispatch(*args)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(phys, want[0]) and torch.equal(prob, want[1])
    phys, prob = torch.compile(dispatch, fullgraph=True)(*args)
    assert torch.equal(phys, want[0]) and torch.equal(prob, want[1])


@pytest.mark.gpu
def test_cuda_deterministic_graph_and_compile():
    topk, phy2log, log2phy, counts = (t.cuda() for t in _case(256, 32, 8, 512, 8, seed=1))
    want = lplb_dispatch(topk, phy2log, log2phy, 8, counts=counts, seed=11)
    for _ in range(3):  # every rank computes the same shares and ids
        again = lplb_dispatch(topk, phy2log, log2phy, 8, counts=counts, seed=11)
        assert torch.equal(want[0], again[0]) and torch.equal(want[1], again[1])
    _check_graph_and_compile(
        lambda t, p, l, c: lplb_dispatch(t, p, l, 8, counts=c, seed=11),
        (topk, phy2log, log2phy, counts),
        want,
    )


def test_cuda_eligibility():
    e = dispatch_module._lplb_dispatch_cuda_eligible
    phy2log, log2phy = replicated_layout(16, 8, 4)
    topk = torch.zeros(4, 2, dtype=I32)
    outs = (torch.empty(4, 2, dtype=I32), torch.empty(log2phy.shape))
    assert e(*outs, topk, phy2log, log2phy, 4, None, None, 0) is None
    assert "contiguous" in e(*outs, topk.t().contiguous().t(), phy2log, log2phy, 4, None, None, 0)
    big_p2l = torch.zeros(1000, dtype=I32)
    big_l2p = torch.zeros(16, 2, dtype=I32)
    reason = e(*outs, topk, big_p2l, big_l2p, 4, None, None, 0)
    assert "shared memory" in reason
    # Given shares there is no LP, so no shared-memory limit; they must be contiguous.
    shares = torch.zeros(16, 2)
    assert e(*outs, topk, big_p2l, big_l2p, 4, None, shares, 0) is None
    wide = torch.zeros(2, 16).t()
    assert "contiguous" in e(*outs, topk, big_p2l, big_l2p, 4, None, wide, 0)


@pytest.mark.gpu
def test_cuda_fallback_runs_the_reference():
    # Pe - L too large for the shared-memory LP: the reference runs (with a fallback warning).
    topk, phy2log, log2phy, counts = _case(16, 300, 4, 20, 2, seed=4)
    want = lplb_dispatch(topk, phy2log, log2phy, 4, counts=counts, seed=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        got = lplb_dispatch(
            topk.cuda(), phy2log.cuda(), log2phy.cuda(), 4, counts=counts.cuda(), seed=1
        )
    assert torch.allclose(got[1].cpu(), want[1], atol=1e-5)


# --- shares given: the draw alone --------------------------------------------------------------


@pytest.mark.parametrize(("experts", "extra", "gpus"), [(8, 4, 4), (32, 16, 8), (96, 60, 3)])
def test_reference_with_the_lp_shares_is_the_reference_without(experts, extra, gpus):
    topk, phy2log, log2phy, counts = _case(experts, extra, gpus, 200, 4, seed=experts)
    for given in (counts, None):
        want_phys, want_prob = reference.lplb_dispatch(topk, phy2log, log2phy, gpus, given, 3)
        phys, prob = reference.lplb_dispatch(topk, phy2log, log2phy, gpus, seed=3, shares=want_prob)
        assert torch.equal(phys, want_phys) and torch.equal(prob, want_prob)
        assert prob.data_ptr() != want_prob.data_ptr()


@pytest.mark.parametrize("device", DEVICES)
def test_shares_reuse_one_lp_for_many_draws(device):
    # One LP per step, then the draw for every layer / micro-batch: the same ids as the full op
    # on each batch, and log2phy_prob a copy of the shares (not the same storage).
    phy2log, log2phy = (t.to(device) for t in replicated_layout(32, 16, 8, seed=6))
    counts = torch.randint(1, 1000, (32,), generator=torch.Generator().manual_seed(6))
    _, shares = lplb_dispatch(
        torch.zeros(1, 1, dtype=I32, device=device), phy2log, log2phy, 8, counts=counts.to(device)
    )
    kept = shares.clone()
    g = torch.Generator().manual_seed(7)
    for batch in range(3):
        topk = torch.randint(-1, 32, (64 + batch, 6), generator=g, dtype=I32).to(device)
        phys, prob = lplb_dispatch(topk, phy2log, log2phy, 8, shares=shares, seed=batch)
        assert torch.equal(prob, shares) and prob.data_ptr() != shares.data_ptr()
        want = reference.dispatch_draw(topk.cpu(), log2phy.cpu(), shares.cpu(), batch)
        assert torch.equal(phys.cpu(), want)
        prob.fill_(-1.0)  # the output is the caller's: the shares stay as they were
        assert torch.equal(shares, kept)


def test_shares_validated_before_any_launch(monkeypatch):
    phy2log, log2phy = replicated_layout(8, 4, 4, seed=4)
    topk = torch.zeros(3, 2, dtype=I32)
    good, _ = reference.replica_shares(phy2log, log2phy, 4, torch.ones(8))

    def launched(*args, **kwargs):
        raise AssertionError("launched before the shares were validated")

    monkeypatch.setattr(dispatch_module.LPLB_DISPATCH, "run", launched)
    cases = [
        (good.double(), TypeError, r"lplb_dispatch: shares must have dtype in \(float32\)"),
        (good.half(), TypeError, r"shares must have dtype in \(float32\), got float16"),
        (good[:, :1].contiguous(), ValueError, r"shares must have the shape of log2phy"),
        (good.t().contiguous(), ValueError, r"\[L, Cmax\] = \[8, \d+\], got \[\d+, 8\]"),
        (good[None], ValueError, r"shares must have 2 dims, got shape \(1, 8, "),
        (good.flatten(), ValueError, r"shares must have 2 dims"),
        (torch.zeros(2, 8).t(), ValueError, r"shares must be contiguous"),
        (good.to("meta"), ValueError, r"shares is on meta, expected cpu"),
        (good.tolist(), TypeError, r"shares must be a torch.Tensor, got list"),
    ]
    for shares, error, message in cases:
        with pytest.raises(error, match=message):
            lplb_dispatch(topk, phy2log, log2phy, 4, shares=shares)
    with pytest.raises(ValueError, match=r"counts and shares are exclusive"):
        lplb_dispatch(topk, phy2log, log2phy, 4, counts=torch.ones(8), shares=good)


@pytest.mark.parametrize("device", DEVICES)
def test_shares_values_checked_by_validate_and_the_reference(device):
    phy2log, log2phy = replicated_layout(8, 4, 4, seed=4)
    good, _ = reference.replica_shares(phy2log, log2phy, 4, torch.ones(8))
    topk = torch.zeros(3, 2, dtype=I32, device=device)
    args = (topk, phy2log.to(device), log2phy.to(device), 4)
    padded = tuple(int(i) for i in torch.nonzero(log2phy < 0)[0])
    nan, negative, on_padding = good.clone(), good.clone(), good.clone()
    nan[0, 0] = float("nan")
    negative[1, 0] = -0.5
    on_padding[padded] = 0.25
    cases = [
        (nan, r"shares must be finite, got 1 NaN/inf"),
        (negative, r"shares must be >= 0, got a minimum of -0.5"),
        (on_padding, rf"shares must be 0 where log2phy is -1, got shares\[{padded[0]}, "),
    ]
    for shares, message in cases:
        with pytest.raises(ValueError, match=message):
            lplb_dispatch(*args, shares=shares.to(device), validate=True)
        with pytest.raises(ValueError, match=message):  # the reference always checks
            lplb_dispatch(*args, shares=shares.to(device), backend="torch")
    # The layout is still checked (reference, validate=True) when the LP is skipped.
    with pytest.raises(ValueError, match=r"log2phy must hold physical ids"):
        lplb_dispatch(*args[:2], args[2] + 20, 4, shares=good.to(device), backend="torch")


def test_shares_empty_tokens_still_return_them():
    phy2log, log2phy = replicated_layout(8, 4, 4, seed=4)
    shares, _ = reference.replica_shares(phy2log, log2phy, 4, torch.arange(8))
    phys, prob = lplb_dispatch(torch.empty(0, 8, dtype=I32), phy2log, log2phy, 4, shares=shares)
    assert phys.shape == (0, 8) and torch.equal(prob, shares)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("experts", "extra", "gpus", "tokens", "k"),
    [
        (256, 32, 8, 8192, 8),  # DeepSeek-V3 EP intra-node, T k = 64K
        (256, 32, 8, 1, 8),
        (16, 8, 4, 1, 1),
        (96, 60, 3, 33, 5),
        (16, 300, 4, 20, 2),  # Pe - L too large for the LP's shared memory: the draw still runs
        (256, 32, 8, 0, 8),  # no slots: the shares are still copied
    ],
)
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_cuda_shares_draw_matches_reference(experts, extra, gpus, tokens, k, index_dtype):
    topk, phy2log, log2phy, counts = _case(experts, extra, gpus, tokens, k, experts, index_dtype)
    shares, _ = reference.replica_shares(phy2log, log2phy, gpus, counts)
    want_phys, want_prob = reference.lplb_dispatch(topk, phy2log, log2phy, gpus, None, 5, shares)
    phys = torch.full((tokens, k), -7, dtype=I32, device="cuda")
    prob = torch.full(log2phy.shape, float("nan"), device="cuda")
    dispatch_module._lplb_dispatch_cuda(
        phys, prob, topk.cuda(), phy2log.cuda(), log2phy.cuda(), gpus, None, shares.cuda(), 5
    )
    assert torch.equal(prob.cpu(), want_prob) and torch.equal(phys.cpu(), want_phys)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the CUDA backend takes it: no fallback warning
        phys, prob = lplb_dispatch(
            topk.cuda(), phy2log.cuda(), log2phy.cuda(), gpus, shares=shares.cuda(), seed=5
        )
    assert torch.equal(prob.cpu(), want_prob) and torch.equal(phys.cpu(), want_phys)


@pytest.mark.gpu
def test_cuda_shares_equal_the_full_op_and_checks_in_the_kernel_function():
    topk, phy2log, log2phy, counts = (t.cuda() for t in _case(64, 8, 8, 100, 6, seed=2))
    phys, shares = lplb_dispatch(topk, phy2log, log2phy, 8, counts=counts, seed=4)
    again, prob = lplb_dispatch(topk, phy2log, log2phy, 8, shares=shares, seed=4)
    assert torch.equal(again, phys) and torch.equal(prob, shares)
    assert prob.data_ptr() != shares.data_ptr()
    # The compiled function checks the shares itself (for callers bypassing Python).
    raw = dispatch_module._lplb_dispatch_cuda
    outs = (torch.empty_like(topk, dtype=I32), torch.empty(log2phy.shape, device="cuda"))
    with pytest.raises(ValueError, match=r"counts and shares are exclusive"):
        raw(*outs, topk, phy2log, log2phy, 8, counts, shares, 4)
    with pytest.raises(TypeError, match=r"shares must be float32"):
        raw(*outs, topk, phy2log, log2phy, 8, None, shares.double(), 4)
    with pytest.raises(ValueError, match=r"shares"):
        raw(*outs, topk, phy2log, log2phy, 8, None, shares[:, :1].contiguous(), 4)
    with pytest.raises(ValueError, match=r"shares"):
        raw(*outs, topk, phy2log, log2phy, 8, None, shares.t().contiguous().t(), 4)
    # Without validate, a NaN row gives -1 for that expert's slots (no fault, as for the LP's
    # rejected layouts); the others draw as before.
    expert = int(topk[topk >= 0][0])
    poisoned = shares.clone()
    poisoned[expert] = float("nan")
    ids, _ = lplb_dispatch(topk, phy2log, log2phy, 8, shares=poisoned, seed=4)
    hit = topk == expert
    assert (ids[hit] == -1).all() and torch.equal(ids[~hit], phys[~hit])


@pytest.mark.gpu
def test_cuda_shares_graph_and_compile():
    topk, phy2log, log2phy, counts = (t.cuda() for t in _case(256, 32, 8, 512, 8, seed=1))
    _, shares = lplb_dispatch(topk, phy2log, log2phy, 8, counts=counts, seed=11)
    want = lplb_dispatch(topk, phy2log, log2phy, 8, shares=shares, seed=11)
    _check_graph_and_compile(
        lambda t, p, l, s: lplb_dispatch(t, p, l, 8, shares=s, seed=11),
        (topk, phy2log, log2phy, shares),
        want,
    )
