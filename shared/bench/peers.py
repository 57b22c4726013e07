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


@functools.cache
def compiled(reference: Callable) -> Callable:
    """``torch.compile`` of a reference (default mode: we capture the CUDA graph ourselves)."""
    return torch.compile(reference, dynamic=False)
