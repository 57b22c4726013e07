"""kvcache.store_cache: write K and V rows [N, Hk*D] into token-major caches [S, Hk*D] at slot
indices (SGLang's MHA token-to-KV pool), optionally converting to fp8 with per-tensor scales.

Backends: CUDA (csrc/store_cache.cuh on the row-scatter engine csrc/kv_write.cuh: K and V rows of a
token moved by one group of threads in 16-byte packs, fp8 scales read on the device; from 2048 rows
into caches of the input dtype, TMA bulk copies through shared-memory stages, where _BULK_* let
them), then the torch reference.
"""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_tensor
from kernels_kvcache import reference
from kernels_kvcache._checks import FP8, check_cache_dtype, check_scale, check_slots

OP_ID = "kvcache.store_cache"

STORE_CACHE_CUDA = ModuleSpec(
    name="store_cache",
    package="kernels_kvcache",
    sources=("csrc/kv_write.cuh", "csrc/store_cache.cuh"),
    exports=(("store_cache", "store_cache"),),
    description="CUDA: row scatter, a thread group per token, 16-byte packs, fp8 with scales",
)

_store_cache_kernels = CompiledFunction(STORE_CACHE_CUDA, "store_cache")
# Where the TMA bulk path runs instead of the register path (kv_write.cuh's BulkGate), read each
# call so one process can A/B it: from _BULK_MIN_ROWS rows (-1: never, 0: from one row) up to
# _BULK_MAX_ROWS (-1: no ceiling), for cache rows of at least _BULK_MIN_RUN_BYTES (token-major rows
# are one run: 2 KB at Hk x D = 8 x 128 bf16). On the H200 (interleaved A/B) it won at 8192 and
# 32768 rows of 2 KB (20.8 -> 19.6, 76.3 -> 75.4 us); 2048 rows is the patch's design point, not
# measured (the suite has no shape between 64 and 8192).
_BULK_MIN_ROWS = 2048
_BULK_MAX_ROWS = -1
_BULK_MIN_RUN_BYTES = 1024


def _store_cache_cuda(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    indices: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    skip_index: int,
) -> None:
    _store_cache_kernels(
        k_cache,
        v_cache,
        k,
        v,
        indices,
        k_scale,
        v_scale,
        skip_index,
        _BULK_MIN_ROWS,
        _BULK_MAX_ROWS,
        _BULK_MIN_RUN_BYTES,
    )


def _store_cache_torch(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    indices: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    skip_index: int,
) -> None:
    reference.store_cache(k, v, k_cache, v_cache, indices, k_scale, v_scale, skip_index)


def _store_cache_cuda_eligible(
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    indices: torch.Tensor,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
    skip_index: int,
) -> str | None:
    """The kernel converts both caches alike: both fp8, or both of the input dtype."""
    if (k_cache.dtype == FP8) != (v_cache.dtype == FP8):
        return "needs both caches fp8 or both of the input dtype"
    return None


STORE_CACHE = Op(_store_cache_torch, mutates=("k_cache", "v_cache"), device="k")
DTYPES = STORE_CACHE.dtypes


def store_cache(
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    indices: torch.Tensor,
    *,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    skip_index: int = -1,
    backend: str | None = None,
) -> None:
    """``k_cache[indices[i]] = conv(k[i])``, ``v_cache[indices[i]] = conv(v[i])``; conv is a copy
    when the dtypes match and ``cvt_satfinite_rne(x / scale)`` for an fp8 cache.

    Negative indices and ``indices == skip_index`` are skipped (SGLang reserves slot 0 for
    CUDA-graph padding and passes ``skip_index=0``; the default -1 drops no real write). With
    duplicate indices the last writer is unspecified.

    Parameters
    ----------
    k : [N, Hk*D] float16, bfloat16 or float32; last dim contiguous, any row stride.
    v : [N, Hk*Dv], the dtype of k.
    k_cache : [S, Hk*D] [inout], the dtype of k or float8_e4m3fn.
    v_cache : [S, Hk*Dv] [inout], the dtype of v or float8_e4m3fn.
    indices : [N] int32 or int64 slots; a slot >= S raises ValueError in the torch reference
        (a host sync); the CUDA kernel cannot check it without one, so it skips that row (never
        an illegal access).
    k_scale, v_scale : optional fp32 [1] scales of fp8 caches (default 1.0); unused otherwise.
    skip_index : one more slot value to skip.
    backend : force a backend by name instead of the best eligible one.
    """
    check_tensor(OP_ID, "k", k, dtypes=DTYPES, ndim=2, last_dim_contiguous=True)
    check_tensor(OP_ID, "v", v, dtypes=(k.dtype,), ndim=2, last_dim_contiguous=True)
    check_tensor(OP_ID, "k_cache", k_cache, ndim=2, device=k.device, last_dim_contiguous=True)
    check_tensor(OP_ID, "v_cache", v_cache, ndim=2, device=k.device, last_dim_contiguous=True)
    n = k.shape[0]
    if v.shape[0] != n:
        raise ValueError(
            f"{OP_ID}: k and v must have the same number of rows N, got k {tuple(k.shape)} and "
            f"v {tuple(v.shape)}"
        )
    for arg, cache, rows in (("k_cache", k_cache, k), ("v_cache", v_cache, v)):
        check_cache_dtype(OP_ID, arg, cache, rows)
        if cache.shape[1] != rows.shape[1]:
            name = arg.removesuffix("_cache")
            raise ValueError(
                f"{OP_ID}: {arg} rows must be as wide as {name} rows ({rows.shape[1]}), got "
                f"{arg} shape {tuple(cache.shape)}"
            )
    if k_cache.shape[0] != v_cache.shape[0]:
        raise ValueError(
            f"{OP_ID}: k_cache and v_cache must have the same number of slots S, got "
            f"{k_cache.shape[0]} and {v_cache.shape[0]}"
        )
    check_slots(OP_ID, "indices", indices, n, k)
    check_scale(OP_ID, "k_scale", k_scale, k)
    check_scale(OP_ID, "v_scale", v_scale, k)
    if type(skip_index) is not int:
        raise TypeError(
            f"{OP_ID}: skip_index must be a Python int, got {type(skip_index).__name__}"
        )
    if n:
        STORE_CACHE.run(
            k_cache, v_cache, k, v, indices, k_scale, v_scale, skip_index, backend=backend
        )


def _store_cache_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls: every dtype, Llama-3-8B rows (8 x 128), K/V widths that differ, an fp8
    cache with scales, padding slots and the skip index."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cases: list[tuple[tuple, dict]] = []
    for n, wk, wv, slots, dtype in (
        (6, 64, 64, 12, torch.float32),
        (5, 1024, 1024, 64, torch.bfloat16),
        (7, 96, 40, 9, torch.float16),
    ):
        k = torch.randn(n, wk, generator=g).to(dtype).to(device)
        v = torch.randn(n, wv, generator=g).to(dtype).to(device)
        k_cache = torch.zeros(slots, wk, dtype=dtype, device=device)
        v_cache = torch.zeros(slots, wv, dtype=dtype, device=device)
        idx = torch.randperm(slots, generator=g)[:n].to(device)
        idx[0] = -1
        cases.append(((k, v, k_cache, v_cache, idx), {}))
    fp8 = torch.float8_e4m3fn
    k8 = torch.zeros(slots, wk, dtype=fp8, device=device)
    v8 = torch.zeros(slots, wv, dtype=fp8, device=device)
    scales = {
        "k_scale": torch.tensor([0.5], device=device),
        "v_scale": torch.tensor([2.0], device=device),
    }
    cases.append(((k, v, k8, v8, idx), {**scales, "skip_index": int(idx[1])}))
    return cases
