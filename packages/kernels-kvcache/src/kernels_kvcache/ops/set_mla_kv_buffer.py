"""kvcache.set_mla_kv_buffer: write packed ``[nope | rope]`` rows of an MLA latent cache at slots
(DeepSeek MLA: kv_lora 512 + rope 64, bf16 1152-byte rows or fp8).

Backends: CUDA (csrc/set_mla_kv_buffer.cuh on the row-scatter engine csrc/kv_write.cuh: nope and
rope packed into the row in one pass, 16-byte packs; from 2048 to 32768 rows into a buffer of the
input dtype, TMA bulk copies through shared-memory stages, where _BULK_* let them), then the torch
reference.
"""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_tensor
from kernels_kvcache import reference
from kernels_kvcache._checks import check_cache_dtype, check_scale, check_slots

OP_ID = "kvcache.set_mla_kv_buffer"

SET_MLA_KV_BUFFER_CUDA = ModuleSpec(
    name="set_mla_kv_buffer",
    package="kernels_kvcache",
    sources=("csrc/kv_write.cuh", "csrc/set_mla_kv_buffer.cuh"),
    exports=(("set_mla_kv_buffer", "set_mla_kv_buffer"),),
    description="CUDA: packed [nope | rope] row scatter, 16-byte packs, fp8 with a scale",
)

_set_mla_kv_buffer_kernels = CompiledFunction(SET_MLA_KV_BUFFER_CUDA, "set_mla_kv_buffer")
# Where the TMA bulk path runs instead of the register path (kv_write.cuh's BulkGate), read each
# call so one process can A/B it: from _BULK_MIN_ROWS rows (-1: never, 0: from one row) up to
# _BULK_MAX_ROWS (-1: no ceiling), where a row's cache-side runs average at least
# _BULK_MIN_RUN_BYTES (nope | rope back to back: one run, 1152 B in bf16). H200 interleaved A/B of
# 512 + 64 bf16 rows: 8192 rows won (8.22 -> 7.01 us), 65536 lost 1.4% (46.84 -> 47.51): the
# ceiling sits between them, at 32768 (not measured; the suite has no shape between).
_BULK_MIN_ROWS = 2048
_BULK_MAX_ROWS = 32768
_BULK_MIN_RUN_BYTES = 1024


def _set_mla_kv_buffer_cuda(
    kv_buffer: torch.Tensor,
    loc: torch.Tensor,
    k_nope: torch.Tensor,
    k_rope: torch.Tensor,
    scale: torch.Tensor | None,
) -> None:
    _set_mla_kv_buffer_kernels(
        kv_buffer, loc, k_nope, k_rope, scale, _BULK_MIN_ROWS, _BULK_MAX_ROWS, _BULK_MIN_RUN_BYTES
    )


def _set_mla_kv_buffer_torch(
    kv_buffer: torch.Tensor,
    loc: torch.Tensor,
    k_nope: torch.Tensor,
    k_rope: torch.Tensor,
    scale: torch.Tensor | None,
) -> None:
    reference.set_mla_kv_buffer(kv_buffer, loc, k_nope, k_rope, scale)


SET_MLA_KV_BUFFER = Op(_set_mla_kv_buffer_torch, mutates=("kv_buffer",), device="k_nope")
DTYPES = SET_MLA_KV_BUFFER.dtypes


def _width(arg: str, t: torch.Tensor, n: int) -> int:
    """D of a [N, D] or [N, 1, D] input."""
    if t.dim() == 3 and t.shape[1] != 1:
        raise ValueError(f"{OP_ID}: {arg} must be [N, D] or [N, 1, D], got shape {tuple(t.shape)}")
    if t.shape[0] != n:
        raise ValueError(
            f"{OP_ID}: {arg} must have N = {n} rows like k_nope, got shape {tuple(t.shape)}"
        )
    return t.shape[-1]


def set_mla_kv_buffer(
    kv_buffer: torch.Tensor,
    loc: torch.Tensor,
    k_nope: torch.Tensor,
    k_rope: torch.Tensor,
    *,
    scale: torch.Tensor | None = None,
    backend: str | None = None,
) -> None:
    """``kv_buffer[loc[i]] = conv(concat(k_nope[i], k_rope[i]))``; negative loc skipped. conv is
    a cast to the buffer dtype, ``cvt_satfinite_rne(x / scale)`` for an fp8 buffer.

    Parameters
    ----------
    kv_buffer : [S, 1, Dn+Dr] or [S, Dn+Dr] [inout], the dtype of k_nope or float8_e4m3fn;
        last dim contiguous.
    loc : [N] int32 or int64 slots; a slot >= S raises ValueError in the torch reference (a host
        sync); the CUDA kernel skips that row instead (never an illegal access).
    k_nope : [N, Dn] or [N, 1, Dn] float16, bfloat16 or float32; last dim contiguous.
    k_rope : [N, Dr] or [N, 1, Dr], the dtype of k_nope; last dim contiguous.
    scale : optional fp32 [1] scale of an fp8 buffer (default 1.0).
    backend : force a backend by name instead of the best eligible one.
    """
    check_tensor(OP_ID, "k_nope", k_nope, dtypes=DTYPES, ndim=(2, 3), last_dim_contiguous=True)
    check_tensor(
        OP_ID, "k_rope", k_rope, dtypes=(k_nope.dtype,), ndim=(2, 3), last_dim_contiguous=True
    )
    check_tensor(
        OP_ID, "kv_buffer", kv_buffer, ndim=(2, 3), device=k_nope.device, last_dim_contiguous=True
    )
    check_tensor(OP_ID, "k_rope", k_rope, device=k_nope.device)
    n = k_nope.shape[0]
    width = _width("k_nope", k_nope, n) + _width("k_rope", k_rope, n)
    if kv_buffer.dim() == 3 and kv_buffer.shape[1] != 1:
        raise ValueError(
            f"{OP_ID}: kv_buffer must be [S, 1, Dn+Dr] or [S, Dn+Dr], got shape "
            f"{tuple(kv_buffer.shape)}"
        )
    if kv_buffer.shape[-1] != width:
        raise ValueError(
            f"{OP_ID}: kv_buffer rows must hold Dn + Dr = {k_nope.shape[-1]} + "
            f"{k_rope.shape[-1]} = {width} values, got shape {tuple(kv_buffer.shape)}"
        )
    check_cache_dtype(OP_ID, "kv_buffer", kv_buffer, k_nope)
    check_slots(OP_ID, "loc", loc, n, k_nope)
    check_scale(OP_ID, "scale", scale, k_nope)
    if n:
        SET_MLA_KV_BUFFER.run(kv_buffer, loc, k_nope, k_rope, scale, backend=backend)


def _set_mla_kv_buffer_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls: every dtype, DeepSeek's 512 + 64 in bf16 and fp8, 2-D and 3-D layouts,
    a padding slot."""
    g = torch.Generator(device="cpu").manual_seed(0)
    n = 5
    nope = torch.randn(n, 1, 512, generator=g).bfloat16().to(device)
    rope = torch.randn(n, 1, 64, generator=g).bfloat16().to(device)
    loc = torch.randperm(32, generator=g)[:n].to(device)
    loc[3] = -1
    buf = torch.zeros(32, 1, 576, dtype=torch.bfloat16, device=device)
    buf8 = torch.zeros(32, 576, dtype=torch.float8_e4m3fn, device=device)
    scale = torch.tensor([0.5], device=device)
    small = torch.zeros(8, 24, dtype=torch.float16, device=device)
    small_nope = torch.randn(3, 16, generator=g).half().to(device)
    small_rope = torch.randn(3, 8, generator=g).half().to(device)
    wide = torch.zeros(6, 1, 40, device=device)
    wide_nope = torch.randn(2, 1, 32, generator=g).to(device)
    wide_rope = torch.randn(2, 1, 8, generator=g).to(device)
    return [
        ((wide, torch.tensor([5, 1], device=device), wide_nope, wide_rope), {}),
        ((buf, loc, nope, rope), {}),
        ((buf8, loc, nope[:, 0], rope[:, 0]), {"scale": scale}),
        ((small, torch.tensor([7, 0, 3], device=device), small_nope, small_rope), {}),
    ]
