"""Pure-torch references of the attention ops: the correctness oracle and the fallback.

Arithmetic in fp32, rounded once when stored; log-sum-exp values are natural logs (OPS.md
section 0).
"""

from __future__ import annotations

import torch


def check_positions(op: str, positions: torch.Tensor, max_position: int) -> None:
    """Positions must index a row of the cos/sin cache."""
    if positions.numel() == 0:
        return
    low, high = int(positions.min()), int(positions.max())
    if low < 0 or high >= max_position:
        bad = low if low < 0 else high
        raise ValueError(
            f"{op}: positions must lie in [0, {max_position}) (the rows of cos_sin_cache), "
            f"found {bad}"
        )


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, is_neox: bool) -> None:
    """Rotate the first R channels of every head of x [T, H, D] in place (cos, sin [T, R/2])."""
    half = cos.shape[-1]
    rot = x[..., : 2 * half].float()
    if is_neox:
        x1, x2 = rot[..., :half], rot[..., half:]
    else:
        x1, x2 = rot[..., 0::2], rot[..., 1::2]
    cos, sin = cos[:, None, :], sin[:, None, :]
    o1 = x1 * cos - x2 * sin
    o2 = x2 * cos + x1 * sin
    if is_neox:
        out = torch.cat((o1, o2), dim=-1)
    else:
        out = torch.stack((o1, o2), dim=-1).flatten(-2)
    x[..., : 2 * half] = out.to(x.dtype)


def rope_inplace(
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    is_neox: bool,
) -> None:
    """Rotary embedding in place on q [T, Hq, D] and k [T, Hk, D] (3-D views).

    With R = the cache width, ``cos_i = cache[pos, i]``, ``sin_i = cache[pos, R/2 + i]``; NeoX
    rotates the pairs (i, i + R/2), GPT-J the pairs (2i, 2i + 1):
    ``x1' = x1 cos - x2 sin``, ``x2' = x2 cos + x1 sin``. Channels >= R are untouched.
    """
    check_positions("attention.rope_inplace", positions, cos_sin_cache.shape[0])
    half = cos_sin_cache.shape[1] // 2
    rows = cos_sin_cache.float()[positions.long()]
    cos, sin = rows[:, :half], rows[:, half : 2 * half]
    _rotate(q, cos, sin, is_neox)
    if k is not None:
        _rotate(k, cos, sin, is_neox)


def merge_state(
    v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attention outputs by their natural-log LSE.

    ``m = max(s_a, s_b)``, ``wa = exp(s_a - m)``, ``wb = exp(s_b - m)``,
    ``v = (wa v_a + wb v_b) / (wa + wb)``, ``s = m + ln(wa + wb)``. +inf LSE counts as -inf
    (an empty segment); both -inf give v = 0, s = -inf; NaN propagates.
    Returns (v like v_a, s fp32 [T, H]).
    """
    inf = float("inf")
    sa = s_a.float().masked_fill(s_a == inf, -inf)
    sb = s_b.float().masked_fill(s_b == inf, -inf)
    m = torch.maximum(sa, sb)
    empty = (sa == -inf) & (sb == -inf)
    m_safe = torch.where(empty, torch.zeros_like(m), m)
    wa = torch.exp(sa - m_safe)
    wb = torch.exp(sb - m_safe)
    total = wa + wb
    v = (wa.unsqueeze(-1) * v_a.float() + wb.unsqueeze(-1) * v_b.float()) / total.unsqueeze(-1)
    v = v.masked_fill(empty.unsqueeze(-1), 0.0)
    s = torch.where(empty, m, m + torch.log(total))
    return v.to(v_a.dtype), s


def concat_mla_k(k: torch.Tensor, k_nope: torch.Tensor, k_rope: torch.Tensor) -> None:
    """``k[..., :Dn] = k_nope``, ``k[..., Dn:] = k_rope`` broadcast over heads, in place
    (k [T, H, Dn+Dr], k_nope [T, H, Dn], k_rope [T, 1, Dr])."""
    dn = k_nope.shape[-1]
    k[..., :dn] = k_nope
    k[..., dn:] = k_rope


def check_kv_indices(
    op: str, kv_indptr: torch.Tensor, kv_indices: torch.Tensor, num_slots: int
) -> None:
    """``kv_indptr`` non-decreasing within [0, numel(kv_indices)], every used slot in
    [0, num_slots) (a host synchronisation: the torch backend's precondition check)."""
    if kv_indptr.numel() == 0:
        return
    ptr = kv_indptr.long().cpu()
    total = kv_indices.numel()
    if int(ptr[0]) < 0 or int(ptr[-1]) > total or bool((ptr[1:] < ptr[:-1]).any()):
        raise ValueError(
            f"{op}: kv_indptr must be non-decreasing within [0, {total}] (the length of "
            f"kv_indices), got {ptr.tolist()[:8]}{'...' if ptr.numel() > 8 else ''}"
        )
    used = kv_indices[int(ptr[0]) : int(ptr[-1])]
    if used.numel():
        low, high = int(used.min()), int(used.max())
        if low < 0 or high >= num_slots:
            bad = low if low < 0 else high
            raise ValueError(
                f"{op}: kv_indices must lie in [0, {num_slots}) (the slots of k_cache), found {bad}"
            )


def decode_attention_math(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float,
    logit_cap: float = 0.0,
    sinks: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    chunk: int = 8192,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`decode_attention` without the precondition check: no host synchronisation
    (CUDA-graph capturable), memory bounded by ``chunk`` tokens at a time."""
    batch, hq, _ = q.shape
    hk, dv = k_cache.shape[1], v_cache.shape[-1]
    group = hq // hk
    dev = q.device
    total = kv_indices.numel()
    inf = float("inf")
    o = torch.zeros(batch, hq, dv, dtype=torch.float32, device=dev)
    if batch == 0 or total == 0:
        lse = torch.full((batch, hq), -inf, dtype=torch.float32, device=dev)
        return o.to(q.dtype), lse
    pos = torch.arange(total, device=dev)
    ptr = kv_indptr.long()
    # request of each position of kv_indices: b with ptr[b] <= pos < ptr[b + 1]
    req = torch.searchsorted(ptr[1:].contiguous(), pos, right=True)
    valid = (pos >= ptr[0]) & (req < batch)
    req = req.clamp(max=batch - 1)
    qf = q.float().view(batch, hk, group, -1)
    scores = []
    for c0 in range(0, total, chunk):
        slots = kv_indices[c0 : c0 + chunk].long()
        k = k_cache[slots].float()  # [c, Hk, D]
        s = torch.einsum("ckgd,ckd->ckg", qf[req[c0 : c0 + chunk]], k)
        scores.append(s.reshape(-1, hq))
    s = torch.cat(scores) * (sm_scale * k_scale)
    if logit_cap > 0:
        s = logit_cap * torch.tanh(s / logit_cap)
    s = s.masked_fill(~valid[:, None], -inf)
    index = req[:, None].expand(total, hq)
    m = torch.full((batch, hq), -inf, device=dev).scatter_reduce(0, index, s, "amax")
    nonempty = m > -inf
    if sinks is not None:
        m = torch.where(nonempty, torch.maximum(m, sinks.float()[None, :]), m)
    m_safe = torch.where(nonempty, m, torch.zeros_like(m))
    p = torch.exp(s - m_safe[req])  # 0 at invalid positions
    denom = torch.zeros(batch, hq, device=dev).index_add_(0, req, p)
    if sinks is not None:  # the sink logit joins the denominator only
        denom = denom + torch.where(nonempty, torch.exp(sinks.float()[None, :] - m_safe), 0.0)
    for c0 in range(0, total, chunk):
        slots = kv_indices[c0 : c0 + chunk].long()
        v = v_cache[slots].float()  # [c, Hk, Dv]
        pc = p[c0 : c0 + chunk].view(-1, hk, group)
        o.index_add_(0, req[c0 : c0 + chunk], (pc[..., None] * v[:, :, None, :]).flatten(1, 2))
    denom_safe = torch.where(nonempty, denom, torch.ones_like(denom))
    o = torch.where(nonempty[..., None], o * (v_scale / denom_safe)[..., None], 0.0)
    lse = torch.where(nonempty, m_safe + torch.log(denom_safe), -inf)
    return o.to(q.dtype), lse


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float,
    logit_cap: float = 0.0,
    sinks: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Decode attention of one query token per request over token-indexed KV slots.

    Request b attends to the slots ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` of
    ``k_cache [S, Hk, D]`` / ``v_cache [S, Hk, Dv]``; query head h uses KV head
    ``h // (Hq / Hk)``. ``z = sm_scale * k_scale * q.k``; with ``logit_cap > 0``,
    ``z = cap * tanh(z / cap)``; ``p = softmax(z)`` whose denominator also holds
    ``exp(sinks[h])`` when given; ``o = v_scale * sum p v``. Returns (o [B, Hq, Dv] of q's
    dtype, lse [B, Hq] float32, natural log, including the sink). An empty request gives
    o = 0 and lse = -inf.
    """
    check_kv_indices("attention.decode_attention", kv_indptr, kv_indices, k_cache.shape[0])
    return decode_attention_math(
        q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale, logit_cap, sinks, k_scale, v_scale
    )
