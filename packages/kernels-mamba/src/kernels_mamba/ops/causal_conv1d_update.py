"""mamba.causal_conv1d_update: one decode step of the causal conv1d, state updated in place.

CUDA: at the decode shape (L = 1, Ls = W-1, 16-byte aligned rows) a thread per (1 or, past one
wave of single rows, 4 batch rows, 16 bytes of channels): the state ([S, D, W-1] rows or the
[S, W-1, D] view), x, taps and bias as 16-byte packs, all loaded at once (the taps once for the
rows), the window shifted (or read circularly) in registers; otherwise a thread per (batch row,
channel). fp32 products and sums; the torch reference (fp32 math, rounded once) is the fallback.
"""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_tensor
from kernels_mamba import reference
from kernels_mamba._checks import (
    FLOATS,
    check_activation,
    check_conv_weight,
    check_int,
    check_vector,
)

OP_ID = "mamba.causal_conv1d_update"

CAUSAL_CONV1D_UPDATE_CUDA = ModuleSpec(
    name="causal_conv1d_update",
    package="kernels_mamba",
    sources=("csrc/causal_conv1d_update.cuh",),
    exports=(("causal_conv1d_update", "causal_conv1d_update"),),
    description="CUDA: a thread per (1 or 4 rows, 16-byte channel pack) at decode shapes, per "
    "(row, channel) otherwise, the state window in registers, fp32 math",
)
_update_kernel = CompiledFunction(CAUSAL_CONV1D_UPDATE_CUDA, "causal_conv1d_update")


def _causal_conv1d_update_torch(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    cache_seqlens: torch.Tensor | None,
    conv_state_indices: torch.Tensor | None,
    pad_slot_id: int,
) -> None:
    reference.causal_conv1d_update(
        x, conv_state, weight, bias, activation, cache_seqlens, conv_state_indices, pad_slot_id
    )


def _causal_conv1d_update_cuda(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    cache_seqlens: torch.Tensor | None,
    conv_state_indices: torch.Tensor | None,
    pad_slot_id: int,
) -> None:
    _update_kernel(
        x.unsqueeze(-1) if x.dim() == 2 else x,
        conv_state,
        weight,
        bias,
        activation is not None,
        cache_seqlens,
        conv_state_indices,
        pad_slot_id,
    )


def _causal_conv1d_update_cuda_eligible(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    activation: str | None,
    cache_seqlens: torch.Tensor | None,
    conv_state_indices: torch.Tensor | None,
    pad_slot_id: int,
) -> str | None:
    """The kernel reads x and the state in one dtype and takes at most 65535 rows."""
    if conv_state.dtype != x.dtype:
        return "needs conv_state in the dtype of x"
    if x.shape[0] > 65535:
        return "needs B <= 65535"
    for t in (cache_seqlens, conv_state_indices):
        if t is not None and t.numel() > 1 and t.stride(0) != 1:
            return "needs contiguous cache_seqlens and conv_state_indices"
    return None


CAUSAL_CONV1D_UPDATE = Op(_causal_conv1d_update_torch, mutates=("x", "conv_state"), device="x")


def causal_conv1d_update(
    x: torch.Tensor,
    conv_state: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str | None = None,
    *,
    cache_seqlens: torch.Tensor | None = None,
    conv_state_indices: torch.Tensor | None = None,
    pad_slot_id: int = -1,
    backend: str | None = None,
) -> torch.Tensor:
    """Decode-step causal conv1d: for row b with state row c (``conv_state_indices[b]`` or b),
    ``xx = concat(conv_state[c], x_b)``, ``conv_state[c] = xx[:, -Ls:]``, and the output
    ``act(conv(xx))[:, -L:]`` overwrites x (returned). With cache_seqlens the state is a circular
    buffer: the window ends at ``cache_seqlens[b] % Ls`` and x is written there. L > 1 is
    speculative decoding. Rows whose index equals pad_slot_id are untouched.

    Parameters
    ----------
    x : [B, D] or [B, D, L] float32, float16 or bfloat16, overwritten.
    conv_state : [S, D, Ls] with Ls >= W-1, updated in place.
    weight : [D, W], W in {2, 3, 4}. bias : [D] or None. activation : "silu"/"swish" or None.
    cache_seqlens : optional int32 [B] (circular state; keep L <= Ls).
    conv_state_indices : optional int32 [B] state rows, or pad_slot_id to skip.
    """
    check_tensor(OP_ID, "x", x, dtypes=FLOATS, ndim=(2, 3))
    device = x.device
    batch, dim = x.shape[:2]
    width = check_conv_weight(OP_ID, weight, bias, dim, device)
    check_tensor(OP_ID, "conv_state", conv_state, dtypes=FLOATS, ndim=3, device=device)
    if conv_state.shape[1] != dim or conv_state.shape[2] < width - 1:
        raise ValueError(
            f"{OP_ID}: conv_state must have shape [S, D, Ls] = [S, {dim}, >= {width - 1}], "
            f"got {tuple(conv_state.shape)}"
        )
    if conv_state_indices is None and conv_state.shape[0] < batch:
        raise ValueError(
            f"{OP_ID}: without conv_state_indices conv_state needs >= B = {batch} rows, "
            f"got {conv_state.shape[0]}"
        )
    check_vector(OP_ID, "cache_seqlens", cache_seqlens, batch, device)
    check_vector(OP_ID, "conv_state_indices", conv_state_indices, batch, device)
    check_activation(OP_ID, activation)
    check_int(OP_ID, "pad_slot_id", pad_slot_id)
    if x.numel():
        CAUSAL_CONV1D_UPDATE.run(
            x,
            conv_state,
            weight,
            bias,
            activation,
            cache_seqlens,
            conv_state_indices,
            pad_slot_id,
            backend=backend,
        )
    return x


def _causal_conv1d_update_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: shifted and circular states, L = 3."""
    g = torch.Generator().manual_seed(0)
    dim, width = 16, 4
    weight = torch.randn(dim, width, generator=g).to(device)
    bias = torch.randn(dim, generator=g).to(device)
    x = torch.randn(3, dim, generator=g).to(device)
    state = torch.randn(5, dim, 3, generator=g).to(device)
    idx = torch.tensor([4, -1, 0], dtype=torch.int32, device=device)
    spec = torch.randn(2, dim, 3, generator=g).to(device)
    ring = torch.randn(2, dim, 6, generator=g).to(device)
    seqlens = torch.tensor([2, 9], dtype=torch.int32, device=device)
    cases = [
        ((x, state, weight, bias, "silu"), {"conv_state_indices": idx}),
        ((spec, ring, weight, bias, None), {"cache_seqlens": seqlens}),
    ]
    for dtype in (torch.float16, torch.bfloat16):  # x and state in one dtype: the CUDA path
        cases.append(((x.to(dtype), state.to(dtype), weight, bias, "silu"), {}))
    return cases
