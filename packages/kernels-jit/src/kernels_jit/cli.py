"""The `kernels-jit` command: ``list``, ``doctor`` and ``build`` over the groups installed here.

It ships with kernels-jit, so a single-group install (``kernels-jit`` + ``kernels-layernorm``)
can diagnose itself and precompile its modules ahead of time. The umbrella's ``kernels-ops``
command is this same implementation with ``check`` and ``bench`` added (see
:func:`make_parser` and :func:`main`).

Output: a rich table on a terminal wide enough to show every op id whole; plain aligned lines
when stdout is not a terminal (pipes, files, CI logs) or is too narrow; JSON with ``--json``.
User errors (an unknown group or op, a bad ``--arch``, a bad ``KERNELS_*`` value) print one line
on stderr and exit 2; a failed build exits 1. ``list`` imports no torch.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kernels_jit.errors import KernelsJitError
from kernels_jit.registry import GROUPS, OpSpec, all_ops
from kernels_jit.version import __version__

Handler = Callable[[argparse.Namespace], int]


class UsageError(Exception):
    """A mistake in the command line or the environment: one line on stderr, exit status 2."""


# ----------------------------------------------------------------------------------------------
# groups and ops


def dist_name(group: str) -> str:
    return "kernels-" + group.replace("_", "-")


def _installed(group: str) -> bool:
    try:
        return importlib.util.find_spec(f"kernels_{group}") is not None
    except (ImportError, ValueError):
        return False


def installed_groups() -> list[str]:
    """The groups whose package is importable here, in :data:`GROUPS` order."""
    return [g for g in GROUPS if _installed(g)]


def selected_groups(args: argparse.Namespace) -> list[str]:
    """The groups ``--group`` names (default: every installed one), imported (metadata only)."""
    chosen = args.group or installed_groups()
    unknown = [g for g in chosen if g not in GROUPS]
    if unknown:
        raise UsageError(
            f"unknown group(s) {', '.join(unknown)}; the groups are {', '.join(GROUPS)}"
        )
    missing = [g for g in chosen if not _installed(g)]
    if missing:
        raise UsageError(
            f"group(s) {', '.join(missing)} not installed here; install "
            + " ".join(dist_name(g) for g in missing)
        )
    for group in chosen:
        importlib.import_module(f"kernels_{group}")
    return list(dict.fromkeys(chosen))


def selected_ops(args: argparse.Namespace) -> list[OpSpec]:
    """The ops of the selected groups, narrowed by ``--op`` (each must exist)."""
    groups = selected_groups(args)
    ops = [spec for spec in all_ops() if spec.group in groups]
    wanted = getattr(args, "op", None)
    if not wanted:
        return ops
    known = {spec.id for spec in ops}
    unknown = [op for op in wanted if op not in known]
    if unknown:
        group = unknown[0].split(".")[0]
        hint = (
            f"; group {group} is not installed"
            if group in GROUPS and not _installed(group)
            else f"; `{args.prog} list` shows them"
        )
        raise UsageError(f"unknown op(s) {', '.join(unknown)}{hint}")
    return [spec for spec in ops if spec.id in wanted]


def backend_kind(backend) -> str:
    return getattr(backend, "kind", backend.name)


# ----------------------------------------------------------------------------------------------
# output


class Output:
    """Tables for people (rich, on a wide enough terminal), plain lines for pipes, or JSON."""

    def __init__(self, as_json: bool = False, console=None) -> None:
        self.as_json = as_json
        self.console = console

    def _rich_console(self, first_width: int, columns: int):
        """A rich console when stdout is a terminal wide enough for whole first-column values."""
        if self.console is None:
            if not sys.stdout.isatty():
                return None
            from rich.console import Console

            self.console = Console()
        return self.console if self.console.width >= first_width + 12 * columns else None

    def table(self, title: str, columns: Sequence[str], rows: Sequence[Sequence[str]]) -> None:
        """Print rows under a title; the first column (an op id, a key) is never cut."""
        first = max((len(r[0]) for r in rows), default=0)
        console = self._rich_console(max(first, len(columns[0])), len(columns))
        if console is None:
            self._plain(title, columns, rows, self.console.file if self.console else sys.stdout)
            return
        from rich.markup import escape
        from rich.table import Table

        table = Table(title=escape(title))
        for index, column in enumerate(columns):
            if index == 0:
                table.add_column(column, no_wrap=True, min_width=first)
            else:
                table.add_column(column, overflow="fold")
        for row in rows:
            table.add_row(*(escape(cell) for cell in row))
        console.print(table)

    @staticmethod
    def _plain(title: str, columns: Sequence[str], rows: Sequence[Sequence[str]], file) -> None:
        flat = [[cell.replace("\n", "; ") for cell in row] for row in rows]
        widths = [max(len(r[i]) for r in [list(columns), *flat]) for i in range(len(columns))]
        print(f"# {title}", file=file)
        for row in [list(columns), *flat]:
            cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=False)]
            print("  ".join([*cells, row[-1]]).rstrip(), file=file)

    def line(self, text: str, *, err: bool = False) -> None:
        print(text, file=sys.stderr if err else sys.stdout)

    @staticmethod
    def dump(value: Any) -> None:
        print(json.dumps(value, indent=2))


# ----------------------------------------------------------------------------------------------
# commands


def cmd_list(args: argparse.Namespace) -> int:
    from kernels_jit.availability import unavailable_reason

    ops = selected_ops(args)
    records = []
    for spec in ops:
        backends = []
        for backend in spec.backends:
            reason = unavailable_reason(backend)
            backends.append(
                {
                    "name": backend.name,
                    "kind": backend_kind(backend),
                    "devices": list(backend.devices),
                    "available": reason is None,
                    "reason": reason,
                    "description": backend.description,
                }
            )
        records.append(
            {
                "id": spec.id,
                "group": spec.group,
                "name": spec.name,
                "description": spec.description,
                "dtypes": list(spec.dtypes),
                "backends": backends,
            }
        )
    out = Output(args.json)
    if args.json:
        out.dump(records)
        return 0
    rows = []
    for record in records:
        here = [
            b["name"] if b["available"] else f"{b['name']}: {b['reason']}"
            for b in record["backends"]
        ]
        rows.append(
            [
                record["id"],
                ", ".join(b["name"] for b in record["backends"]),
                ", ".join(record["dtypes"]) or "-",
                "\n".join(here),
                record["description"],
            ]
        )
    columns = ("op", "backends", "dtypes", "available here", "description")
    out.table(f"{args.prog} inventory: {len(rows)} op(s)", columns, rows)
    return 0


def cmd_doctor(args: argparse.Namespace) -> int:
    from kernels_jit import doctor

    groups = selected_groups(args) if args.group else None
    report = doctor.report(groups, umbrella=args.prog == "kernels-ops")
    out = Output(args.json)
    if args.json:
        out.dump(report)
        return 0
    for title, rows in doctor.sections(report):
        out.table(title, ("key", "value"), rows)
    return 0


def _archs(values: list[str] | None) -> list[str] | None:
    """``--arch`` values (repeatable, comma-separated) normalised; None if not given."""
    from kernels_jit import arch, toolchain

    if not values:
        return None
    archs = []
    for value in values:
        for part in filter(None, (p.strip() for p in value.split(","))):
            try:
                archs.append(arch.normalize_cuda_arch(part))
            except ValueError as exc:
                raise UsageError(f"--arch: {exc}") from None
    if not archs:
        raise UsageError("--arch: give a CUDA arch, e.g. --arch sm_90a")
    # An arch this nvcc cannot compile fails here, once, instead of once per module in nvcc's
    # words (without nvcc the build says what is missing).
    release = toolchain.nvcc_release()
    unsupported = [a for a in archs if release is not None and not arch.nvcc_supports(a)]
    if unsupported:
        raise UsageError(
            f"--arch {', '.join(unsupported)}: nvcc {release[0]}.{release[1]} here does not "
            f"compile for it; it compiles {', '.join(arch.nvcc_archs())}"
        )
    return archs


def cmd_build(args: argparse.Namespace) -> int:
    archs = _archs(args.arch)
    if args.cache_dir is not None:
        cache_dir = args.cache_dir.expanduser().absolute()
        if cache_dir.exists() and not cache_dir.is_dir():
            raise UsageError(f"--cache-dir: {cache_dir} exists and is not a directory")
        os.environ["KERNELS_CACHE_DIR"] = str(cache_dir)
    from kernels_jit import aot, settings
    from kernels_jit.errors import ToolchainError
    from kernels_jit.module import declared_modules
    from kernels_jit.registry import resolve_target

    jobs = args.jobs if args.jobs is not None else settings.max_jobs()
    modules = []
    for group in selected_groups(args):
        for spec in all_ops():
            if spec.group == group:
                resolve_target(spec.public)  # importing the op file declares its modules
        modules += [
            m for m in declared_modules(f"kernels_{group}") if args.cpu or m.device == "cuda"
        ]
    try:
        tasks = aot.plan(modules, archs)
    except ToolchainError as exc:
        raise UsageError(f"{exc}; or pass --arch (e.g. --arch sm_90a)") from None
    out = Output(args.json)
    if not tasks:
        if args.json:
            out.dump({"cache_dir": str(settings.cache_dir()), "artifacts": []})
        else:
            out.line("nothing to build for these groups (add --cpu for the host C++ modules)")
        return 0
    paths = aot.precompile(modules, archs=archs, jobs=jobs, progress=not args.json)
    if args.json:
        out.dump({"cache_dir": str(settings.cache_dir()), "artifacts": [str(p) for p in paths]})
    else:
        out.line(f"built {len(paths)} artifact(s) under {settings.cache_dir()}")
    return 0


# ----------------------------------------------------------------------------------------------
# the parser and the entry point


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return value


def make_parser(
    prog: str = "kernels-jit", description: str | None = None, version: str | None = None
) -> tuple[argparse.ArgumentParser, Any]:
    """The parser with ``list``, ``doctor`` and ``build``; returns it and its subparsers, to
    which ``kernels-ops`` adds its own commands."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description=description
        or "The kernels-jit build utility: inventory, diagnostics and AOT builds of the "
        "kernels-* groups installed here.",
    )
    parser.add_argument("--version", action="version", version=version or f"{prog} {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    group_help = "restrict to this group (repeatable; default: every installed group)"
    json_help = "print JSON instead of a table"

    p_list = sub.add_parser("list", help="the op inventory and what can run here (no torch)")
    p_list.add_argument("--group", action="append", help=group_help)
    p_list.add_argument("--op", action="append", help="restrict to this op id (repeatable)")
    p_list.add_argument("--json", action="store_true", help=json_help)

    p_doctor = sub.add_parser("doctor", help="toolchain, arch, cache, versions, backends here")
    p_doctor.add_argument("--group", action="append", help=group_help)
    p_doctor.add_argument("--json", action="store_true", help=json_help)

    p_build = sub.add_parser("build", help="precompile modules ahead of time (AOT)")
    p_build.add_argument("--group", action="append", help=group_help)
    p_build.add_argument(
        "--arch",
        action="append",
        help="CUDA arch, e.g. sm_90a (repeatable or comma-separated; default: "
        "KERNELS_CUDA_ARCH, else the GPU's)",
    )
    p_build.add_argument("--cache-dir", type=Path, help="where to put the artifacts")
    p_build.add_argument(
        "--jobs", type=_positive_int, help="parallel builds (default: KERNELS_MAX_JOBS)"
    )
    p_build.add_argument("--cpu", action="store_true", help="also build the host C++ modules")
    p_build.add_argument("--json", action="store_true", help="print the artifacts as JSON")
    return parser, sub


COMMANDS: dict[str, Handler] = {"list": cmd_list, "doctor": cmd_doctor, "build": cmd_build}


def run(parser: argparse.ArgumentParser, handlers: dict[str, Handler], argv: Sequence[str]) -> int:
    """Parse ``argv`` and run its command; user errors become one line on stderr."""
    args = parser.parse_args(list(argv))
    if args.command is None:
        parser.print_help()
        return 0
    args.prog = parser.prog
    try:
        return handlers[args.command](args)
    except UsageError as exc:
        print(f"{parser.prog} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KernelsJitError as exc:
        print(f"{parser.prog} {args.command}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    except ValueError as exc:
        if "KERNELS_" not in str(exc):  # a setting's bad value names its variable
            raise
        print(f"{parser.prog} {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `kernels-jit list | head`: the reader left; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


def main(argv: Sequence[str] | None = None) -> int:
    parser, _ = make_parser()
    return run(parser, COMMANDS, sys.argv[1:] if argv is None else argv)


if __name__ == "__main__":
    sys.exit(main())
