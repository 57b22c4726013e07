"""Benchmarks of the elementwise group, plus the JIT costs of its reference kernel.

softcap, sigmoid_mul, gate_sigmoid_mul_add and fused_dual_residual_rmsnorm run against torch
eager (the reference) and torch.compile of the reference (a static graph per target shape, see
peers.py; FlashInfer has none of these ops), at tokens 1..32768 x hidden
4096/7168/8192 in bf16. Expected ceiling: minimum bytes / ~4.27 TB/s (e.g. 32768 x 8192 softcap,
1.07 GB: ~251 us); decode shapes are launch-bound (~1-2 us under CUDA graphs).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator

import torch

from kernels_elementwise import (
    add_constant,
    fused_dual_residual_rmsnorm,
    gate_sigmoid_mul_add,
    reference,
    sigmoid_mul,
    softcap,
)
from shared.bench.harness import Case, host_cost_us
from shared.bench.peers import torch_compile
from shared.bench.shapes import token_grid

DTYPE = torch.bfloat16
HEAD_DIM = 128  # sigmoid_mul: x and gate [T, H, 128], recorded as [T, H * 128]
GATE_K = 7168  # gate_sigmoid_mul_add: h [T, 7168] (the DeepSeek/Qwen-MoE hidden size)
SOFTCAP = 30.0


def _randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device="cuda").to(DTYPE)


def add_constant_cases(quick: bool) -> Iterator[Case]:
    sizes = [2**28] if quick else [2**20, 2**24, 2**28]  # 2**28 fp32 = 1 GiB in and 1 GiB out
    for dtype in (torch.float32, torch.bfloat16):
        for n in sizes:

            def make(n=n, dtype=dtype):
                x = torch.randn(n, device="cuda").to(dtype)
                return x, torch.empty_like(x)

            yield Case(
                op="add_constant",
                shape=[n],
                dtype=dtype,
                bytes=2 * n * dtype.itemsize,  # read x + write out
                make_inputs=make,
                impls={
                    "cuda": lambda s: add_constant(s[0], 1.5, out=s[1], backend="cuda"),
                    "torch_eager": lambda s: torch.add(s[0], 1.5, out=s[1]),
                    "torch_compile": torch_compile(
                        reference.add_constant, [n], lambda f, s: f(s[0], 1.5)
                    ),
                },
            )


def softcap_cases(quick: bool) -> Iterator[Case]:
    for tokens, hidden in token_grid(quick):

        def make(tokens=tokens, hidden=hidden):
            x = _randn(tokens, hidden) * 40
            return {"x": x, "out": torch.empty_like(x)}

        yield Case(
            op="softcap",
            shape=[tokens, hidden],
            dtype=DTYPE,
            bytes=2 * tokens * hidden * DTYPE.itemsize,  # read x + write out, both [T, H]
            make_inputs=make,
            impls={
                "cuda": lambda s: softcap(s["x"], SOFTCAP, out=s["out"], backend="cuda"),
                "torch_eager": lambda s: reference.softcap(s["x"], SOFTCAP),
                "torch_compile": torch_compile(
                    reference.softcap, [tokens, hidden], lambda f, s: f(s["x"], SOFTCAP)
                ),
            },
        )


def sigmoid_mul_cases(quick: bool) -> Iterator[Case]:
    for tokens, hidden in token_grid(quick):
        heads = hidden // HEAD_DIM

        def make(tokens=tokens, heads=heads):
            x = _randn(tokens, heads, HEAD_DIM)
            gate = _randn(tokens, heads, HEAD_DIM)
            return {"x": x, "gate": gate, "out": torch.empty_like(x)}

        yield Case(
            op="sigmoid_mul",
            shape=[tokens, hidden],
            dtype=DTYPE,
            bytes=3 * tokens * hidden * DTYPE.itemsize,  # read x, gate + write out, all [T, H*D]
            make_inputs=make,
            impls={
                "cuda": lambda s: sigmoid_mul(s["x"], s["gate"], out=s["out"], backend="cuda"),
                "torch_eager": lambda s: reference.sigmoid_mul(s["x"], s["gate"]),
                "torch_compile": torch_compile(
                    reference.sigmoid_mul, [tokens, hidden], lambda f, s: f(s["x"], s["gate"])
                ),
            },
            note=f"x, gate [T, H, {HEAD_DIM}], full gate",
        )


def gate_sigmoid_mul_add_cases(quick: bool) -> Iterator[Case]:
    for tokens, hidden in token_grid(quick):

        def make(tokens=tokens, hidden=hidden):
            h = _randn(tokens, GATE_K)
            w = _randn(GATE_K) / GATE_K**0.5
            shared, routed = _randn(tokens, hidden), _randn(tokens, hidden)
            return {
                "h": h,
                "w": w,
                "shared": shared,
                "routed": routed,
                "out": torch.empty_like(shared),
            }

        def ours(s):
            return gate_sigmoid_mul_add(
                s["h"], s["w"], s["shared"], s["routed"], out=s["out"], backend="cuda"
            )

        yield Case(
            op="gate_sigmoid_mul_add",
            shape=[tokens, hidden],
            dtype=DTYPE,
            # read h [T, K], w [K], shared and routed [T, H] + write out [T, H]
            bytes=(tokens * GATE_K + GATE_K + 3 * tokens * hidden) * DTYPE.itemsize,
            make_inputs=make,
            impls={
                "cuda": ours,
                "torch_eager": lambda s: reference.gate_sigmoid_mul_add(
                    s["h"], s["w"], s["shared"], s["routed"]
                ),
                "torch_compile": torch_compile(
                    reference.gate_sigmoid_mul_add,
                    [tokens, hidden],
                    lambda f, s: f(s["h"], s["w"], s["shared"], s["routed"]),
                ),
            },
            note=f"K={GATE_K}, with routed",
        )


def fused_dual_residual_rmsnorm_cases(quick: bool) -> Iterator[Case]:
    for tokens, hidden in token_grid(quick):

        def make(tokens=tokens, hidden=hidden):
            x, residual = _randn(tokens, hidden), _randn(tokens, hidden)
            return {
                "x": x,
                "residual": residual,
                "w1": _randn(hidden),
                "w2": _randn(hidden),
                "out": torch.empty_like(x),
                "mid": torch.empty_like(x),
            }

        def ours(s):
            return fused_dual_residual_rmsnorm(
                s["x"],
                s["residual"],
                s["w1"],
                s["w2"],
                1e-6,
                out=s["out"],
                mid=s["mid"],
                backend="cuda",
            )

        yield Case(
            op="fused_dual_residual_rmsnorm",
            shape=[tokens, hidden],
            dtype=DTYPE,
            # read x, residual [T, H] and w1, w2 [H] + write out, mid [T, H]
            bytes=(4 * tokens * hidden + 2 * hidden) * DTYPE.itemsize,
            make_inputs=make,
            impls={
                "cuda": ours,
                "torch_eager": lambda s: reference.fused_dual_residual_rmsnorm(
                    s["x"], s["residual"], s["w1"], s["w2"], 1e-6
                ),
                "torch_compile": torch_compile(
                    reference.fused_dual_residual_rmsnorm,
                    [tokens, hidden],
                    lambda f, s: f(s["x"], s["residual"], s["w1"], s["w2"], 1e-6),
                ),
            },
        )


def cases(quick: bool) -> Iterator[Case]:
    yield from add_constant_cases(quick)
    yield from softcap_cases(quick)
    yield from sigmoid_mul_cases(quick)
    yield from gate_sigmoid_mul_add_cases(quick)
    yield from fused_dual_residual_rmsnorm_cases(quick)


_COLD = """
import time, torch, tvm_ffi
from kernels_elementwise.ops.add_constant import ADD_CONSTANT_CUDA
from kernels_jit import load_module
t = time.perf_counter(); load_module(ADD_CONSTANT_CUDA); print(time.perf_counter() - t)
"""


def _timed_load(cache: str, jobs: int) -> float:
    env = dict(os.environ, KERNELS_CACHE_DIR=cache, KERNELS_MAX_JOBS=str(jobs))
    out = subprocess.run(
        [sys.executable, "-c", _COLD], env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def add_constant_host_cost() -> dict:
    """Host cost per call of the public op against the raw tvm-ffi function (budget: 1 us)."""
    from kernels_elementwise.ops.add_constant import ADD_CONSTANT_CUDA
    from kernels_jit import load_module

    raw = load_module(ADD_CONSTANT_CUDA).add_constant
    x = torch.randn(1024, device="cuda")
    out = torch.empty_like(x)
    us = host_cost_us(
        {
            "public_op_us": lambda: add_constant(x, 1.5, out=out),
            "raw_tvm_ffi_us": lambda: raw(out, x, 1.5),
            "torch_eager_add_us": lambda: torch.add(x, 1.5, out=out),
        }
    )
    us["overhead_us"] = round(us["public_op_us"] - us["raw_tvm_ffi_us"], 3)
    return us


def extra() -> dict:
    cache = tempfile.mkdtemp(prefix="kernels-cold-")
    cold = _timed_load(cache, jobs=1)
    warm = min(_timed_load(cache, jobs=1) for _ in range(3))
    result = {
        "jit": {
            "module": "add_constant_cuda",
            "cold_build_s": round(cold, 2),
            "warm_load_ms": round(warm * 1e3, 2),
            "build_jobs": 1,
        },
        "host_cost": add_constant_host_cost(),
    }
    print(json.dumps(result))
    return result
