"""lplb.lplb_dispatch: replica shares against hand-solved balancing problems (the optimum max GPU
load is known), feasibility on random EPLB-like layouts, and the dispatch draw: replicas of the
right expert only, frequencies following the shares, reproducibility, -1 for empty slots, the
equal-split fallback, empty input, bad input, opcheck."""

from __future__ import annotations

import pytest
import torch

from kernels_lplb import lplb_dispatch, reference
from kernels_lplb.ops.lplb_dispatch import replicated_layout

I32 = torch.int32


def gpu_loads(prob, log2phy, num_gpus, physical):
    loads = torch.zeros(num_gpus, dtype=torch.float64)
    per_gpu = physical // num_gpus
    for l, row in enumerate(log2phy.tolist()):
        for c, p in enumerate(row):
            if p >= 0:
                loads[p // per_gpu] += float(prob[l, c])
    return loads


def test_balanced_split_hand_example():
    # GPU 0 holds physical 0..2 (logical 0, 1, 2), GPU 1 holds 3..5 (logical 3, 0, 1).
    phy2log = torch.tensor([0, 1, 2, 3, 0, 1], dtype=I32)
    log2phy = torch.tensor([[0, 4], [1, 5], [2, -1], [3, -1]], dtype=I32)
    counts = torch.tensor([100, 50, 10, 10])
    topk = torch.randint(0, 4, (2000, 2), generator=torch.Generator().manual_seed(0), dtype=I32)
    phys, prob = lplb_dispatch(topk, phy2log, log2phy, 2, counts=counts, seed=3)
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


def test_single_copy_overload_sets_the_optimum():
    # Expert 0 (60%) lives only on GPU 0, so the best max load is 0.6: expert 1's replica on
    # GPU 0 must get nothing and its replica on GPU 1 all of expert 1's 30%.
    phy2log = torch.tensor([0, 1, 1, 2], dtype=I32)
    log2phy = torch.tensor([[0, -1], [1, 2], [3, -1]], dtype=I32)
    _, prob = lplb_dispatch(
        torch.zeros(1, 1, dtype=I32), phy2log, log2phy, 2, counts=torch.tensor([60, 30, 10])
    )
    assert torch.allclose(prob, torch.tensor([[0.6, 0.0], [0.0, 0.3], [0.1, 0.0]]), atol=1e-5)


@pytest.mark.parametrize(("experts", "extra", "gpus"), [(8, 4, 4), (32, 16, 8), (64, 8, 8)])
def test_random_layouts_are_feasible_and_no_worse_than_equal_split(experts, extra, gpus):
    phy2log, log2phy = replicated_layout(experts, extra, gpus, seed=experts)
    g = torch.Generator().manual_seed(extra)
    counts = torch.randint(0, 1000, (experts,), generator=g)
    topk = torch.randint(0, experts, (256, 8), generator=g, dtype=I32)
    phys, prob = lplb_dispatch(topk, phy2log, log2phy, gpus, counts=counts, seed=1)
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


def test_reproducible_negative_slots_and_default_counts():
    phy2log, log2phy = replicated_layout(16, 8, 4, seed=2)
    topk = torch.randint(-1, 16, (100, 4), generator=torch.Generator().manual_seed(3), dtype=I32)
    a, prob = lplb_dispatch(topk, phy2log, log2phy, 4, seed=9)
    b, _ = lplb_dispatch(topk, phy2log, log2phy, 4, seed=9)
    c, _ = lplb_dispatch(topk, phy2log, log2phy, 4, seed=10)
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


def test_empty_and_bad_input():
    phy2log, log2phy = replicated_layout(8, 4, 4, seed=4)
    phys, prob = lplb_dispatch(torch.empty(0, 8, dtype=I32), phy2log, log2phy, 4)
    assert phys.shape == (0, 8) and prob.shape == log2phy.shape
    topk = torch.zeros(3, 2, dtype=I32)
    with pytest.raises(ValueError, match=r"num_gpus must be >= 1 and divide Pe = 12, got 5"):
        lplb_dispatch(topk, phy2log, log2phy, 5)
    with pytest.raises(ValueError, match=r"topk_ids must be < L = 8 \(or negative\), got 8"):
        lplb_dispatch(topk + 8, phy2log, log2phy, 4)
    with pytest.raises(ValueError, match=r"counts must have L = 8 entries, got 3"):
        lplb_dispatch(topk, phy2log, log2phy, 4, counts=torch.ones(3))
    with pytest.raises(ValueError, match=r"log2phy must hold physical ids in \[0, 12\) or -1"):
        lplb_dispatch(topk, phy2log, log2phy + 20, 4)


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
        7,
        None,
    )
    torch.library.opcheck(LPLB_DISPATCH.torch_op, args)
