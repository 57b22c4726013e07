"""A/B of a group's CUDA kernels against an earlier commit, in one process on the GPU.

Sweeps compare runs on different days, whose spread (-6% to +10% for unchanged kernels) hides a
5% regression; this times the old and the new compiled kernels interleaved on the same inputs,
through each benchmark case's own ``cuda`` call:

    python -m shared.bench.ab prepare --base 19509e8 --group layernorm   # here: .ab/ (ignored)
    # optional: KERNELS_CACHE_DIR=.gpu/cache ... prepare ... --build sm_90a (see gpu_session.sh)
    python -m shared.bench.ab run --group layernorm [--op rmsnorm] [--quick]   # on the GPU

``prepare`` copies the kernels-jit C++ headers and the group's ``csrc/`` of the base commit into
``.ab/ab_<group>/`` (headers at the package root, so the old sources include them ahead of the
installed ones). ``run`` builds the base twin of every compiled module of the group (the same
spec, read from that copy), then for each case of the group's benchmark suite: checks that base
and new leave the same bytes in every tensor of identically seeded inputs (the outputs, in-place
ones included), and times the case's ``cuda`` call under CUDA graphs with the base and the new
kernels installed in turn (``--rounds`` interleaved rounds, medians; the op's compiled handles
are swapped and dispatch's selections cleared between rounds). gpu_session.sh runs it with
``AB="group ..."`` (and ``AB_OPS``); carry ``.ab``.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import pkgutil
import re
import statistics
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from shared.bench import suites

ROOT = Path(__file__).resolve().parents[2]
AB = ROOT / ".ab"
HEADERS = "packages/kernels-jit/src/kernels_jit/include/kernels"
SEED = 1234


def _package(group: str) -> str:
    return f"ab_{group}"


def _group_dir(group: str) -> str:
    return f"packages/kernels-{group.replace('_', '-')}/src/kernels_{group}/csrc"


def _copy_tree(base: str, source: str, target: Path) -> None:
    files = subprocess.run(
        ["git", "ls-tree", "-r", "--name-only", base, source],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    if not files:
        raise SystemExit(f"{base} has no {source}")
    for name in files:
        path = target / Path(name).relative_to(source)
        path.parent.mkdir(parents=True, exist_ok=True)
        blob = subprocess.run(
            ["git", "show", f"{base}:{name}"], cwd=ROOT, capture_output=True, check=True
        )
        path.write_bytes(blob.stdout)


def prepare(base: str, groups: list[str], build_archs: list[str] | None = None) -> None:
    for group in groups:
        package = AB / _package(group)
        _copy_tree(base, HEADERS, package / "kernels")
        _copy_tree(base, _group_dir(group), package / "csrc")
        (package / "__init__.py").write_text(
            f'"""{group} sources of {base} for shared.bench.ab."""\n'
        )
        print(f"prepared {package} from {base}")
    if build_archs:
        # Both builds of every module into KERNELS_CACHE_DIR here, where CPU time is free: the
        # GPU machine then loads them (gpu_session.sh, .gpu/cache) instead of compiling.
        from kernels_jit.aot import precompile

        sys.path.insert(0, str(AB))
        specs = []
        for group in groups:
            for cf in compiled_functions(group):
                specs += [cf.spec, _base_twin(cf.spec, group)]
        precompile(list(dict.fromkeys(specs)), build_archs)
    print("carry .ab to the GPU, then: python -m shared.bench.ab run --group <group>")


def compiled_functions(group: str, ops: list[str] | None = None) -> list:
    """Every CompiledFunction of the group's op modules (``kernels_<group>.ops.<op>``), or of
    those whose op name starts with one of ``ops`` (so that only their modules are built)."""
    from kernels_jit.loader import CompiledFunction

    package = importlib.import_module(f"kernels_{group}.ops")
    found = []
    for info in pkgutil.iter_modules(package.__path__):
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        for v in vars(module).values():
            # an op file may hold several ops (rmsnorm.py): match the file or the export
            names = (info.name, getattr(v, "export", ""))
            if isinstance(v, CompiledFunction) and (
                not ops or any(n.startswith(tuple(ops)) for n in names)
            ):
                found.append(v)
    if not found:
        raise SystemExit(f"shared.bench.ab: no compiled kernel of {group} matches {ops}")
    return list(dict.fromkeys(found))


def _base_twin(spec: Any, group: str) -> Any:
    """The module spec over the base commit's copy of the sources, without the exports whose C++
    function the base does not define (a test hook added since would fail the base build). Where
    the copy is not prepared (or defines none of them) the exports stay as they are: the base
    build then fails naming what is missing."""
    text = "".join(
        (AB / _package(group) / source).read_text()
        for source in spec.sources
        if (AB / _package(group) / source).is_file()
    )
    exports = tuple(
        (name, expression)
        for name, expression in spec.exports
        if re.search(rf"\b{re.escape(re.split(r'[<(]', expression)[0].strip())}\b", text)
    ) or tuple(spec.exports)
    return dataclasses.replace(
        spec, name=f"{spec.name}_base", package=_package(group), exports=exports
    )


class Kernels:
    """The group's compiled handles, switchable between the base and the new build."""

    def __init__(self, group: str, ops: list[str] | None = None):
        from kernels_jit import load_module
        from kernels_jit.aot import precompile

        sys.path.insert(0, str(AB))
        self.handles = compiled_functions(group, ops)
        twins = [_base_twin(cf.spec, group) for cf in self.handles]
        # Both builds of every module in parallel first (gemm's CUTLASS modules take a minute
        # each), then loaded one by one from the cache.
        precompile(list(dict.fromkeys([*(cf.spec for cf in self.handles), *twins])))
        self.builds: dict[str, list] = {
            # an export the base lacks (a test hook added since) runs the new build on both sides
            "base": [
                getattr(load_module(t), cf.export) if cf.export in dict(t.exports) else cf.resolve()
                for cf, t in zip(self.handles, twins, strict=True)
            ],
            "new": [cf.resolve() for cf in self.handles],
        }

    def use(self, which: str) -> None:
        from kernels_jit import dispatch

        for cf, fn in zip(self.handles, self.builds[which], strict=True):
            cf._fn = fn
        dispatch.clear_caches()


def _tensors(value: Any, seen: set[int] | None = None) -> Iterator:
    """Every tensor reachable from an input set or a result (containers and object fields)."""
    import torch

    seen = set() if seen is None else seen
    if id(value) in seen:
        return
    seen.add(id(value))
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v, seen)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v, seen)
    elif hasattr(value, "__dict__"):
        yield from _tensors(vars(value), seen)


def same_bytes(case, kernels: Kernels) -> bool:
    """Base and new on identically seeded inputs leave the same bytes everywhere."""
    import torch

    states = []
    for which in ("base", "new"):
        kernels.use(which)
        torch.manual_seed(SEED)
        inputs = case.make_inputs()
        result = case.impls["cuda"](inputs)
        torch.cuda.synchronize()
        states.append(
            [
                t.detach().contiguous().reshape(-1).view(torch.uint8)
                for t in _tensors((inputs, result))
            ]
        )
    return len(states[0]) == len(states[1]) and all(
        a.shape == b.shape and torch.equal(a, b) for a, b in zip(*states, strict=True)
    )


def run(groups: list[str], ops: list[str] | None, quick: bool, rounds: int) -> None:
    from shared.bench.harness import sets_needed, time_graph

    print("| op | shape | dtype | base us | new us | new/base | spread base/new | same bytes |")
    print("|---|---|---|---|---|---|---|---|")
    for group in groups:
        kernels = Kernels(group, ops)
        for case in suites.cases(group, quick, ops):
            if "cuda" not in case.impls:
                continue
            same = same_bytes(case, kernels)
            sets = [case.make_inputs() for _ in range(sets_needed(case.bytes))]
            times: dict[str, list[float]] = {"base": [], "new": []}
            for _ in range(rounds):
                for which, timed in times.items():
                    kernels.use(which)
                    timed.append(time_graph(case.impls["cuda"], sets))
            med = {k: statistics.median(v) for k, v in times.items()}
            spread = "/".join(f"{(max(v) - min(v)) / med[k]:.2f}" for k, v in times.items())
            print(
                f"| {case.op} | {case.shape} | {str(case.dtype).removeprefix('torch.')} | "
                f"{med['base']:.2f} | {med['new']:.2f} | {med['new'] / med['base']:.3f} | "
                f"{spread} | {'yes' if same else '**no**'} |",
                flush=True,
            )
            del sets
        kernels.use("new")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="copy the base commit's sources into .ab/")
    prep.add_argument("--base", required=True, help="the earlier commit")
    prep.add_argument("--group", action="append", required=True)
    prep.add_argument(
        "--build",
        action="append",
        metavar="ARCH",
        help="also compile the base and new modules for ARCH (e.g. sm_90a) into KERNELS_CACHE_DIR",
    )
    go = sub.add_parser("run", help="time base and new interleaved (on the GPU)")
    go.add_argument("--group", action="append", required=True)
    go.add_argument("--op", action="append", help="only ops whose name starts with this")
    go.add_argument("--quick", action="store_true", help="the suite's quick grid")
    go.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    if args.command == "prepare":
        prepare(args.base, args.group, args.build)
    else:
        run(args.group, args.op, args.quick, args.rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
