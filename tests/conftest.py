"""Session-wide test settings: a private JIT cache, and GPU tests skipped where there is no GPU."""

from __future__ import annotations

import os
import tempfile

import pytest

# Tests never touch the user's cache; one directory per test session keeps runs independent.
os.environ.setdefault("KERNELS_CACHE_DIR", tempfile.mkdtemp(prefix="kernels-test-cache-"))


def _has_gpu() -> bool:
    try:
        import torch

        return torch.cuda.is_available()
    except ImportError:
        return False


# Without a GPU, Triton kernels run in Triton's interpreter on CPU tensors (shared/testing/
# devices.py); this must be set before triton is first imported, hence here.
if not _has_gpu():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _gpu_count() -> int:
    try:
        import torch

        return torch.cuda.device_count() if torch.cuda.is_available() else 0
    except ImportError:
        return 0


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _gpu_count() < 2:
        multi = pytest.mark.skip(reason="needs at least 2 CUDA GPUs (run with -m multigpu)")
        for item in items:
            if "multigpu" in item.keywords:
                item.add_marker(multi)
    if _has_gpu():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (run with -m gpu on the H200)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
