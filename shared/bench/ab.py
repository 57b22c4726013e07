"""A/B of the row kernels against an earlier commit, in one process on the GPU.

Sweeps compare runs on different days, whose spread (-6% to +10% for unchanged kernels) hides a
5% regression; this times the old and the new compiled kernels interleaved on the same inputs:

    python -m shared.bench.ab prepare --base 91b2b59   # here: the old sources into .ab/ (ignored)
    python -m shared.bench.ab run                      # on the GPU (carry .ab): a table of new/old

``prepare`` copies the kernels-jit C++ headers and layernorm's ``csrc/`` of the base commit into
``.ab/old_kernels`` (headers at the package root, so the old sources include them ahead of the
installed ones); ``run`` builds both versions of the rmsnorm and layernorm modules, checks that
every op's outputs agree bit for bit, and times rmsnorm, fused_add_rmsnorm and layernorm (bf16)
under CUDA graphs, 5 interleaved rounds each.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
AB = ROOT / ".ab"
SOURCES = {
    "packages/kernels-jit/src/kernels_jit/include/kernels": "kernels",
    "packages/kernels-layernorm/src/kernels_layernorm/csrc": "csrc",
}
SHAPES = ((1, 4096), (16, 4096), (64, 4096), (64, 7168), (1024, 4096), (8192, 4096),
          (8192, 7168), (8192, 8192), (32768, 4096), (32768, 8192))  # fmt: skip
EPS = 1e-6


def prepare(base: str) -> None:
    package = AB / "old_kernels"
    for source, target in SOURCES.items():
        files = subprocess.run(
            ["git", "ls-tree", "-r", "--name-only", base, source],
            cwd=ROOT, capture_output=True, text=True, check=True,
        ).stdout.split()  # fmt: skip
        for name in files:
            relative = target if name == source else f"{target}/{Path(name).relative_to(source)}"
            path = package / relative
            path.parent.mkdir(parents=True, exist_ok=True)
            blob = subprocess.run(
                ["git", "show", f"{base}:{name}"], cwd=ROOT, capture_output=True, check=True
            ).stdout
            path.write_bytes(blob)
    (package / "__init__.py").write_text(f'"""Sources of {base} for shared.bench.ab."""\n')
    print(
        f"prepared {package} from {base}; carry .ab to the GPU, then: python -m shared.bench.ab run"
    )


def _modules():
    """{"rmsnorm" | "layernorm": (base module, new module)}."""
    from kernels_jit import ModuleSpec, load_module
    from kernels_layernorm.ops.layernorm import LAYERNORM_CUDA
    from kernels_layernorm.ops.rmsnorm import RMSNORM_CUDA

    sys.path.insert(0, str(AB))
    modules = {}
    for key, new in (("rmsnorm", RMSNORM_CUDA), ("layernorm", LAYERNORM_CUDA)):
        base = ModuleSpec(
            name=f"{new.name}_base", package="old_kernels", sources=new.sources,
            exports=new.exports,
        )  # fmt: skip
        modules[key] = (load_module(base), load_module(new))
    return modules


def run() -> None:
    import torch

    from shared.bench.harness import sets_needed, time_graph

    modules = _modules()
    rms, ln = modules["rmsnorm"], modules["layernorm"]
    # op: (module pair, call on one input set (x, residual, out, weight, bias), arrays moved)
    calls = {
        "rmsnorm": (rms, lambda m, s: m.rmsnorm(s[2], s[0], s[3], EPS, -1), 2),
        "fused_add_rmsnorm": (rms, lambda m, s: m.fused_add_rmsnorm(s[0], s[1], s[3], EPS, -1), 4),
        "layernorm": (ln, lambda m, s: m.layernorm(s[2], s[0], s[3], s[4], EPS, -1), 2),
    }
    print(
        "| op | shape | base us | new us | new/base | spread base/new |\n|---|---|---|---|---|---|"
    )
    for tokens, hidden in SHAPES:
        w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)
        b = torch.randn_like(w)

        def make(t=tokens, h=hidden, w=w, b=b):
            x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
            return x, torch.randn_like(x), torch.empty_like(x), w, b

        for op, ((old, new), call, arrays) in calls.items():
            first = make()
            runs = [tuple(t.clone() for t in first) for _ in range(2)]
            call(old, runs[0])
            call(new, runs[1])
            if not all(torch.equal(a, c) for a, c in zip(*runs, strict=True)):
                print(f"{op} {tokens}x{hidden}: outputs differ from the base", flush=True)
            sets = [make() for _ in range(sets_needed(arrays * tokens * hidden * 2))]
            times: dict[str, list[float]] = {"base": [], "new": []}
            for _ in range(5):
                times["base"].append(time_graph(lambda s, m=old, f=call: f(m, s), sets))
                times["new"].append(time_graph(lambda s, m=new, f=call: f(m, s), sets))
            med = {k: statistics.median(v) for k, v in times.items()}
            spread = "/".join(f"{(max(v) - min(v)) / med[k]:.2f}" for k, v in times.items())
            print(
                f"| {op} | {tokens}x{hidden} | {med['base']:.2f} | {med['new']:.2f} | "
                f"{med['new'] / med['base']:.3f} | {spread} |",
                flush=True,
            )
            del sets


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("prepare").add_argument("--base", required=True, help="the earlier commit")
    sub.add_parser("run")
    args = parser.parse_args(argv)
    prepare(args.base) if args.command == "prepare" else run()
    return 0


if __name__ == "__main__":
    sys.exit(main())
