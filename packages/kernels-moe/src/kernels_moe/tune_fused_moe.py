"""Tune moe.fused_moe's block configs on this GPU and write them into the config table.

    python -m kernels_moe.tune_fused_moe --experts 8 --topk 2 --hidden 4096 --intermediate 14336
        [--tokens 1 16 ...] [--dtype bfloat16] [--out path]

For each token count T (default: the buckets 1, 2, 4, ..., 16384) and each BLOCK_M that suits
its slots per expert, the slots are aligned once, then the gate/up GEMM and the down GEMM are
timed separately (``triton.testing.do_bench``, median) over a pruned grid of BLOCK_N, BLOCK_K,
GROUP_M, num_warps and num_stages (tiles whose pipeline needs more shared memory, or whose
accumulators need more registers, than a Hopper SM has are left out). The BLOCK_M with the
smallest sum of the two best times wins; its entry is merged into the table (default: the
package's ``configs/fused_moe_<device>.json``) under ``E=..,N=I,H=..,dtype=..`` and ``"<T>"``.
Routing is uniform random (k distinct experts per token). Configs are compiled once and shared
across T, so one model shape over the 15 buckets takes a few minutes on an H200.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)
SMEM_BYTES = 200 * 1024  # of the H100/H200's 227 KiB per block, some left for the epilogue
MAX_ACC_REGS = 128  # fp32 accumulator registers per thread


def block_ms(tokens: int, topk: int, experts: int) -> tuple[int, ...]:
    """The BLOCK_M candidates for T tokens: around the mean slots per expert."""
    per_expert = tokens * topk / experts
    if per_expert <= 8:
        return (16,)
    if per_expert <= 24:
        return (16, 32)
    if per_expert <= 64:
        return (16, 32, 64)
    if per_expert <= 256:
        return (32, 64, 128)
    return (64, 128)


def candidates(gemm: str, block_m: int) -> list[dict]:
    """A pruned grid for one GEMM at one BLOCK_M (~8-18 configs): decode tiles (BLOCK_M 16)
    vary the N split, the K depth and the pipeline; the larger ones the N tile and the warps."""
    tiles = 2 if gemm == "gate_up" else 1  # the gate/up program holds two accumulators
    if block_m == 16:
        space = [(n, k, 1, 4, s) for n in (32, 64, 128) for k in (128, 256) for s in (3, 4, 5)]
    elif block_m == 32:
        space = [(n, k, 8, 4, s) for n in (32, 64, 128) for k in (64, 128) for s in (3, 4)]
    else:
        space = [(n, 64, 8, w, s) for n in (64, 128, 256) for w in (4, 8) for s in (3, 4)]
    grid = []
    for block_n, block_k, group_m, warps, stages in space:
        smem = stages * (block_m * block_k + tiles * block_k * block_n) * 2
        regs = tiles * block_m * block_n / (32 * warps)
        if smem > SMEM_BYTES or regs > MAX_ACC_REGS:
            continue
        grid.append(
            {
                "BLOCK_N": block_n,
                "BLOCK_K": block_k,
                "GROUP_M": group_m,
                "num_warps": warps,
                "num_stages": stages,
            }
        )
    return grid


def routing(tokens: int, topk: int, experts: int, device: str) -> tuple[torch.Tensor, ...]:
    ids = torch.argsort(torch.rand(tokens, experts, device=device), dim=1)[:, :topk]
    return torch.rand(tokens, topk, device=device), ids.to(torch.int32).contiguous()


def tune_tokens(args, tokens: int, weights: tuple, progress, task) -> dict:
    import triton

    from kernels_moe.ops.moe_align_block_size import moe_align_block_size
    from kernels_moe.triton_kernels import fused_moe as kernels

    hidden_w, w1, w2 = weights
    hidden = hidden_w[:tokens]
    topk_weights, ids = routing(tokens, args.topk, args.experts, "cuda")
    flat_w = topk_weights.reshape(-1)
    n = tokens * args.topk
    act = torch.randn(n, args.intermediate, device="cuda").to(hidden.dtype)
    y = torch.empty(n, args.hidden, dtype=hidden.dtype, device="cuda")
    best: tuple[float, dict] | None = None
    for block_m in block_ms(tokens, args.topk, args.experts):
        aligned = (*moe_align_block_size(ids, args.experts, block_m), block_m)
        chosen = {}
        total = 0.0
        for gemm in ("gate_up", "down"):
            fastest = (float("inf"), None)
            for config in candidates(gemm, block_m):
                if gemm == "gate_up":

                    def run(config=config, aligned=aligned):
                        sorted_ids, expert_ids, post, bm = aligned
                        kernels.invoke_gate_up(
                            act, hidden, w1, flat_w, sorted_ids, expert_ids, post,
                            args.topk, bm, config, "silu", False,
                        )  # fmt: skip
                else:

                    def run(config=config, aligned=aligned):
                        sorted_ids, expert_ids, post, bm = aligned
                        kernels.invoke_down(
                            y, act, w2, flat_w, sorted_ids, expert_ids, post, bm, config, True
                        )

                progress.update(task, current=f"T={tokens} BLOCK_M={block_m} {gemm} {config}")
                try:
                    ms = triton.testing.do_bench(
                        run, warmup=args.warmup_ms, rep=args.rep_ms, return_mode="median"
                    )
                except Exception as exc:  # out of resources and the like: not a candidate
                    if args.verbose:
                        print(f"  skip {config}: {type(exc).__name__}: {exc}")
                    ms = float("inf")
                progress.advance(task)
                if ms < fastest[0]:
                    fastest = (ms, config)
            chosen[gemm] = fastest[1]
            total += fastest[0]
        if chosen["gate_up"] is None or chosen["down"] is None:
            continue
        if best is None or total < best[0]:
            best = (total, {"BLOCK_M": block_m, **chosen})
    if best is None:
        raise RuntimeError(f"fused_moe tuner: no config ran for T={tokens}")
    flops = 2 * n * args.hidden * 3 * args.intermediate
    progress.console.print(
        f"T={tokens}: {best[0] * 1e3:.1f} us ({flops / best[0] / 1e9:.1f} TFLOP/s) {best[1]}"
    )
    return best[1]


def main(argv: list[str] | None = None) -> int:
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--experts", type=int, required=True, help="E")
    parser.add_argument("--topk", type=int, required=True, help="k")
    parser.add_argument("--hidden", type=int, required=True, help="H")
    parser.add_argument("--intermediate", type=int, required=True, help="I (w1 is [E, 2I, H])")
    parser.add_argument("--tokens", type=int, nargs="+", default=list(BUCKETS), help="T buckets")
    parser.add_argument("--dtype", choices=("bfloat16", "float16"), default="bfloat16")
    parser.add_argument("--out", type=Path, default=None, help="table to merge into")
    parser.add_argument("--warmup-ms", type=float, default=5.0)
    parser.add_argument("--rep-ms", type=float, default=15.0)
    parser.add_argument("--verbose", action="store_true")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("tune_fused_moe needs a CUDA GPU", file=sys.stderr)
        return 2
    from kernels_moe.triton_kernels import fused_moe as kernels

    dtype = getattr(torch, args.dtype)
    out = args.out or kernels.config_path(torch.cuda.get_device_name())
    torch.manual_seed(0)
    e, h, i = args.experts, args.hidden, args.intermediate
    hidden = torch.randn(max(args.tokens), h, device="cuda").to(dtype)
    w1 = (torch.randn(e, 2 * i, h, device="cuda", dtype=dtype)) * h**-0.5
    w2 = (torch.randn(e, h, i, device="cuda", dtype=dtype)) * i**-0.5
    total = 0
    for tokens in args.tokens:
        for block_m in block_ms(tokens, args.topk, e):
            total += len(candidates("gate_up", block_m)) + len(candidates("down", block_m))
    columns = (
        TextColumn("[bold]fused_moe"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[current]}"),
    )
    start = time.time()
    key = kernels.shape_key(e, i, h, dtype)
    with Progress(*columns) as progress:
        task = progress.add_task("tune", total=total, current="")
        for tokens in args.tokens:  # in the order given: put the ones that matter first
            best = tune_tokens(args, tokens, (hidden, w1, w2), progress, task)
            _merge(out, key, str(tokens), best)  # after each bucket: an interrupted run keeps them
    kernels.load_table.cache_clear()
    print(f"{key}: {len(args.tokens)} buckets merged into {out} in {time.time() - start:.0f} s")
    return 0


def _merge(out: Path, key: str, tokens: str, config: dict) -> None:
    """Write ``config`` into the table at ``out`` under ``key`` and ``tokens``."""
    table = json.loads(out.read_text()) if out.exists() else {}
    merged = {**table.get(key, {}), tokens: config}
    table[key] = dict(sorted(merged.items(), key=lambda item: int(item[0])))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table, indent=1) + "\n")


if __name__ == "__main__":
    sys.exit(main())
