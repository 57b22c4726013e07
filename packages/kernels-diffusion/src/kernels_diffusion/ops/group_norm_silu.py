"""diffusion.group_norm_silu: GroupNorm followed by SiLU (VAE and UNet blocks).

Backends: CUDA (groups split across CTAs when N x G under-fills the GPU: for x larger than L2 a
streamed kernel that reads each tile for its statistics and again, from L2, a group later to
normalise it (or, where _STAGED_MIN_BYTES allows, a staged kernel holding each tile in shared
memory between the two); else one read of x where a group's tiles can all be resident,
register-held tiles that wait for their group's statistics; else two kernels, partial sums then
the normalisation; contiguous NC* or channels-last x) and the pure-torch reference (fp32 math,
rounded once).
"""

from __future__ import annotations

import torch

from kernels_diffusion import reference
from kernels_diffusion._checks import FLOATS, check_float
from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_tensor

OP_ID = "diffusion.group_norm_silu"

GROUP_NORM_SILU_CUDA = ModuleSpec(
    name="group_norm_silu",
    package="kernels_diffusion",
    sources=("csrc/group_norm_silu.cuh",),
    exports=(("group_norm_silu", "group_norm_silu"),),
    description="CUDA: GroupNorm + SiLU, groups split across CTAs (partial sums, normalise)",
)

_group_norm_silu_kernels = CompiledFunction(GROUP_NORM_SILU_CUDA, "group_norm_silu")
# CTAs per group at most; the C++ side takes fewer when N x G already fills the GPU.
_MAX_SPLITS = 128
# Units (packs or elements) per tile of the one-read and streamed kernels (kFusedTile and
# kStreamTile in the source).
_FUSED_TILE = 2048
# x of at least this many bytes takes the streamed kernel (its second read of each tile hits L2
# while x itself does not fit there: the H200's L2 is 50 MB). Negative: never. Tests lower it.
_STREAM_MIN_BYTES = 32 << 20
# The streamed kernel's lag beyond one group of tiles, in eighths of its grid (kStreamLagEighths
# in the source): a norm tile then rarely waits for its group's statistics. Tests set 0.
_STREAM_LAG_EIGHTHS = 5
# x (packed NC*, sm_90+) of at least this many bytes takes the staged kernel instead: each tile
# held in shared memory between its two reads (x read from DRAM once whatever L2 keeps).
# Negative: never. Tests lower it. Timed against the streamed kernel (bf16, us, 2026-12-05):
# [1, 128, 20, 256, 256] (320 MiB) H200 284.5 -> 251.8, H100 324.6 -> 280.6; [1, 512, 256, 256]
# (64 MiB) H100 72.4 -> 65.9; [1, 256, 512, 512] (128 MiB) H100 136.9 -> 121.8; so every x the
# streamed kernel would take ([2, 256, 64, 64], 4 MiB, not: 9.4 -> 10.1 on the H200).
_STAGED_MIN_BYTES = _STREAM_MIN_BYTES


def _group_norm_silu_cuda(
    out: torch.Tensor,
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
    channels_last: bool,
) -> None:
    # The per-CTA partial sums live in a workspace from torch's caching allocator (the C++
    # entry allocates nothing); every slot that is read is written first, so no zeroing. The
    # one-read kernel needs 2 floats per tile of 2048 units (at most N * G + numel / 2048 tiles)
    # and zeroed arrival counters, one per group; the streamed kernel the same and one more
    # counter (its tickets); the staged kernel those and a zeroed 8-byte word per group (its
    # statistics, from an 8-byte aligned offset). Zeroed per call: a memset node in CUDA graphs,
    # so every replay starts from zero.
    groups = x.shape[0] * num_groups
    max_splits = max(1, min(_MAX_SPLITS, 4096 // max(groups, 1)))
    floats = 2 * max(groups * max_splits, groups + x.numel() // _FUSED_TILE + 1)
    workspace = torch.empty(floats, dtype=torch.float32, device=x.device)
    arrived = torch.zeros(3 * groups + 2, dtype=torch.int32, device=x.device)
    _group_norm_silu_kernels(
        out,
        x,
        num_groups,
        weight,
        bias,
        eps,
        channels_last,
        workspace,
        arrived,
        max_splits,
        _STREAM_MIN_BYTES,
        _STREAM_LAG_EIGHTHS,
        _STAGED_MIN_BYTES,
    )


def _group_norm_silu_cuda_eligible(
    out: torch.Tensor,
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
    channels_last: bool,
) -> str | None:
    if not (x.is_contiguous() and out.is_contiguous()):
        return "needs contiguous x and out"
    if weight.dtype != bias.dtype or (weight.dtype not in (x.dtype, torch.float32)):
        return "needs weight and bias of one dtype, x's or float32"
    if not (weight.is_contiguous() and bias.is_contiguous()):
        return "needs contiguous weight and bias"
    if eps < 0:
        return "needs eps >= 0"
    return None


def _group_norm_silu_torch(
    out: torch.Tensor,
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float,
    channels_last: bool,
) -> None:
    out.copy_(reference.group_norm_silu(x, num_groups, weight, bias, eps, channels_last))


GROUP_NORM_SILU = Op(_group_norm_silu_torch, mutates=("out",), device="x")


def group_norm_silu(
    x: torch.Tensor,
    num_groups: int,
    weight: torch.Tensor,
    bias: torch.Tensor,
    eps: float = 1e-5,
    *,
    channels_last: bool = False,
    backend: str | None = None,
) -> torch.Tensor:
    """``silu(GroupNorm(x) * weight + bias)``: fp32 mean and biased variance over the C/G
    channels and all spatial positions of each sample and group; rounded once to x's dtype.

    Parameters
    ----------
    x : [N, C, *spatial] float32, float16 or bfloat16, or [N, *spatial, C] with channels_last.
    num_groups : G, with C % G == 0.
    weight, bias : [C].
    eps : added to the variance.
    channels_last : x (and the output) hold channels in the last dim.
    backend : force ``cuda`` or ``torch`` instead of the best eligible one.

    The CUDA backend takes contiguous x (NC* or channels-last) with weight and bias of one
    dtype, x's or float32; other calls run on the reference.
    """
    check_tensor(OP_ID, "x", x, dtypes=FLOATS)
    if x.dim() < 2:
        raise ValueError(f"{OP_ID}: x must have >= 2 dims [N, C, ...], got shape {tuple(x.shape)}")
    channels = x.shape[-1] if channels_last else x.shape[1]
    if isinstance(num_groups, bool) or not isinstance(num_groups, int):
        raise TypeError(f"{OP_ID}: num_groups must be an int, got {type(num_groups).__name__}")
    if num_groups < 1 or channels % num_groups:
        raise ValueError(
            f"{OP_ID}: num_groups must be >= 1 and divide C = {channels}, got {num_groups}"
        )
    for name, v in (("weight", weight), ("bias", bias)):
        check_tensor(OP_ID, name, v, dtypes=FLOATS, ndim=1, device=x.device)
        if v.shape[0] != channels:
            raise ValueError(f"{OP_ID}: {name} must have C = {channels} entries, got {v.shape[0]}")
    eps = check_float(OP_ID, "eps", eps)
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    if x.numel():
        GROUP_NORM_SILU.run(
            out, x, num_groups, weight, bias, eps, bool(channels_last), backend=backend
        )
    return out


def _group_norm_silu_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: every dtype, NCHW and channels-last (packed
    and scalar), x-dtype and fp32 weights, spatial size 1."""
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(64, generator=g).to(device), torch.randn(64, generator=g).to(device)
    cases: list[tuple[tuple, dict]] = []
    for dtype in FLOATS:
        x = torch.randn(2, 64, 5, 8, generator=g).to(dtype).to(device)
        last = torch.randn(2, 3, 3, 64, generator=g).to(dtype).to(device)
        cases.append(((x, 32, w, b), {}))
        cases.append(((last, 8, w.to(dtype), b.to(dtype)), {"channels_last": True}))
    odd = torch.randn(2, 64, 5, 7, generator=g).to(torch.bfloat16).to(device)
    point = torch.randn(3, 64, 1, generator=g).to(device)
    cases.append(((odd, 32, w, b), {}))
    cases.append(((point, 16, w, b, 1e-6), {}))
    return cases
