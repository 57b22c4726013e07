"""layernorm.qk_rmsnorm: per-head RMSNorm of q and k in place (Qwen3, Gemma 3, OLMo 2 ...).

q [T, Hq, D] and k [T, Hk, D] are normalised over D with weights [D], in one launch. Both may be
head-strided views, e.g. of a fused qkv projection output::

    q = qkv[:, : Hq * D].view(T, Hq, D)
    k = qkv[:, Hq * D : (Hq + Hk) * D].view(T, Hk, D)
    qk_rmsnorm(q, k, q_norm.weight, k_norm.weight)
"""

from __future__ import annotations

import torch

from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import (
    check_eps,
    check_param,
    check_pdl,
    check_rows,
    compiled_path,
    eps_ok,
)
from kernels_layernorm import reference
from kernels_layernorm.ops.rmsnorm import RMSNORM_CUDA

_qk_rmsnorm_cuda = CompiledFunction(RMSNORM_CUDA, "qk_rmsnorm")


def _qk_rmsnorm_torch(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
) -> None:
    q_out, k_out = reference.qk_rmsnorm(q, k, q_weight, k_weight, eps)
    q.copy_(q_out)
    k.copy_(k_out)


QK_RMSNORM = Op(_qk_rmsnorm_torch, mutates=("q", "k"), device="q", knobs={"enable_pdl": -1})
DTYPES = QK_RMSNORM.dtypes
_OP = QK_RMSNORM.id


def _check(q: object, k: object, q_weight: object, k_weight: object) -> None:
    check_rows(_OP, "q", q, dtypes=DTYPES, min_dim=3)
    check_rows(_OP, "k", k, dtypes=DTYPES, min_dim=3)
    if q.dim() != 3 or k.dim() != 3:
        raise ValueError(
            f"{_OP}: q and k must be [T, heads, head_dim], got {tuple(q.shape)} and "
            f"{tuple(k.shape)}"
        )
    if k.dtype != q.dtype:
        raise TypeError(f"{_OP}: k must have the dtype of q ({q.dtype}), got {k.dtype}")
    if k.device != q.device:
        raise ValueError(f"{_OP}: k is on {k.device}, q on {q.device}")
    if k.shape[0] != q.shape[0] or k.shape[2] != q.shape[2]:
        raise ValueError(
            f"{_OP}: q {tuple(q.shape)} and k {tuple(k.shape)} must have the same tokens and "
            "head_dim"
        )
    check_param(_OP, "q_weight", q_weight, q.shape[-1], ref=q, ref_name="q")
    check_param(_OP, "k_weight", k_weight, q.shape[-1], ref=q, ref_name="q")


def qk_rmsnorm(
    q: torch.Tensor,
    k: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float = 1e-6,
    *,
    backend: str | None = None,
    enable_pdl: bool | None = None,
) -> None:
    """In place: ``q = rmsnorm(q) * q_weight``, ``k = rmsnorm(k) * k_weight`` per head, over D.

    Parameters
    ----------
    q : [T, Hq, D] float32, float16 or bfloat16; D contiguous, T and head strides arbitrary.
    k : [T, Hk, D], the dtype and device of ``q``; must not overlap ``q``.
    q_weight, k_weight : [D], the dtype and device of ``q``.
    eps : added to the mean square, a float >= 0.
    backend : force ``cuda`` or ``torch`` instead of the best eligible one.
    enable_pdl : programmatic dependent launch; None: on for grids of at most 8 waves on sm_90+
        (larger grids run faster without it); True: always; False: never.
    """
    if not eps_ok(eps):
        eps = check_eps(_OP, eps)
    if not compiled_path(backend, q, DTYPES) or type(k) is not torch.Tensor:
        _check(q, k, q_weight, k_weight)
    pdl = -1 if enable_pdl is None else check_pdl(_OP, enable_pdl)
    QK_RMSNORM.run(q, k, q_weight, k_weight, eps, pdl, backend=backend)


def _qk_rmsnorm_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Contiguous q/k of every dtype, and head-strided views of a fused qkv buffer."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cases = []
    for dtype in DTYPES:
        for tokens, hq, hk, d in ((1, 32, 8, 128), (5, 4, 1, 64), (3, 2, 2, 60)):
            q = torch.randn(tokens, hq, d, generator=g).to(dtype).to(device)
            k = torch.randn(tokens, hk, d, generator=g).to(dtype).to(device)
            qw = (1 + 0.1 * torch.randn(d, generator=g)).to(dtype).to(device)
            kw = (1 + 0.1 * torch.randn(d, generator=g)).to(dtype).to(device)
            cases.append(((q, k, qw, kw, 1e-6), {}))
    return cases
