"""Run one benchmark case's implementation a few times, plainly, for a profiler to watch.

    ncu --section SpeedOfLight ... python -m shared.bench.profile_op --group mamba \\
        --op selective_state_update --shape 64,80,64,128 [--dtype bfloat16] [--impl cuda]

The case (inputs, the call) is the benchmark suite's own, so a profile shows exactly what the
benchmark timed; without CUDA graphs, one launch per call: ``--warmup`` calls first (JIT build,
Triton autotune, caches), then ``--calls`` between ``cudaProfilerStart``/``Stop`` (profile with
``ncu --profile-from-start off``). ``gpu_session.sh``'s ``PROFILE`` runs this under ncu for a list
of cases in one device call.
"""

from __future__ import annotations

import argparse
import sys

import torch

from shared.bench import suites


def find_case(group: str, op: str, shape: list[int], dtype: str | None):
    everything = suites.cases(group, False)
    found = [
        c
        for c in everything
        if c.op == op
        and list(c.shape) == shape
        and (dtype is None or str(c.dtype).removeprefix("torch.") == dtype)
    ]
    if not found:
        listed = sorted({f"{c.op} {list(c.shape)} {c.dtype}" for c in everything})
        wanted = f"{op} {shape} {dtype or ''}"
        raise SystemExit(f"no {group} case {wanted}; cases:\n" + "\n".join(listed))
    return found[0]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--group", required=True)
    parser.add_argument("--op", required=True)
    parser.add_argument("--shape", required=True, help="comma-separated, as the suite names it")
    parser.add_argument("--dtype", help="e.g. bfloat16 (default: the first case of that shape)")
    parser.add_argument("--impl", default="cuda", help="cuda (ours) or a peer's name")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args(argv)
    shape = [int(s) for s in args.shape.split(",")]
    case = find_case(args.group, args.op, shape, args.dtype)
    if args.impl not in case.impls:
        raise SystemExit(f"{args.op} {shape}: no impl {args.impl!r} (has {sorted(case.impls)})")
    fn, inputs = case.impls[args.impl], case.make_inputs()
    for _ in range(args.warmup):
        fn(inputs)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStart()
    for _ in range(args.calls):
        fn(inputs)
    torch.cuda.synchronize()
    torch.cuda.cudart().cudaProfilerStop()
    print(f"profiled {args.calls} call(s) of {args.impl} {args.op} {shape} {case.dtype}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
