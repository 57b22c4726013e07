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

The torch rope reference checks the positions on the host (a synchronisation that CUDA-graph
capture forbids): torch_eager and torch_compile run the same arithmetic without that check.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

import kernels_attention as attention  # the public ops, resolved lazily by the group
from kernels_attention import reference
from shared.bench.harness import Case
from shared.bench.peers import Checked, sglang, torch_compile, vllm

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


def cases(quick: bool) -> Iterator[Case]:
    yield from merge_state_cases(quick)
    yield from rope_cases(quick)
    yield from concat_mla_k_cases(quick)
