"""kvcache.reshape_and_cache_flash: token-major K/V [N, Hk, D] into a paged cache
[num_blocks, block_size, Hk, D] by slot mapping (VLLM's FlashAttention cache layout).

Backends: CUDA (csrc/reshape_and_cache_flash.cuh on the row-scatter engine csrc/kv_write.cuh: every
stride honoured, so NHD caches, HND caches as permuted views and K/V halves of one tensor take the
same kernel; from 2048 rows into caches of the input dtype whose token runs are long (NHD, not
HND), TMA bulk copies through shared-memory stages, where _BULK_* let them), then the torch
reference.
"""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_tensor
from kernels_kvcache import reference
from kernels_kvcache._checks import FP8, check_scale, check_slots

OP_ID = "kvcache.reshape_and_cache_flash"
KV_CACHE_DTYPES = ("auto", "fp8", "fp8_e4m3")

RESHAPE_AND_CACHE_FLASH_CUDA = ModuleSpec(
    name="reshape_and_cache_flash",
    package="kernels_kvcache",
    sources=("csrc/kv_write.cuh", "csrc/reshape_and_cache_flash.cuh"),
    exports=(("reshape_and_cache_flash", "reshape_and_cache_flash"),),
    description="CUDA: paged row scatter (any block/token/head strides), 16-byte packs, fp8",
)

_reshape_and_cache_flash_kernels = CompiledFunction(
    RESHAPE_AND_CACHE_FLASH_CUDA, "reshape_and_cache_flash"
)
# Where the TMA bulk path runs instead of the register path (kv_write.cuh's BulkGate), read each
# call so one process can A/B it: from _BULK_MIN_ROWS rows (-1: never, 0: from one row) up to
# _BULK_MAX_ROWS (-1: no ceiling), where a token's cache-side runs average at least
# _BULK_MIN_RUN_BYTES (0: any). H200 interleaved A/B, Hk x D = 8 x 128 bf16: NHD caches (a
# token's heads are one 2 KB run) won (8192 rows 20.8 -> 19.6 us, 32768 76.3 -> 75.4), HND caches
# (8 runs of 256 B a block stride apart) lost (20.8 -> 21.3, 76.1 -> 79.3): 1 KB keeps NHD and
# excludes HND. 2048 rows is the patch's design point, not measured.
_BULK_MIN_ROWS = 2048
_BULK_MAX_ROWS = -1
_BULK_MIN_RUN_BYTES = 1024


def _reshape_and_cache_flash_torch(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
) -> None:
    reference.reshape_and_cache_flash(
        key, value, key_cache, value_cache, slot_mapping, k_scale, v_scale
    )


RESHAPE_AND_CACHE_FLASH = Op(
    _reshape_and_cache_flash_torch, mutates=("key_cache", "value_cache"), device="key"
)
DTYPES = RESHAPE_AND_CACHE_FLASH.dtypes


def _reshape_and_cache_flash_cuda(
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_cache_dtype: str,
    k_scale: torch.Tensor | None,
    v_scale: torch.Tensor | None,
) -> None:
    _reshape_and_cache_flash_kernels(
        key_cache,
        value_cache,
        key,
        value,
        slot_mapping,
        kv_cache_dtype,
        k_scale,
        v_scale,
        _BULK_MIN_ROWS,
        _BULK_MAX_ROWS,
        _BULK_MIN_RUN_BYTES,
    )


def _check_cache(arg: str, cache: torch.Tensor, rows: torch.Tensor, kv_cache_dtype: str) -> None:
    check_tensor(OP_ID, arg, cache, ndim=4, device=rows.device, last_dim_contiguous=True)
    if kv_cache_dtype == "auto" and cache.dtype != rows.dtype:
        raise TypeError(
            f"{OP_ID}: kv_cache_dtype='auto' needs {arg} of the input dtype "
            f"{str(rows.dtype).removeprefix('torch.')}, got "
            f"{str(cache.dtype).removeprefix('torch.')} (pass kv_cache_dtype='fp8' for fp8)"
        )
    if kv_cache_dtype != "auto" and cache.dtype not in (FP8, torch.uint8):
        raise TypeError(
            f"{OP_ID}: kv_cache_dtype={kv_cache_dtype!r} needs {arg} of dtype float8_e4m3fn "
            f"(or uint8 holding its bytes), got {str(cache.dtype).removeprefix('torch.')}"
        )
    if tuple(cache.shape[2:]) != tuple(rows.shape[1:]):
        raise ValueError(
            f"{OP_ID}: {arg} [num_blocks, block_size, Hk, D] must match the input's [Hk, D] = "
            f"{list(rows.shape[1:])}, got shape {tuple(cache.shape)}"
        )


def reshape_and_cache_flash(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    kv_cache_dtype: str = "auto",
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
    backend: str | None = None,
) -> None:
    """For each ``slot = slot_mapping[i] >= 0``: ``key_cache[slot // bs, slot % bs] = conv(key[i])``
    and the same for value; negative slots (padding) are skipped. conv is a copy ("auto") or
    ``cvt_satfinite_rne(x / scale)`` ("fp8").

    Parameters
    ----------
    key : [N, Hk, D] float16, bfloat16 or float32; last dim contiguous, any other strides.
    value : [N, Hk, Dv], the dtype of key.
    key_cache : [num_blocks, block_size, Hk, D] [inout]; may be a strided view (e.g. the K half
        of one [num_blocks, 2, block_size, Hk, D] tensor).
    value_cache : [num_blocks, block_size, Hk, Dv] [inout].
    slot_mapping : [N] int64 (or int32) slots ``block * block_size + offset``; a slot >=
        num_blocks * block_size raises ValueError in the torch reference (a host sync); the
        CUDA kernel skips that row instead (never an illegal access).
    kv_cache_dtype : "auto" (caches of the input dtype) or "fp8" / "fp8_e4m3" (caches of
        float8_e4m3fn, or uint8 holding its bytes).
    k_scale, v_scale : optional fp32 [1] scales of an fp8 cache (default 1.0).
    backend : force a backend by name instead of the best eligible one.
    """
    check_tensor(OP_ID, "key", key, dtypes=DTYPES, ndim=3, last_dim_contiguous=True)
    check_tensor(OP_ID, "value", value, dtypes=(key.dtype,), ndim=3, last_dim_contiguous=True)
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise ValueError(
            f"{OP_ID}: kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}"
        )
    n = key.shape[0]
    if value.shape[:2] != key.shape[:2]:
        raise ValueError(
            f"{OP_ID}: key [N, Hk, D] and value [N, Hk, Dv] must share N and Hk, got key "
            f"{tuple(key.shape)} and value {tuple(value.shape)}"
        )
    _check_cache("key_cache", key_cache, key, kv_cache_dtype)
    _check_cache("value_cache", value_cache, value, kv_cache_dtype)
    if key_cache.shape[:2] != value_cache.shape[:2]:
        raise ValueError(
            f"{OP_ID}: key_cache and value_cache must share [num_blocks, block_size], got "
            f"{tuple(key_cache.shape)} and {tuple(value_cache.shape)}"
        )
    check_slots(OP_ID, "slot_mapping", slot_mapping, n, key)
    check_scale(OP_ID, "k_scale", k_scale, key)
    check_scale(OP_ID, "v_scale", v_scale, key)
    if n:
        RESHAPE_AND_CACHE_FLASH.run(
            key_cache,
            value_cache,
            key,
            value,
            slot_mapping,
            kv_cache_dtype,
            k_scale,
            v_scale,
            backend=backend,
        )


def _reshape_and_cache_flash_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls: every dtype, block sizes 16, 5 and 8, padding slots, K/V halves of one
    tensor, an HND cache, fp8."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cases: list[tuple[tuple, dict]] = []
    n, heads, d = 6, 2, 64
    key = torch.randn(n, heads, d, generator=g).bfloat16().to(device)
    value = torch.randn(n, heads, d, generator=g).bfloat16().to(device)
    slots = torch.randperm(4 * 16, generator=g)[:n].to(device)
    slots[2] = -1
    caches = torch.zeros(4, 2, 16, heads, d, dtype=torch.bfloat16, device=device)
    cases.append(((key, value, caches[:, 0], caches[:, 1], slots), {}))
    k8 = torch.zeros(4, 16, heads, d, dtype=torch.float8_e4m3fn, device=device)
    v8 = torch.zeros(4, 16, heads, d, dtype=torch.float8_e4m3fn, device=device)
    fp8 = {"kv_cache_dtype": "fp8", "k_scale": torch.tensor([0.25], device=device)}
    cases.append(((key, value, k8, v8, slots), fp8))
    key = torch.randn(3, 1, 40, generator=g).half().to(device)
    value = torch.randn(3, 1, 24, generator=g).half().to(device)
    kc = torch.zeros(3, 5, 1, 40, dtype=torch.float16, device=device)
    vc = torch.zeros(3, 5, 1, 24, dtype=torch.float16, device=device)
    cases.append(((key, value, kc, vc, torch.tensor([14, 0, 7], device=device)), {}))
    key = torch.randn(4, 2, 32, generator=g).to(device)
    value = torch.randn(4, 2, 32, generator=g).to(device)
    hnd = torch.zeros(2, 2, 8, 32, device=device).permute(0, 2, 1, 3)  # HND as [NB, bs, Hk, D]
    cases.append(((key, value, hnd, hnd.clone(), torch.tensor([3, -1, 15, 8], device=device)), {}))
    return cases
