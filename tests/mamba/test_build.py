"""The group's CUDA sources build for sm_90a through the real JIT pipeline (on every machine),
and, on the GPU, every kernel path runs clean under compute-sanitizer's memcheck."""

from __future__ import annotations

import pytest

from shared.testing.builds import compile_group_for_hopper, run_memcheck


def test_cuda_sources_compile_for_sm90a():
    assert sorted(compile_group_for_hopper("mamba")) == [
        "causal_conv1d_fwd_cuda",
        "causal_conv1d_update_cuda",
        "selective_state_update_cuda",
    ]


# One call per kernel path: fwd channel-last CTA kernel, channel-first warp kernel (aligned and
# misaligned rows) and the scalar kernel (unaligned channel-last rows), several rounds/iterations,
# short and padded sequences; update vector path (state rows and channel-last state, shifted and
# circular) and generic path (L > 1); ssu packed/scalar, tied/full, CTA sizes, two ds slabs.
_MEMCHECK_SCRIPT = """
import torch
from kernels_mamba import causal_conv1d_fwd, causal_conv1d_update, selective_state_update
from kernels_mamba.ops import causal_conv1d_fwd as fwd_mod
dev = "cuda"
for dtype in (torch.bfloat16, torch.float32):
    for width in (2, 4):
        w = torch.randn(24, width, device=dev)
        states = torch.randn(5, 24, width - 1, device=dev, dtype=dtype)
        qsl = torch.tensor([0, 2, 2, 1500, 2600], dtype=torch.int32, device=dev)
        idx = torch.tensor([4, -1, 1, 0], dtype=torch.int32, device=dev)
        init = torch.tensor([True, True, False, True], device=dev)
        xl = torch.randn(2600, 32, device=dev, dtype=dtype)[:, :24].T
        causal_conv1d_fwd(xl, w, None, states, qsl, idx, init)
        xc = torch.randn(24, 2600, device=dev, dtype=dtype)
        causal_conv1d_fwd(xc, w, w[:, 0], states, qsl, idx, init)
        xb = torch.randn(2, 24, 77, device=dev, dtype=dtype)
        causal_conv1d_fwd(xb, w)
        default = fwd_mod._SHORT_ROW_MAX_BYTES
        fwd_mod._SHORT_ROW_MAX_BYTES = 1 << 62  # the 2-pack warp kernel over long rows
        causal_conv1d_fwd(xc, w, w[:, 0], states, qsl, idx, init)
        fwd_mod._SHORT_ROW_MAX_BYTES = -1  # the 8-pack warp kernel on short ones
        causal_conv1d_fwd(xb, w)
        fwd_mod._SHORT_ROW_MAX_BYTES = default
        xs = torch.randn(2600, 27, device=dev, dtype=dtype)[:, :24].T
        causal_conv1d_fwd(xs, w, None, states, qsl, idx, init)
        xd = torch.randn(3, 24, device=dev, dtype=dtype)
        sd = torch.randn(4, 24, width - 1, device=dev, dtype=dtype)
        sl_state = torch.randn(4, width - 1, 24, device=dev, dtype=dtype).transpose(1, 2)
        ui = torch.tensor([3, -1, 0], dtype=torch.int32, device=dev)
        sl = torch.tensor([5, 0, 9], dtype=torch.int32, device=dev)
        causal_conv1d_update(xd, sd, w.to(dtype), w[:, 0].to(dtype), "silu", conv_state_indices=ui)
        causal_conv1d_update(xd, sl_state, w, None, "silu", cache_seqlens=sl, conv_state_indices=ui)
        xu = torch.randn(3, 24, 2, device=dev, dtype=dtype)
        st = torch.randn(4, 24, width + 2, device=dev, dtype=dtype)
        ui = torch.tensor([3, -1, 0], dtype=torch.int32, device=dev)
        causal_conv1d_update(xu, st, w, None, "silu", conv_state_indices=ui)
        sl = torch.tensor([5, 0, 9], dtype=torch.int32, device=dev)
        causal_conv1d_update(xu, st, w, None, "silu", cache_seqlens=sl, conv_state_indices=ui)
    # The update vector path with several batch rows per thread (B = 258: a short last group).
    xr = torch.randn(258, 4096, device=dev, dtype=dtype)
    sr = torch.randn(260, 4096, 3, device=dev, dtype=dtype)
    ri = torch.arange(258, dtype=torch.int32, device=dev).flip(0)
    ri[::5] = -1
    causal_conv1d_update(xr, sr, torch.randn(4096, 4, device=dev, dtype=dtype), None, "silu",
                         conv_state_indices=ri)
    # B = 1 (64-thread CTAs, several tiles per head) and ds past one shared-memory slab.
    st1 = torch.randn(1, 80, 64, 128, device=dev, dtype=dtype)
    x1 = torch.randn(1, 80, 64, device=dev)
    A1 = -torch.rand(80, 1, 1, device=dev).expand(80, 64, 128)
    B1 = torch.randn(1, 1, 128, device=dev)
    selective_state_update(st1, x1, x1, A1, B1, B1, x1[0], x1, x1[0], True)
    for ds in (128, 13, 1040):
        st = torch.randn(4, 6, 40, ds, device=dev, dtype=dtype)
        x = torch.randn(3, 6, 40, device=dev)
        A = -torch.rand(6, 40, ds, device=dev)
        B = torch.randn(3, 2, ds, device=dev)
        idx = torch.tensor([3, -1, 1], dtype=torch.int32, device=dev)
        selective_state_update(st, x, x, A, B, B, state_batch_indices=idx)
        At = A[:, :1, :1].expand(6, 40, ds)
        dt = x[:, :, :1].expand(3, 6, 40)
        selective_state_update(st, x, dt, At, B, B, x[0], x, x[0], True)
torch.cuda.synchronize()
print("done")
"""


@pytest.mark.gpu
@pytest.mark.slow
def test_memcheck_every_kernel_path():
    run_memcheck("mamba", _MEMCHECK_SCRIPT)
