"""Session-wide test settings: a private JIT cache, and GPU tests skipped where there is no GPU."""

from __future__ import annotations

import os
import tempfile

import pytest

# Tests never touch the user's cache; one directory per test session keeps runs independent.
os.environ.setdefault("KERNELS_CACHE_DIR", tempfile.mkdtemp(prefix="kernels-test-cache-"))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run with -m gpu on the H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
