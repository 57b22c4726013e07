"""Side-by-side kernel timing on one GPU: every implementation of an op on the same inputs, in one
run, next to the measured copy bandwidth.

Method (DESIGN.md section 7):
- Each call is captured in a CUDA graph and replayed, so the host's launch cost (6-14 us on the
  H200's host for a tvm-ffi, eager or Triton launch) is not what we measure.
- Inputs rotate over enough independent sets that their bytes exceed 3x the L2 (60 MB on the
  H200), so a large shape cannot be served from L2; decode shapes, which fit in L2 anyway in an
  engine, rotate over at most ``MAX_SETS`` sets.
- Outputs are distinct per call: what an implementation returns is held until capture ends, so
  one that allocates its outputs writes as many buffers as one given preallocated outputs.
- Warm-up runs (JIT builds, Triton autotuning, torch.compile) happen before capture; the reported
  time is the median over replays of (replay time / calls in the graph); no ``.clone()`` is timed.
  Capture runs under ``torch.compiler.set_stance("fail_on_recompile")``: a torch.compile peer
  that would compile inside the graph is reported skipped instead.
- An implementation may carry ``record_extra`` (a dict, read after timing: e.g. the torch.compile
  mode and compile time, a peer's check against the reference); it goes into the record.
- Beside each case torch's fp32 elementwise kernel moving the same bytes is timed the same way
  (``copy_us`` of every record): a reference for an op of that traffic at that shape. It is not
  a floor: at decode shapes launch and memory latency set it, and PDL-launched kernels beat it.
- Each timed region starts behind a GPU-side spin (``torch.cuda._sleep``), so the start event, the
  graph launch and the end event are all queued before the GPU reaches them: the host's graph
  launch latency (several us on the H200's host) is not counted in a one-call graph of a large
  shape.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

L2_BYTES = 60 * 2**20  # H200; read at run time where torch exposes it
MAX_SETS = 64
REPLAYS = 10
WARMUP_CALLS = 3
EAGER_BUDGET_S = 3.0  # time_eager's warm-up and repeats of one slow reference, about
# GPU cycles to spin before each timed region (~0.25 ms at the H200's clock): longer than the
# host takes to enqueue the start event, a graph launch and the end event.
SPIN_CYCLES = 500_000


@dataclass
class Case:
    """One op at one shape and dtype, with every implementation to time.

    ``make_inputs()`` returns one fresh set of inputs on the GPU; each impl takes such a set and
    runs the op once (outputs preallocated inside the set where the op allows it). ``bytes`` is
    the minimum traffic: every input read once, every output written once. ``flops`` (optional,
    for compute-bound ops such as GEMMs) is the useful floating-point work of one call; where set,
    each record gets ``tflops`` beside its bandwidth.
    """

    op: str
    shape: list[int]
    dtype: torch.dtype
    bytes: int
    make_inputs: Callable[[], Any]
    impls: dict[str, Callable[[Any], Any]]
    note: str = ""
    flops: int = 0


@dataclass
class Record:
    op: str
    impl: str
    shape: list[int]
    dtype: str
    us: float
    gbps: float
    pct_of_copy: float
    # copy_us: torch_copy_us of the case's bytes, measured beside it
    extra: dict = field(default_factory=dict)

    def as_json(self) -> dict:
        record = {
            "op": self.op,
            "impl": self.impl,
            "shape": self.shape,
            "dtype": self.dtype,
            "us": round(self.us, 3),
            "gbps": round(self.gbps, 1),
            "pct_of_copy": round(self.pct_of_copy, 1),
        }
        record.update(self.extra)
        return record


def l2_bytes() -> int:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return int(getattr(props, "L2_cache_size", L2_BYTES) or L2_BYTES)


def sets_needed(case_bytes: int) -> int:
    return max(1, min(MAX_SETS, math.ceil(3 * l2_bytes() / max(case_bytes, 1))))


def time_graph(fn: Callable[[Any], Any], input_sets: list[Any]) -> float:
    """Median microseconds per call of ``fn`` rotating over ``input_sets``, under a CUDA graph."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(WARMUP_CALLS):
            for inputs in input_sets[:2]:
                fn(inputs)
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with no_compile_in_capture(), torch.cuda.graph(graph):
        # Every call's outputs stay alive until capture ends, so each call writes its own memory:
        # an implementation that allocates its outputs would otherwise get the block the previous
        # call just freed, and rewrite one L2-resident buffer where preallocated outputs (ours,
        # one per input set) go to HBM.
        outputs = [fn(inputs) for inputs in input_sets]
    graph.replay()
    torch.cuda.synchronize()
    us = median_us(graph.replay, REPLAYS) / len(input_sets)
    del graph, outputs
    return us


def _capture_fault(exc: BaseException) -> bool:
    """Did ``exc`` come from an operation that a CUDA graph cannot capture (a host sync)?"""
    text = str(exc).lower()
    return "capture" in text and "fail_on_recompile" not in text


def time_eager(fn: Callable[[Any], Any], input_sets: list[Any]) -> float:
    """Median microseconds per call of ``fn`` over ``input_sets``, launched eagerly (for an
    implementation that syncs with the host and so cannot be captured). A reference that takes
    milliseconds a call (a host-synced Python loop: the LP solver's 50 iterations) rotates over
    fewer sets, so that its warm-up and repeats stay within about EAGER_BUDGET_S; at that scale
    the L2 residency the rotation guards against is immaterial."""
    torch.cuda.synchronize()
    fn(input_sets[0])  # a first call may compile or autotune: not the call that is sized
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn(input_sets[-1])
    torch.cuda.synchronize()
    once = time.perf_counter() - start
    calls_per_set = WARMUP_CALLS + max(5, REPLAYS // 4)
    input_sets = input_sets[
        : max(1, min(len(input_sets), int(EAGER_BUDGET_S / (calls_per_set * once))))
    ]

    def run() -> None:
        for inputs in input_sets:
            fn(inputs)

    for _ in range(WARMUP_CALLS):
        run()
    torch.cuda.synchronize()
    return median_us(run, max(5, REPLAYS // 4)) / len(input_sets)


def no_compile_in_capture() -> contextlib.AbstractContextManager:
    """Any torch.compile (re)compilation raises while this is active: every compile belongs in the
    warm-up, outside capture (torch >= 2.6; a no-op before)."""
    compiler = getattr(torch, "compiler", None)
    if compiler is None or not hasattr(compiler, "set_stance"):
        return contextlib.nullcontext()
    return compiler.set_stance("fail_on_recompile")


def median_us(run: Callable[[], Any], repeats: int) -> float:
    """Median GPU microseconds of ``run()`` between two events, each time behind a GPU spin, so
    that the host's launch latency falls inside the spin instead of the timed region."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(repeats):
        torch.cuda._sleep(SPIN_CYCLES)
        start.record()
        run()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return statistics.median(samples)


def copy_gbps(nbytes: int = 2**30, repeats: int = 20) -> float:
    """Device-to-device copy bandwidth (read + write counted) of a ``nbytes`` fp32 buffer.

    Timed eagerly with CUDA events, not in a graph: a graph turns ``copy_`` into a memcpy node
    that the copy engines serve at 2.75 TB/s on the H200, where the eager copy kernel reaches
    about 4.2 TB/s (both measured 2026-12-02). A spin ahead of each copy keeps the launch out.
    """
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    return 2 * nbytes / median_us(lambda: dst.copy_(src), repeats) / 1e3


def torch_copy_us(nbytes: int) -> float:
    """Microseconds per call of torch's elementwise kernel (fp32 ``neg``) moving ``nbytes`` (half
    read, half written), timed like an op (graph, rotated sets). At large shapes it runs at the
    copy bandwidth; at decode shapes launch and latency set it, and PDL kernels can beat it."""
    numel = max(1, nbytes // 8)  # fp32 in and out
    sets = [
        (torch.empty(numel, device="cuda"), torch.empty(numel, device="cuda"))
        for _ in range(sets_needed(nbytes))
    ]
    return time_graph(lambda s: torch.neg(s[0], out=s[1]), sets)


def run_case(case: Case, copy: float, on_impl: Callable[[str], None] | None = None) -> list[Record]:
    copy_us = torch_copy_us(case.bytes)
    sets = [case.make_inputs() for _ in range(sets_needed(case.bytes))]
    records = []
    for name, fn in case.impls.items():
        if on_impl:
            on_impl(name)
        timing = "graph"
        try:
            try:
                us = time_graph(fn, sets)
            except Exception as exc:
                if not _capture_fault(exc):
                    raise
                # A host sync inside (a reference validating on the host): what a user of it
                # gets is its eager time, launches and syncs included; the record says so.
                print(f"  {case.op} {case.shape} {name}: not capturable, timed eagerly")
                timing = "eager (not capturable)"
                us = time_eager(fn, sets)
        except Exception as exc:  # a peer that cannot run this shape is reported, not fatal
            print(f"  {case.op} {case.shape} {name}: skipped ({type(exc).__name__}: {exc})")
            continue
        gbps = case.bytes / us / 1e3
        extra = {"copy_us": round(copy_us, 3)}
        if case.note:  # what tells cases of one op, shape and dtype apart (the report keys on it)
            extra["note"] = case.note
        if timing != "graph":
            extra["timing"] = timing
        if case.flops:
            extra["tflops"] = round(case.flops / us / 1e6, 2)
        extra.update(getattr(fn, "record_extra", None) or {})
        records.append(
            Record(
                case.op,
                name,
                list(case.shape),
                str(case.dtype).removeprefix("torch."),
                us,
                gbps,
                100 * gbps / copy,
                extra,
            )
        )
    del sets
    torch.cuda.empty_cache()
    return records


def host_cost_us(fns: dict[str, Callable[[], Any]], calls: int = 5000, rounds: int = 15) -> dict:
    """Host microseconds per call of each function (tiny inputs, so the enqueue is the cost).

    The functions are timed in interleaved rounds and each keeps its fastest round, so drift on a
    shared host (the H200's host varied 0.7-2.4 us between runs when timed one after the other)
    hits every function alike.
    """
    best = dict.fromkeys(fns, float("inf"))
    for fn in fns.values():
        for _ in range(500):
            fn()
    torch.cuda.synchronize()
    for _ in range(rounds):
        for name, fn in fns.items():
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            best[name] = min(best[name], (time.perf_counter() - start) / calls * 1e6)
            torch.cuda.synchronize()
    return {name: round(us, 3) for name, us in best.items()}


def count_cases(cases: Iterable[Case]) -> int:
    return sum(1 for _ in cases)
