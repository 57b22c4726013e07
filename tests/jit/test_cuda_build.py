"""The CUDA source of elementwise.add_constant compiled for sm_90a through the real pipeline (key,
lock, nvcc build, record, publish, load of the shared object), on a machine with no GPU."""

from __future__ import annotations

import shutil

import pytest

from kernels_jit import cache, load_module, toolchain

pytestmark = pytest.mark.skipif(
    shutil.which("nvcc") is None and toolchain.cuda_home() is None, reason="needs nvcc"
)


def test_add_constant_cuda_builds_for_sm_90a(sandbox, monkeypatch):
    from kernels_elementwise.ops.add_constant import ADD_CONSTANT_CUDA

    monkeypatch.setenv("KERNELS_CUDA_ARCH", "sm_90a")
    module = load_module(ADD_CONSTANT_CUDA)  # dlopen needs no GPU
    assert module.add_constant is not None
    key = cache.cache_key(ADD_CONSTANT_CUDA)
    artifact = cache.artifact_path(ADD_CONSTANT_CUDA, key)
    assert artifact.relative_to(sandbox.cache).parts[:2] == ("sm_90a", "add_constant_cuda")
    assert "sm_90a" in str(artifact)
    assert cache.verify(artifact, key) is None
    assert cache.read_record(artifact)["arch"] == "sm_90a"
    assert b"sm_90a" in artifact.read_bytes()  # the embedded sm_90a cubin names its target
    assert "-gencode=arch=compute_90a,code=sm_90a" in (artifact.parent / "build.ninja").read_text()
