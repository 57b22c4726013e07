"""Pure-torch references of the Mamba ops: the correctness oracle and the fallback.

Convolution convention (Mamba-2): weight [D, W], column W-1 multiplies the current token,
``y_t = bias + sum_j w[:, j] * xx[t + j]`` where xx is the input preceded by W-1 state columns.
Everything is computed in fp32 and rounded once. Index values are preconditions: out-of-range
values raise ValueError here when run eagerly (a host sync); while a CUDA graph is being captured
or torch.compile traces, the check is skipped and such rows are skipped, like the GPU kernels do.
Nothing else syncs with the host (no boolean-mask indexing), so the references are capturable.
"""

from __future__ import annotations

import torch

ACTIVATIONS = (None, "silu", "swish")


def _host_checks(t: torch.Tensor) -> bool:
    """Whether value checks (host syncs) may run: not under torch.compile, not while the current
    CUDA stream is being captured into a graph."""
    if torch.compiler.is_compiling():
        return False
    return not (t.is_cuda and torch.cuda.is_current_stream_capturing())


def _check_range(op: str, name: str, t: torch.Tensor, live: torch.Tensor, high: int) -> None:
    """Entries of ``t`` where ``live`` lie in [0, high) (eagerly; see _host_checks)."""
    if not t.numel() or not _host_checks(t):
        return
    lo = int(torch.where(live, t, 0).min())
    hi = int(torch.where(live, t, 0).max())
    if lo < 0 or hi >= high:
        raise ValueError(
            f"mamba.{op}: {name} must lie in [0, {high}) (or equal pad_slot_id), got values in "
            f"[{lo}, {hi}]"
        )


def _write_rows(
    dst: torch.Tensor, rows: torch.Tensor, live: torch.Tensor, values: torch.Tensor
) -> None:
    """``dst[rows[b]] = values[b]`` for every live b with rows[b] in range, without a host sync
    (no boolean-mask indexing): each touched slot gets one live row's values (the last one, where
    rows repeat), every other slot named in ``rows`` is rewritten with its own values."""
    slots = dst.shape[0]
    if slots == 0 or rows.numel() == 0:
        return
    live = live & (rows >= 0) & (rows < slots)
    safe = rows.clamp(0, slots - 1)
    order = torch.arange(rows.shape[0], device=rows.device)
    owner = torch.full((slots,), -1, dtype=torch.long, device=rows.device)
    owner.scatter_reduce_(0, safe, torch.where(live, order, -1), reduce="amax")
    own = owner[safe]
    hit = (own >= 0).view(-1, *([1] * (dst.dim() - 1)))
    new = torch.where(hit, values[own.clamp(min=0)].to(dst.dtype), dst[safe])
    dst.index_copy_(0, safe, new)  # repeated slots all carry the same values


def _activate(y: torch.Tensor, activation: str | None) -> torch.Tensor:
    return y * torch.sigmoid(y) if activation in ("silu", "swish") else y


def _conv_varlen(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor | None,
    query_start_loc: torch.Tensor,
    cache_indices: torch.Tensor | None,
    has_initial_state: torch.Tensor | None,
    activation: str | None,
    pad_slot_id: int,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """(y fp32 [D, T] with untouched columns = x, new states fp32 [B, D, W-1] or None,
    live sequences bool [B], their state rows int64 [B]) for a varlen x [D, T]."""
    dim, tokens = x.shape
    width = weight.shape[1]
    qsl = query_start_loc.long()
    batch = qsl.shape[0] - 1
    starts, lens = qsl[:-1], qsl[1:] - qsl[:-1]
    if (
        batch
        and _host_checks(qsl)
        and (int(lens.min()) < 0 or int(qsl[0]) < 0 or int(qsl[-1]) > tokens)
    ):
        raise ValueError(
            f"mamba.causal_conv1d_fwd: query_start_loc must be non-decreasing within [0, {tokens}],"
            f" got {qsl.tolist()[:16]}"
        )
    device = x.device
    rows = torch.arange(batch, device=device) if cache_indices is None else cache_indices.long()
    live = (
        rows != pad_slot_id
        if cache_indices is not None
        else torch.ones_like(rows, dtype=torch.bool)
    )
    if conv_states is not None:
        _check_range("causal_conv1d_fwd", "cache_indices", rows, live, conv_states.shape[0])
        live = live & (rows >= 0) & (rows < conv_states.shape[0])
    if conv_states is None or has_initial_state is None:
        use_state = torch.zeros_like(live)
    else:
        use_state = live & has_initial_state.bool()
    prefix = torch.zeros(batch, dim, width - 1, dtype=torch.float32, device=device)
    if conv_states is not None and batch:
        stored = conv_states[rows.clamp(0, conv_states.shape[0] - 1)].float()
        prefix = torch.where(use_state[:, None, None], stored, prefix)

    xf = x.float()
    tok = torch.arange(tokens, device=device)
    seq = torch.searchsorted(qsl[1:], tok, right=True).clamp(max=max(batch - 1, 0))
    inside = (tok >= qsl[0]) & (tok < qsl[-1]) if batch else torch.zeros_like(tok, dtype=torch.bool)
    active = inside & live[seq] if batch else inside
    local = tok - starts[seq] if batch else tok
    acc = torch.zeros(dim, tokens, dtype=torch.float32, device=device)
    if bias is not None:
        acc = acc + bias.float()[:, None]
    for j in range(width):
        pos = local + j  # position in xx = [prefix (W-1), x_b]
        from_x = xf[:, (tok + j - (width - 1)).clamp(0, max(tokens - 1, 0))]
        from_prefix = prefix[seq, :, pos.clamp(max=width - 2)].T if batch else from_x
        acc = acc + weight[:, j, None].float() * torch.where(pos < width - 1, from_prefix, from_x)
    y = torch.where(active, _activate(acc, activation), xf)

    new_states = None
    if conv_states is not None and batch:
        pos = lens[:, None] + torch.arange(width - 1, device=device)  # last W-1 positions of xx
        cols = (starts[:, None] + pos - (width - 1)).clamp(0, max(tokens - 1, 0))
        from_x = xf[:, cols].permute(1, 0, 2)
        from_prefix = prefix.gather(2, pos.clamp(max=width - 2)[:, None, :].expand_as(prefix))
        new_states = torch.where((pos < width - 1)[:, None, :], from_prefix, from_x)
    return y, new_states, live, rows


def causal_conv1d_fwd(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    conv_states: torch.Tensor | None = None,
    query_start_loc: torch.Tensor | None = None,
    cache_indices: torch.Tensor | None = None,
    has_initial_state: torch.Tensor | None = None,
    activation: str | None = "silu",
    pad_slot_id: int = -1,
) -> torch.Tensor:
    """Depthwise causal conv of each sequence, written into x (returned); conv_states rows of the
    sequences receive the last W-1 columns of ``concat(prefix, x_b)`` from the original inputs.
    x is varlen [D, T] with query_start_loc, or batched [Bt, D, L]."""
    batched = x.dim() == 3
    if batched:
        seqs, dim, length = x.shape
        flat = x.transpose(0, 1).reshape(dim, seqs * length)
        query_start_loc = torch.arange(seqs + 1, device=x.device) * length
    else:
        flat = x
    y, new_states, live, rows = _conv_varlen(
        flat,
        weight,
        bias,
        conv_states,
        query_start_loc,
        cache_indices,
        has_initial_state,
        activation,
        pad_slot_id,
    )
    if new_states is not None:
        _write_rows(conv_states, rows, live, new_states)
    if batched:
        y = y.reshape(x.shape[1], x.shape[0], x.shape[2]).transpose(0, 1)
    x.copy_(y)
    return x


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    cache_seqlens: torch.Tensor | None = None,
    conv_state_indices: torch.Tensor | None = None,
    pad_slot_id: int = -1,
) -> torch.Tensor:
    """One decode step (L > 1: speculative tokens) for x [B, D] or [B, D, L], written into x
    (returned). Without cache_seqlens the state row is shifted: ``state = concat(state, x)[-Ls:]``;
    with it the state is a circular buffer written at ``cache_seqlens % Ls``."""
    xv = x.unsqueeze(-1) if x.dim() == 2 else x
    batch, dim, length = xv.shape
    slots, _, state_len = conv_state.shape
    width = weight.shape[1]
    if conv_state_indices is None:
        rows = torch.arange(batch, device=x.device)
        live = torch.ones(batch, dtype=torch.bool, device=x.device)
    else:
        rows = conv_state_indices.long()
        live = rows != pad_slot_id
    _check_range("causal_conv1d_update", "conv_state_indices", rows, live, slots)
    live = live & (rows >= 0) & (rows < slots)
    state = conv_state[rows.clamp(0, max(slots - 1, 0))].float()
    xf = xv.float()
    if cache_seqlens is None:
        xx = torch.cat([state, xf], dim=-1)
        new_state = xx[..., -state_len:]
    else:
        seqlens = cache_seqlens.long()
        back = torch.arange(-(width - 1), 0, device=x.device)
        window = (seqlens[:, None] + back) % state_len
        prefix = state.gather(2, window[:, None, :].expand(batch, dim, width - 1))
        xx = torch.cat([prefix, xf], dim=-1)
        write = (seqlens[:, None] + torch.arange(length, device=x.device)) % state_len
        new_state = state.scatter(2, write[:, None, :].expand(batch, dim, length), xf)
    first = xx.shape[-1] - length - (width - 1)
    acc = torch.zeros(batch, dim, length, dtype=torch.float32, device=x.device)
    if bias is not None:
        acc = acc + bias.float()[None, :, None]
    for j in range(width):
        acc = acc + weight[None, :, j, None].float() * xx[..., first + j : first + j + length]
    y = torch.where(live[:, None, None], _activate(acc, activation), xf)
    _write_rows(conv_state, rows, live, new_state)
    xv.copy_(y)
    return x


def selective_state_update(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,  # noqa: N803
    B: torch.Tensor,  # noqa: N803
    C: torch.Tensor,  # noqa: N803
    D: torch.Tensor | None = None,  # noqa: N803
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    state_batch_indices: torch.Tensor | None = None,
    pad_slot_id: int = -1,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Mamba-2 decode step: ``dt' = softplus?(dt + dt_bias)``,
    ``state = state * exp(dt' A) + (dt' B) x``, ``y = sum_ds state C + D x``, ``y *= silu(z)``.
    state [S, nh, hd, ds] is updated in place (rows of pad_slot_id skipped); returns y [B, nh, hd]
    (in ``out`` when given; rows of skipped slots are left as they were)."""
    slots, heads = state.shape[:2]
    batch = x.shape[0]
    groups = B.shape[1]
    if state_batch_indices is None:
        rows = torch.arange(batch, device=x.device)
        live = torch.ones(batch, dtype=torch.bool, device=x.device)
    else:
        rows = state_batch_indices.long()
        live = rows != pad_slot_id
    _check_range("selective_state_update", "state_batch_indices", rows, live, slots)
    live = live & (rows >= 0) & (rows < slots)
    s = state[rows.clamp(0, max(slots - 1, 0))].float()
    step = dt.float()
    if dt_bias is not None:
        step = step + dt_bias.float()
    if dt_softplus:
        step = torch.where(step > 20.0, step, torch.log1p(torch.exp(step)))
    b_heads = B.float().repeat_interleave(heads // groups, dim=1)[:, :, None, :]
    c_heads = C.float().repeat_interleave(heads // groups, dim=1)[:, :, None, :]
    s = (
        s * torch.exp(step[..., None] * A.float())
        + (step[..., None] * b_heads) * x.float()[..., None]
    )
    y = (s * c_heads).sum(dim=-1)
    if D is not None:
        y = y + x.float() * D.float()
    if z is not None:
        y = y * (z.float() * torch.sigmoid(z.float()))
    _write_rows(state, rows, live, s)
    if out is None:
        out = torch.zeros_like(x)
    out.copy_(torch.where(live[:, None, None], y.to(out.dtype), out))
    return out
