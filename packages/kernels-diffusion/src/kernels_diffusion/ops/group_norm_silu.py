"""diffusion.group_norm_silu: GroupNorm followed by SiLU (VAE and UNet blocks).

Backends: the pure-torch reference only (fp32 math, rounded once).
"""

from __future__ import annotations

import torch

from kernels_diffusion import reference
from kernels_diffusion._checks import FLOATS, check_float
from kernels_jit.dispatch import Op
from kernels_jit.validation import check_tensor

OP_ID = "diffusion.group_norm_silu"


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
    """Small random calls for ``kernels-ops check``: NCHW and channels-last, spatial size 1."""
    g = torch.Generator().manual_seed(0)
    w, b = torch.randn(64, generator=g).to(device), torch.randn(64, generator=g).to(device)
    x = torch.randn(2, 64, 5, 7, generator=g).to(torch.bfloat16).to(device)
    last = torch.randn(2, 3, 3, 64, generator=g).to(device)
    point = torch.randn(3, 64, 1, generator=g).to(device)
    return [
        ((x, 32, w, b), {}),
        ((last, 8, w, b), {"channels_last": True}),
        ((point, 16, w, b, 1e-6), {}),
    ]
