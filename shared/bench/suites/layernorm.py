"""Benchmarks of the layernorm group: every op against torch eager (the reference), torch.compile
of the reference (a static graph per target shape, see peers.py), Liger-Kernel and FlashInfer's
CUDA kernels (built by shared/bench/build_flashinfer_peer.py) where they have the op, plus the host
cost of a public call.

Expected ceiling, stated before measuring: every op is memory-bound (a few flops per byte), so at
large shapes the floor is the minimum bytes over the measured copy bandwidth (~4.27 TB/s on the
H200): rmsnorm 32768 x 8192 bf16 moves 1.07 GB, 251 us; fused_add_rmsnorm twice that. Decode
shapes (1-64 tokens) are latency-bound: ~1-2 us per kernel under CUDA graphs.

KERNELS_BENCH_DTYPE=float16 or float32 times the suite in that dtype (default bfloat16: the recorded
sweeps), e.g. for an A/B of a change that only those kernels see.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import torch

from kernels_layernorm import (
    fused_add_rmsnorm,
    gemma_fused_add_rmsnorm,
    gemma_rmsnorm,
    layernorm,
    qk_rmsnorm,
    reference,
    rmsnorm,
)
from shared.bench.harness import Case, host_cost_us
from shared.bench.peers import Checked, flashinfer, flashinfer_pdl, has, torch_compile
from shared.bench.shapes import TOKENS, token_grid

QK_HEADS = ((32, 8),)  # (q heads, k heads) of [T, H, 128]
HEAD_DIM = 128
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_dtype_name = os.environ.get("KERNELS_BENCH_DTYPE", "bfloat16")
if _dtype_name not in _DTYPES:
    raise ValueError(f"KERNELS_BENCH_DTYPE={_dtype_name!r}: choose one of {sorted(_DTYPES)}")
DTYPE = _DTYPES[_dtype_name]
EPS = 1e-6


def _weight(hidden: int) -> torch.Tensor:
    return (1.0 + 0.1 * torch.randn(hidden, device="cuda")).to(DTYPE)


def _liger(module: str) -> bool:
    return has("liger_kernel") and has(f"liger_kernel.ops.{module}")


def _norm_case(name: str, op: Callable, ref: Callable, tokens: int, hidden: int) -> Case:
    gemma = name.startswith("gemma")

    def make():
        x = torch.randn(tokens, hidden, device="cuda").to(DTYPE)
        return x, _weight(hidden), torch.empty_like(x)

    impls = {
        "cuda": lambda s: op(s[0], s[1], EPS, out=s[2], backend="cuda"),
        "torch_eager": lambda s: ref(s[0], s[1], EPS),
        "torch_compile": torch_compile(ref, [tokens, hidden], lambda f, s: f(s[0], s[1], EPS)),
    }
    if _liger("rms_norm"):
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction

        offset, mode = (1.0, "gemma") if gemma else (0.0, "llama")
        impls["liger"] = lambda s: LigerRMSNormFunction.apply(s[0], s[1], EPS, offset, mode, False)
    fi = flashinfer()
    if fi is not None:
        fi_op, pdl = getattr(fi, name), flashinfer_pdl()
        impls["flashinfer"] = Checked(
            lambda s: fi_op(s[2], s[0], s[1], EPS, pdl),
            expected=lambda s: ref(s[0], s[1], EPS),
            outputs=lambda s, _: s[2],
        )
    return Case(
        op=name,
        shape=[tokens, hidden],
        dtype=DTYPE,
        bytes=2 * tokens * hidden * DTYPE.itemsize + hidden * DTYPE.itemsize,  # x, out; weight
        make_inputs=make,
        impls=impls,
    )


def _fused_case(name: str, op: Callable, ref: Callable, tokens: int, hidden: int) -> Case:
    gemma = name.startswith("gemma")

    def make():
        x = torch.randn(tokens, hidden, device="cuda").to(DTYPE)
        return x, torch.randn_like(x), _weight(hidden)

    impls = {
        # In place, as engines call it: x and residual are both read and both written.
        "cuda": lambda s: op(s[0], s[1], s[2], EPS, backend="cuda"),
        "torch_eager": lambda s: ref(s[0], s[1], s[2], EPS),
        "torch_compile": torch_compile(
            ref, [tokens, hidden], lambda f, s: f(s[0], s[1], s[2], EPS)
        ),
    }
    if _liger("fused_add_rms_norm"):
        from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction

        offset, mode = (1.0, "gemma") if gemma else (0.0, "llama")
        impls["liger"] = lambda s: LigerFusedAddRMSNormFunction.apply(
            s[0], s[1], s[2], EPS, offset, mode, False
        )
    fi = flashinfer()
    if fi is not None:  # in place like ours: x <- norm(x + residual), residual <- x + residual
        fi_op, pdl = getattr(fi, name), flashinfer_pdl()
        impls["flashinfer"] = Checked(
            lambda s: fi_op(s[0], s[1], s[2], EPS, pdl),
            expected=lambda s: ref(s[0], s[1], s[2], EPS),
            outputs=lambda s, _: (s[0], s[1]),
        )
    return Case(
        op=name,
        shape=[tokens, hidden],
        dtype=DTYPE,
        # read x + residual, write x (normalised) + residual (sum); weight once
        bytes=4 * tokens * hidden * DTYPE.itemsize + hidden * DTYPE.itemsize,
        make_inputs=make,
        impls=impls,
    )


def rmsnorm_cases(quick: bool) -> Iterator[Case]:
    norms = {"rmsnorm": (rmsnorm, reference.rmsnorm)}
    fused = {"fused_add_rmsnorm": (fused_add_rmsnorm, reference.fused_add_rmsnorm)}
    if not quick:
        norms["gemma_rmsnorm"] = (gemma_rmsnorm, reference.gemma_rmsnorm)
        fused["gemma_fused_add_rmsnorm"] = (
            gemma_fused_add_rmsnorm,
            reference.gemma_fused_add_rmsnorm,
        )
    for tokens, hidden in token_grid(quick):
        for name, (op, ref) in norms.items():
            yield _norm_case(name, op, ref, tokens, hidden)
        for name, (op, ref) in fused.items():
            yield _fused_case(name, op, ref, tokens, hidden)
    if quick:  # one shape of each Gemma variant
        yield _norm_case("gemma_rmsnorm", gemma_rmsnorm, reference.gemma_rmsnorm, 8192, 4096)
        yield _fused_case(
            "gemma_fused_add_rmsnorm",
            gemma_fused_add_rmsnorm,
            reference.gemma_fused_add_rmsnorm,
            8192,
            4096,
        )


def qk_rmsnorm_cases(quick: bool) -> Iterator[Case]:
    for hq, hk in QK_HEADS:
        for tokens in (1, 8192) if quick else TOKENS:

            def make(tokens=tokens, hq=hq, hk=hk):
                # q and k as views of a fused qkv projection output, as engines pass them.
                qkv = torch.randn(tokens, (hq + 2 * hk) * HEAD_DIM, device="cuda").to(DTYPE)
                q = qkv[:, : hq * HEAD_DIM].view(tokens, hq, HEAD_DIM)
                k = qkv[:, hq * HEAD_DIM : (hq + hk) * HEAD_DIM].view(tokens, hk, HEAD_DIM)
                return q, k, _weight(HEAD_DIM), _weight(HEAD_DIM)

            yield Case(
                op="qk_rmsnorm",
                shape=[tokens, hq, hk, HEAD_DIM],
                dtype=DTYPE,
                # read + write q and k in place; two weights
                bytes=2 * tokens * (hq + hk) * HEAD_DIM * DTYPE.itemsize
                + 2 * HEAD_DIM * DTYPE.itemsize,
                make_inputs=make,
                impls={
                    "cuda": lambda s: qk_rmsnorm(*s, EPS, backend="cuda"),
                    "torch_eager": lambda s: reference.qk_rmsnorm(*s, EPS),
                    "torch_compile": torch_compile(
                        reference.qk_rmsnorm,
                        [tokens, hq, hk, HEAD_DIM],
                        lambda f, s: f(*s, EPS),
                    ),
                },
                note="q [T, Hq, 128] and k [T, Hk, 128] head-strided in a qkv buffer",
            )


def layernorm_cases(quick: bool) -> Iterator[Case]:
    shapes = [(8192, 4096), (32768, 8192)] if quick else token_grid(quick)
    fi = flashinfer()
    for tokens, hidden in shapes:

        def make(tokens=tokens, hidden=hidden, fp32_affine=fi is not None):
            x = torch.randn(tokens, hidden, device="cuda").to(DTYPE)
            w, b = _weight(hidden), (0.1 * torch.randn(hidden, device="cuda")).to(DTYPE)
            if fp32_affine:  # FlashInfer's CUDA layernorm takes fp32 gamma and beta
                return x, w, b, torch.empty_like(x), w.float(), b.float()
            return x, w, b, torch.empty_like(x)

        impls = {
            "cuda": lambda s: layernorm(s[0], s[1], s[2], 1e-5, out=s[3], backend="cuda"),
            "torch_eager": lambda s: reference.layernorm(s[0], s[1], s[2], 1e-5),
            "torch_compile": torch_compile(
                reference.layernorm, [tokens, hidden], lambda f, s: f(s[0], s[1], s[2], 1e-5)
            ),
        }
        if _liger("layer_norm"):
            from liger_kernel.ops.layer_norm import LigerLayerNormFunction

            impls["liger"] = lambda s: LigerLayerNormFunction.apply(s[0], s[1], s[2], 1e-5)
        if fi is not None:
            impls["flashinfer"] = Checked(
                lambda s: fi.layernorm(s[3], s[0], s[4], s[5], 1e-5),
                expected=lambda s: reference.layernorm(s[0], s[1], s[2], 1e-5),
                outputs=lambda s, _: s[3],
            )
        yield Case(
            op="layernorm",
            shape=[tokens, hidden],
            dtype=DTYPE,
            bytes=2 * tokens * hidden * DTYPE.itemsize
            + 2 * hidden * DTYPE.itemsize,  # x, out; w, b
            make_inputs=make,
            impls=impls,
        )


def cases(quick: bool) -> Iterator[Case]:
    yield from rmsnorm_cases(quick)
    yield from qk_rmsnorm_cases(quick)
    yield from layernorm_cases(quick)


def rmsnorm_host_cost() -> dict:
    """Host cost per call (tiny input) of the public ops and of the raw compiled functions; the
    difference is the Python of validation and dispatch (budget: 1 us)."""
    from kernels_jit import load_module
    from kernels_layernorm.ops.rmsnorm import RMSNORM_CUDA

    raw = load_module(RMSNORM_CUDA)
    x = torch.randn(16, 4096, device="cuda").to(DTYPE)
    r = torch.randn_like(x)
    w = _weight(4096)
    out = torch.empty_like(x)
    result = host_cost_us(
        {
            "rmsnorm_public_us": lambda: rmsnorm(x, w, out=out),
            "rmsnorm_raw_us": lambda: raw.rmsnorm(out, x, w, EPS, -1),
            "fused_add_rmsnorm_public_us": lambda: fused_add_rmsnorm(x, r, w),
            "fused_add_rmsnorm_raw_us": lambda: raw.fused_add_rmsnorm(x, r, w, EPS, -1),
            "torch_rms_norm_us": lambda: torch.nn.functional.rms_norm(x, (4096,), w, EPS),
        }
    )
    result["rmsnorm_overhead_us"] = round(result["rmsnorm_public_us"] - result["rmsnorm_raw_us"], 3)
    return result


def extra() -> dict:
    return {"host_cost": rmsnorm_host_cost()}
