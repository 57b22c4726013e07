"""Peer implementations that benchmarks compare against, each only where importable."""

from __future__ import annotations

import functools
import importlib.util
from collections.abc import Callable

import torch


def has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


COMPILE_NOTE = (
    "torch_compile is torch.compile(reference) with default options: the first shape compiles "
    "static, later shapes reuse one automatic-dynamic graph (as an engine compiling once would)"
)


@functools.cache
def compiled(reference: Callable) -> Callable:
    """``torch.compile`` of a reference with default options (we capture the CUDA graph).

    Default, not ``dynamic=False``: a static graph per shape costs ~2 s of compilation per shape
    on the H200's host, which a full sweep (270 shapes) cannot afford inside one device lease.
    """
    return torch.compile(reference)
