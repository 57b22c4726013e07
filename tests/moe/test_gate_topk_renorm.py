"""moe.gate_topk_renorm against a float64 oracle written per token with explicit group scoring:
DeepSeek-V3 grouped routing, ungrouped (Kimi-K2-like), bias only steering selection, scaling on
output or not, exact ties of experts and groups, NaN logits, zero-sum rows, bad arguments; every
backend on CPU and GPU (poisoned outputs, strided views, many tokens, CUDA graphs, compile)."""

from __future__ import annotations

import math

import pytest
import torch

from kernels_moe import gate_topk_renorm, reference
from shared.testing.compare import assert_close

BACKENDS = {"cpu": ("torch",), "cuda": ("cuda", "torch")}


def _device_params():
    return [
        pytest.param("cpu", id="cpu"),
        pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
    ]


def _spaced_logits(tokens: int, experts: int, seed: int) -> torch.Tensor:
    """Distinct logits 0.02 apart in every row: fp32 and fp64 agree on every comparison."""
    g = torch.Generator().manual_seed(seed)
    rows = [
        torch.randperm(experts, generator=g).float() * 0.02 - 0.01 * experts for _ in range(tokens)
    ]
    return torch.stack(rows)


def _expected(logits, bias, k, n_group=1, topk_group=1, renorm=True, scale=1.0, on_output=False):
    logits = logits.cpu()
    bias = None if bias is None else bias.cpu()
    weights, ids = [], []
    experts = logits.shape[1]
    size = experts // n_group
    for row in logits.double().tolist():
        s = [1.0 / (1.0 + math.exp(-v)) for v in row]
        sb = [
            v + (0.0 if bias is None else b)
            for v, b in zip(
                s, [0.0] * experts if bias is None else bias.double().tolist(), strict=True
            )
        ]
        sb = [-1e30 if math.isnan(v) else v for v in sb]
        allowed = set(range(experts))
        if n_group > 1:
            scores = []
            for grp in range(n_group):
                top2 = sorted(sb[grp * size : (grp + 1) * size], reverse=True)[:2]
                scores.append(sum(top2))
            kept = sorted(range(n_group), key=lambda grp: (-scores[grp], grp))[:topk_group]
            allowed = {e for grp in kept for e in range(grp * size, (grp + 1) * size)}
        chosen = sorted(allowed, key=lambda e: (-sb[e], e))[:k]
        w = [s[e] for e in chosen]
        total = sum(w)
        if renorm and total != 0:
            w = [v / total for v in w]
        if on_output:
            w = [v * scale for v in w]
        weights.append(w)
        ids.append(chosen)
    return torch.tensor(weights, dtype=torch.float64), torch.tensor(ids, dtype=torch.int32)


CONFIGS = (  # (E, k, n_group, topk_group)
    (256, 8, 8, 4),  # DeepSeek-V3
    (384, 8, 1, 1),  # Kimi-K2
    (64, 6, 4, 2),
    (30, 5, 3, 2),  # groups of 10: nothing is a power of two
    (16, 4, 8, 8),  # every group kept
    (12, 2, 6, 1),  # one group of two experts
    (60, 6, 6, 3),  # groups of 10 spread over lanes
    (1024, 8, 32, 4),  # 32 experts per lane, 32 groups
    (96, 32, 4, 4),  # k = 32
    (96, 8, 3, 2),  # groups of 32 (one slot each), a 4th slot past E
    (160, 8, 5, 2),  # groups of 32, slots 5..7 past E
)


@pytest.mark.parametrize("device", _device_params())
@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize("on_output", (False, True))
def test_matches_float64_oracle(device, config, dtype, on_output):
    experts, k, n_group, topk_group = config
    logits = _spaced_logits(5, experts, seed=experts).to(dtype).to(device)
    # A bias small against the logit spacing keeps selection unambiguous but still reorders.
    bias = (_spaced_logits(1, experts, seed=experts + 1)[0] * 0.1).to(device)
    w_ref, ids_ref = _expected(logits, bias, k, n_group, topk_group, True, 2.5, on_output)
    for backend in BACKENDS[device]:
        w, ids = gate_topk_renorm(
            logits,
            bias,
            k,
            n_group=n_group,
            topk_group=topk_group,
            routed_scaling_factor=2.5,
            apply_routed_scaling_factor_on_output=on_output,
            backend=backend,
        )
        assert w.dtype == torch.float32 and ids.dtype == torch.int32 and w.shape == (5, k)
        assert_close(ids, ids_ref, name=f"{backend} ids")
        assert_close(w, w_ref.float(), name=f"{backend} weights")


@pytest.mark.parametrize("device", _device_params())
@pytest.mark.parametrize("bias_dtype", (torch.bfloat16, torch.float16), ids=str)
def test_half_bias_and_strided_logits(device, bias_dtype):
    wide = _spaced_logits(7, 80, seed=11).to(device)
    logits = wide[:, 8:72]
    bias = (_spaced_logits(1, 64, seed=12)[0] * 0.1).to(bias_dtype).to(device)
    w_ref, ids_ref = _expected(logits, bias.float(), 4, 4, 2)
    for backend in BACKENDS[device]:
        w, ids = gate_topk_renorm(logits, bias, 4, n_group=4, topk_group=2, backend=backend)
        assert_close(ids, ids_ref, name=backend)
        assert_close(w, w_ref.float(), name=backend)


@pytest.mark.parametrize("device", _device_params())
def test_bias_steers_selection_but_not_weights(device):
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]], device=device)
    bias = torch.tensor([0.0, 0.0, 0.0, 5.0], device=device)
    for backend in BACKENDS[device]:
        w, ids = gate_topk_renorm(logits, bias, 2, renormalize=False, backend=backend)
        assert ids.tolist() == [[3, 0]]
        assert_close(w, torch.sigmoid(torch.tensor([[-1.0, 2.0]])))


@pytest.mark.parametrize("device", _device_params())
def test_without_bias_and_renormalisation(device):
    logits = _spaced_logits(3, 16, seed=7).to(device)
    w_ref, ids_ref = _expected(logits, None, 3, renorm=False)
    for backend in BACKENDS[device]:
        w, ids = gate_topk_renorm(logits, None, 3, renormalize=False, backend=backend)
        assert_close(ids, ids_ref)
        assert_close(w, w_ref.float())


@pytest.mark.parametrize("device", _device_params())
def test_ties_of_experts_and_groups_go_low(device):
    # Groups of 2: group scores 1+1 (g0), 1+1 (g1), 1+1 (g2): all tie, keep g0 and g1.
    logits = torch.zeros(1, 6, device=device)
    bias = torch.ones(6, device=device)
    for backend in BACKENDS[device]:
        w, ids = gate_topk_renorm(logits, bias, 3, n_group=3, topk_group=2, backend=backend)
        assert ids.tolist() == [[0, 1, 2]]
        assert_close(w, torch.full((1, 3), 1 / 3))
    # DeepSeek-sized: every score equal, so groups 0-3 and experts 0-7 win.
    for backend in BACKENDS[device]:
        _, ids = gate_topk_renorm(
            torch.zeros(3, 256, device=device),
            torch.zeros(256, device=device),
            8,
            n_group=8,
            topk_group=4,
            backend=backend,
        )
        assert ids.tolist() == [list(range(8))] * 3


@pytest.mark.parametrize("device", _device_params())
@pytest.mark.parametrize(
    "config",
    ((256, 8, 8, 4), (256, 32, 8, 4), (384, 16, 1, 1), (60, 6, 6, 3), (96, 8, 3, 2)),
    ids=str,
)
def test_many_exact_ties_of_experts_and_groups(device, config):
    """Logits 0 or -inf (s = 0.5 or 0, exact) and an integer bias in [0, 2]: many equal selection
    scores within a lane's slots, across lanes and across group scores, all exact in fp32 and
    fp64; the lower expert and group must win. T = 5 is not a multiple of 4 tokens per block."""
    experts, k, n_group, topk_group = config
    g = torch.Generator().manual_seed(experts + k)
    logits = torch.where(torch.rand(5, experts, generator=g) < 0.3, float("-inf"), 0.0)
    bias = torch.randint(0, 3, (experts,), generator=g).float()
    w_ref, ids_ref = _expected(logits, bias, k, n_group, topk_group)
    for backend in BACKENDS[device]:
        w, ids = gate_topk_renorm(
            logits.to(device),
            bias.to(device),
            k,
            n_group=n_group,
            topk_group=topk_group,
            backend=backend,
        )
        assert_close(ids, ids_ref, name=f"{backend} ids")
        assert_close(w, w_ref.float(), name=f"{backend} weights")


@pytest.mark.parametrize("device", _device_params())
def test_group_score_counts_duplicates(device):
    # Group 0 holds [5, 5, 0] -> 10; group 1 holds [6, 1, 1] -> 7: group 0 wins on its top-2 sum.
    bias = torch.tensor([5.0, 5.0, 0.0, 6.0, 1.0, 1.0], device=device)
    for backend in BACKENDS[device]:
        _, ids = gate_topk_renorm(
            torch.zeros(1, 6, device=device), bias, 2, n_group=2, topk_group=1, backend=backend
        )
        assert ids.tolist() == [[0, 1]]


@pytest.mark.parametrize("device", _device_params())
def test_nan_logits_are_never_preferred_and_zero_sum_is_kept(device):
    logits = torch.tensor(
        [[float("nan"), 0.0, 1.0, -1.0], [-200.0, -200.0, -300.0, -300.0]], device=device
    )
    for backend in BACKENDS[device]:
        w, ids = gate_topk_renorm(logits, None, 2, backend=backend)
        assert ids[0].tolist() == [2, 1]
        assert ids[1].tolist() == [0, 1] and (w[1] == 0).all()  # sum 0: no NaN


@pytest.mark.parametrize("device", _device_params())
def test_empty(device):
    for backend in BACKENDS[device]:
        w, ids = gate_topk_renorm(
            torch.empty(0, 256, device=device),
            torch.zeros(256, device=device),
            8,
            n_group=8,
            topk_group=4,
            backend=backend,
        )
        assert w.shape == (0, 8) and ids.shape == (0, 8)


@pytest.mark.gpu
def test_many_tokens_match_reference():
    """DeepSeek-V3 routing at T = 8192 (2048 blocks of 4 warps) against the torch reference on
    the same device, distinct scores (no rounding ties)."""
    logits = _spaced_logits(8192, 256, seed=13).cuda()
    bias = (_spaced_logits(1, 256, seed=14)[0] * 0.1).cuda()
    kwargs = {"n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5}
    w, ids = gate_topk_renorm(logits, bias, 8, backend="cuda", **kwargs)
    w_ref, ids_ref = reference.gate_topk_renorm(logits, bias, 8, 8, 4, True, 2.5)
    assert_close(ids, ids_ref)
    assert_close(w, w_ref)


def _group32_rows(case: str) -> tuple[torch.Tensor, torch.Tensor, int]:
    """Rows for the 32-expert-group CUDA kernel (E = 256, 8 groups keep 4) that take its rare
    paths: (logits [6, 256], bias [256], k)."""
    logits = _spaced_logits(6, 256, seed=31)
    if case == "across_zero":
        # Most selection scores in (-1, 0), a few in (0, 1): the 8 winners straddle 0, outside
        # the 32-bit keys' window (64 binades of one sign): the 64-bit keys route them.
        bias = torch.full((256,), -1.0)
        bias[::37] = 0.0
        return logits, bias, 8
    if case == "crowded_lane":
        # The 6 largest logits of each row on experts 8q .. 8q + 5 (one lane's 8): a lane gives
        # up more than its 4 keys in the rounds, so its 5th guards and the row goes 64-bit (no
        # bias: it would reorder them).
        bias = torch.zeros(256)
        for row, q in zip(logits, (0, 5, 12, 19, 26, 31), strict=True):
            top = row.topk(6).values
            rest = row[~torch.isin(row, top)]
            row.copy_(torch.cat([rest[: 8 * q], top, rest[8 * q :]]))
        return logits, bias, 8
    if case == "minus_inf_winners":
        # Groups 0-3 all -inf, groups 4-7 two finite experts each: k = 16 takes the 8 finite
        # ones, then 8 whose -inf bias makes -FLT_MAX (the reference's nan_to_num), above the
        # dropped groups' -inf: ids 130.., far below the window.
        bias = torch.full((256,), float("-inf"))
        for g in range(4, 8):
            bias[32 * g : 32 * g + 2] = 0.0
        return logits, bias, 16
    if case == "all_minus_inf":
        # Every score -FLT_MAX, every group -inf (the sum overflows): groups 0-3 kept and
        # experts 0..7 win, all in one lane (the window starts at -FLT_MAX's code).
        return logits, torch.full((256,), float("-inf")), 8
    if case == "infinite_bias":
        # +inf on experts 3 and 200 (FLT_MAX: their groups score +inf, they win first), -inf on
        # every 7th: a window at FLT_MAX leaves the rest out (the 64-bit keys).
        bias = _spaced_logits(1, 256, seed=34)[0] * 0.1
        bias[::7] = float("-inf")
        bias[[3, 200]] = float("inf")
        return logits, bias, 8
    if case == "nan_and_huge":
        # NaN logits (selection score -1e30, never chosen over a real one) on the rows' largest
        # experts, and logits below -87.3 (the division's slow path) in every lane.
        bias = _spaced_logits(1, 256, seed=33)[0] * 0.1
        logits[:, ::3] = -100.0 - logits[:, ::3].abs()
        for row in logits[:3]:
            row[row.topk(3).indices] = float("nan")
        return logits, bias, 8
    raise AssertionError(case)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "case",
    (
        "across_zero",
        "crowded_lane",
        "minus_inf_winners",
        "all_minus_inf",
        "infinite_bias",
        "nan_and_huge",
    ),
)
def test_group32_kernel_rare_paths_match_reference(case):
    """The 32-expert-group kernel's routes back to 64-bit keys (a window too narrow, a lane out
    of keys), infinite biases and its slow sigmoid, against the torch reference."""
    logits, bias, k = _group32_rows(case)
    kwargs = {"n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5}
    w_ref, ids_ref = gate_topk_renorm(logits, bias, k, backend="torch", **kwargs)
    w, ids = gate_topk_renorm(logits.cuda(), bias.cuda(), k, backend="cuda", **kwargs)
    assert_close(ids, ids_ref, name="ids")
    assert_close(w, w_ref, name="weights")


@pytest.mark.gpu
@pytest.mark.parametrize("bias_dtype", (torch.float32, torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("view", ("aligned", "offset_4_bytes", "padded_rows"), ids=str)
def test_group32_kernel_bias_dtypes_and_row_views(bias_dtype, view):
    """E = 256 in 8 groups: the 16-byte-load kernel on aligned rows and half biases, the
    general kernel where a row or the bias is not 16-byte aligned (a view one element in)."""
    wide = _spaced_logits(9, 264, seed=34)
    logits = {
        "aligned": wide[:, :256],
        "offset_4_bytes": wide[:, 1:257],
        "padded_rows": wide[:, 8:],
    }[view]
    bias_wide = (_spaced_logits(1, 264, seed=35)[0] * 0.1).to(bias_dtype)
    bias = bias_wide[1:257] if view == "offset_4_bytes" else bias_wide[:256]
    w_ref, ids_ref = _expected(logits, bias.float(), 8, 8, 4, True, 2.5, True)
    for backend in BACKENDS["cuda"]:
        w, ids = gate_topk_renorm(
            logits.cuda(),
            bias.cuda(),
            8,
            n_group=8,
            topk_group=4,
            routed_scaling_factor=2.5,
            apply_routed_scaling_factor_on_output=True,
            backend=backend,
        )
        assert_close(ids, ids_ref, name=f"{backend} ids")
        assert_close(w, w_ref.float(), name=f"{backend} weights")


@pytest.mark.gpu
@pytest.mark.parametrize("config", ((256, 16, 8, 8), (256, 32, 8, 2), (64, 8, 2, 1)), ids=str)
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_group32_kernel_k_and_kept_groups(config, dtype):
    """Groups of 32 with every group kept, k = 32 from 2 groups (a lane can win 8 times: the
    64-bit route), two groups (lanes past E), 1001 tokens (the last of 251 blocks holds one)."""
    experts, k, n_group, topk_group = config
    logits = _spaced_logits(1001, experts, seed=36).to(dtype)
    bias = _spaced_logits(1, experts, seed=37)[0] * 0.1
    kwargs = {"n_group": n_group, "topk_group": topk_group}
    w_ref, ids_ref = gate_topk_renorm(logits, bias, k, backend="torch", **kwargs)
    w, ids = gate_topk_renorm(logits.cuda(), bias.cuda(), k, backend="cuda", **kwargs)
    assert_close(ids, ids_ref, name="ids")
    assert_close(w, w_ref, name="weights")


@pytest.mark.gpu
def test_cuda_graph_compile_and_opcheck():
    from kernels_moe.ops.gate_topk_renorm import GATE_TOPK_RENORM

    logits = _spaced_logits(64, 256, seed=15).cuda()
    bias = (_spaced_logits(1, 256, seed=16)[0] * 0.1).cuda()
    w = torch.empty(64, 8, device="cuda")
    ids = torch.empty(64, 8, dtype=torch.int32, device="cuda")
    args = (w, ids, logits, bias, 8, 4, True, 2.5, True)
    GATE_TOPK_RENORM.run(*args)  # builds and loads before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        GATE_TOPK_RENORM.run(*args)
    w.fill_(float("nan"))
    ids.fill_(-7)
    graph.replay()
    torch.cuda.synchronize()
    w_ref, ids_ref = reference.gate_topk_renorm(logits, bias, 8, 8, 4, True, 2.5, True)
    assert_close(ids, ids_ref)
    assert_close(w, w_ref)
    torch.library.opcheck(GATE_TOPK_RENORM.torch_op, (*args, None))

    def route(x):
        return gate_topk_renorm(x * 1.0, bias, 8, n_group=8, topk_group=4)

    wc, idc = torch.compile(route, fullgraph=True)(logits)
    w_ref, ids_ref = reference.gate_topk_renorm(logits, bias, 8, 8, 4)
    assert_close(idc, ids_ref)
    assert_close(wc, w_ref)


def test_bad_arguments():
    logits = torch.randn(2, 12)
    op = "gate_topk_renorm"
    with pytest.raises(
        ValueError, match=rf"{op}: the number of experts E = 12 must be a multiple of n_group = 5"
    ):
        gate_topk_renorm(logits, None, 2, n_group=5)
    with pytest.raises(ValueError, match=r"each group needs >= 2 experts .*n_group = 12"):
        gate_topk_renorm(logits, None, 1, n_group=12, topk_group=1)
    with pytest.raises(ValueError, match=r"topk = 5 must be <= topk_group \* E / n_group = 4"):
        gate_topk_renorm(logits, None, 5, n_group=3, topk_group=1)
    with pytest.raises(ValueError, match="topk_group = 4 must be <= n_group = 3"):
        gate_topk_renorm(logits, None, 2, n_group=3, topk_group=4)
    with pytest.raises(ValueError, match="topk must be >= 1, got 0"):
        gate_topk_renorm(logits, None, 0)
    with pytest.raises(TypeError, match="topk must be a Python int, got float"):
        gate_topk_renorm(logits, None, 2.0)
    with pytest.raises(ValueError, match=r"bias must have shape \[12\] \(E\), got \[11\]"):
        gate_topk_renorm(logits, torch.zeros(11), 2)
    with pytest.raises(TypeError, match="logits must have dtype in .*got float16"):
        gate_topk_renorm(logits.half(), None, 2)


def test_opcheck():
    from kernels_moe.ops.gate_topk_renorm import GATE_TOPK_RENORM

    logits = _spaced_logits(4, 32, seed=9)
    w, ids = torch.empty(4, 4), torch.empty(4, 4, dtype=torch.int32)
    args = (w, ids, logits, torch.zeros(32), 4, 2, True, 2.5, True, None)
    torch.library.opcheck(GATE_TOPK_RENORM.torch_op, args)


def test_torch_compile_fullgraph_aot():
    logits = _spaced_logits(5, 64, seed=10)
    bias = torch.zeros(64)

    def route(x):
        return gate_topk_renorm(x, bias, 4, n_group=4, topk_group=2)

    w, ids = torch.compile(route, fullgraph=True, backend="aot_eager")(logits)
    w_ref, ids_ref = reference.gate_topk_renorm(logits, bias, 4, 4, 2)
    assert_close(ids, ids_ref)
    assert_close(w, w_ref)
