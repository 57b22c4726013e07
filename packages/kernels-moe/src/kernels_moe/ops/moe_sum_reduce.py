"""moe.moe_sum_reduce: combine the k expert outputs of each token, ``out[t] = scaling *
sum_j w[t, j] * x[t, j]``, after the down-projection GEMM of fused MoE."""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import (
    check_out,
    check_same_device,
    check_tensor,
    last_dim_contiguous,
)
from kernels_moe import reference
from kernels_moe._checks import check_float

OP_ID = "moe.moe_sum_reduce"

MOE_SUM_REDUCE_CUDA = ModuleSpec(
    name="moe_sum_reduce",
    package="kernels_moe",
    sources=("csrc/moe_sum_reduce.cuh",),
    exports=(("moe_sum_reduce", "moe_sum_reduce"),),
    description="CUDA: a thread per (token, 16-byte column), the k loads in flight, fp32 sum",
)

_moe_sum_reduce_cuda = CompiledFunction(MOE_SUM_REDUCE_CUDA, "moe_sum_reduce")


def _moe_sum_reduce_torch(
    out: torch.Tensor,
    x: torch.Tensor,
    topk_weights: torch.Tensor | None,
    routed_scaling_factor: float,
) -> None:
    out.copy_(reference.moe_sum_reduce(x, routed_scaling_factor, topk_weights))


def _moe_sum_reduce_cuda_eligible(
    out: torch.Tensor,
    x: torch.Tensor,
    topk_weights: torch.Tensor | None,
    routed_scaling_factor: float,
) -> str | None:
    """The kernel reads rows of a contiguous last dim with any leading strides."""
    if not (last_dim_contiguous(x) and last_dim_contiguous(out)):
        return "needs contiguous last dims of x and out"
    return None


MOE_SUM_REDUCE = Op(_moe_sum_reduce_torch, mutates=("out",), device="x")
DTYPES = MOE_SUM_REDUCE.dtypes


def moe_sum_reduce(
    x: torch.Tensor,
    *,
    routed_scaling_factor: float = 1.0,
    topk_weights: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """``out[t] = routed_scaling_factor * sum_j w[t, j] * x[t, j]`` (w = 1 when None), fp32
    accumulation in j order, rounded once.

    Parameters
    ----------
    x : [T, k, H] float32, float16 or bfloat16; last dim contiguous, any leading strides.
    routed_scaling_factor : a Python float.
    topk_weights : optional [T, k] float weights (float32 usually).
    out : optional destination [T, H] of the dtype of x (may be a strided view).
    backend : force a backend by name instead of the best eligible one.
    """
    check_tensor(OP_ID, "x", x, dtypes=DTYPES, ndim=3, last_dim_contiguous=True)
    routed_scaling_factor = check_float(OP_ID, "routed_scaling_factor", routed_scaling_factor)
    tokens, k, hidden = x.shape
    if topk_weights is not None:
        check_tensor(OP_ID, "topk_weights", topk_weights, dtypes=DTYPES, ndim=2)
        if tuple(topk_weights.shape) != (tokens, k):
            raise ValueError(
                f"{OP_ID}: topk_weights must have shape ({tokens}, {k}) [T, k] like x, got "
                f"{tuple(topk_weights.shape)}"
            )
        check_same_device(OP_ID, x=x, topk_weights=topk_weights)
    if out is None:
        out = torch.empty((tokens, hidden), dtype=x.dtype, device=x.device)
    else:
        check_out(OP_ID, out, like=x, shape=(tokens, hidden))
    if out.numel():
        MOE_SUM_REDUCE.run(out, x, topk_weights, routed_scaling_factor, backend=backend)
    return out


def _moe_sum_reduce_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls: k in {2, 8, 9}, an odd H, weights and scaling."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cases: list[tuple[tuple, dict]] = []
    for tokens, k, hidden, dtype in ((3, 2, 64, torch.bfloat16), (5, 9, 129, torch.float16)):
        x = torch.randn(tokens, k, hidden, generator=g).to(dtype).to(device)
        cases.append(((x,), {}))
        w = torch.rand(tokens, k, generator=g).to(device)
        cases.append(((x,), {"topk_weights": w, "routed_scaling_factor": 2.5}))
    x = torch.randn(4, 8, 256, generator=g).to(device)
    cases.append(((x,), {"routed_scaling_factor": 0.5}))
    return cases
