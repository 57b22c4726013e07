"""Benchmarks of the quantization group: our CUDA kernels against torch eager (the reference),
torch.compile of the reference (a static graph per target shape, see peers.py), sglang-kernel
0.4.5 (``torch.ops.sgl_kernel``) and vLLM 0.33 (``torch.ops._C``) where they have the op, on the
same inputs. Each peer is checked against the reference on its first call (peers.Checked, one
fp8 step of tolerance: peers may multiply by 1/s where the reference divides).

Expected ceiling, stated before measuring: every op is memory-bound. bf16 in, fp8 out: 3 bytes
per element at least, so 8192 x 7168 (176 MB) takes ~41 us at the H200's ~4.27 TB/s copy rate;
dynamic per-tensor reads x twice unless the second read hits L2 (32768 x 4096: 403 MB over two
passes and the write: ~157 us at the copy rate; vLLM 161 us). Decode
shapes (1-16 tokens) are latency-bound: ~1-2 us per kernel under CUDA graphs.

One function per op; ``cases(quick)`` chains them.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

import kernels_quantization as quantization
from kernels_quantization import reference
from shared.bench.harness import Case
from shared.bench.peers import Checked, sglang, torch_compile, vllm
from shared.bench.suites._hadamard import hadamard_cases

DTYPE = torch.bfloat16
FP8 = torch.float8_e4m3fn
HIDDEN = 7168
TOKENS = (1, 16, 128, 8192)
QUICK_TOKENS = (1, 8192)
GROUP = 128
EPS = 1e-10
# One e4m3 step (12.5% relative at worst) and the smallest subnormal: peers that multiply by
# 1/s instead of dividing may round an element to the neighbouring code.
FP8_ATOL, FP8_RTOL = 2.0**-8, 0.13


def _checked(impl, expected, outputs) -> Checked:
    return Checked(impl, expected=expected, outputs=outputs, atol=FP8_ATOL, rtol=FP8_RTOL)


def _tokens(quick: bool) -> tuple[int, ...]:
    return QUICK_TOKENS if quick else TOKENS


# --- per_token_quant_fp8 -------------------------------------------------------------------------


def per_token_quant_fp8_cases(quick: bool) -> Iterator[Case]:
    sgl, vl = sglang(), vllm()
    for tokens in _tokens(quick):

        def make(tokens=tokens):
            x = torch.randn(tokens, HIDDEN, device="cuda").to(DTYPE)
            return {
                "x": x,
                "q": torch.empty(tokens, HIDDEN, device="cuda", dtype=FP8),
                # zeros: ours returns its own scales, so this buffer (the peers') stays as made,
                # and the A/B's byte comparison must not read uninitialised memory
                "s": torch.zeros(tokens, 1, device="cuda"),
            }

        def expected(s):
            return reference.per_token_quant_fp8(s["x"])

        def outputs(s, _):
            return s["q"], s["s"]

        impls = {
            "cuda": lambda s: quantization.per_token_quant_fp8(s["x"], out=s["q"], backend="cuda"),
            "torch_eager": lambda s: reference.per_token_quant_fp8(s["x"]),
            "torch_compile": torch_compile(
                reference.per_token_quant_fp8, [tokens, HIDDEN], lambda f, s: f(s["x"])
            ),
        }
        if sgl is not None:
            impls["sglang"] = _checked(
                lambda s, op=sgl.sgl_per_token_quant_fp8: op(s["x"], s["q"], s["s"]),
                expected,
                outputs,
            )
        if vl is not None:
            impls["vllm"] = _checked(
                lambda s, op=vl._C.dynamic_per_token_scaled_fp8_quant: op(
                    s["q"], s["x"], s["s"], None
                ),
                expected,
                outputs,
            )
        yield Case(
            op="per_token_quant_fp8",
            shape=[tokens, HIDDEN],
            dtype=DTYPE,
            # read x [T, K] bf16, write q [T, K] fp8 and s [T] fp32
            bytes=tokens * HIDDEN * (DTYPE.itemsize + 1) + tokens * 4,
            make_inputs=make,
            impls=impls,
        )


# --- per_token_group_quant_8bit ------------------------------------------------------------------

# layout name -> the public op's flags (the bench's scale buffers follow the same layout)
LAYOUTS = {
    "row": {},
    "col_tma": {"column_major_scales": True, "scale_tma_aligned": True},
    "ue8m0_packed": {
        "column_major_scales": True,
        "scale_tma_aligned": True,
        "scale_ue8m0": True,
        "pack_ue8m0": True,
    },
}


def _group_scales(tokens: int, groups: int, layout: str) -> torch.Tensor:
    """The scale view of ``layout`` (what the public op allocates), for peers and ours alike."""
    if layout == "row":
        return torch.empty(tokens, groups, device="cuda")
    rows = (tokens + 3) // 4 * 4
    if layout == "col_tma":
        return torch.empty(groups, rows, device="cuda").t()[:tokens]
    words = (groups + 3) // 4
    return torch.empty(words, rows, device="cuda", dtype=torch.int32).t()[:tokens]


def per_token_group_quant_8bit_cases(quick: bool) -> Iterator[Case]:
    sgl, vl = sglang(), vllm()
    groups = HIDDEN // GROUP
    for layout, flags in LAYOUTS.items():
        ue8m0 = bool(flags.get("scale_ue8m0"))
        packed = bool(flags.get("pack_ue8m0"))
        for tokens in _tokens(quick):

            def make(tokens=tokens, layout=layout):
                x = torch.randn(tokens, HIDDEN, device="cuda").to(DTYPE)
                return {
                    "x": x,
                    "q": torch.empty(tokens, HIDDEN, device="cuda", dtype=FP8),
                    "s": _group_scales(tokens, groups, layout),
                }

            def expected(s, ue8m0=ue8m0, packed=packed):
                q, sc = reference.per_token_group_quant_8bit(s["x"], GROUP, FP8, EPS, ue8m0)
                return q, (reference.pack_ue8m0(sc) if packed else sc)

            def outputs(s, _):
                return s["q"], s["s"]

            def ref(x, ue8m0=ue8m0):
                return reference.per_token_group_quant_8bit(x, GROUP, FP8, EPS, ue8m0)

            impls = {
                "cuda": lambda s, flags=flags: quantization.per_token_group_quant_8bit(
                    s["x"], GROUP, out_q=s["q"], out_s=s["s"], backend="cuda", **flags
                ),
                "torch_eager": lambda s, ref=ref: ref(s["x"]),
                "torch_compile": torch_compile(ref, [tokens, HIDDEN], lambda f, s: f(s["x"])),
            }
            if sgl is not None:
                impls["sglang"] = _checked(
                    lambda s, op=sgl.sgl_per_token_group_quant_8bit, ue8m0=ue8m0: op(
                        s["x"], s["q"], s["s"], GROUP, EPS, -448.0, 448.0, ue8m0
                    ),
                    expected,
                    outputs,
                )
            if vl is not None:
                if packed:
                    impls["vllm"] = _checked(
                        lambda s, op=vl._C.per_token_group_fp8_quant_packed: op(
                            s["x"], s["q"], s["s"], GROUP, EPS, -448.0, 448.0
                        ),
                        expected,
                        outputs,
                    )
                else:
                    col = layout != "row"
                    impls["vllm"] = _checked(
                        lambda s, op=vl._C.per_token_group_fp8_quant, col=col: op(
                            s["x"], s["q"], s["s"], GROUP, EPS, -448.0, 448.0, False, col, col
                        ),
                        expected,
                        outputs,
                    )
            scale_bytes = tokens * ((groups + 3) // 4 if packed else groups) * 4
            yield Case(
                # one op name per layout: records are keyed by (op, dtype, shape)
                op="per_token_group_quant_8bit" + ("" if layout == "row" else f"_{layout}"),
                shape=[tokens, HIDDEN],
                dtype=DTYPE,
                # read x bf16, write q fp8 and the scales (fp32 per group, or packed int32 words)
                bytes=tokens * HIDDEN * (DTYPE.itemsize + 1) + scale_bytes,
                make_inputs=make,
                impls=impls,
                note=f"group {GROUP}, e4m3, {layout} scales",
            )


# The optional modes (OPS.md: fuse_silu_and_mul, the masked EP layout), row-major scales.
FUSED_SHAPE = (8192, 2048)  # T, K: x is [T, 2K]
MASKED_SHAPE = (8, 1024, HIDDEN)  # E, T_pad, K
# Live rows per expert (4584 of 8192): full, partial and empty experts.
MASKED_M = (1024, 768, 512, 256, 1024, 900, 100, 0)


def _sgl_v2():
    """sglang-kernel's unified op (fuse_silu_and_mul, masked_m), where this build has it."""
    sgl = sglang()
    return None if sgl is None else getattr(sgl, "sgl_per_token_group_quant_8bit_v2", None)


def per_token_group_quant_8bit_fused_cases(quick: bool) -> Iterator[Case]:
    v2 = _sgl_v2()
    tokens, k = FUSED_SHAPE
    groups = k // GROUP

    def make():
        return {
            "x": torch.randn(tokens, 2 * k, device="cuda").to(DTYPE),
            "q": torch.empty(tokens, k, device="cuda", dtype=FP8),
            "s": torch.empty(tokens, groups, device="cuda"),
        }

    def ref(x):
        return reference.per_token_group_quant_8bit(x, GROUP, FP8, EPS, False, True)

    impls = {
        "cuda": lambda s: quantization.per_token_group_quant_8bit(
            s["x"], GROUP, fuse_silu_and_mul=True, out_q=s["q"], out_s=s["s"], backend="cuda"
        ),
        "torch_eager": lambda s: ref(s["x"]),
        "torch_compile": torch_compile(ref, [tokens, 2 * k], lambda f, s: f(s["x"])),
    }
    if v2 is not None:
        impls["sglang"] = _checked(
            lambda s, op=v2: op(
                s["x"], s["q"], s["s"], GROUP, EPS, -448.0, 448.0, False, True, None
            ),
            lambda s: ref(s["x"]),
            lambda s, _: (s["q"], s["s"]),
        )
    yield Case(
        op="per_token_group_quant_8bit_fused_silu",
        shape=[tokens, 2 * k],
        dtype=DTYPE,
        # read x [T, 2K] bf16, write q [T, K] fp8 and s [T, K / 128] fp32
        bytes=tokens * 2 * k * DTYPE.itemsize + tokens * k + tokens * groups * 4,
        make_inputs=make,
        impls=impls,
        note=f"group {GROUP}, e4m3, row scales, quantize silu(x1) * x2",
    )


def _masked_ref(x: torch.Tensor, masked_m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference over every row, dead rows (t >= masked_m[e]) zeroed: what the check and
    torch_compile compare (the op leaves them untouched)."""
    q, s = reference.per_token_group_quant_8bit(x, GROUP, FP8, EPS, False)
    live = reference.masked_rows(masked_m, x.shape[1]).unsqueeze(-1)
    zero_q = torch.zeros((), dtype=torch.uint8, device=x.device)
    q = torch.where(live, q.view(torch.uint8), zero_q).view(FP8)
    return q, torch.where(live, s, torch.zeros((), device=x.device))


def per_token_group_quant_8bit_masked_cases(quick: bool) -> Iterator[Case]:
    v2 = _sgl_v2()
    experts, t_pad, k = MASKED_SHAPE
    groups = k // GROUP
    live_rows = sum(min(m, t_pad) for m in MASKED_M)

    def make():
        return {
            "x": torch.randn(experts, t_pad, k, device="cuda").to(DTYPE),
            "q": torch.zeros(experts, t_pad, k, device="cuda", dtype=FP8),
            "s": torch.zeros(experts, t_pad, groups, device="cuda"),
            "m": torch.tensor(MASKED_M, dtype=torch.int32, device="cuda"),
        }

    def expected(s):
        return _masked_ref(s["x"], s["m"])

    def outputs(s, _):
        return s["q"], s["s"]  # dead rows stay zero (make() zeroes them)

    impls = {
        "cuda": lambda s: quantization.per_token_group_quant_8bit(
            s["x"], GROUP, masked_m=s["m"], out_q=s["q"], out_s=s["s"], backend="cuda"
        ),
        "torch_eager": lambda s: _masked_ref(s["x"], s["m"]),
        "torch_compile": torch_compile(
            _masked_ref, [experts, t_pad, k], lambda f, s: f(s["x"], s["m"])
        ),
    }
    if v2 is not None:
        impls["sglang"] = _checked(
            lambda s, op=v2: op(
                s["x"], s["q"], s["s"], GROUP, EPS, -448.0, 448.0, False, False, s["m"]
            ),
            expected,
            outputs,
        )
    yield Case(
        op="per_token_group_quant_8bit_masked",
        shape=[experts, t_pad, k],
        dtype=DTYPE,
        # the live rows only: read x bf16, write q fp8 and s fp32
        bytes=live_rows * (k * (DTYPE.itemsize + 1) + groups * 4),
        make_inputs=make,
        impls=impls,
        note=f"group {GROUP}, e4m3, row scales, masked_m {list(MASKED_M)} ({live_rows} live rows)",
    )


# --- per_tensor_quant_fp8 ------------------------------------------------------------------------


def per_tensor_quant_fp8_cases(quick: bool) -> Iterator[Case]:
    vl = vllm()  # sglang-kernel 0.4.5 has no per-tensor op
    shapes = [(t, HIDDEN) for t in _tokens(quick)] + [(32768, 4096)]
    for static in (False, True):
        for tokens, hidden in shapes:

            def make(tokens=tokens, hidden=hidden):
                x = torch.randn(tokens, hidden, device="cuda").to(DTYPE)
                return {
                    "x": x,
                    "q": torch.empty(tokens, hidden, device="cuda", dtype=FP8),
                    # zeros: only the vLLM peer writes it (ours returns its scale); `ab` compares it
                    "s": torch.zeros(1, device="cuda"),
                    "scale": torch.tensor([0.01], device="cuda"),
                }

            if static:

                def ref(x, scale):
                    return reference.per_tensor_quant_fp8(x, scale)[0]

                def expected(s, ref=ref):
                    return ref(s["x"], s["scale"])

                def outputs(s, _):
                    return s["q"]

                impls = {
                    "cuda": lambda s: quantization.per_tensor_quant_fp8(
                        s["x"], scale=s["scale"], out=s["q"], backend="cuda"
                    ),
                    "torch_eager": lambda s, ref=ref: ref(s["x"], s["scale"]),
                    "torch_compile": torch_compile(
                        ref, [tokens, hidden], lambda f, s: f(s["x"], s["scale"])
                    ),
                }
                if vl is not None:
                    impls["vllm"] = _checked(
                        lambda s, op=vl._C.static_scaled_fp8_quant: op(
                            s["q"], s["x"], s["scale"], None
                        ),
                        expected,
                        outputs,
                    )
            else:

                def ref(x):
                    return reference.per_tensor_quant_fp8(x)

                def expected(s, ref=ref):
                    return ref(s["x"])

                def outputs(s, _):
                    return s["q"], s["s"]

                impls = {
                    "cuda": lambda s: quantization.per_tensor_quant_fp8(
                        s["x"], out=s["q"], backend="cuda"
                    ),
                    "torch_eager": lambda s, ref=ref: ref(s["x"]),
                    "torch_compile": torch_compile(ref, [tokens, hidden], lambda f, s: f(s["x"])),
                }
                if vl is not None:
                    # vLLM's caller zeroes the scale before the kernel's atomic max: timed too.
                    def vllm_dynamic(s, op=vl._C.dynamic_scaled_fp8_quant):
                        s["s"].zero_()
                        op(s["q"], s["x"], s["s"])

                    impls["vllm"] = _checked(vllm_dynamic, expected, outputs)
            yield Case(
                op="per_tensor_quant_fp8" + ("_static" if static else ""),
                shape=[tokens, hidden],
                dtype=DTYPE,
                # read x bf16 once, write q fp8 (and the one fp32 scale when dynamic)
                bytes=tokens * hidden * (DTYPE.itemsize + 1) + 4,
                make_inputs=make,
                impls=impls,
                note="static scale" if static else "dynamic scale (vllm: zero_ + kernel)",
            )


def cases(quick: bool) -> Iterator[Case]:
    yield from per_token_quant_fp8_cases(quick)
    yield from per_token_group_quant_8bit_cases(quick)
    yield from per_token_group_quant_8bit_fused_cases(quick)
    yield from per_token_group_quant_8bit_masked_cases(quick)
    yield from per_tensor_quant_fp8_cases(quick)
    yield from hadamard_cases(quick)
