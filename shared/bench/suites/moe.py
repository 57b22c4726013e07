"""Benchmarks of the moe group (routing, token alignment, top-k reduction): our CUDA kernels against
torch eager (the reference), torch.compile of the reference (a static graph per target shape, see
peers.py), sglang-kernel 0.4.5 (``torch.ops.sgl_kernel``: topk_softmax, moe_align_block_size,
moe_sum_reduce) and vLLM 0.33.0 (``torch.ops._moe_C``: topk_softmax, grouped_topk,
moe_align_block_size, moe_sum) where they have the op, on the same inputs.

fused_moe (Mixtral E 8 k 2 H 4096 I 14336 and DeepSeek-style E 256 k 8 H 7168 I 2048, T 1 to
16384) is compute-bound past small T, so its records carry ``tflops`` (Case.flops = 2*T*k*H*3I).
Its peers: ``vllm_triton``, vLLM's Triton fused_moe kernel with its shipped H200 configs
(``shared/bench/peer_fused_moe``; needs ``python -m shared.bench.fetch_peers vllm_fused_moe``
and ``.peers/vllm_fused_moe`` carried), and ``torch_grouped_mm`` (torch eager with
``torch._grouped_mm``; the reference itself syncs per expert and cannot be graph-captured). Each
case allocates its own weights (up to 22.5 GB for the DeepSeek shape, one input set).

Peers are called through their registered schema (``_schema_call``: arguments by name, any
further optional argument None), so a version that adds an optional argument still binds, and
each is wrapped in ``Checked`` (a wrong binding is reported skipped, never timed). Outputs that are
unordered by contract are compared canonically: routing ids per token sorted by id (with their
weights), sorted_token_ids as the multiset of the padded region.

Expected ceilings: moe_sum_reduce moves (k + 1) x T x H x 2 bytes (bf16), e.g. T = 8192, k = 8,
H = 4096: 604 MB, ~141 us at the ~4.27 TB/s copy rate. The routing ops read T x E logits (8.4 MB
at 8192 x 256 fp32, ~2 us) and are latency- and shuffle-bound; decode shapes are launch-bound.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch

import kernels_moe as moe  # the public ops, resolved lazily by the group
from kernels_moe import reference
from shared.bench.harness import Case
from shared.bench.peers import Checked, sglang, torch_compile, vllm

TOKENS = (1, 16, 64, 128, 8192)
QUICK_TOKENS = (1, 64, 8192)
SUM_TOKENS = (1, 8192)
SUM_K = (2, 4, 8, 9)
SUM_HIDDEN = (2048, 4096, 7168)


def _op(ops: Any, name: str) -> Any | None:
    try:
        return getattr(ops, name) if ops is not None else None
    except Exception:  # a missing op raises from torch.ops' __getattr__ in some versions
        return None


def _schema_call(op: Any, values: dict[str, Any]) -> Any:
    """Call ``op`` with the arguments of its schema taken by name from ``values``; a schema
    argument not in ``values`` must be optional (it gets its default, or None)."""
    args = []
    for arg in op.default._schema.arguments:
        if arg.name in values:
            args.append(values[arg.name])
        elif arg.has_default_value():
            args.append(arg.default_value)
        else:
            args.append(None)
    return op.default(*args)


def _by_expert(weights: torch.Tensor, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's (ids, weights) ordered by id: the selection order is not a peer contract."""
    ids, order = torch.sort(ids.long(), dim=-1)
    return ids.float(), weights.float().gather(-1, order)


# --- topk_softmax --------------------------------------------------------------------------------


def topk_softmax_cases(quick: bool) -> Iterator[Case]:
    sgl = _op(sglang(), "topk_softmax")
    vl = _op(getattr(vllm(), "_moe_C", None) if vllm() is not None else None, "topk_softmax")
    grid = [(t, 256, 8) for t in (QUICK_TOKENS if quick else TOKENS)]
    grid += [(t, 8, 2) for t in ((1, 8192) if quick else (1, 64, 8192))]  # Mixtral
    for tokens, experts, k in grid:

        def make(tokens=tokens, experts=experts, k=k):
            return {
                "gating": torch.randn(tokens, experts, device="cuda"),
                "w": torch.empty(tokens, k, device="cuda"),
                "ids": torch.empty(tokens, k, dtype=torch.int32, device="cuda"),
                # zeros: only the peers write it, and `ab`'s byte check compares every tensor
                "tei": torch.zeros(tokens, k, dtype=torch.int32, device="cuda"),
            }

        def expected(s, k=k):
            return _by_expert(*reference.topk_softmax(s["gating"], k, True))

        impls = {
            "cuda": lambda s: moe.topk_softmax(s["w"], s["ids"], s["gating"], True, backend="cuda"),
            "torch_eager": lambda s, k=k: reference.topk_softmax(s["gating"], k, True),
            "torch_compile": torch_compile(
                reference.topk_softmax,
                [tokens, experts, k],
                lambda f, s, k=k: f(s["gating"], k, True),
            ),
        }
        values = {
            "topk_weights": None,
            "topk_indices": None,
            "token_expert_indices": None,
            "gating_output": None,
            "renormalize": True,
            "moe_softcapping": 0.0,
        }
        for name, op in (("sglang", sgl), ("vllm", vl)):
            if op is None:
                continue

            def run(s, op=op, values=values):
                args = {
                    **values,
                    "topk_weights": s["w"],
                    "topk_indices": s["ids"],
                    "token_expert_indices": s["tei"],
                    "gating_output": s["gating"],
                }
                return _schema_call(op, args)

            impls[name] = Checked(
                run, expected=expected, outputs=lambda s, _: _by_expert(s["w"], s["ids"])
            )
        yield Case(
            op="topk_softmax",
            shape=[tokens, experts, k],
            dtype=torch.float32,
            bytes=tokens * experts * 4 + tokens * k * 8,  # read logits, write w fp32 + ids int32
            make_inputs=make,
            impls=impls,
            note="renormalize; shape [T, E, k]",
        )


# --- gate_topk_renorm ----------------------------------------------------------------------------


def gate_topk_renorm_cases(quick: bool) -> Iterator[Case]:
    vl = _op(getattr(vllm(), "_moe_C", None) if vllm() is not None else None, "grouped_topk")
    experts, k, n_group, topk_group, scale = 256, 8, 8, 4, 2.5
    for tokens in QUICK_TOKENS if quick else TOKENS:

        def make(tokens=tokens):
            return {
                "logits": torch.randn(tokens, experts, device="cuda"),
                "bias": torch.randn(experts, device="cuda") * 0.1,
            }

        def call(f, s):
            return f(s["logits"], s["bias"], k, n_group, topk_group, True, scale, True)

        impls = {
            "cuda": lambda s: moe.gate_topk_renorm(
                s["logits"],
                s["bias"],
                k,
                n_group=n_group,
                topk_group=topk_group,
                routed_scaling_factor=scale,
                apply_routed_scaling_factor_on_output=True,
                backend="cuda",
            ),
            "torch_eager": lambda s: call(reference.gate_topk_renorm, s),
            "torch_compile": torch_compile(reference.gate_topk_renorm, [tokens, experts, k], call),
        }
        if vl is not None:

            def run(s, op=vl):
                return _schema_call(
                    op,
                    {
                        "scores": s["logits"],
                        "n_group": n_group,
                        "topk_group": topk_group,
                        "topk": k,
                        "renormalize": True,
                        "routed_scaling_factor": scale,
                        "bias": s["bias"],
                        "scoring_func": 1,  # sigmoid
                    },
                )

            impls["vllm"] = Checked(
                run,
                expected=lambda s: _by_expert(*call(reference.gate_topk_renorm, s)),
                outputs=lambda s, out: _by_expert(out[0], out[1]),
            )
        yield Case(
            op="gate_topk_renorm",
            shape=[tokens, experts, k],
            dtype=torch.float32,
            bytes=tokens * experts * 4 + experts * 4 + tokens * k * 8,  # logits, bias, w + ids
            make_inputs=make,
            impls=impls,
            note="DeepSeek-V3: 8 groups keep 4, scaling 2.5 on output; shape [T, E, k]",
        )


# --- moe_align_block_size ------------------------------------------------------------------------


def _padded_multiset(sorted_ids: torch.Tensor, post: torch.Tensor) -> tuple[torch.Tensor, ...]:
    total = int(post.item())
    return post.float(), torch.sort(sorted_ids[:total]).values.float()


def moe_align_block_size_cases(quick: bool) -> Iterator[Case]:
    sgl = _op(sglang(), "moe_align_block_size")
    vl = _op(
        getattr(vllm(), "_moe_C", None) if vllm() is not None else None, "moe_align_block_size"
    )
    experts, k, bs = 256, 8, 64
    for tokens in QUICK_TOKENS if quick else TOKENS:
        n = tokens * k
        padded, blocks = reference.moe_align_block_size_sizes(n, experts, bs)
        peer_padded = n + (experts + 1) * (bs - 1)  # the peers' own bound

        def make(tokens=tokens, peer_padded=peer_padded):
            # Distinct experts per token (as routing gives), no filtered slots.
            ids = torch.argsort(torch.rand(tokens, experts, device="cuda"), dim=1)[:, :k]
            return {
                "ids": ids.to(torch.int32).contiguous(),
                "sorted": torch.empty(peer_padded, dtype=torch.int32, device="cuda"),
                "experts": torch.empty(-(-peer_padded // bs), dtype=torch.int32, device="cuda"),
                "post": torch.empty(1, dtype=torch.int32, device="cuda"),
                "cumsum": torch.empty(experts + 2, dtype=torch.int32, device="cuda"),
            }

        def expected(s):
            ref_sorted, _, ref_post = reference.moe_align_block_size(s["ids"], experts, bs)
            return _padded_multiset(ref_sorted, ref_post)

        def outputs(s, _):
            return _padded_multiset(s["sorted"], s["post"])

        impls = {
            "cuda": lambda s: moe.moe_align_block_size(s["ids"], experts, bs, backend="cuda"),
            "torch_eager": lambda s: reference.moe_align_block_size(s["ids"], experts, bs),
            "torch_compile": torch_compile(
                reference.moe_align_block_size,
                [tokens, k, experts, bs],
                lambda f, s: f(s["ids"], experts, bs),
            ),
        }
        if sgl is not None:

            def run_sgl(s, op=sgl):
                s["cumsum"].zero_()  # the 0.4.x API wants a zeroed cumsum buffer
                return _schema_call(
                    op,
                    {
                        "topk_ids": s["ids"],
                        "num_experts": experts + 1,  # the "+1" bucket convention of SGL
                        "block_size": bs,
                        "sorted_token_ids": s["sorted"],
                        "experts_ids": s["experts"],
                        "num_tokens_post_pad": s["post"],
                        "cumsum_buffer": s["cumsum"],
                        "pad_sorted_token_ids": True,
                    },
                )

            impls["sglang"] = Checked(run_sgl, expected=expected, outputs=outputs)
        if vl is not None:

            def run_vllm(s, op=vl):
                return _schema_call(
                    op,
                    {
                        "topk_ids": s["ids"],
                        "num_experts": experts,
                        "block_size": bs,
                        "sorted_token_ids": s["sorted"],
                        "experts_ids": s["experts"],
                        "num_tokens_post_pad": s["post"],
                    },
                )

            impls["vllm"] = Checked(run_vllm, expected=expected, outputs=outputs)
        yield Case(
            op="moe_align_block_size",
            shape=[tokens, k, experts, bs],
            dtype=torch.int32,
            # read ids, write sorted_token_ids [P], expert_ids and the total
            bytes=4 * (n + padded + blocks + 1),
            make_inputs=make,
            impls=impls,
            note="shape [T, k, E, block]; sglang timed with its cumsum zeroing",
        )


# --- moe_sum_reduce ------------------------------------------------------------------------------


def moe_sum_reduce_cases(quick: bool) -> Iterator[Case]:
    sgl = _op(sglang(), "moe_sum_reduce")
    vl = _op(getattr(vllm(), "_moe_C", None) if vllm() is not None else None, "moe_sum")
    dtype = torch.bfloat16
    grid = [(t, k, h) for t in SUM_TOKENS for k in SUM_K for h in SUM_HIDDEN]
    if quick:
        grid = [(t, k, h) for t, k, h in grid if h == 4096 or (t == 8192 and k == 8)]
    for tokens, k, hidden in grid:

        def make(tokens=tokens, k=k, hidden=hidden):
            return {
                "x": torch.randn(tokens, k, hidden, device="cuda").to(dtype),
                "out": torch.empty(tokens, hidden, device="cuda", dtype=dtype),
            }

        impls = {
            "cuda": lambda s: moe.moe_sum_reduce(
                s["x"], routed_scaling_factor=2.5, out=s["out"], backend="cuda"
            ),
            "torch_eager": lambda s: reference.moe_sum_reduce(s["x"], 2.5),
            "torch_compile": torch_compile(
                reference.moe_sum_reduce, [tokens, k, hidden], lambda f, s: f(s["x"], 2.5)
            ),
        }
        if sgl is not None:
            impls["sglang"] = Checked(
                lambda s, op=sgl: _schema_call(
                    op, {"input": s["x"], "output": s["out"], "routed_scaling_factor": 2.5}
                ),
                expected=lambda s: reference.moe_sum_reduce(s["x"], 2.5),
                outputs=lambda s, _: s["out"],
            )
        if vl is not None:  # no scaling factor: compared with the plain sum
            impls["vllm"] = Checked(
                lambda s, op=vl: _schema_call(op, {"input": s["x"], "output": s["out"]}),
                expected=lambda s: reference.moe_sum_reduce(s["x"], 1.0),
                outputs=lambda s, _: s["out"],
            )
        yield Case(
            op="moe_sum_reduce",
            shape=[tokens, k, hidden],
            dtype=dtype,
            bytes=(k + 1) * tokens * hidden * dtype.itemsize,  # read x [T, k, H], write [T, H]
            make_inputs=make,
            impls=impls,
            note="scaling 2.5 (vllm moe_sum: plain sum)",
        )


# --- fused_moe -----------------------------------------------------------------------------------

FUSED_TOKENS = (1, 16, 64, 256, 1024, 4096, 16384)
QUICK_FUSED_TOKENS = (1, 64, 4096)
FUSED_MODELS = {  # name: (E, k, H, I)
    "mixtral": (8, 2, 4096, 14336),
    "deepseek": (256, 8, 7168, 2048),
}


def _grouped_mm_moe(hidden, w1, w2, weights, ids, out):
    """A torch eager fused MoE that a CUDA graph can capture (the reference syncs on the host
    per expert): slots sorted by expert, ``torch._grouped_mm`` for both GEMMs over the device
    offsets, eager silu_and_mul, weight, scatter back and k-sum."""
    tokens, k = ids.shape
    experts, inter = w1.shape[0], w2.shape[2]
    flat = ids.reshape(-1).long()
    order = torch.argsort(flat)
    counts = torch.zeros(experts, dtype=torch.int32, device=ids.device)
    counts.scatter_add_(0, flat, torch.ones_like(flat, dtype=torch.int32))
    offs = torch.cumsum(counts, 0, dtype=torch.int32)
    x = hidden[order // k]
    gate_up = torch._grouped_mm(x, w1.transpose(1, 2), offs=offs)
    act = torch.nn.functional.silu(gate_up[:, :inter]) * gate_up[:, inter:]
    y = torch._grouped_mm(act, w2.transpose(1, 2), offs=offs)
    y = (y.float() * weights.reshape(-1)[order, None]).to(hidden.dtype)
    slots = torch.empty_like(y).index_copy_(0, order, y)
    return moe.moe_sum_reduce(slots.view(tokens, k, -1), out=out)


def fused_moe_cases(quick: bool) -> Iterator[Case]:
    from shared.bench import peer_fused_moe

    peer = peer_fused_moe.kernel_module() is not None
    dtype = torch.bfloat16
    for model, (experts, k, hidden, inter) in FUSED_MODELS.items():
        for tokens in QUICK_FUSED_TOKENS if quick else FUSED_TOKENS:

            def make(tokens=tokens, experts=experts, k=k, hidden=hidden, inter=inter):
                ids = torch.argsort(torch.rand(tokens, experts, device="cuda"), dim=1)[:, :k]
                return {
                    "h": torch.randn(tokens, hidden, device="cuda").to(dtype),
                    "w1": torch.randn(experts, 2 * inter, hidden, device="cuda", dtype=dtype)
                    * hidden**-0.5,
                    "w2": torch.randn(experts, hidden, inter, device="cuda", dtype=dtype)
                    * inter**-0.5,
                    "w": torch.rand(tokens, k, device="cuda"),
                    "ids": ids.to(torch.int32).contiguous(),
                    "out": torch.empty(tokens, hidden, device="cuda", dtype=dtype),
                }

            def args(s):
                return s["h"], s["w1"], s["w2"], s["w"], s["ids"]

            def expected(s):
                return reference.fused_moe(*args(s))

            impls = {
                "triton": lambda s: moe.fused_moe(*args(s), out=s["out"], backend="triton"),
                "torch_grouped_mm": Checked(
                    lambda s: _grouped_mm_moe(*args(s), s["out"]),
                    expected=expected,
                    outputs=lambda s, out: out,
                ),
            }
            if peer:
                impls["vllm_triton"] = Checked(
                    lambda s: peer_fused_moe.fused_moe(*args(s), s["out"]),
                    expected=expected,
                    outputs=lambda s, out: out,
                )
            # Expected distinct experts hit by T tokens of k uniform distinct picks.
            active = experts * (1 - (1 - k / experts) ** tokens)
            weight_bytes = active * 3 * inter * hidden * dtype.itemsize
            yield Case(
                op="fused_moe",
                shape=[tokens, experts, k, hidden, inter],
                dtype=dtype,
                # read hidden and the active experts' w1 + w2 once, write out
                bytes=int(weight_bytes) + 2 * tokens * hidden * dtype.itemsize,
                flops=2 * tokens * k * hidden * 3 * inter,
                make_inputs=make,
                impls=impls,
                note=f"{model}: shape [T, E, k, H, I]; uniform routing; bytes count the "
                "expected active experts' weights once",
            )


def cases(quick: bool) -> Iterator[Case]:
    yield from topk_softmax_cases(quick)
    yield from gate_topk_renorm_cases(quick)
    yield from moe_align_block_size_cases(quick)
    yield from moe_sum_reduce_cases(quick)
    yield from fused_moe_cases(quick)
