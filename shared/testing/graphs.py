"""CUDA graph capture for kernel tests."""

from __future__ import annotations

from collections.abc import Callable

import torch


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
