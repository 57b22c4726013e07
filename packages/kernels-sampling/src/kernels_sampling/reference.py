"""Pure-torch references of the sampling ops: the correctness oracle and the fallback.

Filtering rules are value based (OPS.md section 6), so ties are kept or dropped together. With
``S_gt(v) = sum{p_j : p_j > v}`` and ``N_gt(v) = #{j : p_j > v}``:

- top-k keeps i iff ``N_gt(p_i) < k`` (``p_i >=`` the k-th largest value); k <= 0 or k >= V: off;
- top-p keeps i iff ``S_gt(p_i) < top_p``; top_p >= 1 is off; top_p <= 0 keeps the argmax set;
- min-p keeps i iff ``p_i >= min_p * max(p)``.

Everything is computed in fp32 and rounded once. Per-row parameters are tensors of shape [B] or a
single number.

Invalid rows (defined here, the kernels must match): a row of probabilities is *bad* if any entry
is NaN, +/-inf or negative (:func:`bad_rows`, read over the whole row before any filtering). A bad
row, a row whose per-row ``top_p`` is NaN or whose per-row ``min_p`` is NaN or outside [0, 1], and
a row whose kept fp32 sum overflows to inf are *invalid*: the renorm ops write an all-NaN row and
the sampling ops return sample 0 with ``valid = False`` (the degenerate-row contract of OPS.md
section 6). An all-zero (or kept sum < 1e-8) row stays what it was: zeros from the renorm ops,
sample 0 / valid False from the sampling ops. Valid rows are never affected by invalid ones.
"""

from __future__ import annotations

import torch

from kernels_jit.rng import uniform

RENORM_MIN_SUM = 1e-8


def _per_row(value, batch: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.to(device=device, dtype=dtype).reshape(batch)
    return torch.full((batch,), value, dtype=dtype, device=device)


def bad_rows(probs: torch.Tensor) -> torch.Tensor:
    """bool [B]: the row holds a NaN, +/-inf or negative entry (``not 0 <= p < inf`` somewhere)."""
    p = probs.float()
    return ~((p >= 0) & (p < float("inf"))).all(dim=1)


def bad_top_p(top_p, batch: int, device: torch.device) -> torch.Tensor:
    """bool [B]: the row's top_p is NaN (every other value is defined)."""
    return _per_row(top_p, batch, torch.float32, device).isnan()


def bad_min_p(min_p, batch: int, device: torch.device) -> torch.Tensor:
    """bool [B]: the row's min_p is NaN or outside [0, 1]."""
    mp = _per_row(min_p, batch, torch.float32, device)
    return ~((mp >= 0) & (mp <= 1))


def top_k_keep(values: torch.Tensor, top_k) -> torch.Tensor:
    """bool [B, V]: ``values >= k-th largest value of the row`` (every entry when k is off)."""
    batch, vocab = values.shape
    k = _per_row(top_k, batch, torch.int64, values.device)
    if vocab == 0:
        return torch.ones_like(values, dtype=torch.bool)
    off = (k <= 0) | (k >= vocab)
    ranked = values.sort(dim=1, descending=True).values
    kth = ranked.gather(1, (k.clamp(1, vocab) - 1)[:, None])
    return (values >= kth) | off[:, None]


def top_p_keep(probs: torch.Tensor, top_p) -> torch.Tensor:
    """bool [B, V]: ``S_gt(p_i) < top_p`` in fp32 (argmax set for top_p <= 0, all for >= 1)."""
    batch, vocab = probs.shape
    p = probs.float()
    tp = _per_row(top_p, batch, torch.float32, p.device)
    ascending = p.sort(dim=1).values
    # suffix[j] = sum of ascending[j:], summed from the largest value down; suffix[V] = 0.
    suffix = ascending.flip(1).cumsum(1).flip(1)
    suffix = torch.cat([suffix, suffix.new_zeros(batch, 1)], dim=1)
    first_greater = torch.searchsorted(ascending, p, right=True)
    keep = suffix.gather(1, first_greater) < tp[:, None]
    if vocab:
        argmax_set = p == p.max(dim=1, keepdim=True).values
        keep = torch.where((tp <= 0)[:, None], argmax_set, keep)
    return keep | (tp >= 1)[:, None]


def min_p_keep(probs: torch.Tensor, min_p) -> torch.Tensor:
    """bool [B, V]: ``p_i >= min_p * max(p)`` in fp32."""
    batch, vocab = probs.shape
    p = probs.float()
    mp = _per_row(min_p, batch, torch.float32, p.device)
    if vocab == 0:
        return torch.ones_like(p, dtype=torch.bool)
    return p >= mp[:, None] * p.max(dim=1, keepdim=True).values


def renorm(
    probs: torch.Tensor, keep: torch.Tensor, invalid: torch.Tensor | None = None
) -> torch.Tensor:
    """Zero the dropped entries and divide the kept by their fp32 sum (sum < 1e-8 -> zeros).

    Invalid rows -- bad input (:func:`bad_rows`), ``invalid`` (bool [B], bad parameters), or a kept
    sum that overflows to inf -- become all NaN.
    """
    kept = torch.where(keep, probs.float(), 0.0)
    total = kept.sum(dim=1, keepdim=True)
    out = torch.where(total < RENORM_MIN_SUM, 0.0, kept / total)
    bad = bad_rows(probs)[:, None] | ~(total < float("inf"))
    if invalid is not None:
        bad = bad | invalid[:, None]
    out = torch.where(bad, float("nan"), out)
    return out.to(probs.dtype)


def top_k_renorm_probs(probs: torch.Tensor, top_k) -> torch.Tensor:
    return renorm(probs, top_k_keep(probs.float(), top_k))


def top_p_renorm_probs(probs: torch.Tensor, top_p) -> torch.Tensor:
    invalid = bad_top_p(top_p, probs.shape[0], probs.device)
    return renorm(probs, top_p_keep(probs, top_p), invalid)


def min_p_renorm_probs(probs: torch.Tensor, min_p) -> torch.Tensor:
    invalid = bad_min_p(min_p, probs.shape[0], probs.device)
    return renorm(probs, min_p_keep(probs, min_p), invalid)


def top_k_mask_logits(logits: torch.Tensor, top_k) -> torch.Tensor:
    """Dropped logits -> -inf, kept unchanged (the top-k rule applied to the logit values)."""
    keep = top_k_keep(logits.float(), top_k)
    return logits.masked_fill(~keep, float("-inf"))


def draw(
    weights: torch.Tensor, u: torch.Tensor, invalid: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inverse-CDF draw in vocabulary order: the smallest j with ``cumsum(w)_j > u * sum(w)``.

    ``weights`` fp32 [B, V] (need not be normalised), ``u`` fp32 [B]. Returns (int64 [B], valid
    bool [B]); a row whose sum is not in (0, inf) (0, NaN, overflow), a bad row
    (:func:`bad_rows`) or an ``invalid`` one (bool [B]) gives index 0 and valid False.
    """
    batch, vocab = weights.shape
    if vocab == 0:
        zeros = torch.zeros(batch, dtype=torch.int64, device=weights.device)
        return zeros, torch.zeros(batch, dtype=torch.bool, device=weights.device)
    cdf = weights.cumsum(dim=1)
    total = cdf[:, -1]
    valid = (total > 0) & (total < float("inf")) & ~bad_rows(weights)
    if invalid is not None:
        valid = valid & ~invalid
    index = torch.searchsorted(cdf, (u * total)[:, None], right=True).squeeze(1)
    # u * total may round up to total itself: fall back to the last token with weight.
    last_positive = (vocab - 1) - (weights > 0).flip(1).to(torch.int8).argmax(dim=1)
    index = torch.where(index >= vocab, last_positive, index)
    return torch.where(valid, index, 0), valid


def _rows(
    op: str, probs: torch.Tensor, indices: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(selected rows fp32 [B'], source row ids int64 [B'])."""
    if indices is None:
        return probs.float(), torch.arange(probs.shape[0], device=probs.device)
    rows = indices.long()
    if rows.numel() and (rows.min() < 0 or rows.max() >= probs.shape[0]):
        raise ValueError(
            f"sampling.{op}: indices must lie in [0, {probs.shape[0]}), got values in "
            f"[{int(rows.min())}, {int(rows.max())}]"
        )
    return probs.float()[rows], rows


def _result(index, valid, indices, return_valid):
    samples = index.to(torch.int32 if indices is None else indices.dtype)
    return (samples, valid) if return_valid else samples


def sampling_from_probs(
    probs: torch.Tensor,
    *,
    indices: torch.Tensor | None = None,
    seed: torch.Tensor,
    offset: torch.Tensor,
    return_valid: bool = False,
):
    """One sample per output row i from ``probs[indices[i]]`` with ``u = U(seed, offset, i, 0)``.

    ``seed``/``offset`` are int64 tensors of shape [1] or [B'] (see the public op for ints/None).
    """
    rows, _ = _rows("sampling_from_probs", probs, indices)  # bad rows: invalid inside draw
    out_rows = torch.arange(rows.shape[0], device=probs.device)
    u = uniform(seed, offset, out_rows, 0)
    index, valid = draw(rows, u)
    return _result(index, valid, indices, return_valid)


def top_k_top_p_keep(probs: torch.Tensor, top_k, top_p, filter_apply_order: str) -> torch.Tensor:
    """The kept set of top_k_top_p_sampling_from_probs ("top_k_first" or "joint")."""
    keep_k = top_k_keep(probs.float(), top_k)
    if filter_apply_order == "joint":
        return keep_k & top_p_keep(probs, top_p)
    return keep_k & top_p_keep(renorm(probs.float(), keep_k), top_p)


def top_k_top_p_sampling_from_probs(
    probs: torch.Tensor,
    top_k,
    top_p,
    *,
    indices: torch.Tensor | None = None,
    filter_apply_order: str = "top_k_first",
    seed: torch.Tensor,
    offset: torch.Tensor,
    return_valid: bool = False,
):
    """Sample among the kept tokens with weights = their original probabilities.

    Per-row ``top_k``/``top_p`` are indexed by the source row (``indices[i]`` when given). A bad
    source row (:func:`bad_rows`, judged before filtering) or a NaN top_p gives 0 / valid False.
    """
    rows, src = _rows("top_k_top_p_sampling_from_probs", probs, indices)
    k = _per_row(top_k, probs.shape[0], torch.int64, probs.device)[src]
    p = _per_row(top_p, probs.shape[0], torch.float32, probs.device)[src]
    keep = top_k_top_p_keep(rows, k, p, filter_apply_order)
    out_rows = torch.arange(rows.shape[0], device=probs.device)
    u = uniform(seed, offset, out_rows, 0)
    # Bad entries may be filtered out of the weights: judge the unfiltered row (and a NaN top_p).
    invalid = bad_rows(rows) | p.isnan()
    index, valid = draw(torch.where(keep, rows, 0.0), u, invalid)
    return _result(index, valid, indices, return_valid)
