"""The `kernels-ops` command: list, doctor, build (the `kernels-jit` command's own), check, bench.

`list`, `doctor` and `build` are :mod:`kernels_jit.cli`'s implementation; this module adds `check`
(every backend against the torch reference) and `bench` (from a source checkout). `list` imports
no torch; the others import what they need.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from kernels_jit import cli as jit_cli
from kernels_jit.cli import Output, UsageError
from kernels_ops.version import __version__


def _device(text: str):
    """``--device``: cpu, cuda or cuda:N, present on this machine."""
    import torch

    try:
        device = torch.device(text)
    except RuntimeError:
        raise UsageError(f"--device: unknown device {text!r}; use cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):
        raise UsageError(f"--device: {text!r} is not a device kernels-ops runs on; use cpu or cuda")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise UsageError(f"--device {text}: no CUDA device here (torch sees none)")
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise UsageError(
                f"--device {text}: this machine has {torch.cuda.device_count()} GPU(s)"
            )
    return device


def cmd_check(args: argparse.Namespace) -> int:
    ops = jit_cli.selected_ops(args)
    from kernels_ops.check import best_device, check_op, summary

    device = best_device() if args.device is None else _device(args.device)
    outcomes = [outcome for spec in ops for outcome in check_op(spec, device)]
    line, failed = summary(outcomes, device)
    out = Output(args.json)
    if args.json:
        out.dump(
            {
                "device": str(device),
                "outcomes": [o.as_dict() for o in outcomes],
                "summary": line,
                "ok": not failed,
            }
        )
        return 1 if failed else 0
    columns = ("op", "backend", "cases", "skipped", "max rel err", "result")
    rows = [
        [
            o.op,
            o.backend,
            str(o.cases),
            str(o.skipped),
            f"{o.worst:.1e}" if o.compared else "-",
            o.label,
        ]
        for o in outcomes
    ]
    out.table(f"kernels-ops check on {device}", columns, rows)
    out.line(line)
    return 1 if failed else 0


def _repo_root() -> Path | None:
    for base in (Path.cwd(), *Path.cwd().parents):
        if (base / "shared" / "bench" / "run.py").exists():
            return base
    return None


def cmd_bench(rest: list[str]) -> int:
    root = _repo_root()
    if root is None:
        print(
            "kernels-ops bench: error: bench runs from a source checkout of kernels-ops (it needs "
            "shared/bench/); cd into the repository first",
            file=sys.stderr,
        )
        return 2
    sys.path.insert(0, str(root))
    from shared.bench import run

    return run.main(rest)


def parser() -> argparse.ArgumentParser:
    from kernels_jit.version import __version__ as jit_version

    p, sub = jit_cli.make_parser(
        "kernels-ops",
        "LLM-inference GPU kernels: the inventory, diagnostics, AOT builds, a check of every "
        "backend against its reference, and benchmarks.",
        version=f"kernels-ops {__version__} (kernels-jit {jit_version})",
    )
    p_check = sub.add_parser("check", help="every op vs its reference on the best device")
    p_check.add_argument(
        "--group", action="append", help="restrict to this group (repeatable; default: all)"
    )
    p_check.add_argument("--op", action="append", help="restrict to this op id (repeatable)")
    p_check.add_argument("--device", help="cpu, cuda or cuda:N (default: the best present)")
    p_check.add_argument("--json", action="store_true", help="print JSON instead of a table")
    sub.add_parser(
        "bench", help="benchmarks vs peers (source checkout; see bench --help)", add_help=False
    )
    return p


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["bench"]:
        return cmd_bench(argv[1:])
    return jit_cli.run(parser(), {**jit_cli.COMMANDS, "check": cmd_check}, argv)


if __name__ == "__main__":
    sys.exit(main())
