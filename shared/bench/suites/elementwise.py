"""Benchmarks of the elementwise group, plus the JIT costs of its reference kernel."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator

import torch

from kernels_elementwise import add_constant, reference
from shared.bench.harness import Case
from shared.bench.peers import compiled


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
                    "torch_compile": lambda s: compiled(reference.add_constant)(s[0], 1.5),
                },
            )


def cases(quick: bool) -> Iterator[Case]:
    yield from add_constant_cases(quick)


_COLD = """
import time, torch, tvm_ffi
from kernels_elementwise.add_constant import ADD_CONSTANT_CUDA
from kernels_jit import load_module
t = time.perf_counter(); load_module(ADD_CONSTANT_CUDA); print(time.perf_counter() - t)
"""


def _timed_load(cache: str, jobs: int) -> float:
    env = dict(os.environ, KERNELS_CACHE_DIR=cache, KERNELS_MAX_JOBS=str(jobs))
    out = subprocess.run(
        [sys.executable, "-c", _COLD], env=env, capture_output=True, text=True, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def host_cost_us(calls: int = 20000) -> dict:
    """Microseconds per call of the public op and of the raw tvm-ffi function (tiny input, so
    the host enqueue is the cost)."""
    from kernels_elementwise.add_constant import ADD_CONSTANT_CUDA
    from kernels_jit import load_module

    raw = load_module(ADD_CONSTANT_CUDA).add_constant
    x = torch.randn(1024, device="cuda")
    out = torch.empty_like(x)

    def per_call(fn) -> float:
        for _ in range(1000):
            fn()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best = min(best, (time.perf_counter() - start) / calls * 1e6)
            torch.cuda.synchronize()
        return best

    public = per_call(lambda: add_constant(x, 1.5, out=out))
    raw_us = per_call(lambda: raw(out, x, 1.5))
    eager = per_call(lambda: torch.add(x, 1.5, out=out))
    return {
        "public_op_us": round(public, 3),
        "raw_tvm_ffi_us": round(raw_us, 3),
        "overhead_us": round(public - raw_us, 3),
        "torch_eager_add_us": round(eager, 3),
    }


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
        "host_cost": host_cost_us(),
    }
    print(json.dumps(result))
    return result
