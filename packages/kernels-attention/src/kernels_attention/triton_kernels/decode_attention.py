# ruff: noqa: N803  (Triton constexpr parameters are upper case by convention)
"""Triton split-KV decode attention (the Triton counterpart of a ``csrc/<name>.cuh``).

One query token per request attends to the KV slots ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``
of a token-indexed cache ``[S, Hk, D]`` (a paged ``[P, ps, Hk, D]`` cache passed as its
``[P*ps, Hk, D]`` view).

Stage 1, grid ``(Hk * head_blocks, B, splits)``: a program takes up to ``BLOCK_H`` query heads of
one KV head (the GQA group packed into the M dimension of ``tl.dot``, padded to 16 rows) and one
of the request's ``splits`` chunks of tokens, and loops over it in tiles of ``BLOCK_N`` gathered
slots: scores ``q k^T`` in fp32, scaled by ``sm_scale * k_scale * log2(e)`` so the online
softmax runs on ``exp2``, then ``acc += p v``. With one split it writes the normalised output and
the LSE itself (one launch); otherwise it writes the split's output (normalised, fp32) and its
natural-log LSE (-inf for an empty split) to a workspace.

Stage 2, grid ``(B, Hq)``: merges the splits by their LSE (the merge_state formula), adds the
sink to the denominator, writes o and the natural-log LSE.

The split count is chosen once, on the host, by :func:`decode_splits`, and both stages read it
from the one Python int (stage 2 merges every split; an empty one carries LSE -inf), so the two
stages cannot disagree. It never synchronises: the longest request is bounded by
``kv_indices.numel()``, which is static under CUDA graphs.
"""

from __future__ import annotations

import functools

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
BLOCK_H = 16  # query heads per program: tl.dot needs M >= 16


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


def _config(d: int, dv: int, fp8: bool) -> tuple[int, int, int]:
    """(BLOCK_N, num_warps, num_stages) of stage 1 for a head dim.

    Chosen without a GPU from the sm_90 compile (triton 3.9, bf16, no spills anywhere): D = 128
    N 32/4 warps/3 stages 167 registers (fp8 155), N 64/4/3 197, N 64/4/2 212; D = 256 N 32/8/3
    186; MLA N 32/8/2 180 (N 32 with 4 warps spills). To be swept on the H200.
    """
    if d > 256:  # MLA: a [576, 32] K tile, v its first 512 channels
        return 32, 8, 2
    if d > 128:
        return 32, 8, 3
    return 32, 4, 3


@triton.jit
def _tanh(x):
    # tanh(x) = 1 - 2 / (exp(2x) + 1): saturates to +-1 without NaN, no libdevice needed
    return 1.0 - 2.0 / (tl.exp(2.0 * x) + 1.0)


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
    o_ptr,
    lse_ptr,
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
    stride_ob,
    stride_oh,
    stride_lb,
    stride_lh,
    num_splits,
    BLOCK_S: tl.constexpr,
    BLOCK_DV: tl.constexpr,
    HAS_SINKS: tl.constexpr,
):
    b = tl.program_id(0)
    h = tl.program_id(1)
    offs_s = tl.arange(0, BLOCK_S)
    offs_dv = tl.arange(0, BLOCK_DV)
    lse_row = ws_lse_ptr + b.to(tl.int64) * stride_lwb + h.to(tl.int64) * stride_lwh
    lses = tl.load(lse_row + offs_s, mask=offs_s < num_splits, other=float("-inf"))
    m = tl.max(lses, 0)
    nonempty = m > float("-inf")
    if HAS_SINKS:
        sink = tl.load(sinks_ptr + h).to(tl.float32)
        m_use = tl.where(nonempty, tl.maximum(m, sink), 0.0)
        total = tl.sum(tl.exp(lses - m_use), 0) + tl.exp(sink - m_use)
    else:
        m_use = tl.where(nonempty, m, 0.0)
        total = tl.sum(tl.exp(lses - m_use), 0)
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    o_row = ws_o_ptr + b.to(tl.int64) * stride_wb + h.to(tl.int64) * stride_wh
    for s in range(0, num_splits):
        w = tl.exp(tl.load(lse_row + s) - m_use)  # 0 for an empty split
        if w > 0.0:
            acc += w * tl.load(o_row + s * stride_ws + offs_dv)
    inv = tl.where(nonempty, 1.0 / tl.where(nonempty, total, 1.0), 0.0)
    out = o_ptr + b.to(tl.int64) * stride_ob + h.to(tl.int64) * stride_oh
    tl.store(out + offs_dv, (acc * inv).to(o_ptr.dtype.element_ty))
    lse = tl.where(nonempty, m_use + tl.log(tl.where(nonempty, total, 1.0)), float("-inf"))
    tl.store(lse_ptr + b.to(tl.int64) * stride_lb + h.to(tl.int64) * stride_lh, lse)


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
) -> None:
    """Launch stage 1 (and stage 2 when there is more than one split) on the current stream.

    The caller has validated the arguments (shapes, dtypes, strides, head dims: see
    ``kernels_attention.ops.decode_attention``); ``out`` is [B, Hq, Dv] and ``lse`` [B, Hq]
    float32, both with a contiguous last dim. ``max_kv_splits`` > 0 caps the split count.
    """
    batch, hq, d = q.shape
    hk = k_cache.shape[1]
    dv = v_cache.shape[2]
    if batch == 0 or hq == 0:
        return
    group = hq // hk
    head_blocks = triton.cdiv(group, BLOCK_H)
    block_d, block_dpe = (512, d - 512) if d == 576 else (d, 0)
    block_n, num_warps, num_stages = _config(d, dv, k_cache.dtype == torch.float8_e4m3fn)
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
        "BLOCK_H": BLOCK_H,
        "BLOCK_N": block_n,
        "BLOCK_D": block_d,
        "BLOCK_DPE": block_dpe,
        "BLOCK_DV": dv,
        "HAS_CAP": has_cap,
        "HAS_SINKS": sinks is not None,
        "V_IS_K": v_is_k,
        "INTERPRETED": interpreted,
        "num_warps": num_warps,
        "num_stages": num_stages,
    }
    grid = (hk * head_blocks, batch, splits)
    if splits == 1:
        _decode_stage1[grid](
            q, k_cache, v_cache, kv_indptr, kv_indices, sinks_arg, out, lse,
            q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
            v_cache.stride(0), v_cache.stride(1),
            out.stride(0), out.stride(1), 0, lse.stride(0), lse.stride(1), 0,
            DIRECT=True, **common,
        )  # fmt: skip
        return
    # fp32 workspace: each split's normalised output and natural-log LSE
    ws_o = torch.empty(batch, hq, splits, dv, dtype=torch.float32, device=q.device)
    ws_lse = torch.empty(batch, hq, splits, dtype=torch.float32, device=q.device)
    _decode_stage1[grid](
        q, k_cache, v_cache, kv_indptr, kv_indices, sinks_arg, ws_o, ws_lse,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1),
        v_cache.stride(0), v_cache.stride(1),
        ws_o.stride(0), ws_o.stride(1), ws_o.stride(2),
        ws_lse.stride(0), ws_lse.stride(1), ws_lse.stride(2),
        DIRECT=False, **common,
    )  # fmt: skip
    _decode_stage2[(batch, hq)](
        ws_o, ws_lse, sinks_arg, out, lse,
        ws_o.stride(0), ws_o.stride(1), ws_o.stride(2), ws_lse.stride(0), ws_lse.stride(1),
        out.stride(0), out.stride(1), lse.stride(0), lse.stride(1),
        splits,
        BLOCK_S=triton.next_power_of_2(splits), BLOCK_DV=dv, HAS_SINKS=sinks is not None,
        num_warps=4 if dv <= 256 else 8,
    )  # fmt: skip
