"""Pure-torch references of the speculative-decoding ops: the correctness oracle and the fallback.

Index values are preconditions: a value out of range raises ValueError here (the GPU kernels skip or
assert instead), so these references synchronise with the host to check them.
"""

from __future__ import annotations

import torch

from kernels_jit.rng import uniform


def _check_range(op: str, name: str, t: torch.Tensor, low: int, high: int) -> None:
    if t.numel() and (int(t.min()) < low or int(t.max()) >= high):
        raise ValueError(
            f"speculative.{op}: {name} values must lie in [{low}, {high}), got values in "
            f"[{int(t.min())}, {int(t.max())}]"
        )


def verify_tree_greedy(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    """Accept, per request, the longest draft-tree path whose tokens match the target's argmax.

    In place: ``predicts[last] = accepted token`` along the path and the bonus token at its end,
    ``accept_index[b, :n+1]`` = flat positions of the root and the accepted nodes,
    ``accept_token_num[b] = n``. Each step walks one level (first child, then siblings) for at most
    N nodes, so malformed or cyclic trees terminate. All requests advance together.
    """
    batch, nodes = candidates.shape
    steps = accept_index.shape[1]
    if batch == 0:
        return
    flat = predicts.shape[0]
    _check_range("verify_tree_greedy", "retrive_index", retrive_index, 0, flat)
    _check_range("verify_tree_greedy", "retrive_next_token", retrive_next_token, -1, nodes)
    _check_range("verify_tree_greedy", "retrive_next_sibling", retrive_next_sibling, -1, nodes)
    b = torch.arange(batch, device=candidates.device)
    cand = candidates.long()
    index = retrive_index.long()
    child = retrive_next_token.long()
    sibling = retrive_next_sibling.long()
    target = target_predict.long()

    last = index[:, 0]
    accept_index[:, 0] = last.to(accept_index.dtype)
    accepted = torch.zeros(batch, dtype=torch.long, device=candidates.device)
    active = torch.ones(batch, dtype=torch.bool, device=candidates.device)
    cur = torch.zeros(batch, dtype=torch.long, device=candidates.device)
    for _ in range(1, steps):
        cur = torch.where(active, child[b, cur.clamp(min=0)], -1)
        active = active & (cur >= 0)
        want = target[last]
        found = torch.zeros_like(active)
        for _ in range(nodes):
            searching = active & ~found & (cur >= 0)
            if not bool(searching.any()):
                break
            match = searching & (cand[b, cur.clamp(min=0)] == want)
            found = found | match
            cur = torch.where(searching & ~match, sibling[b, cur.clamp(min=0)], cur)
        active = active & found
        if not bool(active.any()):
            break
        node = index[b, cur.clamp(min=0)]
        predicts[last[active]] = cand[b, cur.clamp(min=0)][active].to(predicts.dtype)
        accepted = accepted + active.long()
        accept_index[b[active], accepted[active]] = node[active].to(accept_index.dtype)
        last = torch.where(active, node, last)
    predicts[last] = target[last].to(predicts.dtype)
    accept_token_num.copy_(accepted)


_PACKBITS = "speculative.segment_packbits"


def check_packbits_indptr(
    nnz: int,
    input_indptr: torch.Tensor,
    output_indptr: torch.Tensor | None = None,
    out_bytes: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Check the segment pointers of segment_packbits on the host; return host int64 copies of
    ``input_indptr`` and ``output_indptr`` (computed back to back from 0 when None).

    ``input_indptr`` must be non-decreasing within ``[0, nnz]``; ``output_indptr`` must start at
    >= 0 and give segment b exactly ``ceil(len_b / 8)`` bytes; its last entry must fit in
    ``out_bytes``, or, when ``out_bytes`` is None (y is allocated from ``output_indptr[-1]``), it
    must start at 0, so that y is ``sum(ceil(len_b / 8)) <= nnz / 8 + B`` bytes, every one of them
    written. One device-to-host copy per pointer tensor (a sync on CUDA)."""
    if input_indptr.numel() < 1:
        raise ValueError(f"{_PACKBITS}: input_indptr must have B+1 >= 1 entries, got shape (0,)")
    starts = input_indptr.long().cpu()
    lens = starts[1:] - starts[:-1]
    nbytes = (lens + 7) // 8
    within = f"{_PACKBITS}: input_indptr must be non-decreasing within [0, {nnz}], got"
    if int(starts[0]) < 0:
        raise ValueError(f"{within} input_indptr[0] = {int(starts[0])}")
    if lens.numel() and bool((lens < 0).any()):
        b = int((lens < 0).long().argmax())
        raise ValueError(
            f"{within} input_indptr[{b + 1}] = {int(starts[b + 1])} < "
            f"input_indptr[{b}] = {int(starts[b])}"
        )
    if int(starts[-1]) > nnz:
        raise ValueError(
            f"{within} input_indptr[{starts.shape[0] - 1}] = {int(starts[-1])} (x has {nnz} "
            "elements)"
        )
    if output_indptr is None:
        outs = torch.zeros_like(starts)
        outs[1:] = torch.cumsum(nbytes, 0)
        return starts, outs
    outs = output_indptr.long().cpu()
    if int(outs[0]) < 0 or (out_bytes is None and int(outs[0]) != 0):
        need = ">= 0" if out_bytes is not None else "0 when out is None (y is allocated for it)"
        raise ValueError(f"{_PACKBITS}: output_indptr[0] must be {need}, got {int(outs[0])}")
    wrong = (outs[1:] - outs[:-1]) != nbytes
    if wrong.numel() and bool(wrong.any()):
        b = int(wrong.long().argmax())
        raise ValueError(
            f"{_PACKBITS}: output_indptr must give each segment ceil(len/8) bytes, got "
            f"output_indptr[{b + 1}] - output_indptr[{b}] = {int(outs[b + 1] - outs[b])} for "
            f"segment {b} of length {int(lens[b])} (ceil(len/8) = {int(nbytes[b])})"
        )
    if out_bytes is not None and int(outs[-1]) > out_bytes:
        raise ValueError(
            f"{_PACKBITS}: out has {out_bytes} bytes, output_indptr needs {int(outs[-1])}"
        )
    return starts, outs


def segment_packbits_into(
    y: torch.Tensor,
    x: torch.Tensor,
    input_indptr: torch.Tensor,
    output_indptr: torch.Tensor,
    bitorder: str = "little",
) -> None:
    """Write the packed bytes of every segment into ``y[output_indptr[b]:output_indptr[b+1]]``.

    "little": element 8j+t of a segment is bit t (LSB first) of its byte j; "big": bit 7-t. Bits
    past the end of a segment are 0; bytes of ``y`` outside every segment are left untouched.
    The pointers are checked first (:func:`check_packbits_indptr`).
    """
    if input_indptr.numel() > 1:
        check_packbits_indptr(x.shape[0], input_indptr, output_indptr, y.shape[0])
    starts = input_indptr.long()
    lens = starts[1:] - starts[:-1]
    nbytes = (lens + 7) // 8
    outs = output_indptr.long()
    total = int(nbytes.sum()) if nbytes.numel() else 0
    if total == 0:
        return
    segment = torch.repeat_interleave(torch.arange(lens.shape[0], device=x.device), nbytes)
    first_byte = torch.cumsum(nbytes, 0) - nbytes
    local = torch.arange(total, device=x.device) - first_byte[segment]
    t = torch.arange(8, device=x.device)
    within = 8 * local[:, None] + t
    valid = within < lens[segment][:, None]
    element = (starts[segment][:, None] + within).clamp(max=x.shape[0] - 1)
    bits = valid & x[element]
    shift = t if bitorder == "little" else 7 - t
    y[outs[segment] + local] = (bits.long() << shift).sum(dim=1).to(torch.uint8)


def segment_packbits(
    x: torch.Tensor,
    input_indptr: torch.Tensor,
    output_indptr: torch.Tensor | None = None,
    bitorder: str = "little",
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y uint8, output_indptr int32)``; the default output_indptr packs segments back to back.
    The pointers are checked before y is allocated, so bad ones never size an allocation."""
    _, outs = check_packbits_indptr(x.shape[0], input_indptr, output_indptr)
    if output_indptr is None:
        output_indptr = outs.to(device=input_indptr.device, dtype=torch.int32)
    y = torch.zeros(int(outs[-1]), dtype=torch.uint8, device=x.device)
    segment_packbits_into(y, x, input_indptr, output_indptr, bitorder)
    return y, output_indptr


def draw(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Smallest j with ``cumsum(w)_j > u * sum(w)`` per row (0 for a zero or NaN row); int64 [B]."""
    vocab = weights.shape[1]
    cdf = weights.cumsum(dim=1)
    total = cdf[:, -1]
    # searchsorted(cdf, u * total, right=True) as a count (cdf is non-decreasing for the
    # non-negative weights that reach a valid draw): the same index, and torch.compile's
    # inductor lowers it (its searchsorted lowering fails on this [B, 1] query).
    index = (cdf <= (u * total)[:, None]).sum(dim=1)
    last_positive = (vocab - 1) - (weights > 0).flip(1).to(torch.int8).argmax(dim=1)
    index = torch.where(index >= vocab, last_positive, index)
    return torch.where(total > 0, index, 0)


def chain_speculative_sampling(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    *,
    seed: torch.Tensor,
    offset: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rejection sampling of a draft chain against the target (exact target distribution).

    ``u_i = U(seed, offset, b, i)`` accepts draft i iff ``u_i * q < p``; the first rejection r
    stops; position r is drawn from ``relu(target[r] - draft[r])`` (or target[r] when that mass
    is 0), or, if every draft was accepted, position n from target[n], with
    ``U(seed, offset, b, n)``.
    Returns (output_token_ids [B, n+1] int32, accepted_num [B] int32, emitted_num [B] int32).
    """
    batch, n, vocab = draft_probs.shape
    device = draft_probs.device
    ids = draft_token_ids.long()
    _check_range("chain_speculative_sampling", "draft_token_ids", ids, 0, vocab)
    dp, tp = draft_probs.float(), target_probs.float()
    rows = torch.arange(batch, device=device)
    u = uniform(
        seed.reshape(-1, 1),
        offset.reshape(-1, 1),
        rows[:, None],
        torch.arange(n + 1, device=device),
    )
    q = dp.gather(2, ids[..., None]).squeeze(-1)
    p = tp[:, :n].gather(2, ids[..., None]).squeeze(-1)
    accept = u[:, :n] * q < p
    rejected_at = accept.long().cumprod(dim=1).sum(dim=1)  # r: n when every draft is accepted
    target_r = tp[rows, rejected_at]
    if n:
        residual = (target_r - dp[rows, rejected_at.clamp(max=n - 1)]).clamp(min=0)
        use_residual = (rejected_at < n) & (residual.sum(dim=1) > 0)
        weights = torch.where(use_residual[:, None], residual, target_r)
    else:
        weights = target_r
    token = draw(weights, u[:, n])
    position = torch.arange(n + 1, device=device)[None, :]
    padded = torch.cat([ids, ids.new_full((batch, 1), -1)], dim=1)
    out = torch.where(position < rejected_at[:, None], padded, -1)
    out = torch.where(position == rejected_at[:, None], token[:, None], out)
    return (
        out.to(torch.int32),
        accept.sum(dim=1).to(torch.int32),
        rejected_at.to(torch.int32),
    )
