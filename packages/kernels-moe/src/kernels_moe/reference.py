"""Pure-torch references of the MoE ops: the correctness oracle and the fallback.

Routing runs in fp32; selection is by descending score with ties going to the lower expert id
(a stable descending sort), the order every backend must reproduce.
"""

from __future__ import annotations

import torch

# Selection score of a NaN logit in gate_topk_renorm: never chosen over a real expert.
NAN_SCORE = -1e30


def _top(scores: torch.Tensor, k: int) -> torch.Tensor:
    """Indices of the k largest scores per row, descending, ties to the lower index."""
    return torch.sort(scores, dim=-1, descending=True, stable=True).indices[..., :k]


def topk_softmax(
    gating: torch.Tensor,
    topk: int,
    renormalize: bool = False,
    moe_softcapping: float = 0.0,
    correction_bias: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax routing: ``l = gating`` (fp32), ``l = c * tanh(l / c)`` when c != 0,
    ``l += bias``, ``p = softmax(l)``; the k experts of largest p (ties to the lower id),
    their p as weights (divided by their sum when ``renormalize``).

    Returns (weights [T, k] fp32, ids [T, k] int32), columns in selection order.
    """
    logits = gating.float()
    if moe_softcapping != 0.0:
        logits = moe_softcapping * torch.tanh(logits / moe_softcapping)
    if correction_bias is not None:
        logits = logits + correction_bias.float()
    probs = torch.softmax(logits, dim=-1)
    ids = _top(probs, topk)
    weights = probs.gather(-1, ids)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, ids.to(torch.int32)


def gate_topk_renorm(
    logits: torch.Tensor,
    bias: torch.Tensor | None,
    topk: int,
    n_group: int = 1,
    topk_group: int = 1,
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
    apply_routed_scaling_factor_on_output: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 "noaux_tc" routing.

    ``s = sigmoid(logits)``, selection score ``sb = s + bias`` (NaN -> -1e30); with n_group > 1
    only the topk_group groups of largest (top-2 sum of sb) compete; the topk experts of largest
    sb (ties to the lower id) get weight ``s`` (unbiased), divided by the sum when
    ``renormalize`` (unless it is 0) and times the scaling factor when applied on output.

    Returns (weights [T, k] fp32, ids [T, k] int32).
    """
    scores = torch.sigmoid(logits.float())
    selection = scores if bias is None else scores + bias.float()
    selection = torch.nan_to_num(selection, nan=NAN_SCORE)
    tokens, experts = selection.shape
    if n_group > 1:
        grouped = selection.reshape(tokens, n_group, experts // n_group)
        group_scores = torch.sort(grouped, dim=-1, descending=True).values[..., :2].sum(dim=-1)
        kept = _top(group_scores, topk_group)
        mask = torch.zeros(tokens, n_group, dtype=torch.bool, device=logits.device)
        mask.scatter_(1, kept, True)
        grouped = grouped.masked_fill(~mask.unsqueeze(-1), float("-inf"))
        selection = grouped.reshape(tokens, experts)
    ids = _top(selection, topk)
    weights = scores.gather(-1, ids)
    if renormalize:
        total = weights.sum(dim=-1, keepdim=True)
        weights = torch.where(total == 0, weights, weights / total)
    if apply_routed_scaling_factor_on_output:
        weights = weights * routed_scaling_factor
    return weights, ids.to(torch.int32)


def check_expert_ids(op: str, topk_ids: torch.Tensor, num_experts: int) -> None:
    """Expert ids must lie in [-1, E) (-1 marks a slot filtered out by expert parallelism)."""
    if topk_ids.numel() == 0:
        return
    low, high = int(topk_ids.min()), int(topk_ids.max())
    if low < -1 or high >= num_experts:
        bad = low if low < -1 else high
        raise ValueError(
            f"{op}: topk_ids must lie in [-1, {num_experts}) (-1 = filtered slot), found {bad}"
        )


def moe_align_block_size_sizes(n: int, num_experts: int, block_size: int) -> tuple[int, int]:
    """(P, number of blocks): the worst-case padded length ``min(n + (E+1)(bs-1), n*bs)``."""
    padded = min(n + (num_experts + 1) * (block_size - 1), n * block_size)
    return padded, -(-padded // block_size)


def moe_align_block_size(
    topk_ids: torch.Tensor, num_experts: int, block_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sort the n = T*k token slots by bucket (bucket -1 first, then experts 0..E-1), each
    bucket padded with the value n to a multiple of ``block_size``.

    Returns (sorted_token_ids int32 [P], expert_ids int32 [ceil(P/bs)], num_tokens_post_padded
    int32 [1]). Slots of one bucket come in ascending order; entries past the padded total are n,
    expert ids of unused blocks are -1.
    """
    check_expert_ids("moe.moe_align_block_size", topk_ids, num_experts)
    device = topk_ids.device
    n = topk_ids.numel()
    padded_len, blocks = moe_align_block_size_sizes(n, num_experts, block_size)
    bucket = topk_ids.reshape(-1).long() + 1  # 0 = filtered (-1), e + 1 = expert e
    counts = torch.bincount(bucket, minlength=num_experts + 1)
    padded = (counts + block_size - 1) // block_size * block_size
    starts = torch.cumsum(padded, 0) - padded  # where each bucket begins in sorted_token_ids
    order = torch.sort(bucket, stable=True).indices  # slots grouped by bucket, ascending
    sorted_bucket = bucket[order]
    first = torch.cumsum(counts, 0) - counts  # where each bucket begins in `order`
    rank = torch.arange(n, device=device) - first[sorted_bucket]
    sorted_ids = torch.full((padded_len,), n, dtype=torch.int32, device=device)
    sorted_ids[starts[sorted_bucket] + rank] = order.to(torch.int32)
    buckets = torch.arange(-1, num_experts, dtype=torch.int32, device=device)
    used = torch.repeat_interleave(buckets, padded // block_size)
    expert_ids = torch.full((blocks,), -1, dtype=torch.int32, device=device)
    expert_ids[: used.numel()] = used
    total = padded.sum().reshape(1).to(torch.int32)
    return sorted_ids, expert_ids, total


def moe_sum_reduce(
    x: torch.Tensor,
    routed_scaling_factor: float = 1.0,
    topk_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """``out[t] = scaling * sum_j w[t, j] * x[t, j]`` (w = 1 when None), fp32 accumulation in
    j order, rounded once to the dtype of x [T, k, H]."""
    acc = torch.zeros(x.shape[0], x.shape[2], dtype=torch.float32, device=x.device)
    for j in range(x.shape[1]):
        term = x[:, j].float()
        if topk_weights is not None:
            term = term * topk_weights[:, j : j + 1].float()
        acc = acc + term
    return (acc * routed_scaling_factor).to(x.dtype)


def _activation(gate: torch.Tensor, activation: str) -> torch.Tensor:
    """silu or exact (erf) gelu of an fp32 tensor."""
    if activation == "silu":
        return torch.nn.functional.silu(gate)
    return torch.nn.functional.gelu(gate)


def fused_moe(
    hidden: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    routed_scaling_factor: float = 1.0,
) -> torch.Tensor:
    """Fused MoE with the rounding points of the Triton kernel.

    For each slot (t, j) with ``e = topk_ids[t, j] >= 0``: ``g, u = split(h_t @ w1[e]^T)`` (the
    first I rows of w1 are the gate, the next I the up projection; fp32 accumulation rounded to
    the dtype), ``a = act(g) * u`` (from the rounded g and u, in fp32, rounded), ``y = a @
    w2[e]^T`` (fp32), times ``topk_weights[t, j]`` in fp32, rounded; slots with id -1 give zero
    rows. ``out_t = scaling * sum_j y_tj`` in fp32 (moe_sum_reduce), rounded once.

    With ``apply_router_weight_on_input`` the weight scales the input row instead (``h_t * w``
    in fp32, rounded) and the down projection is not weighted.

    Ids outside [-1, E) raise ValueError (one host synchronisation).
    """
    check_expert_ids("moe.fused_moe", topk_ids, w1.shape[0])
    tokens, k = topk_ids.shape
    dtype = hidden.dtype
    inter = w2.shape[2]
    flat_ids = topk_ids.reshape(-1).long()
    flat_w = topk_weights.reshape(-1).float()
    rows = torch.arange(tokens * k, device=hidden.device) // k
    y = torch.zeros(tokens * k, w2.shape[1], dtype=dtype, device=hidden.device)
    for e in torch.unique(flat_ids).tolist():
        if e < 0:
            continue
        slots = torch.nonzero(flat_ids == e).reshape(-1)
        x = hidden[rows[slots]].float()
        if apply_router_weight_on_input:
            x = (x * flat_w[slots, None]).to(dtype).float()
        gate_up = (x @ w1[e].float().t()).to(dtype).float()
        act = (_activation(gate_up[:, :inter], activation) * gate_up[:, inter:]).to(dtype)
        down = act.float() @ w2[e].float().t()
        if not apply_router_weight_on_input:
            down = down * flat_w[slots, None]
        y[slots] = down.to(dtype)
    return moe_sum_reduce(y.reshape(tokens, k, -1), routed_scaling_factor)
