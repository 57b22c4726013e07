"""Fill inductor's on-disk caches for a group's torch_compile peers, in parallel processes.

    python -m shared.bench.precompile --group kv_canary [--op kv_canary_write] [--jobs 8]
        [--static-compile targets|large|all|none] [--quick]

Some references compile for minutes (kv_canary's 256-step hash chain: ~150 s or more per graph
on the H200's host, single-threaded), which no 10-minute device command can pay shape after
shape. This runs each torch_compile peer's first call ahead of the benchmark, one process per
static shape and one per op for the shapes sharing the automatic-dynamic graph (in the sweep's
order, so the same graphs and guards come out), on the host's cores while the GPU does other
work. The benchmark run that follows traces again but finds every graph in inductor's FX-graph
and Triton caches; its ``compile_s`` then measures that warm path, so it records the group in
``precompiled`` (``$KERNELS_BENCH_PRECOMPILED``, set by ``gpu_session.sh``).

Each job is a top-level ``python -m shared.bench.precompile --job`` process, not a
multiprocessing child: graphs compiled in a ProcessPoolExecutor (spawn) worker get other FX-graph
cache keys than the same graphs compiled in a top-level process (2026-12-04, torch 2.11 on the
H200 and 2.13 here: 0 hits of 9 for kv_canary_write in the benchmark; a second top-level process
hits all 9), so the benchmark found none of them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

import torch

from shared.bench import peers, suites

PRECOMPILED_ENV = "KERNELS_BENCH_PRECOMPILED"


def _cases(group: str, quick: bool, ops: list[str] | None, mode: str) -> list:
    """The group's cases as the benchmark makes them under ``--static-compile mode`` (a
    torch_compile peer decides static or auto when its case is made)."""
    peers.set_compile_mode(mode)
    return suites.cases(group, quick, ops)


def _jobs(cases: list) -> list[list[int]]:
    """Case indices per process: each static compile alone, each op's auto shapes in order."""
    static, auto = [], {}
    for i, case in enumerate(cases):
        peer = case.impls.get("torch_compile")
        if peer is None:
            continue
        if getattr(peer, "static", False):
            static.append([i])
        else:
            auto.setdefault(case.op, []).append(i)
    return static + list(auto.values())


def _first_calls(group: str, quick: bool, ops: list[str] | None, mode: str, job: list[int]):
    cases = _cases(group, quick, ops, mode)
    done = []
    for i in job:
        case = cases[i]
        start = time.perf_counter()
        case.impls["torch_compile"](case.make_inputs())
        torch.cuda.synchronize()
        done.append(f"{case.op} {case.shape}: {time.perf_counter() - start:.1f} s")
    return done


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group", action="append", required=True)
    parser.add_argument("--op", action="append", help="only ops whose name starts with this")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2))
    parser.add_argument(
        "--static-compile",
        choices=sorted(peers.COMPILE_MODES),
        default=os.environ.get(peers.COMPILE_ENV, peers.DEFAULT_COMPILE_MODE),
    )
    parser.add_argument("--job", help=argparse.SUPPRESS)  # one job's case indices, "3,4"
    args = parser.parse_args(argv)
    if args.job is not None:  # a job process: its cases' first calls, one line each
        job = [int(i) for i in args.job.split(",")]
        for line in _first_calls(args.group[0], args.quick, args.op, args.static_compile, job):
            print(f"precompiled {args.group[0]}.{line}", flush=True)
        return 0
    work = [
        (group, job)
        for group in args.group
        for job in _jobs(_cases(group, args.quick, args.op, args.static_compile))
    ]
    print(f"precompile: {len(work)} process(es) for {', '.join(args.group)}", flush=True)
    common = ["--static-compile", args.static_compile] + (["--quick"] if args.quick else [])
    for op in args.op or []:
        common += ["--op", op]

    def run_job(group: str, job: list[int]) -> subprocess.CompletedProcess:
        cmd = [sys.executable, "-m", "shared.bench.precompile", "--group", group, *common]
        return subprocess.run(
            [*cmd, "--job", ",".join(map(str, job))],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, check=False,
        )  # fmt: skip

    failed = 0
    # Threads only wait on the job processes (subprocess.run drains their output as it comes).
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(run_job, group, job): group for group, job in work}
        for future in as_completed(futures):
            done = future.result()
            for line in done.stdout.splitlines():
                if line.startswith("precompiled "):
                    print(line, flush=True)
            if done.returncode != 0:  # the benchmark then compiles those graphs itself
                failed += 1
                print(
                    f"precompile {futures[future]} failed (exit {done.returncode}): "
                    f"{done.stdout[-2000:]}"
                )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
