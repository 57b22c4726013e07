"""Benchmarks of quantization.hadamard_transform: our CUDA kernel against torch eager (the
reference), torch.compile of the reference (a static graph per target shape, see peers.py) and
vLLM 0.33's HadaCore (``torch.ops._C.hadacore_transform(Tensor! x, bool inplace) -> Tensor``, the
orthonormal transform, run in place on its own copy of x), on the same inputs, all with the
orthonormal scale N^-1/2 so every result is comparable (HadaCore has no scale argument).

Expected ceiling, stated before measuring: memory-bound, one read and one write of x: 32768 x 4096
bf16 (537 MB) takes ~126 us at the H200's ~4.27 TB/s copy rate (target <= 140 us; vLLM 148 us);
8192 x 16384 (537 MB) the same (target <= 168 us; vLLM 239 us). T = 1 is latency-bound (<= 2 us).

``hadamard_cases(quick)`` is chained into the group's ``cases`` by shared/bench/suites/
quantization.py (the leading underscore keeps this file out of the suites run.py discovers).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

import kernels_quantization as quantization
from kernels_quantization import reference
from shared.bench.harness import Case
from shared.bench.peers import Checked, torch_compile, vllm

DTYPE = torch.bfloat16
TOKENS = (1, 16, 8192, 32768)
WIDTHS = (128, 4096, 8192, 16384)
QUICK = ((1, 4096), (8192, 128), (32768, 4096), (8192, 16384))
MAX_BYTES = 2 * 10**9  # read + write; larger combinations are skipped


def _shapes(quick: bool) -> list[tuple[int, int]]:
    if quick:
        return list(QUICK)
    return [
        (tokens, d)
        for d in WIDTHS
        for tokens in TOKENS
        if 2 * tokens * d * DTYPE.itemsize <= MAX_BYTES
    ]


def hadamard_cases(quick: bool) -> Iterator[Case]:
    vl = vllm()
    hadacore = getattr(getattr(vl, "_C", None), "hadacore_transform", None) if vl else None
    for tokens, d in _shapes(quick):
        scale = d**-0.5  # the orthonormal transform (d is a power of two here)

        def make(tokens=tokens, d=d, peer=hadacore is not None):
            x = torch.randn(tokens, d, device="cuda").to(DTYPE)
            inputs = {"x": x}
            if peer:  # HadaCore works in place: its own copy, made outside the timing
                inputs["y"] = x.clone()
            return inputs

        impls = {
            "cuda": lambda s, scale=scale: quantization.hadamard_transform(
                s["x"], scale, backend="cuda"
            ),
            "torch_eager": lambda s, scale=scale: reference.hadamard_transform(s["x"], scale),
            "torch_compile": torch_compile(
                reference.hadamard_transform,
                [tokens, d],
                lambda f, s, scale=scale: f(s["x"], scale),
            ),
        }
        if hadacore is not None:
            # Orthonormal, so repeated in-place calls stay bounded (H/sqrt(N) is an involution).
            impls["vllm"] = Checked(
                lambda s, op=hadacore: op(s["y"], True),
                expected=lambda s, scale=scale: reference.hadamard_transform(s["y"], scale),
                outputs=lambda s, _: s["y"],
            )
        yield Case(
            op="hadamard_transform",
            shape=[tokens, d],
            dtype=DTYPE,
            bytes=2 * tokens * d * DTYPE.itemsize,  # read x [T, D] + write y [T, D]
            make_inputs=make,
            impls=impls,
            note="scale = D^-1/2 (orthonormal); vllm in place on a copy",
        )
