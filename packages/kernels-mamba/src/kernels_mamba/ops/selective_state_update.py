# ruff: noqa: N803
# A, B, C, D are the names of the Mamba paper and of every public implementation of this op.
"""mamba.selective_state_update: one Mamba-2 decode step of the SSM state, in place.

CUDA: a CTA of 64-256 threads per (head_dim tile, head, batch row); the state streamed once
(16-byte packs, four rows in flight per thread, issued first), the small inputs (dt', exp(dt' A)
for a per-head A, x, D x, silu(z) per row; B and C per slab of ds) staged once per CTA in shared
memory as one batch of loads, fp32 math, y reduced by warp shuffles. The torch reference (fp32
math, rounded once) is the fallback.
"""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_out, check_tensor
from kernels_mamba import reference
from kernels_mamba._checks import FLOATS, check_int, check_shape, check_vector

OP_ID = "mamba.selective_state_update"

SELECTIVE_STATE_UPDATE_CUDA = ModuleSpec(
    name="selective_state_update",
    package="kernels_mamba",
    sources=("csrc/selective_state_update.cuh",),
    exports=(("selective_state_update", "selective_state_update"),),
    description="CUDA: a CTA per (row tile, head, batch row), state streamed once, inputs in smem",
)
_selective_state_update_cuda = CompiledFunction(
    SELECTIVE_STATE_UPDATE_CUDA, "selective_state_update"
)


def _selective_state_update_torch(
    out: torch.Tensor,
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    dt_softplus: bool,
    state_batch_indices: torch.Tensor | None,
    pad_slot_id: int,
) -> None:
    reference.selective_state_update(
        state,
        x,
        dt,
        A,
        B,
        C,
        D,
        z,
        dt_bias,
        dt_softplus,
        state_batch_indices,
        pad_slot_id,
        out,
    )


def _selective_state_update_cuda_eligible(
    out: torch.Tensor,
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None,
    z: torch.Tensor | None,
    dt_bias: torch.Tensor | None,
    dt_softplus: bool,
    state_batch_indices: torch.Tensor | None,
    pad_slot_id: int,
) -> str | None:
    """Grid limits (B and nh <= 65535) and a contiguous index vector."""
    if x.shape[0] > 65535 or state.shape[1] > 65535:
        return "needs B <= 65535 and nh <= 65535"
    t = state_batch_indices
    if t is not None and t.numel() > 1 and t.stride(0) != 1:
        return "needs a contiguous state_batch_indices"
    return None


SELECTIVE_STATE_UPDATE = Op(_selective_state_update_torch, mutates=("out", "state"), device="x")


def selective_state_update(
    state: torch.Tensor,
    x: torch.Tensor,
    dt: torch.Tensor,
    A: torch.Tensor,
    B: torch.Tensor,
    C: torch.Tensor,
    D: torch.Tensor | None = None,
    z: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    dt_softplus: bool = False,
    *,
    state_batch_indices: torch.Tensor | None = None,
    pad_slot_id: int = -1,
    out: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Mamba-2 SSM decode step. Head h uses group ``h // (nh / ng)``;
    ``dt' = dt + dt_bias`` (softplus'd if dt_softplus: ``dt' if dt' > 20 else log1p(exp(dt'))``);
    ``state = state * exp(dt' A) + (dt' B) x``; ``y = sum_ds state * C + D x``; ``y *= silu(z)``.
    fp32 math; the state is stored back in its own dtype.

    Parameters
    ----------
    state : [S, nh, hd, ds] float32 or bfloat16 (or float16), updated in place.
    x, dt : [B, nh, hd]. A : [nh, hd, ds] (stride-0 expansions of per-head scalars are fine).
    B, C : [B, ng, ds] with nh % ng == 0. D : [nh, hd] or None. z : [B, nh, hd] or None.
    dt_bias : [nh, hd] or None.
    state_batch_indices : int32 [B] state rows (default: row b); rows equal to pad_slot_id are
        skipped (state and output row untouched).
    out : optional [B, nh, hd] destination in the dtype of x.

    Returns
    -------
    out [B, nh, hd] in the dtype of x (skipped rows: zeros when allocated here).
    """
    check_tensor(OP_ID, "state", state, dtypes=FLOATS, ndim=4)
    device = state.device
    slots, heads, head_dim, dstate = state.shape
    check_tensor(OP_ID, "x", x, dtypes=FLOATS, ndim=3, device=device)
    batch = x.shape[0]
    check_shape(OP_ID, "x", x, (batch, heads, head_dim), device)
    check_shape(OP_ID, "dt", dt, (batch, heads, head_dim), device)
    check_shape(OP_ID, "A", A, (heads, head_dim, dstate), device)
    check_tensor(OP_ID, "B", B, dtypes=FLOATS, ndim=3, device=device)
    groups = B.shape[1]
    if groups < 1 or heads % groups:
        raise ValueError(
            f"{OP_ID}: B must be [B, ng, ds] with ng dividing nh = {heads}, got {tuple(B.shape)}"
        )
    check_shape(OP_ID, "B", B, (batch, groups, dstate), device)
    check_shape(OP_ID, "C", C, (batch, groups, dstate), device)
    if D is not None:
        check_shape(OP_ID, "D", D, (heads, head_dim), device)
    if z is not None:
        check_shape(OP_ID, "z", z, (batch, heads, head_dim), device)
    if dt_bias is not None:
        check_shape(OP_ID, "dt_bias", dt_bias, (heads, head_dim), device)
    check_vector(OP_ID, "state_batch_indices", state_batch_indices, batch, device)
    if state_batch_indices is None and slots < batch:
        raise ValueError(
            f"{OP_ID}: without state_batch_indices state needs >= B = {batch} rows, got {slots}"
        )
    check_int(OP_ID, "pad_slot_id", pad_slot_id)
    if out is None:
        alloc = torch.empty if state_batch_indices is None else torch.zeros
        out = alloc(batch, heads, head_dim, dtype=x.dtype, device=device)
    else:
        check_out(OP_ID, out, like=x)
    if x.numel():
        SELECTIVE_STATE_UPDATE.run(
            out,
            state,
            x,
            dt,
            A,
            B,
            C,
            D,
            z,
            dt_bias,
            bool(dt_softplus),
            state_batch_indices,
            pad_slot_id,
            backend=backend,
        )
    return out


def _selective_state_update_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: tied per-head A/dt/D (stride 0), two groups,
    a padded slot, bf16 state."""
    g = torch.Generator().manual_seed(0)
    batch, heads, head_dim, dstate, groups = 3, 4, 8, 12, 2

    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(device)

    state = rnd(5, heads, head_dim, dstate).to(torch.bfloat16)
    x, dt, z = rnd(batch, heads, head_dim), rnd(batch, heads, head_dim, scale=0.5), rnd(3, 4, 8)
    A = (-torch.rand(heads, generator=g).to(device))[:, None, None].expand(heads, head_dim, dstate)
    D = rnd(heads)[:, None].expand(heads, head_dim)
    dt_bias = rnd(heads)[:, None].expand(heads, head_dim)
    B, C = rnd(batch, groups, dstate), rnd(batch, groups, dstate)
    idx = torch.tensor([3, -1, 0], dtype=torch.int32, device=device)
    return [
        ((state, x, dt, A, B, C, D, z, dt_bias, True), {"state_batch_indices": idx}),
        ((state.float()[:3], x, dt, A, B, C), {}),
        ((state[:3], x.half(), dt, A, B, C), {}),
        ((state[:3], x.bfloat16(), dt, A, B, C), {}),
    ]
