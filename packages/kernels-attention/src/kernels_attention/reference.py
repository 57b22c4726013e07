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
