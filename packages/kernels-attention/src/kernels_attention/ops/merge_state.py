"""attention.merge_state: merge two partial attention outputs (e.g. prefix and suffix of a cascade,
or two KV splits) by their natural-log log-sum-exp."""

from __future__ import annotations

import torch

from kernels_attention import reference
from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import (
    check_disjoint,
    check_out,
    check_same_device,
    check_tensor,
    compiled_path,
)

OP_ID = "attention.merge_state"

MERGE_STATE_CUDA = ModuleSpec(
    name="merge_state",
    package="kernels_attention",
    sources=("csrc/merge_state.cuh",),
    exports=(("merge_state", "merge_state"),),
    description="CUDA: one thread per 16-byte pack of v (or per element), LSEs per thread",
)

_merge_state_cuda = CompiledFunction(MERGE_STATE_CUDA, "merge_state")


def _merge_state_torch(
    out: torch.Tensor,
    out_lse: torch.Tensor,
    v_a: torch.Tensor,
    s_a: torch.Tensor,
    v_b: torch.Tensor,
    s_b: torch.Tensor,
) -> None:
    v, s = reference.merge_state(v_a, s_a, v_b, s_b)
    out.copy_(v)
    out_lse.copy_(s)


MERGE_STATE = Op(_merge_state_torch, mutates=("out", "out_lse"), device="v_a")
DTYPES = MERGE_STATE.dtypes


def merge_state(
    v_a: torch.Tensor,
    s_a: torch.Tensor,
    v_b: torch.Tensor,
    s_b: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    out_lse: torch.Tensor | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``m = max(s_a, s_b)``, ``wa = exp(s_a - m)``, ``wb = exp(s_b - m)``,
    ``v = (wa v_a + wb v_b) / (wa + wb)``, ``s = m + ln(wa + wb)`` in fp32, v rounded once.

    An LSE of +inf counts as -inf (an empty segment); both -inf give v = 0 and s = -inf; NaN
    propagates.

    Parameters
    ----------
    v_a, v_b : [T, H, D] float16, bfloat16 or float32 (the same); last dim contiguous.
    s_a, s_b : [T, H] float32 natural-log LSE; any strides (a transposed [H, T] buffer is fine).
    out : optional destination [T, H, D] of the dtype of v_a (may be a strided view); may be v_a
        or v_b itself, must not partly overlap them.
    out_lse : optional destination [T, H] float32 (may be a strided view); must not overlap s_a,
        s_b or out.
    backend : force a backend by name instead of the best eligible one.

    Returns
    -------
    (v [T, H, D], s [T, H] float32)
    """
    # On the CUDA fast path the compiled function checks shapes, dtypes, strides, devices and
    # overlaps itself (kernels_jit.validation.compiled_path says why Python does not repeat them).
    fast = compiled_path(backend, v_a, DTYPES)
    if not fast:
        _check(v_a, s_a, v_b, s_b)
    if out is None:
        out = torch.empty(v_a.shape, dtype=v_a.dtype, device=v_a.device)
    elif not fast:
        check_out(OP_ID, out, like=v_a)
    if out_lse is None:
        out_lse = torch.empty(v_a.shape[:2], dtype=torch.float32, device=v_a.device)
    elif not fast:
        check_out(OP_ID, out_lse, like=s_a, arg="out_lse")
        for arg, s in (("s_a", s_a), ("s_b", s_b), ("out", out)):
            check_disjoint(OP_ID, "out_lse", out_lse, arg, s)
    if fast or out_lse.numel():
        MERGE_STATE.run(out, out_lse, v_a, s_a, v_b, s_b, backend=backend)
    return out, out_lse


def _check(v_a: object, s_a: object, v_b: object, s_b: object) -> None:
    check_tensor(OP_ID, "v_a", v_a, dtypes=DTYPES, ndim=3, last_dim_contiguous=True)
    check_tensor(OP_ID, "v_b", v_b, dtypes=(v_a.dtype,), ndim=3, last_dim_contiguous=True)
    check_tensor(OP_ID, "s_a", s_a, dtypes=(torch.float32,), ndim=2)
    check_tensor(OP_ID, "s_b", s_b, dtypes=(torch.float32,), ndim=2)
    if v_b.shape != v_a.shape:
        raise ValueError(
            f"{OP_ID}: v_b must have the shape of v_a {tuple(v_a.shape)}, got {tuple(v_b.shape)}"
        )
    lse_shape = tuple(v_a.shape[:2])
    for arg, s in (("s_a", s_a), ("s_b", s_b)):
        if tuple(s.shape) != lse_shape:
            raise ValueError(
                f"{OP_ID}: {arg} must have shape {lse_shape} ([T, H] of v_a), got {tuple(s.shape)}"
            )
    check_same_device(OP_ID, v_a=v_a, s_a=s_a, v_b=v_b, s_b=s_b)


def _merge_state_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls: every dtype, MLA's D = 512, a transposed LSE, empty segments."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cases: list[tuple[tuple, dict]] = []
    for dtype, (t, h, d) in zip(DTYPES, ((3, 8, 64), (5, 16, 512), (4, 2, 129)), strict=True):
        v_a = torch.randn(t, h, d, generator=g).to(dtype).to(device)
        v_b = torch.randn(t, h, d, generator=g).to(dtype).to(device)
        s_a = (torch.randn(t, h, generator=g) * 3).to(device)
        s_b = (torch.randn(h, t, generator=g) * 3).to(device).t()
        cases.append(((v_a, s_a, v_b, s_b), {}))
    s_a = s_a.clone()
    s_a[0, 0] = float("-inf")
    cases.append(((v_a, s_a, v_b, s_b.contiguous()), {}))
    return cases
