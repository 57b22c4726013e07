"""moe.gate_topk_renorm: DeepSeek-V3 "noaux_tc" routing: sigmoid scores, a correction bias that
only steers selection, optional group-limited routing, renormalised (and scaled) weights."""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_same_device, check_tensor
from kernels_moe import reference
from kernels_moe._checks import check_float, check_int

OP_ID = "moe.gate_topk_renorm"

GATE_TOPK_RENORM_CUDA = ModuleSpec(
    name="gate_topk_renorm",
    package="kernels_moe",
    sources=("csrc/gate_topk_renorm.cuh",),
    exports=(("gate_topk_renorm", "gate_topk_renorm"),),
    description="CUDA: a warp per token, scores in registers, shuffle group top-2 and top-k",
)
# The kernel's limits (csrc/gate_topk_renorm.cuh).
CUDA_MAX_EXPERTS, CUDA_MAX_K, CUDA_MAX_GROUPS = 1024, 32, 32

_gate_topk_renorm_cuda = CompiledFunction(GATE_TOPK_RENORM_CUDA, "gate_topk_renorm")
BIAS_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _gate_topk_renorm_torch(
    weights: torch.Tensor,
    ids: torch.Tensor,
    logits: torch.Tensor,
    bias: torch.Tensor | None,
    n_group: int,
    topk_group: int,
    renormalize: bool,
    routed_scaling_factor: float,
    apply_routed_scaling_factor_on_output: bool,
) -> None:
    w, i = reference.gate_topk_renorm(
        logits,
        bias,
        weights.shape[1],
        n_group,
        topk_group,
        renormalize,
        routed_scaling_factor,
        apply_routed_scaling_factor_on_output,
    )
    weights.copy_(w)
    ids.copy_(i)


def _gate_topk_renorm_cuda_eligible(
    weights: torch.Tensor,
    ids: torch.Tensor,
    logits: torch.Tensor,
    bias: torch.Tensor | None,
    n_group: int,
    topk_group: int,
    renormalize: bool,
    routed_scaling_factor: float,
    apply_routed_scaling_factor_on_output: bool,
) -> str | None:
    if logits.shape[1] > CUDA_MAX_EXPERTS:
        return f"E = {logits.shape[1]} > {CUDA_MAX_EXPERTS} experts"
    if weights.shape[1] > CUDA_MAX_K:
        return f"k = {weights.shape[1]} > {CUDA_MAX_K}"
    if n_group > CUDA_MAX_GROUPS:
        return f"n_group = {n_group} > {CUDA_MAX_GROUPS}"
    if logits.shape[1] > 1 and logits.stride(1) != 1:
        return "needs a contiguous last dim of logits"
    if bias is not None and not bias.is_contiguous():
        return "needs a contiguous bias"
    return None


GATE_TOPK_RENORM = Op(_gate_topk_renorm_torch, mutates=("weights", "ids"), device="logits")
LOGIT_DTYPES = GATE_TOPK_RENORM.dtypes


def gate_topk_renorm(
    logits: torch.Tensor,
    bias: torch.Tensor | None,
    topk: int,
    *,
    n_group: int = 1,
    topk_group: int = 1,
    renormalize: bool = True,
    routed_scaling_factor: float = 1.0,
    apply_routed_scaling_factor_on_output: bool = False,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Biased grouped top-k routing.

    1. ``s = sigmoid(logits)``, ``sb = s + bias`` (NaN -> -1e30) selects, s weighs.
    2. If n_group > 1: the E experts form n_group contiguous groups; a group scores the sum of
       its two largest sb; only the topk_group best groups (ties to the lower group) compete.
    3. ids = the topk largest sb, descending, ties to the lower expert id.
    4. ``w = s[ids]``; divided by its sum if ``renormalize`` (not when the sum is 0); times
       ``routed_scaling_factor`` if ``apply_routed_scaling_factor_on_output``.

    Parameters
    ----------
    logits : [T, E] float32 or bfloat16; last dim contiguous.
    bias : [E] correction bias (float32, bfloat16 or float16) or None.
    topk : experts per token; <= topk_group * E / n_group.
    n_group, topk_group : group-limited routing (E % n_group == 0, E / n_group >= 2,
        1 <= topk_group <= n_group).
    backend : force a backend by name instead of the best eligible one.

    Returns
    -------
    (weights [T, topk] float32, ids [T, topk] int32)
    """
    check_tensor(OP_ID, "logits", logits, dtypes=LOGIT_DTYPES, ndim=2, last_dim_contiguous=True)
    tokens, experts = logits.shape
    topk = check_int(OP_ID, "topk", topk, minimum=1)
    n_group = check_int(OP_ID, "n_group", n_group, minimum=1)
    topk_group = check_int(OP_ID, "topk_group", topk_group, minimum=1)
    routed_scaling_factor = check_float(OP_ID, "routed_scaling_factor", routed_scaling_factor)
    if experts % n_group:
        raise ValueError(
            f"{OP_ID}: the number of experts E = {experts} must be a multiple of n_group = "
            f"{n_group}"
        )
    if experts // n_group < 2:
        raise ValueError(
            f"{OP_ID}: each group needs >= 2 experts (E / n_group >= 2), got E = {experts}, "
            f"n_group = {n_group}"
        )
    if topk_group > n_group:
        raise ValueError(f"{OP_ID}: topk_group = {topk_group} must be <= n_group = {n_group}")
    if topk > topk_group * experts // n_group:
        raise ValueError(
            f"{OP_ID}: topk = {topk} must be <= topk_group * E / n_group = "
            f"{topk_group * experts // n_group} (the experts of the kept groups)"
        )
    if bias is not None:
        check_tensor(OP_ID, "bias", bias, dtypes=BIAS_DTYPES, ndim=1)
        if bias.shape[0] != experts:
            raise ValueError(
                f"{OP_ID}: bias must have shape [{experts}] (E), got {list(bias.shape)}"
            )
        check_same_device(OP_ID, logits=logits, bias=bias)
    weights = torch.empty((tokens, topk), dtype=torch.float32, device=logits.device)
    ids = torch.empty((tokens, topk), dtype=torch.int32, device=logits.device)
    if tokens:
        GATE_TOPK_RENORM.run(
            weights,
            ids,
            logits,
            bias,
            n_group,
            topk_group,
            bool(renormalize),
            routed_scaling_factor,
            bool(apply_routed_scaling_factor_on_output),
            backend=backend,
        )
    return weights, ids


def _gate_topk_renorm_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls: DeepSeek-V3 (E=256, k=8, 8 groups keep 4, scaling 2.5 on output),
    Kimi-K2-like ungrouped routing, no bias."""
    g = torch.Generator(device="cpu").manual_seed(0)
    logits = torch.randn(5, 256, generator=g).to(device)
    bias = (torch.randn(256, generator=g) * 0.1).to(device)
    deepseek = {"n_group": 8, "topk_group": 4, "routed_scaling_factor": 2.5}
    return [
        ((logits, bias, 8), deepseek),
        ((logits, bias, 8), {**deepseek, "apply_routed_scaling_factor_on_output": True}),
        ((logits.bfloat16()[:, :96], bias[:96], 6), {}),
        ((logits[:3, :16], None, 2), {"renormalize": False}),
    ]
