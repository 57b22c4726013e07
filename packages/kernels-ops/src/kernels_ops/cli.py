"""The `kernels-ops` command: list, doctor, build, check, bench.

`list` imports no torch; the others import what they need.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

console = Console()


def _groups(args) -> list[str]:
    from kernels_jit.registry import GROUPS

    chosen = args.group or list(GROUPS)
    unknown = set(chosen) - set(GROUPS)
    if unknown:
        raise SystemExit(f"unknown group(s) {sorted(unknown)}; the groups are {', '.join(GROUPS)}")
    return chosen


def cmd_list(args) -> int:
    import kernels_ops
    from kernels_jit.availability import unavailable_reason

    table = Table(title="kernels-ops inventory")
    for column in ("op", "backends", "dtypes", "available here", "description"):
        table.add_column(column)
    groups = set(_groups(args))
    for spec in kernels_ops.list_ops():
        if spec.group not in groups:
            continue
        marks = []
        for backend in spec.backends:
            reason = unavailable_reason(backend)
            marks.append(
                backend.name if reason is None else f"[dim]{backend.name}: {escape(reason)}[/dim]"
            )
        table.add_row(
            spec.id,
            ", ".join(b.name for b in spec.backends),
            ", ".join(spec.dtypes) or "-",
            "\n".join(marks),
            spec.description,
        )
    console.print(table)
    return 0


def cmd_doctor(args) -> int:
    import kernels_ops  # noqa: F401  (registers every group)
    from kernels_jit import doctor

    for title, rows in doctor.sections():
        table = Table(title=title, show_header=False)
        table.add_column("key", style="bold")
        table.add_column("value")
        for key, value in rows:
            table.add_row(escape(key), escape(value))
        console.print(table)
    return 0


def cmd_build(args) -> int:
    import importlib
    import os

    if args.cache_dir:
        os.environ["KERNELS_CACHE_DIR"] = str(args.cache_dir)
    from kernels_jit import PrecompileError, aot, declared_modules, settings
    from kernels_jit.registry import resolve_target

    modules = []
    for group in _groups(args):
        package = importlib.import_module(f"kernels_{group}")
        for spec in package.OPS:
            resolve_target(spec.public)
        modules += [
            m for m in declared_modules(f"kernels_{group}") if args.cpu or m.device == "cuda"
        ]
    if not modules:
        console.print("nothing to build for these groups")
        return 0
    try:
        paths = aot.precompile(modules, archs=args.arch, jobs=args.jobs)
    except PrecompileError as exc:
        console.print(f"[red]{escape(str(exc))}[/red]")
        return 1
    console.print(f"built {len(paths)} artifact(s) under {settings.cache_dir()}")
    return 0


def cmd_check(args) -> int:
    import kernels_ops
    from kernels_ops.check import best_device, check_op

    device = best_device() if args.device is None else __import__("torch").device(args.device)
    groups = set(_groups(args))
    table = Table(title=f"kernels-ops check on {device}")
    for column in ("op", "backend", "cases", "skipped", "max rel err", "result"):
        table.add_column(column)
    failures = 0
    for spec in kernels_ops.list_ops():
        if spec.group not in groups or (args.op and spec.id not in args.op):
            continue
        for outcome in check_op(spec, device):
            failures += not outcome.ok
            result = (
                "[green]ok[/green]" if outcome.ok else f"[red]FAIL[/red] {escape(outcome.error)}"
            )
            if outcome.ok and outcome.backend == "torch":
                result = "[green]ok[/green] (reference only)"
            elif outcome.ok and outcome.cases == 0:
                result = "[dim]not runnable on this device[/dim]"
            table.add_row(
                outcome.op,
                outcome.backend,
                str(outcome.cases),
                str(outcome.skipped),
                f"{outcome.worst:.1e}",
                result,
            )
    console.print(table)
    if failures:
        console.print(f"[red]{failures} backend(s) disagree with the reference[/red]")
    return 1 if failures else 0


def _repo_root() -> Path | None:
    for base in (Path.cwd(), *Path.cwd().parents):
        if (base / "shared" / "bench" / "run.py").exists():
            return base
    return None


def cmd_bench(args, rest: list[str]) -> int:
    root = _repo_root()
    if root is None:
        console.print(
            "bench runs from a source checkout of kernels-ops (it needs shared/bench/); "
            "cd into the repository first"
        )
        return 2
    sys.path.insert(0, str(root))
    from shared.bench import run

    return run.main(rest)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="kernels-ops", description="LLM-inference GPU kernels")
    sub = p.add_subparsers(dest="command", required=True)
    group_help = "restrict to this group (repeatable)"
    p_list = sub.add_parser("list", help="the op inventory and what can run here (no torch)")
    p_list.add_argument("--group", action="append", help=group_help)
    sub.add_parser("doctor", help="toolchain, arch, cache, versions, runnable backends")
    p_build = sub.add_parser("build", help="precompile modules ahead of time (AOT)")
    p_build.add_argument("--group", action="append", help=group_help)
    p_build.add_argument("--arch", action="append", help="CUDA arch, e.g. sm_90a (repeatable)")
    p_build.add_argument("--cache-dir", type=Path, help="where to put the artifacts")
    p_build.add_argument("--jobs", type=int, help="parallel builds (default KERNELS_MAX_JOBS)")
    p_build.add_argument("--cpu", action="store_true", help="also build the CPU modules")
    p_check = sub.add_parser("check", help="every op vs its reference on the best device")
    p_check.add_argument("--group", action="append", help=group_help)
    p_check.add_argument("--op", action="append", help="restrict to this op id (repeatable)")
    p_check.add_argument("--device", help="cpu or cuda (default: the best present)")
    sub.add_parser(
        "bench", help="benchmarks vs peers (source checkout; see --help)", add_help=False
    )
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        return cmd_bench(None, argv[1:])
    args = parser().parse_args(argv)
    handlers = {"list": cmd_list, "doctor": cmd_doctor, "build": cmd_build, "check": cmd_check}
    return handlers[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
