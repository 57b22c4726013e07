"""CUDA graph capture for kernel tests."""

from __future__ import annotations

from collections.abc import Callable

import torch

from shared.testing.inputs import poison, randn


def eager_and_replayed(
    calls: dict[str, Callable[[], object]],
) -> tuple[dict, dict, torch.cuda.CUDAGraph]:
    """(eager results, results of one replay of a graph capturing every call, the graph).

    The eager run comes first, so modules are built and loaded before the capture.
    """
    eager = {name: fn() for name, fn in calls.items()}
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = {name: fn() for name, fn in calls.items()}
    graph.replay()
    torch.cuda.synchronize()
    return eager, captured, graph


def assert_pdl_chain_matches_eager(
    call: Callable[[int, torch.Tensor, torch.Tensor, bool], object],
    xs: list[torch.Tensor],
    n: int,
    out_dtype: torch.dtype,
    trials: int = 3,
) -> None:
    """A CUDA graph of PDL calls whose input was just written by the kernel right before each
    replays bit for bit as the same calls made eagerly without PDL (for kernels that read other
    operands before griddepcontrol.wait and only ``xs[i]`` after it).

    ``call(i, x, out, enable_pdl)`` runs step i on ``x = xs[i]`` ([M, K], an even number of
    steps) into ``out`` ([M, n] of ``out_dtype``). ``xs[i]`` was just written by: even steps, a
    torch kernel (a dtype-converting copy, whose dependents launch as its blocks exit) rewriting
    it whole from a new fp32 source each trial; odd steps, the previous call, writing its output
    into the first n columns of ``xs[i]``.
    """
    steps = len(xs)
    m, k = xs[0].shape
    device = xs[0].device
    srcs = [torch.empty(m, k, device=device) for _ in range(steps)]
    outs = [torch.empty(m, n, device=device, dtype=out_dtype) for _ in range(steps)]

    def calls(pdl: bool) -> None:
        for i in range(steps):
            if i % 2 == 0:
                xs[i].copy_(srcs[i])  # fp32 -> x's dtype: a kernel, not a memcpy node
            out = xs[i + 1][:, :n] if i % 2 == 0 else outs[i]
            call(i, xs[i], out, pdl)

    def written() -> list[torch.Tensor]:
        return [xs[i] if i % 2 == 0 else xs[i][:, :n] for i in range(steps)] + outs[1::2]

    calls(False)  # built before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls(True)
    for trial in range(trials):
        for i, src in enumerate(srcs):
            src.copy_(randn(m, k, device=device, seed=100 * trial + i))
        calls(False)
        expected = [t.clone() for t in written()]
        for t in written():
            poison(t)
        graph.replay()
        torch.cuda.synchronize()
        for i, (got, want) in enumerate(zip(written(), expected, strict=True)):
            assert torch.equal(got, want), f"trial {trial}: tensor {i} differs from the eager calls"
