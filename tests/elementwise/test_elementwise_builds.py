"""Every CUDA module of the elementwise group builds for sm_90a through the real JIT pipeline."""

from __future__ import annotations

from shared.testing.builds import compile_group_for_hopper


def test_every_cuda_module_compiles_for_sm90a():
    assert compile_group_for_hopper("elementwise") == [
        "add_constant_cuda",
        "fused_dual_residual_rmsnorm_cuda",
        "gate_sigmoid_mul_add_cuda",
        "sigmoid_mul_cuda",
        "softcap_cuda",
    ]
