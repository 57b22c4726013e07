"""Device parameters for kernel tests: where each kind of backend can be checked.

CUDA C++ backends run only on the GPU. Triton backends also run on the CPU under Triton's
interpreter (``TRITON_INTERPRET=1``, set by ``tests/conftest.py`` when no GPU is present): that
is how the CPU CI checks a Triton kernel's indexing and masking, on small shapes.
"""

from __future__ import annotations

import importlib.util
import os

import pytest

GPU = pytest.param("cuda", marks=pytest.mark.gpu, id="cuda")

TRITON_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
needs_triton_interpreter = pytest.mark.skipif(
    importlib.util.find_spec("triton") is None or not TRITON_INTERPRETED,
    reason="needs triton with TRITON_INTERPRET=1 (the CPU run of a Triton kernel)",
)
INTERPRETER = pytest.param("cpu", marks=needs_triton_interpreter, id="interpreter")

# A Triton backend's test devices: its interpreter on the CPU, the real kernel on the GPU.
TRITON_DEVICES = [INTERPRETER, GPU]
