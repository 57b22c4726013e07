"""moe.fused_moe: the expert MLPs of a mixture-of-experts layer for top-k routed tokens,
``out[t] = scaling * sum_j w[t, j] * (act(h_t @ w1[e]^T gate) * (h_t @ w1[e]^T up)) @ w2[e]^T``
with ``e = topk_ids[t, j]`` (slots with id -1 contribute 0).

The Triton backend (``triton_kernels/fused_moe.py``) sorts the slots by expert with
``moe_align_block_size``, runs a grouped gate/up GEMM with the activation fused in its epilogue,
a grouped down GEMM with the top-k weight in its epilogue, and sums the k rows per token with
``moe_sum_reduce``. Block configs per (E, I, H, dtype) and token count come from
``configs/fused_moe_<device>.json`` (``python -m kernels_moe.tune_fused_moe`` writes it).
"""

from __future__ import annotations

import os

import torch

from kernels_jit.dispatch import Op
from kernels_jit.validation import check_out, check_same_device, check_tensor, last_dim_contiguous
from kernels_moe import reference
from kernels_moe._checks import check_float

OP_ID = "moe.fused_moe"
ACTIVATIONS = ("silu", "gelu")


def _fused_moe_torch(
    out: torch.Tensor,
    hidden: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
    apply_router_weight_on_input: bool,
    routed_scaling_factor: float,
) -> None:
    out.copy_(
        reference.fused_moe(
            hidden,
            w1,
            w2,
            topk_weights,
            topk_ids,
            activation,
            apply_router_weight_on_input,
            routed_scaling_factor,
        )
    )


def _fused_moe_triton(
    out: torch.Tensor,
    hidden: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
    apply_router_weight_on_input: bool,
    routed_scaling_factor: float,
) -> None:
    """Align + two grouped Triton GEMMs + moe_sum_reduce (imported lazily: the package imports
    without triton)."""
    from kernels_moe.triton_kernels import fused_moe as kernels

    kernels.fused_moe(
        out,
        hidden,
        w1,
        w2,
        topk_weights,
        topk_ids,
        activation,
        apply_router_weight_on_input,
        routed_scaling_factor,
    )


FUSED_MOE = Op(_fused_moe_torch, mutates=("out",), device="hidden")
DTYPES = FUSED_MOE.dtypes


def _check_shapes(
    hidden: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
) -> None:
    check_tensor(OP_ID, "hidden", hidden, dtypes=DTYPES, ndim=2, last_dim_contiguous=True)
    check_tensor(OP_ID, "w1", w1, dtypes=(hidden.dtype,), ndim=3, last_dim_contiguous=True)
    check_tensor(OP_ID, "w2", w2, dtypes=(hidden.dtype,), ndim=3, last_dim_contiguous=True)
    check_tensor(OP_ID, "topk_ids", topk_ids, dtypes=(torch.int32,), ndim=2)
    check_tensor(OP_ID, "topk_weights", topk_weights, dtypes=(torch.float32,), ndim=2)
    check_same_device(
        OP_ID, hidden=hidden, w1=w1, w2=w2, topk_weights=topk_weights, topk_ids=topk_ids
    )
    tokens, dim = hidden.shape
    experts, two_inter, w1_dim = w1.shape
    if w1_dim != dim:
        raise ValueError(
            f"{OP_ID}: w1 must be [E, 2I, H] with H = {dim} (hidden's), got {tuple(w1.shape)}"
        )
    if two_inter == 0 or two_inter % 2:
        raise ValueError(
            f"{OP_ID}: w1 must be [E, 2I, H] with an even 2I >= 2, got {tuple(w1.shape)}"
        )
    if tuple(w2.shape) != (experts, dim, two_inter // 2):
        raise ValueError(
            f"{OP_ID}: w2 must be [E, H, I] = {(experts, dim, two_inter // 2)} (from w1 "
            f"{tuple(w1.shape)}), got {tuple(w2.shape)}"
        )
    if topk_ids.shape[0] != tokens or topk_ids.shape[1] < 1:
        raise ValueError(
            f"{OP_ID}: topk_ids must be [T, k] with T = {tokens} (hidden's) and k >= 1, got "
            f"{tuple(topk_ids.shape)}"
        )
    if topk_weights.shape != topk_ids.shape:
        raise ValueError(
            f"{OP_ID}: topk_weights must have the shape of topk_ids {tuple(topk_ids.shape)}, got "
            f"{tuple(topk_weights.shape)}"
        )


def fused_moe(
    hidden: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    activation: str = "silu",
    apply_router_weight_on_input: bool = False,
    routed_scaling_factor: float = 1.0,
    out: torch.Tensor | None = None,
    inplace: bool = False,
    backend: str | None = None,
) -> torch.Tensor:
    """Fused MoE: for each slot (t, j) with ``e = topk_ids[t, j] >= 0``,
    ``g, u = split(h_t @ w1[e]^T)`` (first I rows of w1 = gate, next I = up), ``a = act(g) * u``,
    ``y = a @ w2[e]^T``; ``out_t = scaling * sum_j topk_weights[t, j] * y_tj``.

    Rounding points (the reference mirrors them): the GEMM1 output and the activation output are
    rounded to the dtype; the down GEMM's epilogue multiplies the weight in fp32 and rounds; the
    k-sum is fp32 (moe_sum_reduce) and rounds once.

    Parameters
    ----------
    hidden : [T, H] bfloat16 or float16, contiguous last dim (row stride free).
    w1 : [E, 2I, H], the dtype of hidden, contiguous last dim.
    w2 : [E, H, I], the dtype of hidden, contiguous last dim.
    topk_weights : [T, k] float32.
    topk_ids : [T, k] int32 in [-1, E); -1 = slot filtered out (expert parallelism), which
        contributes 0. Other ids are a precondition violation: the torch reference raises
        ValueError; the Triton path skips such slots (their rows of the k-sum are then
        unspecified, never an illegal access) unless ``KERNELS_DEBUG_CHECKS=1``, which checks
        them here at the cost of a host synchronisation.
    activation : "silu" or "gelu" (exact, erf).
    apply_router_weight_on_input : scale h_t by the slot's weight (fp32, rounded) before GEMM1
        instead of weighting the down projection.
    routed_scaling_factor : a Python float applied to the k-sum.
    out : optional destination [T, H] of hidden's dtype (may be a strided view).
    inplace : write the result into ``hidden`` (not together with ``out``).
    backend : force a backend by name ("triton", "torch").
    """
    _check_shapes(hidden, w1, w2, topk_weights, topk_ids)
    if activation not in ACTIVATIONS:
        raise ValueError(f"{OP_ID}: activation must be one of {ACTIVATIONS}, got {activation!r}")
    routed_scaling_factor = check_float(OP_ID, "routed_scaling_factor", routed_scaling_factor)
    if _debug_checks():
        reference.check_expert_ids(OP_ID, topk_ids, w1.shape[0])
    tokens, dim = hidden.shape
    if inplace:
        if out is not None:
            raise ValueError(f"{OP_ID}: pass either out= or inplace=True, not both")
        out = hidden
    elif out is None:
        out = torch.empty((tokens, dim), dtype=hidden.dtype, device=hidden.device)
    else:
        check_out(OP_ID, out, like=hidden, shape=(tokens, dim))
    if tokens == 0:
        return out
    if out is hidden and torch.compiler.is_compiling():
        # A traced custom op must not mutate an alias of another of its inputs: compute into a
        # fresh tensor and copy (eager calls write hidden directly: the sum runs after both GEMMs
        # have read it).
        result = torch.empty_like(hidden)
        FUSED_MOE.run(
            result, hidden, w1, w2, topk_weights, topk_ids, activation,
            bool(apply_router_weight_on_input), routed_scaling_factor, backend=backend,
        )  # fmt: skip
        hidden.copy_(result)
        return hidden
    FUSED_MOE.run(
        out, hidden, w1, w2, topk_weights, topk_ids, activation,
        bool(apply_router_weight_on_input), routed_scaling_factor, backend=backend,
    )  # fmt: skip
    return out


def _debug_checks() -> bool:
    """``KERNELS_DEBUG_CHECKS=1``: check the expert ids on the host (one synchronisation)."""
    return os.environ.get("KERNELS_DEBUG_CHECKS", "").strip().lower() in ("1", "true", "yes", "on")


def _fused_moe_triton_eligible(
    out: torch.Tensor,
    hidden: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
    apply_router_weight_on_input: bool,
    routed_scaling_factor: float,
) -> str | None:
    """The GEMMs index rows of contiguous last dims (the public function checks them)."""
    if not (last_dim_contiguous(hidden) and last_dim_contiguous(w1) and last_dim_contiguous(w2)):
        return "needs contiguous last dims of hidden, w1 and w2"
    return None


def _fused_moe_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls: bf16 and fp16, -1 slots, k > T, gelu, weight on input, scaling."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cases: list[tuple[tuple, dict]] = []
    shapes = ((3, 2, 4, 64, 32, torch.bfloat16), (2, 4, 6, 48, 24, torch.float16))
    for tokens, k, experts, dim, inter, dtype in shapes:
        hidden = (torch.randn(tokens, dim, generator=g) * 0.5).to(dtype).to(device)
        w1 = (torch.randn(experts, 2 * inter, dim, generator=g) * dim**-0.5).to(dtype).to(device)
        w2 = (torch.randn(experts, dim, inter, generator=g) * inter**-0.5).to(dtype).to(device)
        ids = torch.randint(-1, experts, (tokens, k), generator=g, dtype=torch.int32).to(device)
        weights = torch.rand(tokens, k, generator=g).to(device)
        cases.append(((hidden, w1, w2, weights, ids), {}))
        cases.append(
            ((hidden, w1, w2, weights, ids), {"activation": "gelu", "routed_scaling_factor": 2.5})
        )
    return cases
