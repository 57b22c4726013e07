"""attention.rope_inplace: rotary position embedding applied in place to q and k from a float32
or bfloat16 cos/sin cache (cos in the first half of each row, sin in the second), NeoX or GPT-J
pairing, partial rotary dim.

Positions outside [0, max_pos): the torch backend raises ValueError before writing anything (it
reads the positions on the host); the CUDA backend never synchronises with the host, so it skips
such a token instead: that token's q and k rows are left untouched, every other token is rotated.
"""

from __future__ import annotations

import torch

from kernels_attention import reference
from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_same_device, check_tensor

OP_ID = "attention.rope_inplace"
POSITION_DTYPES = (torch.int32, torch.int64)
CACHE_DTYPES = (torch.float32, torch.bfloat16)

ROPE_INPLACE_CUDA = ModuleSpec(
    name="rope_inplace",
    package="kernels_attention",
    sources=("csrc/rope_inplace.cuh",),
    exports=(("rope_inplace", "rope_inplace"),),
    description="CUDA: 16-byte packs of both pair halves, cos/sin once per thread for 1-4 heads",
)

_rope_inplace_cuda = CompiledFunction(ROPE_INPLACE_CUDA, "rope_inplace")


def _rope_inplace_torch(
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    is_neox: bool,
) -> None:
    reference.rope_inplace(q, k, cos_sin_cache, positions, is_neox)


ROPE_INPLACE = Op(_rope_inplace_torch, mutates=("q", "k"), device="q")
DTYPES = ROPE_INPLACE.dtypes


def _heads(arg: str, x: torch.Tensor, head_size: int | None) -> torch.Tensor:
    """x as a [T, H, D] view (a 2-D [T, H*D] input needs head_size)."""
    check_tensor(OP_ID, arg, x, dtypes=DTYPES, ndim=(2, 3), last_dim_contiguous=True)
    if x.dim() == 3:
        if head_size is not None and x.shape[2] != head_size:
            raise ValueError(
                f"{OP_ID}: head_size = {head_size} does not match {arg}'s last dim, shape "
                f"{tuple(x.shape)}"
            )
        return x
    if head_size is None:
        raise ValueError(
            f"{OP_ID}: a 2-D {arg} [T, H*D] needs head_size, got shape {tuple(x.shape)}"
        )
    if x.shape[1] % head_size:
        raise ValueError(
            f"{OP_ID}: {arg}'s width {x.shape[1]} is not a multiple of head_size = {head_size}"
        )
    return x.view(x.shape[0], x.shape[1] // head_size, head_size)


def rope_inplace(
    q: torch.Tensor,
    k: torch.Tensor | None,
    cos_sin_cache: torch.Tensor,
    positions: torch.Tensor,
    *,
    is_neox: bool,
    rotary_dim: int = 0,
    head_size: int | None = None,
    backend: str | None = None,
) -> None:
    """Rotary embedding in place: with R the rotary dim, ``cos_i = cache[pos, i]``,
    ``sin_i = cache[pos, R/2 + i]`` (i < R/2) rotate each pair (x1, x2) of every head to
    ``(x1 cos - x2 sin, x2 cos + x1 sin)`` in fp32, rounded once. Channels >= R are untouched.

    Parameters
    ----------
    q : [T, Hq, D] or [T, Hq*D] [inout] float16, bfloat16 or float32; last dim contiguous, any
        row stride (e.g. a view into a fused qkv buffer).
    k : [T, Hk, D] or [T, Hk*D] [inout] of the dtype of q, or None (q only); must not share
        elements with q.
    cos_sin_cache : [max_pos, R] float32 or bfloat16 (any q dtype), cos in columns [0, R/2), sin
        in [R/2, R); last dim contiguous.
    positions : [T] int32 or int64 in [0, max_pos). Out of range: the torch backend raises
        ValueError (nothing written); the CUDA backend skips that token (its q and k untouched).
    is_neox : True pairs (i, i + R/2) (NeoX, Llama); False pairs (2i, 2i + 1) (GPT-J, DeepSeek
        MLA rope).
    rotary_dim : R (even, <= D); 0 = the cache width. Must equal the cache width when given.
    head_size : D, required for 2-D q and k.
    backend : force a backend by name instead of the best eligible one.
    """
    q3 = _heads("q", q, head_size)
    k3 = None if k is None else _heads("k", k, head_size)
    check_tensor(
        OP_ID,
        "cos_sin_cache",
        cos_sin_cache,
        dtypes=CACHE_DTYPES,
        ndim=2,
        last_dim_contiguous=True,
    )
    check_tensor(OP_ID, "positions", positions, dtypes=POSITION_DTYPES, ndim=1)
    tensors = {"q": q, "cos_sin_cache": cos_sin_cache, "positions": positions}
    tokens, _, d = q3.shape
    if k3 is not None:
        if k3.dtype != q3.dtype:
            raise TypeError(f"{OP_ID}: k must have the dtype of q ({q.dtype}), got {k.dtype}")
        if k3.shape[0] != tokens or k3.shape[2] != d:
            raise ValueError(
                f"{OP_ID}: k [T, Hk, D] must share T = {tokens} and D = {d} with q, got k shape "
                f"{tuple(k.shape)}"
            )
        tensors["k"] = k
    if positions.shape[0] != tokens:
        raise ValueError(
            f"{OP_ID}: positions must have one entry per token (T = {tokens}), got shape "
            f"{tuple(positions.shape)}"
        )
    check_same_device(OP_ID, **tensors)
    width = cos_sin_cache.shape[1]
    if type(rotary_dim) is not int:
        raise TypeError(
            f"{OP_ID}: rotary_dim must be a Python int, got {type(rotary_dim).__name__}"
        )
    if rotary_dim and rotary_dim != width:
        raise ValueError(
            f"{OP_ID}: rotary_dim = {rotary_dim} must equal the cos_sin_cache width {width} "
            "(cos and sin halves of R/2 each)"
        )
    if width == 0 or width % 2 or width > d:
        raise ValueError(
            f"{OP_ID}: the rotary dim R (cos_sin_cache width) must be even and in [2, D = {d}], "
            f"got {width}"
        )
    if tokens:
        ROPE_INPLACE.run(q3, k3, cos_sin_cache, positions, bool(is_neox), backend=backend)


def _rope_inplace_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls: Llama (32q/8kv, D=R=128, NeoX), DeepSeek MLA rope (D=R=64, GPT-J),
    GLM partial rotary (R=64 of 128), 2-D inputs, q only, a bfloat16 cache and int32 positions."""
    g = torch.Generator(device="cpu").manual_seed(0)

    def cache(rows: int, r: int) -> torch.Tensor:
        return torch.randn(rows, r, generator=g).to(device)

    cases: list[tuple[tuple, dict]] = []
    pos = torch.randint(0, 64, (5,), generator=g).to(device)
    q = torch.randn(5, 32, 128, generator=g).bfloat16().to(device)
    k = torch.randn(5, 8, 128, generator=g).bfloat16().to(device)
    cases.append(((q, k, cache(64, 128), pos), {"is_neox": True}))
    cases.append(((q, k, cache(64, 64), pos), {"is_neox": True, "rotary_dim": 64}))
    q = torch.randn(5, 16, 64, generator=g).half().to(device)
    cases.append(((q, None, cache(64, 64), pos), {"is_neox": False}))
    q2 = torch.randn(5, 4 * 96, generator=g).to(device)
    k2 = torch.randn(5, 2 * 96, generator=g).to(device)
    cases.append(((q2, k2, cache(64, 32), pos), {"is_neox": False, "head_size": 96}))
    cases.append(((q, None, cache(64, 64).bfloat16(), pos.int()), {"is_neox": True}))
    return cases
