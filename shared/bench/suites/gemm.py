"""Benchmarks of the gemm group: the small-M (decode) GEMMs against torch eager (the fp32
reference), cuBLAS through ``F.linear`` in bf16 (``torch_linear``, the engines' default),
torch.compile of the reference, and the sgl-kernel / vLLM kernels where they have the op.

Expected ceiling, stated before measuring: at M <= 16 both ops are weight-bandwidth bound. The
router weight (256 x 7168 bf16) is 3.67 MB: 0.86 us at the H200's ~4.3 TB/s copy rate, so launch
and DRAM latency dominate (target <= 2.5 us for M <= 8, below F.linear at every M <= 16). The
fused q_a/kv_a weight (2112 x 7168 bf16) is 30.3 MB: ~7.1 us at copy rate (target <= 9 us from a
cold L2, below vLLM's kernel L2-warm).

Each op is timed twice:
- ``<op>``: every input set has its own weight, and the harness rotates sets past 3x the L2, so
  the weight streams from HBM (a cold L2: one layer's weights in a real decode step, where the
  other layers' weights evict it);
- ``<op>_l2warm``: one weight shared by every set, so after the first call it is served from the
  L2 (how a CUDA graph replaying only this op sees it; peers-and-targets.md quotes vLLM there).

The fp8 GEMMs (``fp8_cases``) are timed at decode and prefill M (1 to 4096) on DeepSeek-V3's
projections (N, K) = (7168, 7168), (2112, 7168), (24576, 7168) (blockwise only) and a square
4096 x 4096, against torch._scaled_mm (cuBLAS LT, per-token x per-channel scales), sgl-kernel's
``fp8_scaled_mm`` / ``fp8_blockwise_scaled_mm`` and vLLM's ``cutlass_scaled_mm``. Expected
ceiling: decode (M <= 64) streams the fp8 weight (7168 x 7168 is 51 MB: ~12 us at copy rate);
M = 4096 is compute bound (4096 x 7168 x 7168 is 421 GFLOP: 0.21 ms at the H200's 1,979 dense
fp8 TFLOPS peak, ~0.3 ms at the ~70% of peak a CUTLASS sm90 kernel reaches).

Shapes are [M, N, K] (N: experts or output columns); records carry ``tflops`` (2 M N K per call).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch
import torch.nn.functional as F

import kernels_gemm as gemm  # the public ops, resolved lazily by the group
from kernels_gemm import reference
from shared.bench.harness import Case
from shared.bench.peers import Checked, sglang, torch_compile, vllm

BF16 = torch.bfloat16
HIDDEN = 7168  # DeepSeek-V3 K
ROUTER_EXPERTS = (256, 384)
FUSED_A_N = 2112  # q_lora 1536 + kv_lora 512 + rope 64
TOKENS = (1, 2, 4, 8, 12, 16)
QUICK_TOKENS = (1, 8, 16)


def _has_arg(op: object, name: str) -> bool:
    """Whether a torch op's schema has an argument ``name`` (e.g. vLLM's ``enable_pdl``)."""
    try:
        return any(a.name == name for a in op.default._schema.arguments)  # type: ignore[attr-defined]
    except (AttributeError, RuntimeError):
        return False


def _peer_op(lib: object, path: tuple[str, ...]) -> object | None:
    """``lib.<path>`` or None (a library without that op)."""
    obj = lib
    for name in path:
        try:
            obj = getattr(obj, name)
        except (AttributeError, RuntimeError):
            return None
    return obj


def _weights(shared: bool, n: int, k: int) -> Callable[[], torch.Tensor]:
    """A factory of [N, K] weights: one tensor for every set (L2-warm) or a fresh one each."""
    made: list[torch.Tensor] = []

    def weight() -> torch.Tensor:
        if made and shared:
            return made[0]
        made[:] = [(torch.randn(n, k, device="cuda") * 0.05).to(BF16)]
        return made[0]

    return weight


def _router_cases(quick: bool) -> Iterator[Case]:
    experts = ROUTER_EXPERTS[:1] if quick else ROUTER_EXPERTS
    lib = vllm()
    vllm_op = _peer_op(lib, ("_moe_C", "dsv3_router_gemm")) if lib is not None else None
    for warm in (False, True):
        for e in experts:
            for m in QUICK_TOKENS if quick else TOKENS:
                weight = _weights(warm, e, HIDDEN)

                def make(m=m, e=e, weight=weight):
                    return {
                        "x": torch.randn(m, HIDDEN, device="cuda").to(BF16),
                        "w": weight(),
                        "out": torch.empty(m, e, device="cuda"),
                    }

                ref = reference.dsv3_router_gemm
                impls = {
                    "cuda": lambda s: gemm.dsv3_router_gemm(s["x"], s["w"], out=s["out"]),
                    "torch_eager": lambda s, ref=ref: ref(s["x"], s["w"]),
                    # cuBLAS bf16 GEMM (fp32 accumulation, bf16 logits): the engines' default
                    "torch_linear": lambda s: F.linear(s["x"], s["w"]),
                    "torch_compile": torch_compile(
                        ref, [m, e, HIDDEN], lambda f, s: f(s["x"], s["w"])
                    ),
                }
                if vllm_op is not None:  # dsv3_router_gemm(Tensor! output, Tensor mat_a, mat_b)
                    impls["vllm"] = Checked(
                        lambda s, op=vllm_op: op(s["out"], s["x"], s["w"]),
                        expected=lambda s, ref=ref: ref(s["x"], s["w"]),
                        outputs=lambda s, _: s["out"],
                    )
                yield Case(
                    op="dsv3_router_gemm" + ("_l2warm" if warm else ""),
                    shape=[m, e, HIDDEN],
                    dtype=BF16,
                    # read x [M, K] and w [E, K] (bf16), write fp32 logits [M, E]
                    bytes=(m * HIDDEN + e * HIDDEN) * 2 + m * e * 4,
                    flops=2 * m * e * HIDDEN,
                    make_inputs=make,
                    impls=impls,
                    note="one weight shared by every input set (L2-warm)"
                    if warm
                    else "a weight per input set (cold L2)",
                )


def _fused_a_cases(quick: bool) -> Iterator[Case]:
    sgl, lib = sglang(), vllm()
    sgl_op = _peer_op(sgl, ("dsv3_fused_a_gemm",)) if sgl is not None else None
    vllm_op = _peer_op(lib, ("_C", "dsv3_fused_a_gemm")) if lib is not None else None
    for warm in (False, True):
        for m in QUICK_TOKENS if quick else TOKENS:
            weight = _weights(warm, FUSED_A_N, HIDDEN)

            def make(m=m, weight=weight):
                w = weight()
                return {
                    "a": torch.randn(m, HIDDEN, device="cuda").to(BF16),
                    "w": w,
                    "b": w.t(),  # [K, N] column-major, as every implementation takes it
                    "out": torch.empty(m, FUSED_A_N, device="cuda", dtype=BF16),
                }

            ref = reference.dsv3_fused_a_gemm
            impls = {
                "cuda": lambda s: gemm.dsv3_fused_a_gemm(s["a"], s["b"], out=s["out"]),
                "torch_eager": lambda s, ref=ref: ref(s["a"], s["b"]),
                "torch_linear": lambda s: F.linear(s["a"], s["w"]),  # cuBLAS bf16
                "torch_compile": torch_compile(
                    ref, [m, FUSED_A_N, HIDDEN], lambda f, s: f(s["a"], s["b"])
                ),
            }
            # dsv3_fused_a_gemm(Tensor! output, Tensor mat_a, Tensor mat_b[, bool enable_pdl])
            for name, op in (("sglang", sgl_op), ("vllm", vllm_op)):
                if op is None:
                    continue
                if _has_arg(op, "enable_pdl"):
                    call = lambda s, op=op: op(s["out"], s["a"], s["b"], True)  # noqa: E731
                else:
                    call = lambda s, op=op: op(s["out"], s["a"], s["b"])  # noqa: E731
                impls[name] = Checked(
                    call,
                    expected=lambda s, ref=ref: ref(s["a"], s["b"]),
                    outputs=lambda s, _: s["out"],
                )
            yield Case(
                op="dsv3_fused_a_gemm" + ("_l2warm" if warm else ""),
                shape=[m, FUSED_A_N, HIDDEN],
                dtype=BF16,
                # read a [M, K] and the weight [N, K], write out [M, N], all bf16
                bytes=(m * HIDDEN + FUSED_A_N * HIDDEN + m * FUSED_A_N) * 2,
                flops=2 * m * FUSED_A_N * HIDDEN,
                make_inputs=make,
                impls=impls,
                note="one weight shared by every input set (L2-warm); peers with PDL where they "
                "take it"
                if warm
                else "a weight per input set (cold L2); peers with PDL where they take it",
            )


def small_m_cases(quick: bool) -> Iterator[Case]:
    """The small-M (decode) GEMMs: dsv3_router_gemm and dsv3_fused_a_gemm."""
    yield from _router_cases(quick)
    yield from _fused_a_cases(quick)


FP8 = torch.float8_e4m3fn
FP8_TOKENS = (1, 16, 64, 128, 4096)
QUICK_FP8_TOKENS = (1, 128, 4096)
FP8_SHAPES = ((7168, 7168), (2112, 7168), (4096, 4096))  # (N, K)
FP8_BLOCKWISE_SHAPES = ((7168, 7168), (2112, 7168), (24576, 7168), (4096, 4096))


def _fp8_operands(m: int, n: int, k: int) -> dict[str, torch.Tensor]:
    """a [M, K] fp8 row-major and b = w.t() of a row-major [N, K] fp8 weight, values ~N(0, 1) so
    that outputs are O(1) with scales ~0.01 (the peers' check tolerance means something)."""
    w = torch.randn(n, k, device="cuda").to(FP8)
    return {"a": torch.randn(m, k, device="cuda").to(FP8), "w": w, "b": w.t()}


def _add_fp8_peers(impls: dict, expected: Callable, sgl_call, vllm_op) -> None:
    """The binary peers of an fp8 case, each checked against ``expected``: sglang's call (it
    returns the product) and vLLM's ``cutlass_scaled_mm(Tensor! out, a, b, a_scales, b_scales,
    Tensor? bias)``, which writes ``s["out"]``; either may be None (absent)."""
    if sgl_call is not None:
        impls["sglang"] = Checked(sgl_call, expected=expected, outputs=lambda s, r: r)
    if vllm_op is not None:
        impls["vllm"] = Checked(
            lambda s, op=vllm_op: op(s["out"], s["a"], s["b"], s["sa"], s["sb"], None),
            expected=expected,
            outputs=lambda s, _: s["out"],
        )


def _fp8_scaled_cases(quick: bool) -> Iterator[Case]:
    sgl, lib = sglang(), vllm()
    sgl_op = _peer_op(sgl, ("fp8_scaled_mm",)) if sgl is not None else None
    vllm_op = _peer_op(lib, ("_C", "cutlass_scaled_mm")) if lib is not None else None
    for n, k in FP8_SHAPES:
        for m in QUICK_FP8_TOKENS if quick else FP8_TOKENS:

            def make(m=m, n=n, k=k):
                s = _fp8_operands(m, n, k)
                s["sa"] = torch.rand(m, 1, device="cuda") * 0.02 + 0.01  # per token
                s["sb"] = torch.rand(n, device="cuda") * 0.02 + 0.01  # per channel
                s["out"] = torch.empty(m, n, device="cuda", dtype=BF16)
                return s

            ref = reference.fp8_scaled_mm

            def expected(s, ref=ref):
                return ref(s["a"], s["b"], s["sa"], s["sb"], BF16)

            impls = {
                "cuda": lambda s: gemm.fp8_scaled_mm(s["a"], s["b"], s["sa"], s["sb"], BF16),
                "torch_eager": expected,
                "torch_compile": torch_compile(
                    ref, [m, n, k], lambda f, s: f(s["a"], s["b"], s["sa"], s["sb"], BF16)
                ),
                # cuBLAS LT row-wise scaled fp8 GEMM: scale_a [M, 1], scale_b [1, N], bf16 out
                "torch_scaled_mm": Checked(
                    lambda s: torch._scaled_mm(
                        s["a"], s["b"], s["sa"], s["sb"].view(1, -1), out_dtype=BF16
                    ),
                    expected=expected,
                    outputs=lambda s, r: r,
                ),
            }

            # fp8_scaled_mm(mat_a, mat_b, scales_a, scales_b, dtype, bias)
            def sgl_call(s, op=sgl_op):
                return op(s["a"], s["b"], s["sa"], s["sb"], BF16, None)

            _add_fp8_peers(impls, expected, sgl_call if sgl_op is not None else None, vllm_op)
            yield Case(
                op="fp8_scaled_mm",
                shape=[m, n, k],
                dtype=FP8,
                # read a, w (fp8) and the fp32 scales, write bf16 out
                bytes=m * k + n * k + (m + n) * 4 + m * n * 2,
                flops=2 * m * n * k,
                make_inputs=make,
                impls=impls,
                note="per-token x per-channel scales, bf16 out",
            )


def _fp8_blockwise_cases(quick: bool) -> Iterator[Case]:
    sgl, lib = sglang(), vllm()
    sgl_op = _peer_op(sgl, ("fp8_blockwise_scaled_mm",)) if sgl is not None else None
    vllm_op = _peer_op(lib, ("_C", "cutlass_scaled_mm")) if lib is not None else None
    for n, k in FP8_BLOCKWISE_SHAPES:
        groups, blocks_n = k // 128, -(-n // 128)
        for m in QUICK_FP8_TOKENS if quick else FP8_TOKENS:

            def make(m=m, n=n, k=k, groups=groups, blocks_n=blocks_n):
                s = _fp8_operands(m, n, k)
                # scale_a [M, K/128] M-major with 16-byte aligned columns (per_token_group_quant's
                # column_major_scales + scale_tma_aligned); scale_b = weight_scale_inv.t()
                rows = -(-m // 4) * 4
                s["sa"] = (torch.rand(groups, rows, device="cuda") * 0.02 + 0.01).t()[:m]
                s["sb"] = (torch.rand(blocks_n, groups, device="cuda") * 0.02 + 0.01).t()
                s["out"] = torch.empty(m, n, device="cuda", dtype=BF16)
                return s

            ref = reference.fp8_blockwise_mm

            def expected(s, ref=ref):
                return ref(s["a"], s["b"], s["sa"], s["sb"], BF16)

            impls = {
                "cuda": lambda s: gemm.fp8_blockwise_mm(s["a"], s["b"], s["sa"], s["sb"]),
                "torch_eager": expected,
                "torch_compile": torch_compile(
                    ref, [m, n, k], lambda f, s: f(s["a"], s["b"], s["sa"], s["sb"], BF16)
                ),
            }
            # fp8_blockwise_scaled_mm(mat_a, mat_b, scales_a, scales_b, out_dtype): its scale_b
            # must have N/128 columns (rounded down), so N a multiple of 128
            sgl_call = None
            if sgl_op is not None and n % 128 == 0:  # its scale_b has N/128 columns
                sgl_call = lambda s, op=sgl_op: op(s["a"], s["b"], s["sa"], s["sb"], BF16)  # noqa: E731
            # vLLM's cutlass_scaled_mm takes [M, K/128] x [K/128, ceil(N/128)] as block scales
            _add_fp8_peers(impls, expected, sgl_call, vllm_op)
            yield Case(
                op="fp8_blockwise_mm",
                shape=[m, n, k],
                dtype=FP8,
                # read a, w (fp8) and the fp32 block scales, write bf16 out
                bytes=m * k + n * k + (m * groups + groups * blocks_n) * 4 + m * n * 2,
                flops=2 * m * n * k,
                make_inputs=make,
                impls=impls,
                note="1x128 activation and 128x128 weight block scales, bf16 out",
            )


def fp8_cases(quick: bool) -> Iterator[Case]:
    """The CUTLASS fp8 GEMMs: fp8_scaled_mm and fp8_blockwise_mm."""
    yield from _fp8_scaled_cases(quick)
    yield from _fp8_blockwise_cases(quick)


def cases(quick: bool) -> Iterator[Case]:
    """Every public ``<family>_cases(quick)`` function of this module, in definition order (the
    fp8 GEMMs add theirs beside ``small_m_cases``; nothing to register)."""
    for name, family in list(globals().items()):
        if name.endswith("_cases") and not name.startswith("_") and callable(family):
            yield from family(quick)
