"""The group's CUDA sources build for sm_90a through the real JIT pipeline (on every machine),
and, on the GPU, every kernel path runs clean under compute-sanitizer's memcheck."""

from __future__ import annotations

import pytest

from shared.testing.builds import compile_group_for_hopper, run_memcheck


def test_cuda_sources_compile_for_sm90a():
    assert sorted(compile_group_for_hopper("diffusion")) == [
        "group_norm_silu_cuda",
        "layernorm_scale_shift_cuda",
        "residual_gate_add_cuda",
        "timestep_embedding_cuda",
    ]


# One call per kernel path: residual_gate_add packed/scalar with each gate layout;
# layernorm_scale_shift register (1/2/4/8 vectors) and loop kernels, fp32 modulation, affine;
# timestep_embedding packed/scalar, odd dims, every t dtype; group_norm_silu one-read, streamed
# and two-kernel paths, NC* and channels-last, packed and scalar.
_MEMCHECK_SCRIPT = """
import torch
from kernels_diffusion import (group_norm_silu, layernorm_scale_shift, residual_gate_add,
                               timestep_embedding)
dev = "cuda"
for dtype in (torch.bfloat16, torch.float32):
    for b, l, h in ((1, 1, 8), (2, 5, 33), (3, 7, 256), (1, 3, 3072), (2, 2, 12288),
                    (1, 2, 40000)):
        r = torch.randn(b, l, h, device=dev).to(dtype)
        x = torch.randn(b, l, h, device=dev).to(dtype)
        for gate in (torch.randn(b, h, device=dev), torch.randn(b, 1, h, device=dev).to(dtype),
                     torch.randn(b, l, h, device=dev)):
            residual_gate_add(r, x, gate)
            residual_gate_add(r, x, gate, out=r)
            layernorm_scale_shift(x, gate, gate)
            layernorm_scale_shift(x, gate, gate, weight=gate.new_ones(h), bias=gate.new_ones(h))
        wide = torch.randn(b, l, h + 1, device=dev).to(dtype)
        residual_gate_add(wide[..., 1:], x, torch.randn(b, h, device=dev))
        layernorm_scale_shift(wide[..., 1:], x[:, :1], x)
    for t_dtype in (torch.float32, torch.int64, torch.bfloat16):
        t = (torch.rand(37, device=dev) * 1000).to(t_dtype)
        for dim in (1, 2, 7, 64, 321, 512):
            timestep_embedding(t, dim, out_dtype=dtype, downscale_freq_shift=0.5)
    for shape, groups, last in (((2, 32, 5, 7), 32, False), ((1, 128, 64, 64), 32, False),
                                ((1, 16, 16, 128), 32, True), ((3, 6), 3, True),
                                ((1, 16, 600000), 1, False), ((1, 4, 300001), 1, False)):
        x = torch.randn(*shape, device=dev).to(dtype)
        c = shape[-1] if last else shape[1]
        w, bias = torch.randn(c, device=dev), torch.randn(c, device=dev)
        group_norm_silu(x, groups, w, bias, channels_last=last)
        group_norm_silu(x, groups, w.to(dtype), bias.to(dtype), channels_last=last)
import kernels_diffusion.ops.group_norm_silu as gns
gns._STREAM_MIN_BYTES = 0  # the streamed kernel: NC* and channels-last, packed and scalar
for shape, groups, last in (((2, 32, 5, 7), 32, False), ((2, 64, 300, 300), 32, False),
                            ((1, 16, 16, 128), 32, True), ((2, 40, 40, 96), 32, True)):
    x = torch.randn(*shape, device=dev).to(torch.bfloat16)
    c = shape[-1] if last else shape[1]
    w, bias = torch.randn(c, device=dev), torch.randn(c, device=dev)
    group_norm_silu(x, groups, w, bias, channels_last=last)
gns._STAGED_MIN_BYTES = 0  # the staged kernel (sm_90+): packed NC* x
for shape, groups in (((1, 4, 8), 2), ((2, 64, 300, 300), 32), ((1, 48, 1000, 16), 3)):
    x = torch.randn(*shape, device=dev).to(torch.bfloat16)
    w, bias = torch.randn(shape[1], device=dev), torch.randn(shape[1], device=dev)
    group_norm_silu(x, groups, w, bias)
torch.cuda.synchronize()
print("done")
"""


@pytest.mark.gpu
@pytest.mark.slow
def test_memcheck_every_kernel_path():
    run_memcheck("diffusion", _MEMCHECK_SCRIPT)
