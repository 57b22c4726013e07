"""mamba.causal_conv1d_fwd: depthwise causal conv1d over prefill sequences, in place.

CUDA (in place, so each sequence's channel is owned by one warp or CTA from its first column to
its last; the W-1 halo travels in registers, never re-read from the overwritten x):
- channel-first x (stride 1 along time): a warp per (sequence, channel), 16-byte packs along time
  interleaved over the lanes, double-buffered (the next 8 per lane in flight during this 8's
  math; rows of at most _SHORT_ROW_MAX_BYTES: 2 per lane, both buffers loaded at once and
  reloaded in turn), the halo by warp shuffles, a lean path for packs inside the sequence;
- 16-byte aligned channel-last x (the proj_out view): a 512-thread CTA per (sequence, 64 bytes of
  channels), 4 consecutive steps per thread, the halo by shuffles and a small shared buffer, the
  next round's loads in flight during this round's math;
- anything else: a scalar CTA per (sequence, channel) with a shared-memory halo.
The torch reference (fp32 math, rounded once) is the fallback.
"""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_tensor
from kernels_mamba import reference
from kernels_mamba._checks import (
    FLOATS,
    INDEX,
    check_activation,
    check_conv_weight,
    check_int,
    check_vector,
)

OP_ID = "mamba.causal_conv1d_fwd"

CAUSAL_CONV1D_FWD_CUDA = ModuleSpec(
    name="causal_conv1d_fwd",
    package="kernels_mamba",
    sources=("csrc/causal_conv1d_fwd.cuh",),
    exports=(("causal_conv1d_fwd", "causal_conv1d_fwd"),),
    description="CUDA: a warp (channel-first) or CTA (channel-last) owns a sequence's channels, "
    "16-byte packs, the halo in registers, fp32 math",
)
_fwd_kernel = CompiledFunction(CAUSAL_CONV1D_FWD_CUDA, "causal_conv1d_fwd")
# Channel-first rows (the time axis of a sequence's channel) of at most this many bytes take the
# 2-pack warp kernel (both buffers loaded at once), longer ones the 8-pack kernel; read each call
# so one process can A/B it (-1: never; sys.maxsize: always). H200 interleaved A/B, bf16: 512
# columns (1 KB) won, 10.08 -> 7.31 us at [1, 4096, 512]; 2 KB, 1024 columns, is where the 2-pack
# kernel's two iterations still hold the whole row (not measured); the 8-pack kernel kept the one-
# ahead double buffer, as the two-ahead one lost at [1, 4096, 2048] and [1, 4096, 4096].
_SHORT_ROW_MAX_BYTES = 2048


def _causal_conv1d_fwd_torch(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor | None,
    query_start_loc: torch.Tensor | None,
    cache_indices: torch.Tensor | None,
    has_initial_state: torch.Tensor | None,
    activation: str | None,
    pad_slot_id: int,
) -> None:
    reference.causal_conv1d_fwd(
        x,
        weight,
        bias,
        conv_states,
        query_start_loc,
        cache_indices,
        has_initial_state,
        activation,
        pad_slot_id,
    )


def _causal_conv1d_fwd_cuda(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor | None,
    query_start_loc: torch.Tensor | None,
    cache_indices: torch.Tensor | None,
    has_initial_state: torch.Tensor | None,
    activation: str | None,
    pad_slot_id: int,
) -> None:
    _fwd_kernel(
        x,
        weight,
        bias,
        conv_states,
        query_start_loc,
        cache_indices,
        has_initial_state,
        activation is not None,
        pad_slot_id,
        _SHORT_ROW_MAX_BYTES,
    )


def _causal_conv1d_fwd_cuda_eligible(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    conv_states: torch.Tensor | None,
    query_start_loc: torch.Tensor | None,
    cache_indices: torch.Tensor | None,
    has_initial_state: torch.Tensor | None,
    activation: str | None,
    pad_slot_id: int,
) -> str | None:
    """A CTA row per sequence: at most 65535 sequences; index vectors contiguous."""
    seqs = x.shape[0] if x.dim() == 3 else query_start_loc.shape[0] - 1
    if seqs > 65535:
        return "needs at most 65535 sequences"
    for t in (query_start_loc, cache_indices):
        if t is not None and t.numel() > 1 and t.stride(0) != 1:
            return "needs contiguous query_start_loc and cache_indices"
    return None


CAUSAL_CONV1D_FWD = Op(_causal_conv1d_fwd_torch, mutates=("x", "conv_states"), device="x")


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
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """Prefill causal conv1d (Mamba-2): ``y = act(bias + sum_j w[:, j] * xx[t + j])`` per sequence,
    where xx is the sequence preceded by its W-1 state columns (``conv_states[cache_indices[b]]``
    if ``has_initial_state[b]``, else zeros). The output overwrites x, which is returned; the state
    row then holds the last W-1 columns of xx (from the original inputs; a sequence shorter than W-1
    keeps the tail of its prefix). A sequence whose cache index is pad_slot_id is skipped entirely.

    Parameters
    ----------
    x : varlen [D, T] (with query_start_loc; a channel-last view with strides (1, row) works) or
        batched [Bt, D, L]; float32, float16 or bfloat16; overwritten.
    weight : [D, W], W in {2, 3, 4}. bias : [D] or None.
    conv_states : [S, D, W-1] or None, updated in place.
    query_start_loc : int32 [B+1] sequence starts (varlen x only).
    cache_indices : int32 [B] state rows (default: row b), or pad_slot_id to skip.
    has_initial_state : bool [B]; None means no sequence has a prefix.
    activation : "silu" (or "swish") or None.
    """
    check_tensor(OP_ID, "x", x, dtypes=FLOATS, ndim=(2, 3))
    device = x.device
    dim = x.shape[0] if x.dim() == 2 else x.shape[1]
    width = check_conv_weight(OP_ID, weight, bias, dim, device)
    if x.dim() == 2:
        if query_start_loc is None:
            raise ValueError(f"{OP_ID}: varlen x [D, T] needs query_start_loc [B+1]")
        check_tensor(OP_ID, "query_start_loc", query_start_loc, dtypes=INDEX, ndim=1, device=device)
        if query_start_loc.shape[0] < 1:
            raise ValueError(f"{OP_ID}: query_start_loc must have B+1 >= 1 entries, got 0")
        batch = query_start_loc.shape[0] - 1
    else:
        if query_start_loc is not None:
            raise ValueError(f"{OP_ID}: batched x [Bt, D, L] takes no query_start_loc")
        batch = x.shape[0]
    if conv_states is not None:
        check_tensor(OP_ID, "conv_states", conv_states, dtypes=FLOATS, ndim=3, device=device)
        if tuple(conv_states.shape[1:]) != (dim, width - 1):
            raise ValueError(
                f"{OP_ID}: conv_states must have shape [S, D, W-1] = [S, {dim}, {width - 1}], "
                f"got {tuple(conv_states.shape)}"
            )
    elif has_initial_state is not None:
        raise ValueError(f"{OP_ID}: has_initial_state needs conv_states")
    check_vector(OP_ID, "cache_indices", cache_indices, batch, device)
    check_vector(OP_ID, "has_initial_state", has_initial_state, batch, device, (torch.bool,))
    check_activation(OP_ID, activation)
    check_int(OP_ID, "pad_slot_id", pad_slot_id)
    if batch and x.numel():
        CAUSAL_CONV1D_FWD.run(
            x,
            weight,
            bias,
            conv_states,
            query_start_loc,
            cache_indices,
            has_initial_state,
            activation,
            pad_slot_id,
            backend=backend,
        )
    return x


def _causal_conv1d_fwd_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: varlen with states (a channel-last view,
    a padded and a too-short sequence) and batched bf16 without states."""
    g = torch.Generator().manual_seed(0)
    dim, width = 24, 4
    proj = torch.randn(19, dim + 8, generator=g)
    x = proj[:, :dim].T.to(device)
    weight = torch.randn(dim, width, generator=g).to(device)
    bias = torch.randn(dim, generator=g).to(device)
    states = torch.randn(6, dim, width - 1, generator=g).to(device)
    qsl = torch.tensor([0, 2, 9, 9, 19], dtype=torch.int32, device=device)
    idx = torch.tensor([4, -1, 1, 0], dtype=torch.int32, device=device)
    init = torch.tensor([True, True, False, True], device=device)
    batched = torch.randn(3, dim, 7, generator=g).to(torch.bfloat16).to(device)
    half = torch.randn(2, dim, 5, generator=g).to(torch.float16).to(device)
    return [
        ((x, weight, bias, states, qsl, idx, init), {}),
        ((batched, weight), {"activation": None}),
        ((half, weight, bias), {}),
    ]
