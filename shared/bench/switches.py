"""In-process A/B of an op's host switches: module attributes its CUDA backend reads each call.

Some kernel paths are chosen on the host by a threshold or a flag that the op's module reads on
every call (kvcache's ``_BULK_*`` rows and run lengths, causal_conv1d_fwd's
``_SHORT_ROW_MAX_BYTES``, the small-M GEMMs' ``_RING_MAX_M``, ``_CLUSTER_PUSH`` and
``_WEIGHT_FIRST``), so one process can time the same compiled kernels under every setting, on
the same inputs, interleaved, where ``shared.bench.ab`` compares two builds:

    python -m shared.bench.switches --group gemm --op dsv3_fused_a_gemm \\
        --grid _RING_MAX_M=0,16 --grid _CLUSTER_PUSH=False,True --grid _WEIGHT_FIRST=False,True
    python -m shared.bench.switches --group kvcache --op store_cache \\
        --setting off:_BULK_MIN_ROWS=-1 \\
        --setting on:_BULK_MIN_ROWS=0,_BULK_MAX_ROWS=-1,_BULK_MIN_RUN_BYTES=0

The module is ``kernels_<group>.ops.<op>``; the cases are the group suite's cases of the op and of
its variants (``dsv3_fused_a_gemm_l2warm``), timed through their ``cuda`` call under CUDA graphs.
Settings: ``--setting name:A=v,B=w`` each, or ``--grid A=v1,v2`` for every combination of the
grids; ``default`` (the module as shipped) is always one of them. Values are Python literals.
Prints one markdown table (rows: cases; columns: settings, medians of ``--rounds`` interleaved
rounds in us, the fastest of a row in bold). The attributes are restored after every case.
"""

from __future__ import annotations

import argparse
import ast
import importlib
import itertools
import statistics
import sys
from collections.abc import Callable, Iterable
from types import ModuleType
from typing import Any

from shared.bench import suites

Setting = tuple[str, dict[str, Any]]


def _value(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError) as exc:
        raise SystemExit(f"switches: {text!r} is not a Python literal") from exc


def _assignments(text: str) -> dict[str, Any]:
    """``A=1,B=False`` -> {"A": 1, "B": False}."""
    out = {}
    for part in filter(None, text.split(",")):
        name, sep, value = part.partition("=")
        if not sep or not name:
            raise SystemExit(f"switches: expected NAME=VALUE, got {part!r}")
        out[name.strip()] = _value(value.strip())
    return out


def parse_settings(settings: Iterable[str], grids: Iterable[str]) -> list[Setting]:
    """``default`` first, then each ``name:A=v,...``, then every combination of the grids."""
    out: list[Setting] = [("default", {})]
    for text in settings:
        name, sep, rest = text.partition(":")
        if not sep or not name:
            raise SystemExit(f"switches: expected name:A=v,..., got {text!r}")
        out.append((name, _assignments(rest)))
    axes = []
    for text in grids:
        name, sep, values = text.partition("=")
        if not sep or not values:
            raise SystemExit(f"switches: expected NAME=v1,v2,..., got {text!r}")
        axes.append([(name.strip(), _value(v.strip())) for v in values.split(",")])
    for combo in itertools.product(*axes) if axes else ():
        out.append((" ".join(f"{n.strip('_')}={v}" for n, v in combo), dict(combo)))
    names = [name for name, _ in out]
    if len(set(names)) != len(names):
        raise SystemExit(f"switches: setting names must differ, got {names}")
    return out


def check_attributes(module: ModuleType, settings: list[Setting]) -> dict[str, Any]:
    """The shipped values of every attribute the settings touch (an unknown one is an error)."""
    names = sorted({name for _, attrs in settings for name in attrs})
    missing = [name for name in names if not hasattr(module, name)]
    if missing:
        raise SystemExit(f"switches: {module.__name__} has no attribute {', '.join(missing)}")
    return {name: getattr(module, name) for name in names}


def run(
    module: ModuleType,
    cases: Iterable[Any],
    settings: list[Setting],
    rounds: int,
    time_case: Callable[[Any], float],
    emit: Callable[[str], None] = print,
) -> dict[str, dict[str, float]]:
    """Time every case under every setting (``rounds`` interleaved rounds, medians); emit the
    markdown table; return {case label: {setting: median us}}."""
    shipped = check_attributes(module, settings)
    emit(f"defaults of {module.__name__}: " + ", ".join(f"{n}={v}" for n, v in shipped.items()))
    emit("")
    emit("| case | shape | " + " | ".join(name for name, _ in settings) + " |")
    emit("|---|---|" + "---|" * len(settings))
    results: dict[str, dict[str, float]] = {}
    for case in cases:
        times: dict[str, list[float]] = {name: [] for name, _ in settings}
        run_case = time_case(case)
        try:
            for _ in range(rounds):
                for name, attrs in settings:
                    for attr, value in {**shipped, **attrs}.items():
                        setattr(module, attr, value)
                    times[name].append(run_case())
        finally:
            for attr, value in shipped.items():
                setattr(module, attr, value)
        medians = {name: statistics.median(v) for name, v in times.items()}
        best = min(medians.values())
        cells = " | ".join(f"**{t:.2f}**" if t == best else f"{t:.2f}" for t in medians.values())
        label = f"{case.op} {case.note}".strip()
        emit(f"| {label} | {case.shape} | {cells} |")
        results[f"{label} {case.shape}"] = medians
    return results


def graph_timer(case: Any) -> Callable[[], float]:
    """The case's ``cuda`` call timed under CUDA graphs over enough input sets to pass the L2."""
    from shared.bench.harness import sets_needed, time_graph

    sets = [case.make_inputs() for _ in range(sets_needed(case.bytes))]
    return lambda: time_graph(case.impls["cuda"], sets)


def op_cases(group: str, op: str, quick: bool) -> list[Any]:
    """The suite's cases of ``op`` and of its variants (``<op>_<variant>``) with a cuda call."""
    return [
        c
        for c in suites.cases(group, quick, [op])
        if (c.op == op or c.op.startswith(op + "_")) and "cuda" in c.impls
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--group", required=True)
    parser.add_argument("--op", required=True, help="the op (its module: kernels_<group>.ops.<op>)")
    parser.add_argument("--setting", action="append", default=[], metavar="NAME:A=v,B=w")
    parser.add_argument("--grid", action="append", default=[], metavar="A=v1,v2")
    parser.add_argument("--quick", action="store_true", help="the suite's quick grid")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    settings = parse_settings(args.setting, args.grid)
    if len(settings) < 2:
        parser.error("give at least one --setting or --grid")
    module = importlib.import_module(f"kernels_{args.group}.ops.{args.op}")
    check_attributes(module, settings)
    cases = op_cases(args.group, args.op, args.quick)
    if not cases:
        raise SystemExit(f"switches: the {args.group} suite has no cuda case of {args.op}")
    print(f"### {args.group}.{args.op} (us, CUDA graphs, medians of {args.rounds} rounds)\n")
    run(module, cases, settings, args.rounds, graph_timer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
