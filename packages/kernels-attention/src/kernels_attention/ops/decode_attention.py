"""attention.decode_attention: one query token per request attending to its KV slots, split-KV,
GQA and MLA (a Triton backend: ``kernels_attention/triton_kernels/decode_attention.py``).

Request b attends to ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` (token-level slots, OPS.md
section 5): a paged ``[P, ps, Hk, D]`` cache is its ``[P*ps, Hk, D]`` view with
``slot = page * ps + offset`` (a 4-D cache is flattened here when that is a view).

The Triton backend never synchronises with the host: the split count depends only on shapes
(``decode_splits``; the longest request is bounded by ``kv_indices.numel()``), and a slot
outside [0, S) or an index past the end of kv_indices is skipped, where the torch backend reads
them on the host and raises ValueError.
"""

from __future__ import annotations

import math

import torch

from kernels_attention import reference
from kernels_jit.dispatch import Op
from kernels_jit.validation import check_out, check_same_device, check_tensor

OP_ID = "attention.decode_attention"
FP8 = torch.float8_e4m3fn
INDEX_DTYPES = (torch.int32, torch.int64)
# Head dims of the Triton kernel: (D, Dv); 576/512 is MLA (v the first 512 channels of k).
TRITON_QK_DIMS = (64, 128, 256, 576)
TRITON_V_DIMS = (64, 128, 256, 512)


def _decode_attention_triton(
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
    from kernels_attention.triton_kernels import decode_attention as kernels

    kernels.decode_attention(
        out, lse, q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale, logit_cap, sinks,
        k_scale, v_scale, max_kv_splits,
    )  # fmt: skip


def _decode_attention_triton_eligible(
    out: torch.Tensor,
    lse: torch.Tensor,
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    *args: object,
) -> str | None:
    if q.shape[2] not in TRITON_QK_DIMS:
        return f"supports head dims {TRITON_QK_DIMS}, got D = {q.shape[2]}"
    if v_cache.shape[2] not in TRITON_V_DIMS:
        return f"supports value head dims {TRITON_V_DIMS}, got Dv = {v_cache.shape[2]}"
    return None


def _decode_attention_torch(
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
) -> None:
    o, s = reference.decode_attention(
        q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale, logit_cap, sinks, k_scale, v_scale
    )
    out.copy_(o)
    lse.copy_(s)


DECODE_ATTENTION = Op(
    _decode_attention_torch, mutates=("out", "lse"), device="q", knobs={"max_kv_splits": 0}
)
DTYPES = DECODE_ATTENTION.dtypes


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    kv_indptr: torch.Tensor,
    kv_indices: torch.Tensor,
    sm_scale: float | None = None,
    *,
    logit_cap: float = 0.0,
    sinks: torch.Tensor | None = None,
    k_scale: float = 1.0,
    v_scale: float = 1.0,
    max_kv_splits: int | None = None,
    out: torch.Tensor | None = None,
    return_lse: bool = False,
    backend: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Decode attention: ``z = sm_scale * k_scale * q.k`` over the request's slots, with
    ``logit_cap > 0``: ``z = cap * tanh(z / cap)``; ``p = softmax(z)`` whose denominator also
    holds ``exp(sinks[h])`` (GPT-OSS); ``o = v_scale * sum p v``; fp32 arithmetic, o rounded
    once. Query head h reads KV head ``h // (Hq / Hk)``. An empty request gives o = 0 and
    lse = -inf.

    Parameters
    ----------
    q : [B, Hq, D] float16 or bfloat16, last dim contiguous (any leading strides).
    k_cache : [S, Hk, D] (or a paged [P, ps, Hk, D], flattened as a view) of q's dtype, or
        float8_e4m3fn dequantised by ``k_scale``; last dim contiguous.
    v_cache : [S, Hk, Dv] like k_cache (float8_e4m3fn with ``v_scale``). MLA: Hk = 1, D = 576,
        Dv = 512 and ``v_cache = k_cache[..., :512]`` (a view of the same cache).
    kv_indptr : [B + 1] int32 (or int64), non-decreasing offsets into kv_indices.
    kv_indices : [nnz] int32 (or int64) slots of the cache, in attention order.
    sm_scale : softmax scale; default ``1 / sqrt(D)``.
    logit_cap : tanh soft cap of the scores (0: off).
    sinks : optional [Hq] float32 attention-sink logits (natural units, not scaled).
    k_scale, v_scale : scalar dequantisation scales of fp8 caches (any cache may use them).
    max_kv_splits : caps the Triton backend's KV splits per request (default: chosen by
        ``decode_splits`` from the shapes and the SM count).
    out : optional destination [B, Hq, Dv] of q's dtype (last dim contiguous).
    return_lse : also return the natural-log LSE [B, Hq] float32 (sink included).
    backend : force a backend by name instead of the best eligible one.

    Returns
    -------
    o [B, Hq, Dv], or (o, lse [B, Hq] float32) with ``return_lse``.
    """
    k_cache, v_cache = _paged_view("k_cache", k_cache), _paged_view("v_cache", v_cache)
    sm_scale = _check(q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale, logit_cap, sinks)
    k_scale = _finite("k_scale", k_scale)
    v_scale = _finite("v_scale", v_scale)
    if max_kv_splits is None:
        splits = 0
    elif isinstance(max_kv_splits, int) and not isinstance(max_kv_splits, bool):
        if max_kv_splits < 1:
            raise ValueError(f"{OP_ID}: max_kv_splits must be >= 1, got {max_kv_splits}")
        splits = max_kv_splits
    else:
        raise TypeError(f"{OP_ID}: max_kv_splits must be an int, got {max_kv_splits!r}")
    batch, hq = q.shape[0], q.shape[1]
    dv = v_cache.shape[2]
    if out is None:
        out = torch.empty(batch, hq, dv, dtype=q.dtype, device=q.device)
    else:
        check_out(OP_ID, out, like=q, shape=(batch, hq, dv))
        check_tensor(OP_ID, "out", out, last_dim_contiguous=True)
    lse = torch.empty(batch, hq, dtype=torch.float32, device=q.device)
    if batch and hq:
        DECODE_ATTENTION.run(
            out, lse, q, k_cache, v_cache, kv_indptr, kv_indices, sm_scale, logit_cap, sinks,
            k_scale, v_scale, splits, backend=backend,
        )  # fmt: skip
    return (out, lse) if return_lse else out


def _paged_view(arg: str, cache: object) -> torch.Tensor:
    """A paged [P, ps, Hk, D] cache as its [P*ps, Hk, D] view; 3-D caches as they are."""
    if isinstance(cache, torch.Tensor) and cache.dim() == 4:
        if cache.shape[0] > 1 and cache.stride(0) != cache.shape[1] * cache.stride(1):
            raise ValueError(
                f"{OP_ID}: a paged {arg} [P, ps, Hk, D] must have stride(0) = ps * stride(1) "
                f"to be viewed as [P*ps, Hk, D], got shape {tuple(cache.shape)} and strides "
                f"{cache.stride()}"
            )
        return cache.flatten(0, 1)
    return cache  # type: ignore[return-value]


def _finite(arg: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{OP_ID}: {arg} must be a float, got {type(value).__name__} {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{OP_ID}: {arg} must be finite, got {value!r}")
    return float(value)


def _check(
    q: object,
    k_cache: object,
    v_cache: object,
    kv_indptr: object,
    kv_indices: object,
    sm_scale: object,
    logit_cap: object,
    sinks: object,
) -> float:
    """Every argument check (no host synchronisation); returns sm_scale."""
    check_tensor(OP_ID, "q", q, dtypes=DTYPES, ndim=3, last_dim_contiguous=True)
    cache_dtypes = (q.dtype, FP8)
    check_tensor(OP_ID, "k_cache", k_cache, dtypes=cache_dtypes, ndim=3, last_dim_contiguous=True)
    check_tensor(
        OP_ID, "v_cache", v_cache, dtypes=(k_cache.dtype,), ndim=3, last_dim_contiguous=True
    )
    check_tensor(OP_ID, "kv_indptr", kv_indptr, dtypes=INDEX_DTYPES, ndim=1, contiguous=True)
    check_tensor(OP_ID, "kv_indices", kv_indices, dtypes=INDEX_DTYPES, ndim=1, contiguous=True)
    batch, hq, d = q.shape
    slots, hk, dk = k_cache.shape
    if dk != d:
        raise ValueError(
            f"{OP_ID}: k_cache's head dim must equal q's ({d}), got shape {tuple(k_cache.shape)}"
        )
    if tuple(v_cache.shape[:2]) != (slots, hk):
        raise ValueError(
            f"{OP_ID}: v_cache must have k_cache's slots and heads ({slots}, {hk}, Dv), got "
            f"shape {tuple(v_cache.shape)}"
        )
    if hk == 0 or hq % hk:
        raise ValueError(
            f"{OP_ID}: q's heads ({hq}) must be a multiple of the KV heads of k_cache ({hk})"
        )
    if d == 0 or v_cache.shape[2] == 0:
        raise ValueError(f"{OP_ID}: head dims must be >= 1, got D = {d}, Dv = {v_cache.shape[2]}")
    if kv_indptr.shape[0] != batch + 1:
        raise ValueError(
            f"{OP_ID}: kv_indptr must have shape ({batch + 1},) (B + 1 of q), got "
            f"{tuple(kv_indptr.shape)}"
        )
    if sinks is not None:
        check_tensor(OP_ID, "sinks", sinks, dtypes=(torch.float32,), ndim=1, contiguous=True)
        if sinks.shape[0] != hq:
            raise ValueError(
                f"{OP_ID}: sinks must have shape ({hq},) (the heads of q), got {tuple(sinks.shape)}"
            )
        check_same_device(OP_ID, q=q, sinks=sinks)
    check_same_device(
        OP_ID, q=q, k_cache=k_cache, v_cache=v_cache, kv_indptr=kv_indptr, kv_indices=kv_indices
    )
    cap = _finite("logit_cap", logit_cap)
    if cap < 0:
        raise ValueError(f"{OP_ID}: logit_cap must be >= 0 (0: off), got {logit_cap!r}")
    if sm_scale is None:
        return 1.0 / math.sqrt(d)
    return _finite("sm_scale", sm_scale)


def _decode_attention_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls: Llama GQA 32/8 D=128 bf16 over a shuffled paged cache, fp16 with a
    soft cap and sinks, an fp8 cache with scales, MLA (Hk = 1, D = 576, v a view), an empty
    request."""
    g = torch.Generator(device="cpu").manual_seed(0)

    def paged(lens: list[int], page: int, pages: int) -> tuple[torch.Tensor, torch.Tensor]:
        order = torch.randperm(pages, generator=g)
        indptr, indices, used = [0], [], 0
        for n in lens:
            need = -(-n // page)
            slots = (order[used : used + need, None] * page + torch.arange(page)).flatten()[:n]
            indices.append(slots)
            used += need
            indptr.append(indptr[-1] + n)
        ptr = torch.tensor(indptr, dtype=torch.int32).to(device)
        return ptr, torch.cat(indices).int().to(device)

    cases: list[tuple[tuple, dict]] = []
    ptr, idx = paged([5, 0, 37, 16], 16, 8)
    for dtype, kw in zip(DTYPES, ({}, {"logit_cap": 30.0}), strict=False):
        q = torch.randn(4, 32, 128, generator=g).to(dtype).to(device)
        k = torch.randn(128, 8, 128, generator=g).to(dtype).to(device)
        v = torch.randn(128, 8, 128, generator=g).to(dtype).to(device)
        cases.append(((q, k, v, ptr, idx), kw))
    sinks = torch.randn(32, generator=g).to(device)
    cases.append(((q, k, v, ptr, idx), {"sinks": sinks, "return_lse": True}))
    k8 = (torch.randn(128, 8, 128, generator=g) * 4).to(FP8).to(device)
    v8 = (torch.randn(128, 8, 128, generator=g) * 4).to(FP8).to(device)
    cases.append(((q, k8, v8, ptr, idx), {"k_scale": 0.25, "v_scale": 0.5}))
    kv = torch.randn(128, 1, 576, generator=g).bfloat16().to(device)
    q_mla = torch.randn(4, 16, 576, generator=g).bfloat16().to(device)
    cases.append(((q_mla, kv, kv[..., :512], ptr, idx), {"sm_scale": 192**-0.5}))
    return cases
