# ruff: noqa: N803  (Triton constexpr parameters are upper case by convention)
"""Triton split-KV decode attention (the Triton counterpart of a ``csrc/<name>.cuh``).

One query token per request attends to the KV slots ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``
of a token-indexed cache ``[S, Hk, D]`` (a paged ``[P, ps, Hk, D]`` cache passed as its
``[P*ps, Hk, D]`` view).

Stage 1, grid ``(Hk * head_blocks, B, splits)``: a program takes up to ``BLOCK_H`` query heads of
one KV head (the GQA group packed into the M dimension of ``tl.dot``, padded to 16 rows; 64 for
MLA's 128 heads, see :func:`stage1_config`) and one
of the request's ``splits`` chunks of tokens, and loops over it in tiles of ``BLOCK_N`` gathered
slots: scores ``q k^T`` in fp32, scaled by ``sm_scale * k_scale * log2(e)`` so the online
softmax runs on ``exp2``, then ``acc += p v``. With one split it writes the normalised output and
the LSE itself (one launch); otherwise it writes the split's output (normalised, fp32) and its
natural-log LSE (-inf for an empty split) to a workspace.

The splits are merged by their LSE (the merge_state formula, the sink added to the denominator)
in one of two ways, both through ``_merge_splits``, which loads ``S_CHUNK`` splits at a time so
their loads overlap (no dependent load per split):

- ticket (one launch): after its partial store, each program takes a ticket from an int32
  counter of its (request, head block) with a gpu-scope acq_rel atomic (after a CTA barrier, so
  every thread's store is released); the program that draws the last ticket resets the counter
  to 0 and merges the head block's splits, reading them past L1 (``.cg``). The counters live in
  a per-device buffer zeroed once, outside any capture, and are left at 0 by every launch, so
  CUDA-graph replays need no memset. Chosen when one program's merge reads at most
  ``TICKET_MERGE_BYTES`` (the GQA decode shapes; not MLA's 16-head blocks of 512 channels).
- stage 2, grid ``(B, Hq)``: a second launch merges one head per program (MLA, and a capture
  that finds no counter buffer yet).

Kernels running concurrently on two streams may share counters: each launch takes the next of
``COUNTER_REGIONS`` regions of the buffer round robin, so two launches collide only if they are
``COUNTER_REGIONS`` launches apart and run at the same time.

The split count is chosen once, on the host, by :func:`decode_splits`, and every path reads it
from the one Python int (the merge covers every split; an empty one carries LSE -inf), so the
stages cannot disagree. It never synchronises: the longest request is bounded by
``kv_indices.numel()``, which is static under CUDA graphs.
"""

from __future__ import annotations

import functools
import itertools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

# Stage-1 programs per request: the ~2 waves of a 132-SM H200 that the split count aims at, and
# the fewest tokens worth a split of their own (one BLOCK_N tile of the default config).
WAVES = 2
MIN_TOKENS_PER_SPLIT = 64
MAX_SPLITS = 64
# The ticket merge's bound on what one program reads back (splits x heads x Dv fp32): predicted
# to cost less than a second launch's fixed latency under CUDA graphs (to be swept on the H200).
TICKET_MERGE_BYTES = 64 * 1024
# fp32 values a thread of one merge chunk [rows, S_CHUNK, Dv]: Llama's ticket merge then needs
# 153 registers, fewer than its split loop (sm_90 compile, triton 3.9).
MERGE_CHUNK_PER_THREAD = 32
COUNTER_REGIONS = 64


def decode_splits(batch: int, kv_heads: int, max_seq_len: int, sm_count: int) -> int:
    """The number of KV splits per request, for both stages.

    ``kv_heads`` counts the stage-1 programs of one request and one split (KV heads times
    query-head blocks). Splits are added until ``batch * kv_heads * splits`` fills ``WAVES``
    waves of ``sm_count`` SMs, while each split keeps at least ``MIN_TOKENS_PER_SPLIT`` tokens of
    ``max_seq_len`` (an upper bound of the longest request; the kernels size the real chunks
    from each request's length at run time) and there are at most ``MAX_SPLITS``.
    """
    programs = max(1, batch * kv_heads)
    want = -(-WAVES * sm_count // programs)
    by_length = -(-max(max_seq_len, 1) // MIN_TOKENS_PER_SPLIT)
    return max(1, min(want, by_length, MAX_SPLITS))


@functools.lru_cache(maxsize=16)
def sm_count(device: torch.device) -> int:
    """SMs of a CUDA device (cached); 4 under the interpreter, which keeps CPU splits small."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


class StageConfig(NamedTuple):
    """Stage 1's launch shape for one head dim and GQA group."""

    block_h: int  # query heads per program (the M of tl.dot: at least 16)
    block_n: int  # KV slots per tile
    num_warps: int
    num_stages: int


def stage1_config(d: int, group: int) -> StageConfig:
    """Stage 1's launch shape, measured on the H200 (bf16, CUDA graphs,
    ``python -m shared.bench.sweep_decode_attention``, 2026-12-04).

    D <= 128: 64-slot tiles, 4 warps, 2 stages (Llama-3-8B B 1 L 1024: 7.58 us against 8.60 for
    32/4/3; B 64 L 4096: 252.6 against 290.8). MLA (D 576) with >= 64 query heads: 64 heads per
    program, so each KV tile read from L2 serves four times the rows (B 64 L 4096: 565 us
    against 1343 for 16 heads, 32/8/2; B 1: 26.5 against 35.4 in the benchmark suite; 16 warps,
    3 stages, 32- or 128-slot tiles and 128 heads were slower or did not compile). D = 256 and MLA
    with fewer heads: not swept (compile-checked, no spills).
    """
    if d > 256:  # MLA: a [576, N] K tile, v its first 512 channels
        return StageConfig(64, 64, 8, 2) if group >= 64 else StageConfig(16, 64, 4, 2)
    if d > 128:
        return StageConfig(16, 32, 8, 3)
    return StageConfig(16, 64, 4, 2)


@triton.jit
def _tanh(x):
    # tanh(x) = 1 - 2 / (exp(2x) + 1): saturates to +-1 without NaN, no libdevice needed
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


@triton.jit
def _merge_splits(
    ws_o_ptr,
    ws_lse_ptr,
    sinks_ptr,
    o_ptr,
    lse_ptr,
    b,
    heads,  # [ROWS] query heads of request b
    mask_h,
    stride_wb,
    stride_wh,
    stride_ws,
    stride_lwb,
    stride_lwh,
    stride_lws,
    stride_ob,
    stride_oh,
    stride_lb,
    stride_lh,
    num_splits,
    BLOCK_S: tl.constexpr,  # next_power_of_2(num_splits)
    S_CHUNK: tl.constexpr,  # splits loaded together
    BLOCK_DV: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    """o = sum_s exp(lse_s - m) o_s / total and lse = m + log(total) for the rows ``heads``,
    ``total`` holding every split's exp(lse_s - m) and the sink's exp(sink - m)."""
    offs_s = tl.arange(0, BLOCK_S)
    offs_c = tl.arange(0, S_CHUNK)
    offs_dv = tl.arange(0, BLOCK_DV)
    h64 = heads.to(tl.int64)
    lse_rows = ws_lse_ptr + b.to(tl.int64) * stride_lwb + h64[:, None] * stride_lwh
    mask_s = mask_h[:, None] & (offs_s[None, :] < num_splits)
    lses = tl.load(lse_rows + offs_s[None, :] * stride_lws, mask=mask_s, other=float("-inf"),
                   cache_modifier=".cg")  # fmt: skip
    m = tl.max(lses, 1)
    nonempty = m > float("-inf")
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + heads, mask=mask_h, other=0.0).to(tl.float32)
        m_use = tl.where(nonempty, tl.maximum(m, sink), 0.0)
        total = tl.sum(tl.exp(lses - m_use[:, None]), 1) + tl.exp(sink - m_use)
    else:
        m_use = tl.where(nonempty, m, 0.0)
        total = tl.sum(tl.exp(lses - m_use[:, None]), 1)
    o_rows = ws_o_ptr + b.to(tl.int64) * stride_wb + h64[:, None, None] * stride_wh
    acc = tl.zeros([heads.shape[0], BLOCK_DV], dtype=tl.float32)
    for s0 in range(0, num_splits, S_CHUNK):
        # the chunk's weights and outputs depend on no earlier chunk: their loads overlap
        chunk = s0 + offs_c
        mask_c = mask_h[:, None] & (chunk[None, :] < num_splits)
        w = tl.exp(tl.load(lse_rows + chunk[None, :] * stride_lws, mask=mask_c,
                           other=float("-inf"), cache_modifier=".cg") - m_use[:, None])  # fmt: skip
        o_s = tl.load(
            o_rows + chunk[None, :, None].to(tl.int64) * stride_ws + offs_dv[None, None, :],
            mask=mask_c[:, :, None],
            other=0.0,
            cache_modifier=".cg",
        )
        acc += tl.sum(w[:, :, None] * o_s, 1)  # an empty split: w = 0 and o_s = 0
    inv = tl.where(nonempty, 1.0 / tl.where(nonempty, total, 1.0), 0.0)
    out = o_ptr + b.to(tl.int64) * stride_ob + h64[:, None] * stride_oh + offs_dv[None, :]
    tl.store(out, (acc * inv[:, None]).to(o_ptr.dtype.element_ty), mask=mask_h[:, None])
    lse = tl.where(nonempty, m_use + tl.log(tl.where(nonempty, total, 1.0)), float("-inf"))
    tl.store(lse_ptr + b.to(tl.int64) * stride_lb + h64 * stride_lh, lse, mask=mask_h)


# Sizes that change from call to call are not specialised on (a new divisibility would compile a
# new variant, possibly inside a CUDA-graph capture).
@triton.jit(do_not_specialize=["num_slots", "num_indices", "num_splits"])
def _decode_stage1(
    q_ptr,
    k_ptr,
    v_ptr,
    indptr_ptr,
    indices_ptr,
    sinks_ptr,
    o_ptr,  # DIRECT: the output; otherwise the workspace of split outputs
    lse_ptr,  # DIRECT: the LSE; otherwise the workspace of split LSEs
    final_o_ptr,  # TICKET: the output and LSE the last program writes (else unused)
    final_lse_ptr,
    counter_ptr,  # TICKET: one int32 ticket counter per (request, head block), 0 between calls
    stride_qb,
    stride_qh,
    stride_ks,
    stride_kh,
    stride_vs,
    stride_vh,
    stride_ob,
    stride_oh,
    stride_os,
    stride_lb,
    stride_lh,
    stride_ls,
    stride_fob,
    stride_foh,
    stride_flb,
    stride_flh,
    num_slots,
    num_indices,
    scale,  # sm_scale * k_scale (* log2 e without a cap)
    logit_cap,
    v_scale,
    num_splits,
    GROUP: tl.constexpr,  # query heads per KV head
    HEAD_BLOCKS: tl.constexpr,  # programs per KV head: cdiv(GROUP, BLOCK_H)
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,  # channels of the main q k part (512 for MLA)
    BLOCK_DPE: tl.constexpr,  # extra q k channels after BLOCK_D (64 for MLA's 576), or 0
    BLOCK_DV: tl.constexpr,
    HAS_CAP: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    V_IS_K: tl.constexpr,  # v_cache is the first BLOCK_DV channels of k_cache (MLA)
    DIRECT: tl.constexpr,  # one split: write the final output and LSE
    TICKET: tl.constexpr,  # the last program of a (request, head block) merges its splits
    MERGE_H: tl.constexpr,  # TICKET: rows merged, min(BLOCK_H, next_power_of_2(GROUP))
    BLOCK_S: tl.constexpr,  # TICKET: next_power_of_2(num_splits)
    S_CHUNK: tl.constexpr,  # TICKET: splits merged together
    INTERPRETED: tl.constexpr,  # the interpreter's tl.dot is wrong on bf16: compute it in fp32
):
    hb = tl.program_id(0)  # fastest: MLA's head blocks of one request share its KV through L2
    b = tl.program_id(1)
    split = tl.program_id(2)
    kv_head = hb // HEAD_BLOCKS
    h_local = (hb % HEAD_BLOCKS) * BLOCK_H + tl.arange(0, BLOCK_H)
    mask_h = h_local < GROUP
    heads = kv_head * GROUP + h_local
    offs_d = tl.arange(0, BLOCK_D)
    offs_dv = tl.arange(0, BLOCK_DV)
    offs_n = tl.arange(0, BLOCK_N)

    start = tl.load(indptr_ptr + b)
    seq_len = tl.maximum(tl.load(indptr_ptr + b + 1) - start, 0)
    # the split's share, whole BLOCK_N tiles; trailing splits may be empty
    per_split = tl.cdiv(tl.cdiv(seq_len, num_splits), BLOCK_N) * BLOCK_N
    split_start = split * per_split
    split_end = tl.minimum(split_start + per_split, seq_len)

    q_rows = q_ptr + b.to(tl.int64) * stride_qb + heads[:, None].to(tl.int64) * stride_qh
    q = tl.load(q_rows + offs_d[None, :], mask=mask_h[:, None], other=0.0)
    if BLOCK_DPE > 0:
        offs_pe = BLOCK_D + tl.arange(0, BLOCK_DPE)
        q_pe = tl.load(q_rows + offs_pe[None, :], mask=mask_h[:, None], other=0.0)
    if INTERPRETED:
        q = q.to(tl.float32)
        if BLOCK_DPE > 0:
            q_pe = q_pe.to(tl.float32)
    k_head = k_ptr + kv_head.to(tl.int64) * stride_kh
    v_head = v_ptr + kv_head.to(tl.int64) * stride_vh

    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)

    for n0 in range(split_start, split_end, BLOCK_N):
        pos = start + n0 + offs_n
        in_split = (n0 + offs_n) < split_end
        in_list = in_split & (pos < num_indices)
        slot = tl.load(indices_ptr + pos, mask=in_list, other=0).to(tl.int64)
        # an out-of-range slot is skipped (never read); the torch backend raises instead
        ok = in_list & (slot >= 0) & (slot < num_slots)
        slot = tl.where(ok, slot, 0)
        # K loaded as [D, BLOCK_N] (the dot's B operand as it is, no transpose)
        k_cols = k_head + slot[None, :] * stride_ks
        k = tl.load(k_cols + offs_d[:, None], mask=ok[None, :], other=0.0)
        if INTERPRETED:
            qk = tl.dot(q, k.to(tl.float32))
        else:
            qk = tl.dot(q, k.to(q.dtype))
        if BLOCK_DPE > 0:
            k_pe = tl.load(k_cols + offs_pe[:, None], mask=ok[None, :], other=0.0)
            qk += tl.dot(q_pe, k_pe.to(q_pe.dtype))
        if HAS_CAP:
            s = qk * scale
            s = logit_cap * _tanh(s / logit_cap) * 1.4426950408889634
        else:
            s = qk * scale
        s = tl.where(ok[None, :], s, float("-inf"))

        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new > float("-inf"), m_new, 0.0)  # a tile of skipped slots only
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        if V_IS_K:
            v = tl.trans(k)
        else:
            v = tl.load(
                v_head + slot[:, None] * stride_vs + offs_dv[None, :], mask=ok[:, None], other=0.0
            )
        if INTERPRETED:
            pv = tl.dot(p, v.to(tl.float32))
        else:
            pv = tl.dot(p.to(q.dtype), v.to(q.dtype))
        acc = acc * alpha[:, None] + pv
        m_i = m_new

    nonempty = l_i > 0.0
    m_fin = tl.where(nonempty, m_i, 0.0)
    lse = tl.where(nonempty, (m_fin + tl.log2(tl.where(nonempty, l_i, 1.0))) * 0.6931471805599453,
                   float("-inf"))  # fmt: skip
    if DIRECT and HAS_SINKS:
        # the sink logit joins the denominator only (log2 units, against max(m, sink))
        sink = tl.load(sinks_ptr + heads, mask=mask_h, other=0.0).to(tl.float32)
        sink = sink * 1.4426950408889634
        m_all = tl.maximum(m_fin, sink)
        rescale = tl.exp2(m_fin - m_all)
        denom = tl.where(nonempty, l_i * rescale + tl.exp2(sink - m_all), 1.0)
        lse = tl.where(nonempty, (m_all + tl.log2(denom)) * 0.6931471805599453, float("-inf"))
        inv = tl.where(nonempty, v_scale * rescale / denom, 0.0)
    else:
        inv = tl.where(nonempty, v_scale / tl.where(nonempty, l_i, 1.0), 0.0)
    out = acc * inv[:, None]

    o_rows = (
        o_ptr
        + b.to(tl.int64) * stride_ob
        + heads[:, None].to(tl.int64) * stride_oh
        + split.to(tl.int64) * stride_os
    )
    tl.store(o_rows + offs_dv[None, :], out.to(o_ptr.dtype.element_ty), mask=mask_h[:, None])
    lse_ptrs = (
        lse_ptr
        + b.to(tl.int64) * stride_lb
        + heads.to(tl.int64) * stride_lh
        + split.to(tl.int64) * stride_ls
    )
    tl.store(lse_ptrs, lse, mask=mask_h)

    if TICKET:
        tl.debug_barrier()  # every thread's partial is stored before the release below
        counter = counter_ptr + b * tl.num_programs(0) + hb
        ticket = tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu")
        if ticket == num_splits - 1:  # every other split's partial is visible (acquire)
            tl.store(counter, 0)  # left at 0 for the next launch or graph replay
            rows = (hb % HEAD_BLOCKS) * BLOCK_H + tl.arange(0, MERGE_H)
            _merge_splits(
                o_ptr, lse_ptr, sinks_ptr, final_o_ptr, final_lse_ptr, b,
                kv_head * GROUP + rows, rows < GROUP,
                stride_ob, stride_oh, stride_os, stride_lb, stride_lh, stride_ls,
                stride_fob, stride_foh, stride_flb, stride_flh, num_splits,
                BLOCK_S=BLOCK_S, S_CHUNK=S_CHUNK, BLOCK_DV=BLOCK_DV, HAS_SINKS=HAS_SINKS,
            )  # fmt: skip


@triton.jit(do_not_specialize=["num_splits"])
def _decode_stage2(
    ws_o_ptr,
    ws_lse_ptr,
    sinks_ptr,
    o_ptr,
    lse_ptr,
    stride_wb,
    stride_wh,
    stride_ws,
    stride_lwb,
    stride_lwh,
    stride_lws,
    stride_ob,
    stride_oh,
    stride_lb,
    stride_lh,
    num_splits,
    BLOCK_S: tl.constexpr,
    S_CHUNK: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    h = tl.program_id(1) + tl.arange(0, 1)
    _merge_splits(
        ws_o_ptr, ws_lse_ptr, sinks_ptr, o_ptr, lse_ptr, tl.program_id(0), h, h >= 0,
        stride_wb, stride_wh, stride_ws, stride_lwb, stride_lwh, stride_lws,
        stride_ob, stride_oh, stride_lb, stride_lh, num_splits,
        BLOCK_S=BLOCK_S, S_CHUNK=S_CHUNK, BLOCK_DV=BLOCK_DV, HAS_SINKS=HAS_SINKS,
    )  # fmt: skip


# Ticket counter buffers by (device, region size), never freed: a captured graph keeps their
# addresses.
_COUNTERS: dict[tuple[torch.device, int], torch.Tensor] = {}
_NEXT_REGION = itertools.count()


def _ticket_counters(device: torch.device, programs: int) -> torch.Tensor | None:
    """``programs`` ticket counters (all 0) of the next region of the device's buffer, or None
    where there are none: more programs than a region (``decode_splits`` splits only below
    ``WAVES * sm_count`` programs), or a CUDA-graph capture before the buffer exists (a zeroing
    captured into one graph would not run before another graph's replay)."""
    region = WAVES * sm_count(device)
    if programs > region:
        return None
    counters = _COUNTERS.get((device, region))
    if counters is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            return None
        counters = torch.zeros(COUNTER_REGIONS * region, dtype=torch.int32, device=device)
        _COUNTERS[device, region] = counters
    start = next(_NEXT_REGION) % COUNTER_REGIONS * region
    return counters[start : start + programs]


def _merge_chunk(rows: int, dv: int, block_s: int, num_warps: int) -> int:
    """Splits merged together: a [rows, chunk, Dv] fp32 tile of at most MERGE_CHUNK_PER_THREAD
    values a thread."""
    fit = max(1, MERGE_CHUNK_PER_THREAD * 32 * num_warps // (rows * dv))
    return min(1 << (fit.bit_length() - 1), block_s)


def decode_attention(
    out: torch.Tensor,
    lse: torch.Tensor,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float,
    logit_cap: float,
    sinks: torch.Tensor | None,
    k_scale: float,
    v_scale: float,
    max_kv_splits: int = 0,
    merge: str | None = None,
) -> None:
    """Launch stage 1, merging several splits by ticket in the same launch or by stage 2.

    The caller has validated the arguments (shapes, dtypes, strides, head dims: see
    ``kernels_attention.ops.decode_attention``); ``out`` is [B, Hq, Dv] and ``lse`` [B, Hq]
    float32, both with a contiguous last dim. ``max_kv_splits`` > 0 caps the split count.
    ``merge`` ("ticket" or "stage2", for tests) overrides the choice of merge; a ticket merge
    without counters (a capture before the first call) still falls back to stage 2.
    """
    if merge not in (None, "ticket", "stage2"):
        raise ValueError(
            f"decode_attention: merge must be None, 'ticket' or 'stage2', got {merge!r}"
        )
    batch, hq, d = q.shape
    hk = k_cache.shape[1]
    dv = v_cache.shape[2]
    if batch == 0 or hq == 0:
        return
    group = hq // hk
    config = stage1_config(d, group)
    head_blocks = triton.cdiv(group, config.block_h)
    block_d, block_dpe = (512, d - 512) if d == 576 else (d, 0)
    splits = decode_splits(batch, hk * head_blocks, kv_indices.numel(), sm_count(q.device))
    if max_kv_splits > 0:
        splits = min(splits, max_kv_splits)
    has_cap = logit_cap > 0.0
    scale = sm_scale * k_scale * (1.0 if has_cap else LOG2E)
    v_is_k = (
        v_cache.data_ptr() == k_cache.data_ptr()
        and v_cache.stride()[:2] == k_cache.stride()[:2]
        and v_cache.dtype == k_cache.dtype
        and dv == block_d
    )
    sinks_arg = sinks if sinks is not None else lse  # any pointer: never read
    interpreted = q.device.type == "cpu"
    common = {
        "num_slots": k_cache.shape[0],
        "num_indices": kv_indices.numel(),
        "scale": scale,
        "logit_cap": float(logit_cap),
        "v_scale": float(v_scale),
        "num_splits": splits,
        "GROUP": group,
        "HEAD_BLOCKS": head_blocks,
        "BLOCK_H": config.block_h,
        "BLOCK_N": config.block_n,
        "BLOCK_D": block_d,
        "BLOCK_DPE": block_dpe,
        "BLOCK_DV": dv,
        "HAS_CAP": has_cap,
        "HAS_SINKS": sinks is not None,
        "V_IS_K": v_is_k,
        "INTERPRETED": interpreted,
        "num_warps": config.num_warps,
        "num_stages": config.num_stages,
    }
    inputs = (q, k_cache, v_cache, kv_indptr, kv_indices, sinks_arg)
    in_strides = (q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
                  v_cache.stride(0), v_cache.stride(1))  # fmt: skip
    grid = (hk * head_blocks, batch, splits)
    final = (out.stride(0), out.stride(1), lse.stride(0), lse.stride(1))
    if splits == 1:
        _decode_stage1[grid](
            *inputs, out, lse, out, lse, lse, *in_strides,
            out.stride(0), out.stride(1), 0, lse.stride(0), lse.stride(1), 0, *final,
            DIRECT=True, TICKET=False, MERGE_H=1, BLOCK_S=1, S_CHUNK=1, **common,
        )  # fmt: skip
        return
    # fp32 workspace: each split's normalised output and natural-log LSE
    ws_o = torch.empty(batch, hq, splits, dv, dtype=torch.float32, device=q.device)
    ws_lse = torch.empty(batch, hq, splits, dtype=torch.float32, device=q.device)
    ws_strides = (ws_o.stride(0), ws_o.stride(1), ws_o.stride(2),
                  ws_lse.stride(0), ws_lse.stride(1), ws_lse.stride(2))  # fmt: skip
    block_s = triton.next_power_of_2(splits)
    merge_h = min(config.block_h, triton.next_power_of_2(group))
    small_merge = splits * merge_h * dv * 4 <= TICKET_MERGE_BYTES
    counters = None
    if merge == "ticket" or (merge is None and small_merge):
        counters = _ticket_counters(q.device, hk * head_blocks * batch)
    if counters is not None:
        _decode_stage1[grid](
            *inputs, ws_o, ws_lse, out, lse, counters, *in_strides, *ws_strides, *final,
            DIRECT=False, TICKET=True, MERGE_H=merge_h, BLOCK_S=block_s,
            S_CHUNK=_merge_chunk(merge_h, dv, block_s, config.num_warps), **common,
        )  # fmt: skip
        return
    _decode_stage1[grid](
        *inputs, ws_o, ws_lse, out, lse, lse, *in_strides, *ws_strides, *final,
        DIRECT=False, TICKET=False, MERGE_H=1, BLOCK_S=1, S_CHUNK=1, **common,
    )  # fmt: skip
    merge_warps = 4 if dv <= 256 else 8
    _decode_stage2[(batch, hq)](
        ws_o, ws_lse, sinks_arg, out, lse, *ws_strides, *final, splits,
        BLOCK_S=block_s, S_CHUNK=_merge_chunk(1, dv, block_s, merge_warps), BLOCK_DV=dv,
        HAS_SINKS=sinks is not None, num_warps=merge_warps,
    )  # fmt: skip
