"""Sweep decode_attention's stage-1 launch choices on the GPU, beside the vLLM Triton peer.

    python -m shared.bench.sweep_decode_attention [--mla] [--gqa] [--budget-s 300]

Times (CUDA graphs, inputs rotated past the L2, as the benchmark suite does) the Triton backend
at the suite's shapes under each candidate of: the stage-1 config (query heads per program,
BLOCK_N, num_warps, num_stages: ``stage1_config``) and the split policy (``WAVES``,
``MIN_TOKENS_PER_SPLIT``), by overriding the module's choices for one call. The point is to
choose those constants from measurements (their docstrings say they were chosen from compiles
only); the output is a table per shape, best first, and nothing is written to the package.
A candidate that fails to compile or to run is reported and skipped.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from rich.console import Console
from rich.table import Table

from kernels_attention.triton_kernels import decode_attention as kernel
from shared.bench.harness import sets_needed, time_graph
from shared.bench.suites import attention as suite

MLA_SHAPES = ((1, 4096), (64, 4096))
GQA_SHAPES = ((1, 512), (1, 1024), (1, 4096), (8, 1024), (64, 4096))
COPY_GBPS = 4200.0  # nominal (the suite's run measures it): this sweep only ranks choices


@contextmanager
def choices(config: kernel.StageConfig, waves: int, min_tokens: int) -> Iterator:
    """The module's launch choices replaced for the duration of the block."""
    saved = (kernel.stage1_config, kernel.WAVES, kernel.MIN_TOKENS_PER_SPLIT)
    kernel.WAVES, kernel.MIN_TOKENS_PER_SPLIT = waves, min_tokens
    kernel.stage1_config = lambda d, group: config
    try:
        yield
    finally:
        kernel.stage1_config, kernel.WAVES, kernel.MIN_TOKENS_PER_SPLIT = saved


def candidates(mla: bool) -> list[tuple[kernel.StageConfig, int, int]]:
    """(stage-1 config, WAVES, MIN_TOKENS_PER_SPLIT) to try."""
    config = kernel.StageConfig
    if mla:
        shapes_64 = ((64, 8, 2), (64, 8, 3), (128, 8, 2), (64, 16, 2), (128, 16, 2), (32, 16, 2))
        heads_64 = [config(64, n, w, s) for n, w, s in shapes_64]
        heads_128 = [config(128, n, 16, 2) for n in (32, 64)]
        return [(c, waves, 64) for c in heads_64 + heads_128 for waves in (2, 4)]
    shapes = ((64, 4, 2), (64, 4, 3), (128, 4, 2), (128, 8, 2), (64, 8, 2), (32, 4, 3))
    tiles = [config(16, n, w, s) for n, w, s in shapes]
    return [(c, waves, 64) for c in tiles for waves in (2, 4)]


def case_for(batch: int, length: int, mla: bool) -> suite.Case:
    want = [batch, length, 128, 1, 576] if mla else [batch, length, suite.HQ, suite.HK, 128]
    for case in suite.decode_attention_cases(quick=False):
        if case.shape == want:
            return case
    raise ValueError(f"no suite case of shape {want}")


def sweep(shapes, mla: bool, deadline: float, console: Console) -> None:
    for batch, length in shapes:
        case = case_for(batch, length, mla)
        sets = [case.make_inputs() for _ in range(sets_needed(case.bytes))]
        rows = []
        peer = case.impls.get("vllm_triton")
        if peer is not None:
            try:
                rows.append((time_graph(peer, sets), "vllm_triton (8 splits)"))
            except Exception as exc:  # a peer that cannot run is reported
                console.print(f"  vllm_triton: {type(exc).__name__}: {exc}")
        d, group = (576, 128) if mla else (128, suite.HQ // suite.HK)
        default = (kernel.stage1_config(d, group), kernel.WAVES, kernel.MIN_TOKENS_PER_SPLIT)
        ours = case.impls["triton"]
        for cand in [default, *candidates(mla)]:
            if time.monotonic() > deadline:
                console.print("  budget spent: the remaining candidates are not timed")
                break
            try:
                with choices(*cand):
                    us = time_graph(ours, sets)
            except Exception as exc:  # compile or launch failures: reported
                console.print(f"  {cand}: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            c = cand[0]
            label = (f"H {c.block_h} N {c.block_n} warps {c.num_warps} stages {c.num_stages}"
                     f" waves {cand[1]} min_tokens {cand[2]}")  # fmt: skip
            rows.append((us, label + (" (current)" if cand is default else "")))
        table = Table(title=f"decode_attention {case.shape} ({case.note})")
        table.add_column("us", justify="right")
        table.add_column("% of copy", justify="right")
        table.add_column("choice")
        for us, label in sorted(rows)[:12]:
            table.add_row(f"{us:.2f}", f"{case.bytes / us / 1e3 / COPY_GBPS * 100:.1f}", label)
        console.print(table)
        del sets
        torch.cuda.empty_cache()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mla", action="store_true", help="MLA shapes (128 heads, D 576)")
    parser.add_argument("--gqa", action="store_true", help="Llama-3-8B GQA shapes")
    parser.add_argument("--budget-s", type=float, default=300.0, help="stop timing after this")
    args = parser.parse_args(argv)
    console = Console(width=140)
    deadline = time.monotonic() + args.budget_s
    for mla, wanted in ((True, args.mla), (False, args.gqa)):
        if wanted or not (args.mla or args.gqa):
            sweep(MLA_SHAPES if mla else GQA_SHAPES, mla, deadline, console)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
