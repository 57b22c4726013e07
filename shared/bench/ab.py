"""A/B of the row kernels against an earlier commit, in one process on the GPU.

Sweeps compare runs on different days, whose spread (-6% to +10% for unchanged kernels) hides a
5% regression; this times the old and the new compiled kernels interleaved on the same inputs:

    python -m shared.bench.ab prepare --base 91b2b59   # here: the old sources into .ab/ (ignored)
    python -m shared.bench.ab run                      # on the GPU (carry .ab): a table of new/old

``prepare`` copies the kernels-jit C++ headers and layernorm's ``csrc/rmsnorm.cuh`` of the base
commit into ``.ab/old_kernels`` (headers at the package root, so the old sources include them
ahead of the installed ones); ``run`` builds both modules, checks that the fused outputs agree
bit for bit, and times rmsnorm and fused_add_rmsnorm (bf16) under CUDA graphs, 5 interleaved
rounds each.
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
    "packages/kernels-layernorm/src/kernels_layernorm/csrc/rmsnorm.cuh": "csrc/rmsnorm.cuh",
}
SHAPES = ((1, 4096), (16, 4096), (64, 7168), (1024, 4096), (8192, 4096), (8192, 7168),
          (8192, 8192), (32768, 7168))  # fmt: skip


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


def run() -> None:
    import torch

    from kernels_jit import ModuleSpec, load_module
    from kernels_layernorm.ops.rmsnorm import RMSNORM_CUDA
    from shared.bench.harness import sets_needed, time_graph

    sys.path.insert(0, str(AB))
    exports = (("rmsnorm", "rmsnorm"), ("fused_add_rmsnorm", "fused_add_rmsnorm"))
    old_spec = ModuleSpec(
        name="rmsnorm_base", package="old_kernels", sources=("csrc/rmsnorm.cuh",), exports=exports
    )
    old, new = load_module(old_spec), load_module(RMSNORM_CUDA)
    eps = 1e-6
    print(
        "| op | shape | base us | new us | new/base | spread base/new |\n|---|---|---|---|---|---|"
    )
    for tokens, hidden in SHAPES:
        w = torch.randn(hidden, device="cuda", dtype=torch.bfloat16)

        def make(t=tokens, h=hidden):
            x = torch.randn(t, h, device="cuda", dtype=torch.bfloat16)
            return x, torch.randn_like(x), torch.empty_like(x)

        x, r, _ = make()
        xo, ro, xn, rn = x.clone(), r.clone(), x.clone(), r.clone()
        old.fused_add_rmsnorm(xo, ro, w, eps, -1)
        new.fused_add_rmsnorm(xn, rn, w, eps, -1)
        if not (torch.equal(xo, xn) and torch.equal(ro, rn)):
            print(f"fused_add_rmsnorm {tokens}x{hidden}: outputs differ from the base", flush=True)

        def fused(module, w=w):
            return lambda s: module.fused_add_rmsnorm(s[0], s[1], w, eps, -1)

        def plain(module, w=w):
            return lambda s: module.rmsnorm(s[2], s[0], w, eps, -1)

        calls = {"fused_add_rmsnorm": (fused, 4), "rmsnorm": (plain, 2)}
        for op, (bind, arrays) in calls.items():
            sets = [make() for _ in range(sets_needed(arrays * tokens * hidden * 2))]
            times: dict[str, list[float]] = {"base": [], "new": []}
            for _ in range(5):
                times["base"].append(time_graph(bind(old), sets))
                times["new"].append(time_graph(bind(new), sets))
            med = {k: statistics.median(v) for k, v in times.items()}
            spread = "/".join(f"{(max(v) - min(v)) / med[k]:.2f}" for k, v in times.items())
            print(
                f"| {op} | {tokens}x{hidden} | {med['base']:.2f} | {med['new']:.2f} | "
                f"{med['new'] / med['base']:.3f} | {spread} |",
                flush=True,
            )


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
