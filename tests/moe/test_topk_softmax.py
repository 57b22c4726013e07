"""moe.topk_softmax against a float64 oracle with explicit per-row selection: Mixtral, Qwen3 and
non-power-of-two expert counts, softcapping, correction bias, renormalisation, exact ties, NaN rows,
empty input, bad arguments, opcheck and torch.compile."""

from __future__ import annotations

import math

import pytest
import torch

from kernels_moe import reference, topk_softmax
from shared.testing.compare import assert_close


def _spaced_logits(tokens: int, experts: int, seed: int) -> torch.Tensor:
    """Distinct logits at least 0.01 apart in every row, so fp32 and fp64 agree on the order."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randperm(experts, generator=g).float() * 0.05 for _ in range(tokens)]
    return torch.stack(rows) - 0.025 * experts if rows else torch.empty(0, experts)


def _expected(gating, k, renormalize, softcap=0.0, bias=None):
    weights, ids = [], []
    for row in gating.double().tolist():
        logits = [softcap * math.tanh(v / softcap) if softcap else v for v in row]
        if bias is not None:
            logits = [v + b for v, b in zip(logits, bias.double().tolist(), strict=True)]
        peak = max(logits)
        exps = [math.exp(v - peak) for v in logits]
        probs = [e / sum(exps) for e in exps]
        chosen = sorted(range(len(probs)), key=lambda e: (-probs[e], e))[:k]
        w = [probs[e] for e in chosen]
        if renormalize:
            w = [v / sum(w) for v in w]
        weights.append(w)
        ids.append(chosen)
    return (
        torch.tensor(weights, dtype=torch.float64).reshape(-1, k),
        torch.tensor(ids, dtype=torch.int32).reshape(-1, k),
    )


def _run(gating, k, renormalize=False, **kwargs):
    w = torch.full((gating.shape[0], k), float("nan"))
    ids = torch.full((gating.shape[0], k), -7, dtype=torch.int32)
    out = topk_softmax(w, ids, gating, renormalize, **kwargs)
    assert out[0] is w and out[1] is ids
    return w, ids


CONFIGS = (  # (T, E, k): Mixtral, Qwen3-MoE, GPT-OSS, non-power-of-two E, k = E, one expert
    (5, 8, 2),
    (9, 128, 8),
    (4, 128, 4),
    (7, 60, 6),
    (3, 6, 6),
    (2, 1, 1),
)


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("renormalize", (False, True))
def test_matches_float64_oracle(dtype, config, renormalize):
    tokens, experts, k = config
    gating = _spaced_logits(tokens, experts, seed=experts).to(dtype)
    w, ids = _run(gating, k, renormalize)
    w_ref, ids_ref = _expected(gating, k, renormalize)
    assert_close(ids, ids_ref)
    assert_close(w, w_ref.float())


def test_softcap_and_correction_bias():
    gating = _spaced_logits(6, 32, seed=1) * 4
    bias = torch.linspace(-0.3, 0.3, 32)[
        torch.randperm(32, generator=torch.Generator().manual_seed(2))
    ]
    w, ids = _run(gating, 4, True, moe_softcapping=3.0, correction_bias=bias)
    w_ref, ids_ref = _expected(gating, 4, True, softcap=3.0, bias=bias)
    assert_close(ids, ids_ref)
    assert_close(w, w_ref.float())


def test_ties_go_to_the_lower_expert():
    gating = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]])
    w, ids = _run(gating, 3)
    assert ids.tolist() == [[1, 2, 4], [0, 1, 2]]
    assert_close(w[1], torch.full((3,), 0.2))


def test_nan_logits_give_nan_weights():
    gating = torch.tensor([[0.0, float("nan"), 1.0], [0.0, 1.0, 2.0]])
    w, _ = _run(gating, 2)
    assert w[0].isnan().all() and not w[1].isnan().any()


def test_strided_gating_and_empty():
    wide = _spaced_logits(4, 40, seed=3)
    gating = wide[:, 4:36]
    w, ids = _run(gating, 3)
    w_ref, ids_ref = _expected(gating, 3, False)
    assert_close(ids, ids_ref)
    assert_close(w, w_ref.float())
    w, ids = _run(torch.empty(0, 8), 2)
    assert w.shape == (0, 2) and ids.shape == (0, 2)


def test_bad_arguments():
    gating = torch.randn(4, 8)
    w, ids = torch.empty(4, 2), torch.empty(4, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"topk_softmax: k = 9 must be <= the number of experts"):
        topk_softmax(torch.empty(4, 9), torch.empty(4, 9, dtype=torch.int32), gating)
    with pytest.raises(TypeError, match=r"topk_ids must have dtype in \(int32\), got int64"):
        topk_softmax(w, ids.long(), gating)
    with pytest.raises(ValueError, match=r"topk_weights must have T = 4 rows like gating"):
        topk_softmax(torch.empty(3, 2), ids, gating)
    with pytest.raises(ValueError, match=r"correction_bias must have shape \[8\] \(E\), got \[7\]"):
        topk_softmax(w, ids, gating, correction_bias=torch.zeros(7))
    with pytest.raises(TypeError, match="moe_softcapping must be a Python float, got Tensor"):
        topk_softmax(w, ids, gating, moe_softcapping=torch.tensor(1.0))


def test_opcheck():
    from kernels_moe.ops.topk_softmax import TOPK_SOFTMAX

    gating = _spaced_logits(5, 16, seed=4)
    w, ids = torch.empty(5, 4), torch.empty(5, 4, dtype=torch.int32)
    torch.library.opcheck(TOPK_SOFTMAX.torch_op, (w, ids, gating, True, 0.0, None, None))
    torch.library.opcheck(TOPK_SOFTMAX.torch_op, (w, ids, gating, False, 5.0, gating[0], None))


def test_torch_compile_fullgraph():
    """Inductor, so the custom op is traced, functionalised and lowered (about 5 s on CPU)."""

    def route(gating):
        w = torch.empty(gating.shape[0], 2)
        ids = torch.empty(gating.shape[0], 2, dtype=torch.int32)
        topk_softmax(w, ids, gating * 2, True)
        return w, ids

    gating = _spaced_logits(6, 8, seed=5)
    w, ids = torch.compile(route, fullgraph=True)(gating)
    w_ref, ids_ref = reference.topk_softmax(gating * 2, 2, True)
    assert_close(ids, ids_ref)
    assert_close(w, w_ref)
