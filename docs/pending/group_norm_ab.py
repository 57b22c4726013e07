"""In-process A/B of the streamed group_norm_silu kernel (patch 03) on the GPU machine.

Its C++ entry gained an argument, so ``shared.bench.ab`` cannot swap in main's build; the old paths
are in the same binary instead: ``_STREAM_MIN_BYTES = -1`` never streams, 0 always does.

    python docs/pending/group_norm_ab.py   # with gpu_session.sh's PYTHONPATH and cache
"""

import statistics

import kernels_diffusion.ops.group_norm_silu as op_module
from shared.bench.harness import sets_needed, time_graph
from shared.bench.suites.diffusion import group_norm_silu_cases

DEFAULT = op_module._STREAM_MIN_BYTES
print("| shape | never streamed (-1) us | default threshold us | always streamed (0) us |")
print("|---|---|---|---|")
for case in group_norm_silu_cases(False):
    sets = [case.make_inputs() for _ in range(sets_needed(case.bytes))]
    times: dict[int, list[float]] = {-1: [], DEFAULT: [], 0: []}
    for _ in range(3):
        for threshold, timed in times.items():
            op_module._STREAM_MIN_BYTES = threshold
            timed.append(time_graph(case.impls["cuda"], sets))
    medians = " | ".join(f"{statistics.median(v):.2f}" for v in times.values())
    print(f"| {case.shape} | {medians} |", flush=True)
    del sets
op_module._STREAM_MIN_BYTES = DEFAULT
