"""attention.decode_attention: the torch reference against a naive per-request float64 loop; the
Triton kernel against the reference (tiny shapes in Triton's interpreter on the CPU, the real
kernel on the GPU) over random lengths (0, 1, non-multiples of the page size), GQA 1/4/8, D 64/
128/256, MLA as a view, soft cap, sinks, fp8 KV with scales, return_lse, one and many KV splits
merged by ticket in the same launch or by stage 2, strided q and out; the split count; bad input;
opcheck, torch.compile and CUDA-graph capture (replayed twice: the ticket counters reset)."""

from __future__ import annotations

import math

import pytest
import torch

from kernels_attention import decode_attention, reference
from shared.testing.compare import assert_close
from shared.testing.devices import TRITON_DEVICES
from shared.testing.inputs import poison

FP8 = torch.float8_e4m3fn
INF = float("inf")
LSE_TOL = {"atol": 1e-4, "rtol": 1e-4}


def _paged(lens, page, device, seed=0, spare_pages=3):
    """kv_indptr and kv_indices of requests of ``lens`` tokens over shuffled pages of ``page``
    slots (the last page of a request partly used); returns (indptr, indices, slots)."""
    g = torch.Generator().manual_seed(seed)
    pages = sum(-(-n // page) for n in lens) + spare_pages
    order = torch.randperm(pages, generator=g)
    indptr, chunks, used = [0], [], 0
    for n in lens:
        need = -(-n // page)
        slots = (order[used : used + need, None] * page + torch.arange(page)).flatten()[:n]
        chunks.append(slots)
        used += need
        indptr.append(indptr[-1] + n)
    indices = torch.cat(chunks) if chunks else torch.empty(0, dtype=torch.int64)
    return (
        torch.tensor(indptr, dtype=torch.int32, device=device),
        indices.to(torch.int32).to(device),
        pages * page,
    )


def _inputs(lens, hq, hk, d, dv=None, *, dtype=torch.bfloat16, cache_dtype=None, page=16,
            device="cpu", seed=0, mla=False):  # fmt: skip
    g = torch.Generator().manual_seed(seed)
    dv = d if dv is None else dv
    indptr, indices, slots = _paged(lens, page, device, seed)
    q = torch.randn(len(lens), hq, d, generator=g).to(dtype).to(device)
    cache_dtype = cache_dtype or dtype
    scale = 4.0 if cache_dtype == FP8 else 1.0
    k = (torch.randn(slots, hk, d, generator=g) * scale).to(cache_dtype).to(device)
    v = k[..., :dv] if mla else (torch.randn(slots, hk, dv, generator=g) * scale).to(cache_dtype)
    return q, k, v.to(device), indptr, indices


def _naive(q, k, v, indptr, indices, sm_scale, logit_cap=0.0, sinks=None, k_scale=1.0,
           v_scale=1.0):  # fmt: skip
    """Per request and head, in float64: softmax over the request's slots (and the sink)."""
    b_, hq, _ = q.shape
    group = hq // k.shape[1]
    o = torch.zeros(b_, hq, v.shape[-1], dtype=torch.float64)
    lse = torch.full((b_, hq), -INF, dtype=torch.float64)
    ptr = indptr.tolist()
    for b in range(b_):
        slots = indices[ptr[b] : ptr[b + 1]].long().cpu()
        if not len(slots):
            continue
        for h in range(hq):
            kk = k.cpu()[slots, h // group].double() * k_scale
            vv = v.cpu()[slots, h // group].double() * v_scale
            z = kk @ q[b, h].cpu().double() * sm_scale
            if logit_cap > 0:
                z = logit_cap * torch.tanh(z / logit_cap)
            full = z if sinks is None else torch.cat((z, sinks[h : h + 1].cpu().double()))
            total = torch.logsumexp(full, 0)
            o[b, h] = torch.exp(z - total) @ vv
            lse[b, h] = total
    return o, lse


# --- the reference against the naive loop (CPU) ------------------------------------------------

REFERENCE_CASES = {
    "gqa4_d128": ({"lens": [37, 0, 1, 16, 100], "hq": 8, "hk": 2, "d": 128}, {}),
    "mha_d64": ({"lens": [5, 33], "hq": 4, "hk": 4, "d": 64}, {}),
    "gqa8_fp16_cap": ({"lens": [17, 64], "hq": 16, "hk": 2, "d": 64, "dtype": torch.float16},
                      {"logit_cap": 2.0}),
    "sinks": ({"lens": [3, 0, 50], "hq": 8, "hk": 2, "d": 64}, {"sinks": True}),
    "fp8_scales": ({"lens": [20, 9], "hq": 8, "hk": 2, "d": 64, "cache_dtype": FP8},
                   {"k_scale": 0.3, "v_scale": 0.7}),
    "mla": ({"lens": [12, 0, 40], "hq": 4, "hk": 1, "d": 576, "dv": 512, "mla": True}, {}),
    "d256": ({"lens": [7], "hq": 2, "hk": 1, "d": 256}, {}),
}  # fmt: skip


@pytest.mark.parametrize("case", REFERENCE_CASES, ids=str)
def test_reference_matches_naive(case):
    spec, kw = REFERENCE_CASES[case]
    q, k, v, ptr, idx = _inputs(**spec)
    if kw.pop("sinks", False):
        kw["sinks"] = torch.randn(q.shape[1]) * 2
    scale = 1.0 / math.sqrt(q.shape[-1])
    o, lse = reference.decode_attention(q, k, v, ptr, idx, scale, **kw)
    o_ref, lse_ref = _naive(q, k, v, ptr, idx, scale, **kw)
    assert_close(o, o_ref.to(q.dtype))
    assert_close(lse, lse_ref.float(), **LSE_TOL)
    lens = (ptr[1:] - ptr[:-1]).tolist()
    for b, n in enumerate(lens):
        if n == 0:  # an empty request: o = 0, lse = -inf
            assert (o[b] == 0).all() and (lse[b] == -INF).all()
    # small chunks give the same result
    o2, lse2 = reference.decode_attention_math(q, k, v, ptr, idx, scale, chunk=7, **kw)
    assert_close(o2, o)
    assert_close(lse2, lse, **LSE_TOL)


def test_unused_trailing_indices_and_offset_indptr():
    q, k, v, ptr, idx = _inputs([9, 4], 4, 2, 64)
    shifted = torch.cat((torch.tensor([7, 7, 7], dtype=torch.int32), idx, idx[:5]))
    o, lse = decode_attention(q, k, v, ptr + 3, shifted, return_lse=True)
    o_ref, lse_ref = _naive(q, k, v, ptr, idx, 0.125)
    assert_close(o, o_ref.to(q.dtype))
    assert_close(lse, lse_ref.float(), **LSE_TOL)


def test_public_cpu_defaults_out_and_paged_cache():
    q, k, v, ptr, idx = _inputs([30, 2], 8, 2, 64, page=16)
    o_ref, lse_ref = _naive(q, k, v, ptr, idx, 1 / 8)
    o = decode_attention(q, k, v, ptr, idx)
    assert_close(o, o_ref.to(q.dtype))
    wide = torch.zeros(2, 8, 80, dtype=q.dtype)
    out = wide[..., 8:72]
    res, lse = decode_attention(
        q, k.view(-1, 16, 2, 64), v.view(-1, 16, 2, 64), ptr, idx, out=out, return_lse=True
    )
    assert res is out and (wide[..., :8] == 0).all()
    assert_close(out, o_ref.to(q.dtype))
    assert_close(lse, lse_ref.float(), **LSE_TOL)
    assert decode_attention(q[:0], k, v, ptr[:1], idx).shape == (0, 8, 64)


def test_bad_arguments():
    q, k, v, ptr, idx = _inputs([4, 3], 8, 2, 64)
    cases = [
        (TypeError, r"decode_attention: q must have dtype in \(float16, bfloat16\)",
         (q.float(), k, v, ptr, idx), {}),
        (TypeError, r"k_cache must have dtype in \(bfloat16, float8_e4m3fn\), got float16",
         (q, k.half(), v, ptr, idx), {}),
        (TypeError, r"v_cache must have dtype in \(bfloat16\)", (q, k, v.half(), ptr, idx), {}),
        (ValueError, r"q's heads \(8\) must be a multiple of the KV heads of k_cache \(3\)",
         (q, k.repeat(1, 2, 1)[:, :3], v.repeat(1, 2, 1)[:, :3], ptr, idx), {}),
        (ValueError, r"k_cache's head dim must equal q's \(64\)", (q, k[..., :32], v, ptr, idx),
         {}),
        (ValueError, r"v_cache must have k_cache's slots and heads", (q, k, v[:5], ptr, idx), {}),
        (ValueError, r"kv_indptr must have shape \(3,\)", (q, k, v, ptr[:2], idx), {}),
        (TypeError, r"kv_indices must have dtype in \(int32, int64\)",
         (q, k, v, ptr, idx.float()), {}),
        (ValueError, r"q must have a contiguous last dim", (q.transpose(1, 2), k, v, ptr, idx),
         {}),
        (ValueError, r"k_cache must have a contiguous last dim",
         (q, k.transpose(0, 2).contiguous().transpose(0, 2), v, ptr, idx), {}),
        (ValueError, r"sinks must have shape \(8,\)", (q, k, v, ptr, idx),
         {"sinks": torch.zeros(2)}),
        (TypeError, r"sinks must have dtype in \(float32\)", (q, k, v, ptr, idx),
         {"sinks": torch.zeros(8, dtype=torch.bfloat16)}),
        (ValueError, r"logit_cap must be >= 0", (q, k, v, ptr, idx), {"logit_cap": -1.0}),
        (ValueError, r"sm_scale must be finite", (q, k, v, ptr, idx), {"sm_scale": math.inf}),
        (TypeError, r"k_scale must be a float", (q, k, v, ptr, idx), {"k_scale": "1"}),
        (ValueError, r"max_kv_splits must be >= 1", (q, k, v, ptr, idx), {"max_kv_splits": 0}),
        (ValueError, r"out must have shape \(2, 8, 64\)", (q, k, v, ptr, idx),
         {"out": torch.empty(2, 8, 32, dtype=q.dtype)}),
        (TypeError, r"out must have dtype bfloat16", (q, k, v, ptr, idx),
         {"out": torch.empty(2, 8, 64)}),
        (ValueError, r"a paged k_cache \[P, ps, Hk, D\] must have stride\(0\) = ps \* stride\(1\)",
         (q, k.view(-1, 4, 2, 64)[:, :2], v, ptr, idx), {}),
        (ValueError, r"kv_indices must lie in \[0, \d+\) \(the slots of k_cache\), found -1",
         (q, k, v, ptr, torch.cat((idx[:-1], torch.tensor([-1], dtype=torch.int32)))), {}),
        (ValueError, r"kv_indptr must be non-decreasing within \[0, 7\]",
         (q, k, v, torch.tensor([0, 5, 9], dtype=torch.int32), idx), {}),
    ]  # fmt: skip
    for error, message, args, kw in cases:
        with pytest.raises(error, match=message):
            decode_attention(*args, **kw)


def test_decode_splits():
    from kernels_attention.triton_kernels.decode_attention import (
        MAX_SPLITS,
        MIN_TOKENS_PER_SPLIT,
        decode_splits,
    )

    # Llama-3-8B (8 KV heads, one 16-head block each) on a 132-SM H200
    assert decode_splits(64, 8, 64 * 4096, 132) == 1  # 512 programs: already ~2 waves
    assert decode_splits(8, 8, 8 * 4096, 132) == 5  # 64 programs x 5 >= 264
    assert decode_splits(1, 8, 1024, 132) == 1024 // MIN_TOKENS_PER_SPLIT  # length-bound
    assert decode_splits(1, 1, 10**6, 132) == MAX_SPLITS
    assert decode_splits(4, 8, 0, 132) == 1
    for b in (1, 3, 64):
        for n in (1, 100, 5000):
            s = decode_splits(b, 8, n, 132)
            assert 1 <= s <= MAX_SPLITS
            assert s == 1 or b * 8 * (s - 1) < 2 * 132


def test_opcheck():
    from kernels_attention.ops.decode_attention import DECODE_ATTENTION

    q, k, v, ptr, idx = _inputs([5, 0, 9], 4, 2, 64)
    out, lse = torch.empty(3, 4, 64, dtype=q.dtype), torch.empty(3, 4)
    args = (out, lse, q, k, v, ptr, idx, 0.125, 0.0, torch.zeros(4), 1.0, 1.0, None)
    torch.library.opcheck(DECODE_ATTENTION.torch_op, args)


def test_torch_compile_fullgraph_aot():
    q, k, v, ptr, idx = _inputs([5, 17], 4, 2, 64)

    def f(q, k, v, ptr, idx):
        return decode_attention(q, k, v, ptr, idx, 0.125, logit_cap=3.0, return_lse=True)

    o, lse = torch.compile(f, fullgraph=True, backend="aot_eager")(q, k, v, ptr, idx)
    o_ref, lse_ref = reference.decode_attention(q, k, v, ptr, idx, 0.125, 3.0)
    assert_close(o, o_ref)
    assert_close(lse, lse_ref, **LSE_TOL)


# --- the Triton kernel (interpreter on the CPU, the GPU kernel on CUDA) ------------------------


def _run_triton(device, q, k, v, ptr, idx, sm_scale, *, logit_cap=0.0, sinks=None, k_scale=1.0,
                v_scale=1.0, max_kv_splits=None, out=None):  # fmt: skip
    """The interpreter calls the backend directly, the GPU goes through the public function."""
    if device == "cpu":
        from kernels_attention.ops import decode_attention as m

        b_, hq = q.shape[:2]
        out = poison(torch.empty(b_, hq, v.shape[-1], dtype=q.dtype)) if out is None else out
        lse = poison(torch.empty(b_, hq))
        m._decode_attention_triton(
            out, lse, q, k, v, ptr, idx, sm_scale, logit_cap, sinks, k_scale, v_scale,
            max_kv_splits or 0,
        )  # fmt: skip
        return out, lse
    if out is not None:
        poison(out)
    return decode_attention(
        q, k, v, ptr, idx, sm_scale, logit_cap=logit_cap, sinks=sinks, k_scale=k_scale,
        v_scale=v_scale, max_kv_splits=max_kv_splits, out=out, return_lse=True, backend="triton",
    )  # fmt: skip


def _case_inputs(device, spec, kw):
    """The positional arguments (q, k, v, kv_indptr, kv_indices, sm_scale) of a case and its
    keyword arguments, with ``sinks`` True / "huge" made a tensor."""
    kw = dict(kw or {})
    q, k, v, ptr, idx = _inputs(device=device, **spec)
    sinks = kw.pop("sinks", False)
    if sinks:
        g = torch.Generator().manual_seed(3)
        scale = 200.0 if sinks == "huge" else 2.0  # huge: the sink outweighs every score
        kw["sinks"] = (torch.randn(q.shape[1], generator=g) * scale).to(device)
    scale = kw.pop("sm_scale", 1.0 / math.sqrt(q.shape[-1]))
    return (q, k, v, ptr, idx, scale), kw


def _check_triton(device, spec, kw=None, splits=(None,), out=None):
    args, kw = _case_inputs(device, spec, kw)
    o_ref, lse_ref = reference.decode_attention(*args, **kw)
    for s in splits:
        o, lse = _run_triton(device, *args, max_kv_splits=s, out=out, **kw)
        assert_close(o, o_ref, name=f"o (max_kv_splits={s})")
        assert_close(lse, lse_ref, name=f"lse (max_kv_splits={s})", **LSE_TOL)


INTERPRETER_CASES = {
    # (spec, kwargs, max_kv_splits values): lens with 0, 1 and non-multiples of the page
    "gqa4_bf16": ({"lens": [70, 0, 1, 16], "hq": 8, "hk": 2, "d": 64}, {}, (1, 3)),
    "mha_fp16_cap_sinks": (
        {"lens": [33, 5], "hq": 2, "hk": 2, "d": 64, "dtype": torch.float16},
        {"logit_cap": 1.5, "sinks": True},
        (1, 2),
    ),
    "huge_sinks": ({"lens": [40, 0, 9], "hq": 4, "hk": 2, "d": 64}, {"sinks": "huge"}, (1, 4)),
    "gqa8_fp8": (
        {"lens": [40, 0], "hq": 8, "hk": 1, "d": 64, "cache_dtype": FP8},
        {"k_scale": 0.25, "v_scale": 0.5},
        (None,),
    ),
    "mla": (
        {"lens": [20, 3], "hq": 16, "hk": 1, "d": 576, "dv": 512, "mla": True},
        {"sm_scale": 192**-0.5},
        (None,),
    ),
}


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("case", INTERPRETER_CASES, ids=str)
def test_triton_small(device, case):
    spec, kw, splits = INTERPRETER_CASES[case]
    _check_triton(device, spec, kw, splits)


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_triton_skips_out_of_range_slots(device):
    """The kernel never reads a slot outside [0, S): such a token is skipped."""
    q, k, v, ptr, idx = _inputs([6, 5], 4, 2, 64, device=device)
    bad = idx.clone()
    bad[1], bad[7] = -5, k.shape[0] + 100
    keep = torch.ones(idx.numel(), dtype=torch.bool)
    keep[[1, 7]] = False
    ptr_kept = torch.tensor([0, 5, 9], dtype=torch.int32, device=device)
    o_ref, lse_ref = reference.decode_attention(q, k, v, ptr_kept, idx[keep.to(device)], 0.125)
    o, lse = _run_triton(device, q, k, v, ptr, bad, 0.125)
    assert_close(o, o_ref)
    assert_close(lse, lse_ref, **LSE_TOL)


# --- the merges of several splits: ticket (one launch) and stage 2 ----------------------------


@pytest.fixture
def kernels(monkeypatch):
    """The Triton module with H200-like splits on the interpreter too: 132 SMs and 8-token
    splits (the interpreter's 4 SMs and 64-token splits give one split for its small lengths),
    merge chunks of 1 to 8 splits (so that several chunks are merged), fresh ticket counters."""
    from kernels_attention.triton_kernels import decode_attention as module

    monkeypatch.setattr(module, "sm_count", lambda device: 132)
    monkeypatch.setattr(module, "MIN_TOKENS_PER_SPLIT", 8)
    monkeypatch.setattr(module, "MERGE_CHUNK_PER_THREAD", 4)
    monkeypatch.setattr(module, "_COUNTERS", {})
    return module


def _run_merge(kernels, merge, q, k, v, ptr, idx, sm_scale, *, logit_cap=0.0, sinks=None,
               k_scale=1.0, v_scale=1.0, max_kv_splits=0):  # fmt: skip
    """The Triton launcher with a forced merge, into poisoned outputs."""
    out = poison(torch.empty(q.shape[0], q.shape[1], v.shape[-1], dtype=q.dtype, device=q.device))
    lse = poison(torch.empty(q.shape[:2], device=q.device))
    kernels.decode_attention(
        out, lse, q, k, v, ptr, idx, sm_scale, logit_cap, sinks, k_scale, v_scale,
        max_kv_splits, merge,
    )  # fmt: skip
    return out, lse


def _assert_counters_zero(kernels):
    for counters in kernels._COUNTERS.values():
        assert (counters == 0).all(), "a ticket counter was left non-zero"


MERGE_CASES = {
    # (spec, kwargs): lens with 0, 1 and odd lengths; splits of 8 tokens
    "gqa4_empty_odd": ({"lens": [70, 0, 1, 23], "hq": 8, "hk": 2, "d": 64}, {}),
    "gqa4_long": ({"lens": [1, 333], "hq": 4, "hk": 1, "d": 64}, {}),  # 11 non-empty splits
    "mha_fp16_cap_sinks": (
        {"lens": [33, 5], "hq": 2, "hk": 2, "d": 64, "dtype": torch.float16},
        {"logit_cap": 1.5, "sinks": True},
    ),
    "huge_sinks_gqa6": ({"lens": [41, 0, 9], "hq": 12, "hk": 2, "d": 64}, {"sinks": "huge"}),
    "gqa8_fp8": (
        {"lens": [45, 0], "hq": 8, "hk": 1, "d": 64, "cache_dtype": FP8},
        {"k_scale": 0.25, "v_scale": 0.5},
    ),
    "gqa32_two_head_blocks": ({"lens": [19, 30], "hq": 32, "hk": 1, "d": 64}, {}),
    "mla": (
        {"lens": [20, 3], "hq": 16, "hk": 1, "d": 576, "dv": 512, "mla": True},
        {"sm_scale": 192**-0.5},
    ),
}


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("merge", ("ticket", "stage2", None), ids=str)
@pytest.mark.parametrize("case", MERGE_CASES, ids=str)
def test_triton_merges(kernels, device, merge, case):
    """Every merge of several splits against the reference; the ticket counters are back at 0
    after each launch (a second launch over the same counters would otherwise merge early)."""
    args, kw = _case_inputs(device, *MERGE_CASES[case])
    o_ref, lse_ref = reference.decode_attention(*args, **kw)
    total = args[4].numel()
    assert kernels.decode_splits(args[0].shape[0], 1, total, 132) > 1  # several splits
    for max_splits in (0, 3, 0):
        o, lse = _run_merge(kernels, merge, *args, max_kv_splits=max_splits, **kw)
        assert_close(o, o_ref, name=f"o (merge={merge}, max_kv_splits={max_splits})")
        assert_close(lse, lse_ref, name=f"lse (merge={merge})", **LSE_TOL)
        _assert_counters_zero(kernels)
    assert bool(kernels._COUNTERS) == (merge == "ticket" or (merge is None and case != "mla"))


def test_triton_merge_argument(kernels):
    args, _ = _case_inputs("cpu", {"lens": [3], "hq": 2, "hk": 1, "d": 64}, {})
    with pytest.raises(ValueError, match="merge must be None, 'ticket' or 'stage2', got 'x'"):
        _run_merge(kernels, "x", *args)


# --- GPU only -----------------------------------------------------------------------------------


def _random_lens(b, max_len, seed):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(0, max_len + 1, (b,), generator=g).tolist()
    lens[0], lens[-1] = 0, 1  # always an empty and a one-token request
    return lens


GPU_CASES = {
    "llama_gqa4_d128_p16": ({"hq": 32, "hk": 8, "d": 128, "page": 16}, {}),
    "gqa4_d128_p64_fp16": ({"hq": 32, "hk": 8, "d": 128, "page": 64, "dtype": torch.float16},
                           {}),
    "mha_d64": ({"hq": 8, "hk": 8, "d": 64}, {}),
    "gqa8_d256": ({"hq": 16, "hk": 2, "d": 256}, {}),
    "gqa32_d128": ({"hq": 64, "hk": 2, "d": 128}, {}),  # two 16-head blocks per KV head
    "softcap": ({"hq": 32, "hk": 8, "d": 128}, {"logit_cap": 30.0}),
    "sinks": ({"hq": 64, "hk": 8, "d": 64}, {"sinks": True}),
    "fp8_kv": ({"hq": 32, "hk": 8, "d": 128, "cache_dtype": FP8},
               {"k_scale": 0.05, "v_scale": 0.2}),
    "mla_16": ({"hq": 16, "hk": 1, "d": 576, "dv": 512, "mla": True}, {"sm_scale": 192**-0.5}),
    "mla_128": ({"hq": 128, "hk": 1, "d": 576, "dv": 512, "mla": True}, {"sm_scale": 192**-0.5}),
}  # fmt: skip


@pytest.mark.gpu
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
@pytest.mark.parametrize("batch,max_len", ((1, 1000), (7, 300), (33, 2000)), ids=str)
def test_gpu_matches_reference(case, batch, max_len):
    spec, kw = GPU_CASES[case]
    spec = {**spec, "lens": _random_lens(batch, max_len, seed=batch)}
    _check_triton("cuda", spec, kw, splits=(None, 1, 7))


@pytest.mark.gpu
@pytest.mark.parametrize("batch,length", ((1, 8192), (64, 4096), (128, 1000)), ids=str)
def test_gpu_target_shapes(batch, length):
    spec = {"lens": [length] * batch, "hq": 32, "hk": 8, "d": 128, "page": 16}
    _check_triton("cuda", spec)


@pytest.mark.gpu
def test_gpu_strided_q_and_out():
    lens = [50, 0, 129, 1]
    q, k, v, ptr, idx = _inputs(lens, 32, 8, 128, device="cuda")
    qkv = torch.randn(4, 48, 128, device="cuda").bfloat16()
    qkv[:, :32] = q
    q_view = qkv[:, :32]  # a view of a fused qkv buffer
    wide = torch.zeros(4, 32, 160, device="cuda", dtype=torch.bfloat16)
    out = wide[..., 16:144]
    o_ref, lse_ref = reference.decode_attention(q, k, v, ptr, idx, 0.1)
    o, lse = decode_attention(q_view, k, v, ptr, idx, 0.1, out=out, return_lse=True)
    assert o is out and (wide[..., :16] == 0).all() and (wide[..., 144:] == 0).all()
    assert_close(out, o_ref)
    assert_close(lse, lse_ref, **LSE_TOL)
    o64, lse64 = decode_attention(q_view, k, v, ptr.long(), idx.long(), 0.1, return_lse=True)
    assert_close(o64, o_ref)
    assert_close(lse64, lse_ref, **LSE_TOL)


@pytest.mark.gpu
def test_gpu_all_empty_and_no_tokens():
    q, k, v, _, _ = _inputs([3], 8, 2, 64, device="cuda")
    q = q.expand(3, -1, -1).contiguous()
    ptr = torch.zeros(4, dtype=torch.int32, device="cuda")
    idx = torch.empty(0, dtype=torch.int32, device="cuda")
    o, lse = decode_attention(q, k, v, ptr, idx, return_lse=True, backend="triton")
    assert (o == 0).all() and (lse == -INF).all()


@pytest.mark.gpu
def test_cuda_graph_capture():
    lens = [300, 0, 17, 1000]
    q, k, v, ptr, idx = _inputs(lens, 32, 8, 128, device="cuda")
    out = torch.empty(4, 32, 128, device="cuda", dtype=torch.bfloat16)
    decode_attention(q, k, v, ptr, idx, out=out, backend="triton")  # compiles before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = decode_attention(q, k, v, ptr, idx, out=out, return_lse=True, backend="triton")
    poison(out)
    poison(lse)
    graph.replay()
    torch.cuda.synchronize()
    o_ref, lse_ref = reference.decode_attention(q, k, v, ptr, idx, 1 / math.sqrt(128))
    assert_close(out, o_ref)
    assert_close(lse, lse_ref, **LSE_TOL)


@pytest.mark.gpu
@pytest.mark.parametrize("merge", ("ticket", "stage2"), ids=str)
@pytest.mark.parametrize("case", GPU_CASES, ids=str)
@pytest.mark.parametrize("batch,max_len", ((1, 1000), (7, 300), (3, 4097)), ids=str)
def test_gpu_merges(merge, case, batch, max_len):
    """Both merges forced on the H200's own split counts (the MLA ticket beyond its bound)."""
    from kernels_attention.triton_kernels import decode_attention as kernels

    spec, kw = GPU_CASES[case]
    spec = {**spec, "lens": _random_lens(batch, max_len, seed=batch + 1)}
    args, kw = _case_inputs("cuda", spec, kw)
    o_ref, lse_ref = reference.decode_attention(*args, **kw)
    for max_splits in (0, 2, 0):
        o, lse = _run_merge(kernels, merge, *args, max_kv_splits=max_splits, **kw)
        assert_close(o, o_ref, name=f"o (merge={merge}, max_kv_splits={max_splits})")
        assert_close(lse, lse_ref, name=f"lse (merge={merge})", **LSE_TOL)
    torch.cuda.synchronize()
    _assert_counters_zero(kernels)


@pytest.mark.gpu
@pytest.mark.parametrize("lens", ([512], [1024], [300, 0, 17, 1000], [4096] * 8), ids=str)
def test_cuda_graph_ticket_replays(monkeypatch, lens):
    """The one-launch ticket merge in a graph, replayed twice over new inputs: the counters it
    takes must be back at 0 after each replay, or the second replay merges too early."""
    from kernels_attention.triton_kernels import decode_attention as kernels

    monkeypatch.setattr(kernels, "_COUNTERS", {})
    q, k, v, ptr, idx = _inputs(lens, 32, 8, 128, device="cuda", seed=len(lens))
    out = torch.empty(len(lens), 32, 128, device="cuda", dtype=torch.bfloat16)
    decode_attention(q, k, v, ptr, idx, out=out, backend="triton")  # compiles, makes counters
    assert kernels._COUNTERS, "these shapes take the ticket merge"
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = decode_attention(q, k, v, ptr, idx, out=out, return_lse=True, backend="triton")
    for replay in range(2):
        q.copy_(torch.randn_like(q))
        poison(out)
        poison(lse)
        graph.replay()
        torch.cuda.synchronize()
        o_ref, lse_ref = reference.decode_attention(q, k, v, ptr, idx, 1 / math.sqrt(128))
        assert_close(out, o_ref, name=f"o (replay {replay})")
        assert_close(lse, lse_ref, name=f"lse (replay {replay})", **LSE_TOL)
        _assert_counters_zero(kernels)


@pytest.mark.gpu
def test_cuda_graph_capture_before_counters(monkeypatch):
    """A capture that finds no counter buffer merges by stage 2 (a zeroing captured into this
    graph would not run before another graph's replay), and allocates no counters."""
    from kernels_attention.triton_kernels import decode_attention as kernels

    monkeypatch.setattr(kernels, "_COUNTERS", {})
    lens = [200, 0, 31]
    q, k, v, ptr, idx = _inputs(lens, 32, 8, 128, device="cuda", seed=5)
    out = torch.empty(3, 32, 128, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(3, 32, device="cuda")
    args = (out, lse, q, k, v, ptr, idx, 0.1, 0.0, None, 1.0, 1.0, 0)
    kernels.decode_attention(*args, "stage2")  # compiles both stages before the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kernels.decode_attention(*args)
    assert not kernels._COUNTERS
    o_ref, lse_ref = reference.decode_attention(q, k, v, ptr, idx, 0.1)
    for _ in range(2):
        poison(out)
        poison(lse)
        graph.replay()
        torch.cuda.synchronize()
        assert_close(out, o_ref)
        assert_close(lse, lse_ref, **LSE_TOL)


@pytest.mark.gpu
def test_torch_compile_fullgraph_cuda():
    q, k, v, ptr, idx = _inputs([40, 0, 3], 32, 8, 128, device="cuda")
    sinks = torch.randn(32, device="cuda")

    def f(q, k, v, ptr, idx, sinks):
        return decode_attention(q, k, v, ptr, idx, 0.1, sinks=sinks, return_lse=True)

    o, lse = torch.compile(f, fullgraph=True)(q, k, v, ptr, idx, sinks)
    o_ref, lse_ref = reference.decode_attention(q, k, v, ptr, idx, 0.1, sinks=sinks)
    assert_close(o, o_ref)
    assert_close(lse, lse_ref, **LSE_TOL)


@pytest.mark.gpu
def test_opcheck_cuda():
    from kernels_attention.ops.decode_attention import DECODE_ATTENTION

    q, k, v, ptr, idx = _inputs([5, 0, 9], 8, 2, 128, device="cuda")
    out, lse = torch.empty(3, 8, 128, dtype=q.dtype, device="cuda"), torch.empty(3, 8).cuda()
    args = (out, lse, q, k, v, ptr, idx, 0.125, 0.0, None, 1.0, 1.0, None)
    torch.library.opcheck(DECODE_ATTENTION.torch_op, args)


@pytest.mark.gpu
def test_unsupported_head_dim_falls_back():
    """D = 96 has no Triton kernel: the reference runs (with a fallback warning)."""
    from kernels_jit.errors import KernelsFallbackWarning

    q, k, v, ptr, idx = _inputs([9, 2], 4, 2, 96, device="cuda")
    with pytest.warns(KernelsFallbackWarning, match="head dims"):
        o = decode_attention(q, k, v, ptr, idx, 0.1)
    assert_close(o, reference.decode_attention(q, k, v, ptr, idx, 0.1)[0])
