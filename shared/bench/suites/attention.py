"""Benchmarks of the attention group: our CUDA kernels against torch eager (the reference),
torch.compile of the reference (a static graph per target shape, see peers.py), sglang-kernel
0.4.5 (``torch.ops.sgl_kernel``: merge_state_v2, concat_mla_k, apply_rope_pos_ids_cos_sin_cache,
rotary_embedding where present) and vLLM 0.33.0 (``torch.ops._C.rotary_embedding``), each peer
checked against the reference at its first call (``peers.Checked``: a wrong binding is reported
skipped, not timed).

Shapes (``bytes`` = each input read once, each output written once):
- merge_state: [T, H, D] bf16 v, fp32 LSE; Llama H = 32, D = 128 at T 1-32768; MLA H = 128,
  D = 512 at T 1-8192. bytes = 3 T H D 2 + 3 T H 4.
- rope_inplace: Llama 32 q + 8 kv heads x 128, NeoX, q and k 2-D views of a fused qkv buffer
  [T, (32 + 16) 128] bf16, an fp32 cos/sin cache of 131072 positions, int64 positions.
  bytes = 2 T 40 128 2 (q, k read and written) + T 128 4 (one cache row per token) + T 8.
- concat_mla_k: DeepSeek H = 128, Dn = 128, Dr = 64 bf16; k_nope a view of the kv_b output
  [T, H, 256], k_rope a view of the latent output [T, 576][:, 512:]. bytes = T H 128 2 +
  T 64 2 + T H 192 2.
- decode_attention: Llama-3-8B (32 q / 8 KV heads, D = 128) bf16 at B 1-128 x L 512-8192, every
  request L tokens over shuffled pages of 16 slots (token-level kv_indices); MLA (128 heads,
  D = 576, Dv = 512, v a view of the one cache) at B 1 and 64, L 4096. bytes = the KV bytes read
  (B L Hk (D + Dv) 2; MLA: B L 576 2) + q + o + kv_indices and kv_indptr (4 B each). The torch
  peers run the reference's arithmetic without its host-side index check, in at most 4 chunks of
  tokens. Peer ``vllm_triton``: vLLM's Triton decode attention (SGLang's split-KV kernel with a
  [B, pages] block table, ``decode_attention_fwd``), cut from the vLLM 0.33.0 wheel by
  ``python -m shared.bench.fetch_peers vllm_decode_attention`` into the ignored
  ``.peers/vllm_decode_attention/kernel.py`` (skipped where absent), with 8 KV splits (SGLang's
  default ``--triton-attention-num-kv-splits``) and the same pages as its block table. Peer
  ``flashinfer`` (Llama GQA shapes): FlashInfer 0.7.2.post1's paged decode
  (BatchDecodeWithPagedKVCache, its CUDA-core FA2 module, built by
  shared/bench/build_flashinfer_peer.py) on the same cache as NHD pages of 16 slots and the same
  page order; its plan runs on the host in ``make_inputs`` (as
  ``BatchDecodeWithPagedKVCacheWrapper.plan`` with its default ``use_cuda_graph=False``: KV split
  only where its scheduler finds it pays), so only ``run`` is timed.

The torch rope reference checks the positions on the host (a synchronisation that CUDA-graph
capture forbids): torch_eager and torch_compile run the same arithmetic without that check.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

import kernels_attention as attention  # the public ops, resolved lazily by the group
from kernels_attention import reference
from shared.bench.harness import Case
from shared.bench.peers import (
    Checked,
    flashinfer,
    flashinfer_pdl,
    peer_source,
    sglang,
    torch_compile,
    vllm,
)

DTYPE = torch.bfloat16
TOKENS = (1, 16, 64, 1024, 8192, 32768)
QUICK_TOKENS = (1, 16, 8192, 32768)
MLA_TOKENS = (1, 16, 128, 1024, 8192)
QUICK_MLA_TOKENS = (1, 16, 8192)


def _has(ops: object, name: str) -> bool:
    try:
        return ops is not None and hasattr(ops, name)
    except Exception:  # a missing op raises from torch.ops' __getattr__ in some versions
        return False


# --- merge_state ---------------------------------------------------------------------------------


def merge_state_cases(quick: bool) -> Iterator[Case]:
    sgl = sglang()
    grid = [(t, 32, 128) for t in (QUICK_TOKENS if quick else TOKENS)]
    grid += [(t, 128, 512) for t in (QUICK_MLA_TOKENS if quick else MLA_TOKENS)]
    for tokens, heads, dim in grid:

        def make(tokens=tokens, heads=heads, dim=dim):
            return {
                "v_a": torch.randn(tokens, heads, dim, device="cuda").to(DTYPE),
                "v_b": torch.randn(tokens, heads, dim, device="cuda").to(DTYPE),
                "s_a": torch.randn(tokens, heads, device="cuda") * 4,
                "s_b": torch.randn(tokens, heads, device="cuda") * 4,
                "out": torch.empty(tokens, heads, dim, device="cuda", dtype=DTYPE),
                "out_lse": torch.empty(tokens, heads, device="cuda"),
            }

        def args(s):
            return s["v_a"], s["s_a"], s["v_b"], s["s_b"]

        impls = {
            "cuda": lambda s: attention.merge_state(
                *args(s), out=s["out"], out_lse=s["out_lse"], backend="cuda"
            ),
            "torch_eager": lambda s: reference.merge_state(*args(s)),
            "torch_compile": torch_compile(
                reference.merge_state, [tokens, heads, dim], lambda f, s: f(*args(s))
            ),
        }
        if _has(sgl, "merge_state_v2"):
            impls["sglang"] = Checked(
                lambda s, op=sgl.merge_state_v2: op(*args(s), s["out"], s["out_lse"]),
                expected=lambda s: reference.merge_state(*args(s)),
                outputs=lambda s, _: (s["out"], s["out_lse"]),
            )
        yield Case(
            op="merge_state",
            shape=[tokens, heads, dim],
            dtype=DTYPE,
            # read v_a, v_b, s_a, s_b; write v, s
            bytes=3 * tokens * heads * dim * DTYPE.itemsize + 3 * tokens * heads * 4,
            make_inputs=make,
            impls=impls,
            note="MLA" if dim == 512 else "",
        )


# --- rope_inplace --------------------------------------------------------------------------------

HQ, HK, HEAD = 32, 8, 128
MAX_POS = 131072


def _rope_math(q: torch.Tensor, k: torch.Tensor, cache: torch.Tensor, positions: torch.Tensor):
    """The reference's arithmetic on [T, H*D] views, without its host-side position check."""
    half = cache.shape[1] // 2
    rows = cache.float()[positions.long()]
    cos, sin = rows[:, :half], rows[:, half : 2 * half]
    reference._rotate(q.view(q.shape[0], -1, HEAD), cos, sin, True)
    reference._rotate(k.view(k.shape[0], -1, HEAD), cos, sin, True)


def _rope_expected(s: dict, cache_key: str = "cache") -> tuple[torch.Tensor, torch.Tensor]:
    q, k = s["q"].clone(), s["k"].clone()
    _rope_math(q, k, s[cache_key], s["pos"])
    return q, k


def rope_cases(quick: bool) -> Iterator[Case]:
    sgl, vl = sglang(), vllm()
    for tokens in QUICK_TOKENS if quick else TOKENS:

        def make(tokens=tokens):
            qkv = torch.randn(tokens, (HQ + 2 * HK) * HEAD, device="cuda").to(DTYPE)
            cache = torch.randn(MAX_POS, HEAD, device="cuda")
            return {
                "qkv": qkv,
                "q": qkv[:, : HQ * HEAD],
                "k": qkv[:, HQ * HEAD : (HQ + HK) * HEAD],
                "cache": cache,
                "cache_bf16": cache.to(DTYPE),  # vLLM reads the cache in the query dtype
                "pos": torch.randint(0, MAX_POS, (tokens,), device="cuda"),
            }

        impls = {
            "cuda": lambda s: attention.rope_inplace(
                s["q"], s["k"], s["cache"], s["pos"], is_neox=True, head_size=HEAD, backend="cuda"
            ),
            "torch_eager": lambda s: _rope_math(s["q"], s["k"], s["cache"], s["pos"]),
            "torch_compile": torch_compile(
                _rope_math,
                [tokens, HQ + HK, HEAD],
                lambda f, s: f(s["q"], s["k"], s["cache"], s["pos"]),
            ),
        }
        if _has(sgl, "apply_rope_pos_ids_cos_sin_cache"):
            impls["sglang"] = Checked(
                lambda s, op=sgl.apply_rope_pos_ids_cos_sin_cache: _sglang_rope(op, s),
                expected=_rope_expected,
                outputs=lambda s, _: (s["q"], s["k"]),
            )
        elif _has(sgl, "rotary_embedding"):
            impls["sglang"] = Checked(
                lambda s, op=sgl.rotary_embedding: op(
                    s["pos"], s["q"], s["k"], HEAD, s["cache_bf16"], True
                ),
                expected=lambda s: _rope_expected(s, "cache_bf16"),
                outputs=lambda s, _: (s["q"], s["k"]),
            )
        if vl is not None and _has(getattr(vl, "_C", None), "rotary_embedding"):
            impls["vllm"] = Checked(
                lambda s, op=vl._C.rotary_embedding: op(
                    s["pos"], s["q"], s["k"], HEAD, s["cache_bf16"], True
                ),
                expected=lambda s: _rope_expected(s, "cache_bf16"),
                outputs=lambda s, _: (s["q"], s["k"]),
            )
        yield Case(
            op="rope_inplace",
            shape=[tokens, HQ + HK, HEAD],
            dtype=DTYPE,
            # q and k read and written; one fp32 cache row and one int64 position per token
            bytes=2 * tokens * (HQ + HK) * HEAD * DTYPE.itemsize + tokens * HEAD * 4 + tokens * 8,
            make_inputs=make,
            impls=impls,
            note="NeoX, q/k views of qkv, fp32 cache (vllm: a bf16 copy, read in the query dtype)",
        )


def _sglang_rope(op, s: dict) -> None:
    """sgl-kernel's FlashInfer-derived RoPE in place (q_rope = q, k_rope = k), bound by the
    argument names of the loaded schema (0.4.x dropped ``cuda_stream`` in some releases)."""
    t = s["q"].shape[0]
    q3, k3 = s["q"].view(t, HQ, HEAD), s["k"].view(t, HK, HEAD)
    values = {
        "q": q3,
        "k": k3,
        "q_rope": q3,
        "k_rope": k3,
        "cos_sin_cache": s["cache"],
        "pos_ids": s["pos"],
        "interleave": False,
        "enable_pdl": False,
        "cuda_stream": torch.cuda.current_stream().cuda_stream,
        "v": None,
        "k_buffer": None,
        "v_buffer": None,
        "kv_cache_loc": None,
    }
    names = [a.name for a in op.default._schema.arguments]
    op(*(values[name] for name in names))


# --- concat_mla_k --------------------------------------------------------------------------------

MLA_HEADS, NOPE, ROPE = 128, 128, 64


def concat_mla_k_cases(quick: bool) -> Iterator[Case]:
    sgl = sglang()
    for tokens in QUICK_TOKENS if quick else TOKENS:

        def make(tokens=tokens):
            kv = torch.randn(tokens, MLA_HEADS, NOPE + 128, device="cuda").to(DTYPE)
            latent = torch.randn(tokens, 512 + ROPE, device="cuda").to(DTYPE)
            return {
                "k_nope": kv[..., :NOPE],
                "k_rope": latent[:, 512:].unsqueeze(1),
                "k": torch.empty(tokens, MLA_HEADS, NOPE + ROPE, device="cuda", dtype=DTYPE),
            }

        def ref(k, k_nope, k_rope):
            reference.concat_mla_k(k, k_nope, k_rope)
            return k

        impls = {
            "cuda": lambda s: attention.concat_mla_k(
                s["k"], s["k_nope"], s["k_rope"], backend="cuda"
            ),
            "torch_eager": lambda s: ref(s["k"], s["k_nope"], s["k_rope"]),
            "torch_compile": torch_compile(
                ref,
                [tokens, MLA_HEADS, NOPE + ROPE],
                lambda f, s: f(s["k"], s["k_nope"], s["k_rope"]),
            ),
        }
        if _has(sgl, "concat_mla_k"):
            impls["sglang"] = Checked(
                lambda s, op=sgl.concat_mla_k: op(s["k"], s["k_nope"], s["k_rope"]),
                expected=lambda s: torch.cat(
                    (s["k_nope"], s["k_rope"].expand(-1, MLA_HEADS, -1)), dim=-1
                ),
                outputs=lambda s, _: s["k"],
                atol=0.0,
                rtol=0.0,
            )
        yield Case(
            op="concat_mla_k",
            shape=[tokens, MLA_HEADS, NOPE + ROPE],
            dtype=DTYPE,
            # read k_nope [T, H, 128] and k_rope [T, 64]; write k [T, H, 192]
            bytes=(tokens * MLA_HEADS * NOPE + tokens * ROPE + tokens * MLA_HEADS * (NOPE + ROPE))
            * DTYPE.itemsize,
            make_inputs=make,
            impls=impls,
            note="k_nope a view of kv_b's output, k_rope a view of the latent output",
        )


# --- decode_attention ----------------------------------------------------------------------------

DECODE_BATCHES = (1, 8, 64, 128)
DECODE_LENGTHS = (512, 1024, 4096, 8192)
QUICK_DECODE = ((1, 512), (1, 1024), (8, 4096), (64, 4096), (128, 8192))
MLA_DECODE = ((1, 4096), (64, 4096))
PAGE = 16
VLLM_DECODE_SPLITS = 8


def _vllm_decode_attention():
    """``decode_attention_fwd`` of the vLLM Triton source in .peers/, or None where absent."""
    module = peer_source("vllm_decode_attention", "decode_attention_fwd")
    return None if module is None else module.decode_attention_fwd


def _vllm_decode_call(fwd, s: dict) -> torch.Tensor:
    # Scales as device tensors (its default builds them from host values: a copy that CUDA-graph
    # capture rejects); MLA through its grouped kernel's 512 + 64 channel split.
    fwd(s["q"], s["k"], s["v"], s["out_peer"], s["lse_peer"], s["block_table"], s["seq_lens"],
        s["logits_peer"], VLLM_DECODE_SPLITS, s["scale"], PAGE, k_scale=s["one"],
        v_scale=s["one"], is_mla=s["q"].shape[-1] == 576)  # fmt: skip
    return s["out_peer"]


def _decode_math(s: dict) -> torch.Tensor:
    """The reference's arithmetic (no host-side index check), in at most 4 chunks of tokens."""
    chunk = max(32768, -(-s["kv_indices"].numel() // 4))
    o, _ = reference.decode_attention_math(
        s["q"], s["k"], s["v"], s["kv_indptr"], s["kv_indices"], s["scale"], chunk=chunk
    )
    return o


def _fi_decode_plan(fi, s: dict, batch: int, length: int) -> dict:
    """FlashInfer's buffers and plan for one input set, on the host before capture, with the
    arguments ``BatchDecodeWithPagedKVCacheWrapper.plan`` passes (window_left -1, no logits cap,
    use_cuda_graph False); the workspaces sized by its own ``workspace_size``."""
    pages = -(-length // PAGE)
    indptr = torch.arange(batch + 1, dtype=torch.int32) * pages
    empty_q, empty_kv = torch.empty(0, dtype=DTYPE), torch.empty(0, dtype=DTYPE)
    plan_args = (batch, HQ, HK, PAGE, False, -1, 0.0, HEAD, HEAD, empty_q, empty_kv)
    float_bytes, int_bytes = fi.workspace_size(s["q"], indptr, *plan_args)
    fi_s = {
        "float_ws": torch.empty(max(float_bytes, 1 << 20), dtype=torch.uint8, device="cuda"),
        "int_ws": torch.empty(max(int_bytes, 1 << 20), dtype=torch.uint8, device="cuda"),
        "pinned": torch.empty(max(int_bytes, 1 << 20), dtype=torch.uint8, pin_memory=True),
        "indptr": indptr.cuda(),
        "indices": s["block_table"].flatten(),
        "last_page_len": torch.full(
            (batch,), length - (pages - 1) * PAGE, dtype=torch.int32, device="cuda"
        ),
        "out": torch.empty_like(s["out"]),
    }
    fi_s["plan"] = fi.plan(fi_s["float_ws"], fi_s["int_ws"], fi_s["pinned"], indptr, *plan_args)
    return fi_s


def _fi_decode_run(fi, s: dict) -> torch.Tensor:
    """``run`` as the wrapper calls it: NHD layout (0), window_left -1, its default PDL on sm_90,
    no alibi slopes, logits cap 0, rope_rcp_scale 1 and rope_rcp_theta 1e-4 (unused here)."""
    f = s["fi"]
    k = s["k"].view(-1, PAGE, HK, HEAD)
    v = s["v"].view(-1, PAGE, HK, HEAD)
    fi.run(f["float_ws"], f["int_ws"], f["plan"], s["q"], k, v, f["indptr"], f["indices"],
           f["last_page_len"], f["out"], None, 0, -1, flashinfer_pdl(), None, 0.0, s["scale"],
           1.0, 1e-4)  # fmt: skip
    return f["out"]


def decode_attention_cases(quick: bool) -> Iterator[Case]:
    fi = flashinfer("decode")
    grid = (
        [(b, n, HQ, HK, HEAD, HEAD) for b, n in QUICK_DECODE]
        if quick
        else [(b, n, HQ, HK, HEAD, HEAD) for b in DECODE_BATCHES for n in DECODE_LENGTHS]
    )
    grid += [(b, n, 128, 1, 576, 512) for b, n in MLA_DECODE[: 1 if quick else None]]
    for batch, length, hq, hk, d, dv in grid:
        mla = d == 576

        fi_peer = fi is not None and not mla  # its module is built for Llama GQA (D 128) only

        def make(batch=batch, length=length, hq=hq, hk=hk, d=d, dv=dv, mla=mla, fi_peer=fi_peer):
            pages = batch * -(-length // PAGE)
            order = torch.randperm(pages, device="cuda").view(batch, -1)
            slots = order[..., None] * PAGE + torch.arange(PAGE, device="cuda")
            k = torch.randn(pages * PAGE, hk, d, device="cuda").to(DTYPE)
            s = {
                "q": torch.randn(batch, hq, d, device="cuda").to(DTYPE),
                "k": k,
                "v": k[..., :dv] if mla else torch.randn_like(k[..., :dv]),
                "kv_indptr": (torch.arange(batch + 1, device="cuda") * length).int(),
                "kv_indices": slots.view(batch, -1)[:, :length].flatten().int(),
                "scale": 192**-0.5 if mla else d**-0.5,
                "out": torch.empty(batch, hq, dv, device="cuda", dtype=DTYPE),
                # the vLLM peer: pages as a block table, its outputs and split workspace
                "block_table": order.int(),
                "seq_lens": torch.full((batch,), length, device="cuda", dtype=torch.int32),
                "out_peer": torch.empty(batch, hq, dv, device="cuda", dtype=DTYPE),
                "lse_peer": torch.empty(batch, hq, device="cuda"),
                "one": torch.ones((), device="cuda"),
                "logits_peer": torch.empty(
                    batch, hq, VLLM_DECODE_SPLITS, dv + 1, device="cuda", dtype=torch.float32
                ),
            }
            if fi_peer:
                s["fi"] = _fi_decode_plan(fi, s, batch, length)
            return s

        def args(s):
            return s["q"], s["k"], s["v"], s["kv_indptr"], s["kv_indices"], s["scale"]

        impls = {
            "triton": lambda s: attention.decode_attention(
                *args(s), out=s["out"], backend="triton"
            ),
            "torch_eager": _decode_math,
            "torch_compile": torch_compile(
                _decode_math, [batch, length, hq, hk, d], lambda f, s: f(s)
            ),
        }
        vllm_fwd = _vllm_decode_attention()
        if vllm_fwd is not None:
            impls["vllm_triton"] = Checked(
                lambda s, fwd=vllm_fwd: _vllm_decode_call(fwd, s),
                expected=_decode_math,
                outputs=lambda s, returned: returned,
            )
        if fi_peer:
            impls["flashinfer"] = Checked(
                lambda s: _fi_decode_run(fi, s),
                expected=_decode_math,
                outputs=lambda s, returned: returned,
            )
        kv_bytes = batch * length * hk * (d if mla else d + dv) * DTYPE.itemsize
        yield Case(
            op="decode_attention",
            shape=[batch, length, hq, hk, d],
            dtype=DTYPE,
            # KV read once (MLA: one 576-wide cache), q read, o written, indices read
            bytes=kv_bytes
            + batch * hq * (d + dv) * DTYPE.itemsize
            + batch * length * 4
            + (batch + 1) * 4,
            make_inputs=make,
            impls=impls,
            note=("MLA, v = k[..., :512]" if mla else "Llama-3-8B GQA 32/8")
            + f", {PAGE}-slot pages shuffled, token-level kv_indices",
        )


def cases(quick: bool) -> Iterator[Case]:
    yield from merge_state_cases(quick)
    yield from rope_cases(quick)
    yield from concat_mla_k_cases(quick)
    yield from decode_attention_cases(quick)
