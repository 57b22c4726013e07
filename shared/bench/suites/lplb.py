"""Benchmarks of the lplb group: our CUDA kernels (csrc/solve_lp.cuh, csrc/lplb_dispatch.cuh)
against torch eager (the reference) and torch.compile of the reference. There is no runnable
binary peer: SGL's JIT ``solve_ipm`` needs nvidia-mathdx and sglang's headers, and DeepSeek's LPLB
solver is not packaged (its README quotes ~100 us for one intra-node problem).

solve_lp: the load-balancing LPs lplb_dispatch builds for DeepSeek-V3 expert parallelism inside a
node (L = 256 logical experts over G = 8 GPUs): 32 redundant slots give an LP of about 40 rows x
75 variables, 152 redundant slots about 125 x 290; P = 1, 8 and 132 problems (one per SM). Shape
[P, m, n]. The issue's targets: <= 50 us for one ~75-variable problem, about the same for P up to
132. The references loop in Python and sync with the host (no CUDA graph: timed eagerly). No
torch_compile row for solve_lp: on the H200's host (2026-12-03) inductor had not finished the
first graph of its 50-iteration interior point after 7.5 minutes (shared.bench.precompile), so
eager is its only torch baseline.

lplb_dispatch: the whole op (LP shares, then the seeded draw) on the DeepSeek-V3 layout (L = 256,
Pe = 288, G = 8), counts given, T x k = 8 .. 64K slots (k = 8). Shape [T, k]. The LP part is the
one-problem solve above.

lplb_dispatch_shares: the same op and shapes with ``shares`` given (the LP's log2phy_prob,
computed once per step), so only the draw runs: the issue's target of <= 5 us for T x k <= 64K.
Records are keyed by (op, shape, dtype), not by note, so this set has an op label of its own
(like per_tensor_quant_fp8_static); ``--op lplb_dispatch`` selects both sets,
``--op lplb_dispatch_shares`` the draw alone. Its torch rows time ``reference.dispatch_draw``
plus the copy of the shares the op returns: the reference op's host-side checks of the layout
and the shares (syncs, and not what a torch engine would pay per layer) are left out.

``bytes`` is the minimum traffic: inputs read once, outputs written once (formulas beside them).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

import kernels_lplb as lplb  # the public ops, resolved lazily by the group
from kernels_lplb import reference
from kernels_lplb.ops.lplb_dispatch import replicated_layout
from shared.bench.harness import Case
from shared.bench.peers import torch_compile

EXPERTS, GPUS = 256, 8
LP_SIZES = {"dsv3_intra_75": 32, "dsv3_intra_290": 152}  # redundant slots
PROBLEMS = (1, 8, 132)
QUICK_PROBLEMS = (1, 132)
SLOTS_K = 8
TOKENS = (1, 16, 64, 128, 512, 2048, 8192)  # T x k = 8 .. 64K
QUICK_TOKENS = (1, 8192)


def balancing_lps(problems: int, extra: int, seed: int = 0):
    """``problems`` load-balancing LPs of one layout (random loads), as A [P, m, n], b, c fp32."""
    phy2log, log2phy = replicated_layout(EXPERTS, extra, GPUS, seed=seed)
    captured: list = []

    def capture(a, b, c, **kwargs):
        captured.append((a, b, c))
        return torch.zeros(a.shape[0], a.shape[2]), torch.ones(a.shape[0], dtype=torch.int32)

    original = reference.solve_lp
    reference.solve_lp = capture
    try:
        for p in range(problems):
            g = torch.Generator().manual_seed(seed + p)
            counts = torch.randint(1, 1000, (EXPERTS,), generator=g)
            reference.replica_shares(phy2log, log2phy, GPUS, counts)
    finally:
        reference.solve_lp = original
    return tuple(torch.cat([t[i] for t in captured]) for i in range(3))


def solve_lp_cases(quick: bool) -> Iterator[Case]:
    for name, extra in LP_SIZES.items():
        a1, b1, c1 = balancing_lps(max(PROBLEMS), extra)
        for problems in QUICK_PROBLEMS if quick else PROBLEMS:
            rows, cols = a1.shape[1], a1.shape[2]

            def make(problems=problems, a1=a1, b1=b1, c1=c1):
                return {
                    "a": a1[:problems].cuda(),
                    "b": b1[:problems].cuda(),
                    "c": c1[:problems].cuda(),
                }

            def ref(a, b, c):
                return reference.solve_lp(a, b, c)

            yield Case(
                op="solve_lp",
                shape=[problems, rows, cols],
                dtype=torch.float32,
                # read A, b, c; write x (fp32) and status (int32)
                bytes=problems * (rows * cols + rows + cols + cols + 1) * 4,
                make_inputs=make,
                impls={
                    "cuda": lambda s: lplb.solve_lp(s["a"], s["b"], s["c"], backend="cuda"),
                    "torch_eager": lambda s, ref=ref: ref(s["a"], s["b"], s["c"]),
                },
                note=name,
            )


def _ours(s: dict, **given):
    """Our CUDA lplb_dispatch on the case's inputs, with counts or shares ``given``."""
    return lplb.lplb_dispatch(
        s["topk"], s["phy2log"], s["log2phy"], GPUS, seed=7, backend="cuda", **given
    )


def dispatch_cases(quick: bool) -> Iterator[Case]:
    phy2log, log2phy = replicated_layout(EXPERTS, 32, GPUS, seed=0)
    for tokens in QUICK_TOKENS if quick else TOKENS:

        def make(tokens=tokens):
            g = torch.Generator().manual_seed(tokens)
            topk = torch.randint(0, EXPERTS, (tokens, SLOTS_K), generator=g, dtype=torch.int32)
            counts = torch.randint(1, 10000, (EXPERTS,), generator=g)
            return {
                "topk": topk.cuda(),
                "phy2log": phy2log.cuda(),
                "log2phy": log2phy.cuda(),
                "counts": counts.cuda(),
            }

        def ref(topk, p2l, l2p, counts):
            return reference.lplb_dispatch(topk, p2l, l2p, GPUS, counts, 7)

        def call(f, s):
            return f(s["topk"], s["phy2log"], s["log2phy"], s["counts"])

        yield Case(
            op="lplb_dispatch",
            shape=[tokens, SLOTS_K],
            dtype=torch.int32,
            # read topk_ids, phy2log, log2phy, counts (int64); write phys_ids and log2phy_prob
            bytes=(2 * tokens * SLOTS_K + phy2log.numel() + 2 * log2phy.numel()) * 4 + EXPERTS * 8,
            make_inputs=make,
            impls={
                "cuda": lambda s: _ours(s, counts=s["counts"]),
                "torch_eager": lambda s, ref=ref: call(ref, s),
                "torch_compile": torch_compile(ref, [tokens, SLOTS_K], call),
            },
            note="LP shares + draw (DeepSeek-V3: L 256, Pe 288, G 8)",
        )


def shares_cases(quick: bool) -> Iterator[Case]:
    phy2log, log2phy = replicated_layout(EXPERTS, 32, GPUS, seed=0)
    counts = torch.randint(1, 10000, (EXPERTS,), generator=torch.Generator().manual_seed(0))
    shares, _ = reference.replica_shares(phy2log, log2phy, GPUS, counts)
    for tokens in QUICK_TOKENS if quick else TOKENS:

        def make(tokens=tokens):
            g = torch.Generator().manual_seed(tokens)
            topk = torch.randint(0, EXPERTS, (tokens, SLOTS_K), generator=g, dtype=torch.int32)
            return {
                "topk": topk.cuda(),
                "phy2log": phy2log.cuda(),
                "log2phy": log2phy.cuda(),
                "shares": shares.cuda(),
            }

        def ref(topk, l2p, shares):
            return reference.dispatch_draw(topk, l2p, shares, 7), shares.clone()

        def call(f, s):
            return f(s["topk"], s["log2phy"], s["shares"])

        yield Case(
            op="lplb_dispatch_shares",
            shape=[tokens, SLOTS_K],
            dtype=torch.int32,
            # read topk_ids, log2phy, shares; write phys_ids and log2phy_prob (the shares' copy)
            bytes=(2 * tokens * SLOTS_K + 3 * log2phy.numel()) * 4,
            make_inputs=make,
            impls={
                "cuda": lambda s: _ours(s, shares=s["shares"]),
                "torch_eager": lambda s, ref=ref: call(ref, s),
                "torch_compile": torch_compile(ref, [tokens, SLOTS_K], call),
            },
            note="draw only (shares given; DeepSeek-V3: L 256, Pe 288, G 8)",
        )


def cases(quick: bool) -> Iterator[Case]:
    yield from solve_lp_cases(quick)
    yield from dispatch_cases(quick)
    yield from shares_cases(quick)
