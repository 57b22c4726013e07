"""attention.concat_mla_k: assemble the MLA key k [T, H, Dn+Dr] from the per-head no-position
part k_nope [T, H, Dn] and the rope part k_rope [T, 1, Dr] shared by all heads."""

from __future__ import annotations

import torch

from kernels_attention import reference
from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_disjoint, check_same_device, check_tensor, compiled_path

OP_ID = "attention.concat_mla_k"

CONCAT_MLA_K_CUDA = ModuleSpec(
    name="concat_mla_k",
    package="kernels_attention",
    sources=("csrc/concat_mla_k.cuh",),
    exports=(("concat_mla_k", "concat_mla_k"),),
    description="CUDA: a byte copy, one 16-byte chunk per thread (narrower where strides need)",
)

_concat_mla_k_cuda = CompiledFunction(CONCAT_MLA_K_CUDA, "concat_mla_k")


def _concat_mla_k_torch(k: torch.Tensor, k_nope: torch.Tensor, k_rope: torch.Tensor) -> None:
    reference.concat_mla_k(k, k_nope, k_rope)


CONCAT_MLA_K = Op(_concat_mla_k_torch, mutates=("k",), device="k_nope")
DTYPES = CONCAT_MLA_K.dtypes


def concat_mla_k(
    k: torch.Tensor,
    k_nope: torch.Tensor,
    k_rope: torch.Tensor,
    *,
    backend: str | None = None,
) -> None:
    """``k[..., :Dn] = k_nope``, ``k[..., Dn:] = k_rope`` (broadcast over the H heads), in place.

    Parameters
    ----------
    k : [T, H, Dn+Dr] [inout]; last dim contiguous, any other strides; must not overlap k_nope
        or k_rope in memory (ValueError).
    k_nope : [T, H, Dn] of the dtype of k; last dim contiguous (often a view of the kv_b
        projection output).
    k_rope : [T, 1, Dr] of the dtype of k; last dim contiguous.
    backend : force a backend by name instead of the best eligible one.
    """
    if compiled_path(backend, k_nope, DTYPES):
        # The compiled function checks shapes, dtypes, strides, devices and overlaps itself.
        CONCAT_MLA_K.run(k, k_nope, k_rope, backend=backend)
        return
    check_tensor(OP_ID, "k", k, dtypes=DTYPES, ndim=3, last_dim_contiguous=True)
    for arg, t in (("k_nope", k_nope), ("k_rope", k_rope)):
        check_tensor(OP_ID, arg, t, dtypes=(k.dtype,), ndim=3, last_dim_contiguous=True)
    check_same_device(OP_ID, k=k, k_nope=k_nope, k_rope=k_rope)
    tokens, heads, width = k.shape
    if tuple(k_nope.shape[:2]) != (tokens, heads):
        raise ValueError(
            f"{OP_ID}: k_nope [T, H, Dn] must share T = {tokens} and H = {heads} with k, got "
            f"shape {tuple(k_nope.shape)}"
        )
    if k_rope.shape[0] != tokens or k_rope.shape[1] != 1:
        raise ValueError(
            f"{OP_ID}: k_rope must be [T, 1, Dr] with T = {tokens}, got shape {tuple(k_rope.shape)}"
        )
    if k_nope.shape[2] + k_rope.shape[2] != width:
        raise ValueError(
            f"{OP_ID}: k's last dim {width} must be Dn + Dr = {k_nope.shape[2]} + {k_rope.shape[2]}"
        )
    if k.numel():
        check_disjoint(OP_ID, "k", k, "k_nope", k_nope)
        check_disjoint(OP_ID, "k", k, "k_rope", k_rope)
        CONCAT_MLA_K.run(k, k_nope, k_rope, backend=backend)


def _concat_mla_k_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls: DeepSeek (H=128, 128 + 64, bf16), H = 12 and 96, strided views, and
    every other declared dtype."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cases: list[tuple[tuple, dict]] = []
    shapes = ((3, 128, 128, 64), (5, 12, 128, 64), (2, 96, 40, 24))
    for t, h, dn, dr in shapes:
        kv = torch.randn(t, h, dn + 128, generator=g).bfloat16().to(device)
        k_nope = kv[..., :dn]  # a view of the kv_b projection output, as in DeepSeek MLA
        k_rope = torch.randn(t, 1, dr, generator=g).bfloat16().to(device)
        k = torch.empty(t, h, dn + dr, dtype=torch.bfloat16, device=device)
        cases.append(((k, k_nope, k_rope), {}))
    for dtype in DTYPES:
        if dtype == torch.bfloat16:
            continue
        t, h, dn, dr = 4, 12, 128, 64
        k_nope = torch.randn(t, h, dn, generator=g).to(dtype).to(device)
        k_rope = torch.randn(t, 1, dr, generator=g).to(dtype).to(device)
        k = torch.empty(t, h, dn + dr, dtype=dtype, device=device)
        cases.append(((k, k_nope, k_rope), {}))
    return cases
