"""moe.topk_softmax: softmax routing (Mixtral, Qwen3-MoE, GPT-OSS): the top-k experts of each token
by softmax probability, with optional softcapping, correction bias and renormalisation."""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_same_device, check_tensor
from kernels_moe import reference
from kernels_moe._checks import check_float

OP_ID = "moe.topk_softmax"

TOPK_SOFTMAX_CUDA = ModuleSpec(
    name="topk_softmax",
    package="kernels_moe",
    sources=("csrc/topk_softmax.cuh",),
    exports=(("topk_softmax", "topk_softmax"),),
    description="CUDA: a thread per token for E <= 16 (trees in registers), else a warp per "
    "token (logits in registers, k rounds of a warp key max)",
)
# The kernel's limits (csrc/topk_softmax.cuh): experts held in registers, one output per lane.
CUDA_MAX_EXPERTS, CUDA_MAX_K = 1024, 32
# E at most this runs one thread per token (csrc/topk_softmax.cuh, kThreadMaxExperts); the tests
# cover both sides of it.
CUDA_THREAD_MAX_EXPERTS = 16

_topk_softmax_cuda = CompiledFunction(TOPK_SOFTMAX_CUDA, "topk_softmax")


def _topk_softmax_torch(
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    gating: torch.Tensor,
    renormalize: bool,
    moe_softcapping: float,
    correction_bias: torch.Tensor | None,
) -> None:
    weights, ids = reference.topk_softmax(
        gating, topk_weights.shape[1], renormalize, moe_softcapping, correction_bias
    )
    topk_weights.copy_(weights)
    topk_ids.copy_(ids)


def _topk_softmax_cuda_eligible(
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    gating: torch.Tensor,
    renormalize: bool,
    moe_softcapping: float,
    correction_bias: torch.Tensor | None,
) -> str | None:
    if gating.shape[1] > CUDA_MAX_EXPERTS:
        return f"E = {gating.shape[1]} > {CUDA_MAX_EXPERTS} experts"
    if topk_weights.shape[1] > CUDA_MAX_K:
        return f"k = {topk_weights.shape[1]} > {CUDA_MAX_K}"
    if gating.shape[1] > 1 and gating.stride(1) != 1:
        return "needs a contiguous last dim of gating"
    if correction_bias is not None and not correction_bias.is_contiguous():
        return "needs a contiguous correction_bias"
    return None


TOPK_SOFTMAX = Op(_topk_softmax_torch, mutates=("topk_weights", "topk_ids"), device="gating")
GATING_DTYPES = TOPK_SOFTMAX.dtypes


def topk_softmax(
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    gating: torch.Tensor,
    renormalize: bool = False,
    *,
    moe_softcapping: float = 0.0,
    correction_bias: torch.Tensor | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per token: ``l = gating`` (fp32), ``l = c * tanh(l / c)`` if c = moe_softcapping != 0,
    ``l += correction_bias``, ``p = softmax(l)``; the k experts of largest p (descending, ties to
    the lower id) and their p (the biased softmax), divided by their sum if ``renormalize``.

    Parameters
    ----------
    topk_weights : [T, k] float32, written in place (selection order).
    topk_ids : [T, k] int32, written in place.
    gating : [T, E] float32, bfloat16 or float16 router logits, k <= E; last dim contiguous.
    renormalize : divide the k weights by their sum.
    moe_softcapping : c of the softcap (0 = off).
    correction_bias : optional [E] float bias added to the (capped) logits.
    backend : force a backend by name instead of the best eligible one.

    Returns
    -------
    (topk_weights, topk_ids), the tensors passed in. NaN logits give NaN weights.
    """
    check_tensor(OP_ID, "gating", gating, dtypes=GATING_DTYPES, ndim=2, last_dim_contiguous=True)
    check_tensor(OP_ID, "topk_weights", topk_weights, dtypes=(torch.float32,), ndim=2)
    check_tensor(OP_ID, "topk_ids", topk_ids, dtypes=(torch.int32,), ndim=2)
    tokens, experts = gating.shape
    for arg, t in (("topk_weights", topk_weights), ("topk_ids", topk_ids)):
        if t.shape[0] != tokens:
            raise ValueError(
                f"{OP_ID}: {arg} must have T = {tokens} rows like gating, got shape "
                f"{tuple(t.shape)}"
            )
    k = topk_weights.shape[1]
    if topk_ids.shape[1] != k:
        raise ValueError(
            f"{OP_ID}: topk_ids and topk_weights must have the same shape [T, k], got "
            f"{tuple(topk_ids.shape)} and {tuple(topk_weights.shape)}"
        )
    if k > experts:
        raise ValueError(f"{OP_ID}: k = {k} must be <= the number of experts E = {experts}")
    moe_softcapping = check_float(OP_ID, "moe_softcapping", moe_softcapping)
    tensors = {"gating": gating, "topk_weights": topk_weights, "topk_ids": topk_ids}
    if correction_bias is not None:
        check_tensor(OP_ID, "correction_bias", correction_bias, dtypes=GATING_DTYPES, ndim=1)
        if correction_bias.shape[0] != experts:
            raise ValueError(
                f"{OP_ID}: correction_bias must have shape [{experts}] (E), got "
                f"{list(correction_bias.shape)}"
            )
        tensors["correction_bias"] = correction_bias
    check_same_device(OP_ID, **tensors)
    if tokens and k:
        TOPK_SOFTMAX.run(
            topk_weights,
            topk_ids,
            gating,
            bool(renormalize),
            moe_softcapping,
            correction_bias,
            backend=backend,
        )
    return topk_weights, topk_ids


def _topk_softmax_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls: Mixtral (E=8, k=2), Qwen3 (128, 8, renormalised), a non-power-of-two
    E, softcapping and correction bias."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cases: list[tuple[tuple, dict]] = []
    for tokens, experts, k, renorm, dtype in (
        (5, 8, 2, False, torch.bfloat16),
        (7, 128, 8, True, torch.float32),
        (3, 60, 4, True, torch.float16),
    ):
        gating = torch.randn(tokens, experts, generator=g).to(dtype).to(device)
        w = torch.empty(tokens, k, device=device)
        ids = torch.empty(tokens, k, dtype=torch.int32, device=device)
        cases.append(((w, ids, gating, renorm), {}))
    bias = torch.randn(60, generator=g).to(device)
    cases.append(((w, ids, gating, False), {"moe_softcapping": 2.0, "correction_bias": bias}))
    return cases
