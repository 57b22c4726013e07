"""Benchmarks of the communication group.

Single GPU (``--group communication``): the world-size-1 path of all_reduce_add_rmsnorm (the
fused kernel's add + RMSNorm, no peers) against torch eager; bytes = read x, residual, weight,
write x and residual.

Several GPUs: ``python -m shared.bench.suites.communication`` under torchrun (one process per
GPU; shared/bench/multi_gpu_session.sh starts it) times, under CUDA graphs, custom_all_reduce
against NCCL (torch.distributed.all_reduce in the dtype) for 1 KiB..256 MiB, and
all_reduce_add_rmsnorm against NCCL all-reduce + layernorm's fused_add_rmsnorm for T <= 8192,
H 4096/8192, and writes docs/benchmarks/communication.json with the world size.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import torch

import kernels_communication as comm_ops
from shared.bench.harness import Case

DTYPE = torch.bfloat16
_COMM: dict[str, object] = {}


def _world1():
    if "w1" not in _COMM:
        _COMM["w1"] = comm_ops.CustomAllReduce(device="cuda")
    return _COMM["w1"]


def cases(quick: bool) -> Iterator[Case]:
    comm = _world1()
    tokens_list = (1, 16, 128, 2048) if quick else (1, 16, 64, 128, 512, 2048, 8192)
    for hidden in (4096, 8192):
        for tokens in tokens_list:

            def make(t=tokens, h=hidden):
                return {
                    "x": torch.randn(t, h, device="cuda", dtype=DTYPE),
                    "res": torch.randn(t, h, device="cuda", dtype=DTYPE),
                    "w": torch.randn(h, device="cuda", dtype=DTYPE),
                }

            def run(s, backend):
                comm_ops.all_reduce_add_rmsnorm(s["x"], s["res"], s["w"], 1e-6, comm,
                                                backend=backend)  # fmt: skip

            yield Case(
                op="all_reduce_add_rmsnorm",
                shape=[tokens, hidden],
                dtype=DTYPE,
                bytes=(4 * tokens * hidden + hidden) * DTYPE.itemsize,  # x, res in+out; w
                make_inputs=make,
                impls={
                    "cuda": lambda s: run(s, "cuda"),
                    "torch_eager": lambda s: run(s, "torch"),
                },
                note="world size 1 (no peers): add + RMSNorm of the fused kernel",
            )


# ---- several GPUs (torchrun) ---------------------------------------------------------------


def _time_graph(fn, iters: int = 50) -> tuple[torch.cuda.CUDAGraph, int]:
    """fn warmed up, then captured `iters` times in one CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(iters):
            fn()
    return graph, iters


def main() -> None:
    import torch.distributed as dist

    from kernels_layernorm import fused_add_rmsnorm

    dist.init_process_group("nccl")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    torch.cuda.set_device(local)
    gloo = dist.new_group(backend="gloo")
    comm = comm_ops.CustomAllReduce(gloo, device=f"cuda:{local}", max_size=8 << 20)
    big = comm_ops.CustomAllReduce(gloo, device=f"cuda:{local}", max_size=64 << 20)
    records = []

    def bench(name, impl, shape, nbytes, fn, comm_objs=()):
        graph, iters = _time_graph(fn)
        for c in comm_objs:
            c.register_graph_buffers()
        dist.barrier()
        graph.replay()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        samples = []
        for _ in range(5):
            dist.barrier()
            torch.cuda.synchronize()
            start.record()
            graph.replay()
            end.record()
            torch.cuda.synchronize()
            samples.append(start.elapsed_time(end) * 1000 / iters)
        us = sorted(samples)[len(samples) // 2]
        records.append({"op": name, "impl": impl, "shape": shape, "dtype": "bfloat16",
                        "bytes": nbytes, "us": us, "world_size": world})  # fmt: skip
        for c in comm_objs:
            c.check(sync=True)

    size = 1024
    while size <= 256 << 20:
        x = torch.randn(size // 2, device="cuda", dtype=DTYPE)
        out = torch.empty_like(x)
        for c, impl in ((comm, "cuda"), (big, "cuda_max64MiB")):
            if size <= c.max_size:
                bench("custom_all_reduce", impl, [size // 2], size,
                      lambda c=c, x=x, out=out: comm_ops.custom_all_reduce(x, c, out=out),
                      (c,))  # fmt: skip
        bench("custom_all_reduce", "nccl", [size // 2], size, lambda out=out: dist.all_reduce(out))
        size *= 4
    for hidden in (4096, 8192):
        for tokens in (1, 16, 64, 128, 512, 2048, 8192):
            x = torch.randn(tokens, hidden, device="cuda", dtype=DTYPE)
            res = torch.randn_like(x)
            w = torch.ones(hidden, device="cuda", dtype=DTYPE)
            nbytes = tokens * hidden * 2
            for c, impl in ((comm, "cuda"), (big, "cuda_max64MiB")):
                bench("all_reduce_add_rmsnorm", impl, [tokens, hidden], nbytes,
                      lambda c=c, x=x, res=res, w=w: comm_ops.all_reduce_add_rmsnorm(
                          x, res, w, 1e-6, c), (c,))  # fmt: skip

            def unfused(x=x, res=res, w=w):
                dist.all_reduce(x)
                fused_add_rmsnorm(x, res, w, 1e-6)

            bench("all_reduce_add_rmsnorm", "nccl+fused_add_rmsnorm", [tokens, hidden], nbytes,
                  unfused)  # fmt: skip
    if rank == 0:
        path = Path(os.environ.get("COMM_BENCH_OUT", "docs/benchmarks/communication.json"))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"world_size": world, "records": records}, indent=1) + "\n")
        for r in records:
            print(f"{r['op']:24s} {r['impl']:24s} {r['shape']!s:16s} {r['us']:9.2f} us")
    comm.close()
    big.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
