"""Run benchmark suites and write ``docs/benchmarks/<group>.json``, a markdown table and plots.

    python -m shared.bench.run --group layernorm [--quick] [--out docs/benchmarks]
        [--static-compile targets|large|all|none]

``--static-compile`` (default ``$KERNELS_BENCH_STATIC_COMPILE`` or ``targets``) picks the shapes
where the torch_compile peer gets a static graph of its own (``peers.COMPILE_MODES``); a static
compile costs ~2 s of host time per shape on the H200's host, so ``all`` over the full grid of the
three groups (~270 shapes) does not fit one 10-minute device command. FlashInfer runs where its
libraries ``flashinfer_<library>.so`` are in ``.peers/flashinfer/`` (or in
``$KERNELS_PEER_FLASHINFER``).

A suite is ``shared/bench/suites/<group>.py`` with ``cases(quick: bool) -> Iterable[Case]`` and
optionally ``extra() -> dict`` (more top-level JSON keys, e.g. JIT timings).
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import os
import subprocess
import sys
import traceback
from pathlib import Path

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from shared.bench import harness, peers, report, suites
from shared.bench.precompile import PRECOMPILED_ENV

ROOT = Path(__file__).resolve().parents[2]


def commit() -> str:
    """The commit benchmarked: ``KERNELS_COMMIT`` (set where the tree has no .git), else git's."""
    if os.environ.get("KERNELS_COMMIT"):
        return os.environ["KERNELS_COMMIT"]
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        return out.stdout.strip() + ("-dirty" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def available_suites() -> list[str]:
    return sorted(
        p.stem
        for p in (Path(__file__).parent / "suites").glob("*.py")
        if not p.stem.startswith("_")
    )


def run_group(
    group: str,
    quick: bool,
    out_dir: Path,
    copy: float,
    commit_id: str,
    ops: list[str] | None = None,
) -> dict:
    suite = importlib.import_module(f"shared.bench.suites.{group}")  # its cases and extra()
    cases = suites.cases(group, quick, ops)
    records: list[harness.Record] = []
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[current]}"),
    )
    with Progress(*columns, transient=False) as progress:
        task = progress.add_task(group, total=len(cases), current="")
        for case in cases:
            label = f"{case.op} {case.shape}"
            records += harness.run_case(
                case,
                copy,
                on_impl=lambda name, label=label: progress.update(task, current=f"{label} {name}"),
            )
            progress.advance(task)
    rows = [r.as_json() for r in records]
    compile_s = sum(r.get("compile_s", 0.0) for r in rows if r["impl"] == "torch_compile")
    result = {
        "gpu": torch.cuda.get_device_name(),
        "date": datetime.date.today().isoformat(),
        "commit": commit_id,
        "copy_gbps": round(copy, 1),
        "static_compile": peers.compile_mode(),
        "torch_compile_first_calls_s": round(compile_s, 1),
        # Graphs compiled ahead by shared.bench.precompile: compile_s is then the warm path.
        "precompiled": group in os.environ.get(PRECOMPILED_ENV, "").split(),
        "peers": peers.describe(ran={r["impl"] for r in rows}),
        "records": rows,
        "method": "medians under CUDA graphs, inputs rotated past 3x the L2, the GPU spinning "
        "ahead of each timed region (no host launch latency counted); peers are compared with the "
        "reference at their first call where 'check_max_abs_err' is recorded; "
        + peers.compile_note(),
    }
    if hasattr(suite, "extra"):
        try:
            result.update(suite.extra())
        except Exception as exc:  # keep the sweep's records whatever the extras do
            print(f"{group}: extra() failed ({type(exc).__name__}: {exc})")
            result["extra_error"] = f"{type(exc).__name__}: {exc}"[:500]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{group}.json").write_text(json.dumps(result, indent=1) + "\n")
    (out_dir / f"{group}.md").write_text(report.markdown(group, result))
    report.plots(group, result, out_dir)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="benchmark kernels against their peers")
    parser.add_argument(
        "--group",
        action="append",
        choices=available_suites(),
        help="suite to run (repeatable; default: all)",
    )
    parser.add_argument("--quick", action="store_true", help="a few shapes only")
    parser.add_argument(
        "--op",
        action="append",
        help="only the cases of ops whose name starts with this (repeatable; the group's JSON "
        "then holds only them)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "benchmarks")
    parser.add_argument(
        "--static-compile",
        choices=sorted(peers.COMPILE_MODES),
        default=os.environ.get(peers.COMPILE_ENV, peers.DEFAULT_COMPILE_MODE),
        help="shapes where torch_compile compiles a static graph per shape: "
        + "; ".join(f"{k}: {v}" for k, v in peers.COMPILE_MODES.items())
        + f" (default {peers.DEFAULT_COMPILE_MODE}, or ${peers.COMPILE_ENV})",
    )
    args = parser.parse_args(argv)
    peers.set_compile_mode(args.static_compile)
    if not torch.cuda.is_available():
        print("benchmarks need a CUDA GPU", file=sys.stderr)
        return 2
    copy = harness.copy_gbps()
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {copy:.0f} GB/s (read + write)")
    for library in peers.FLASHINFER_LIBRARIES:
        peers.flashinfer(library)  # load (or record as absent) before the suites ask
    for load in (peers.sglang, peers.vllm):
        load()
    for name, info in peers.describe().items():
        print(f"peer {name}: " + ", ".join(f"{k}={v}" for k, v in info.items() if k != "ran"))
    commit_id = commit()
    results = {}
    failed = []
    for group in args.group or available_suites():
        try:
            results[group] = run_group(group, args.quick, args.out, copy, commit_id, args.op)
        except Exception as exc:  # one broken suite must not cost the others their results
            traceback.print_exc()
            failed.append(f"{group}: {type(exc).__name__}: {exc}")
            continue
        print(report.markdown(group, results[group]))
    print(report.summary(results))
    for line in failed:
        print(f"suite failed: {line}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
