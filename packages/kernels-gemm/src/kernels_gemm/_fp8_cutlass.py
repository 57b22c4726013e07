"""What the CUTLASS fp8 GEMMs (fp8_scaled_mm, fp8_blockwise_mm) share on the Python side: where
their headers come from and the operand rules of their TMA kernels."""

from __future__ import annotations

import functools
import importlib.metadata

import torch

from kernels_jit.validation import check_tensor

FP8 = torch.float8_e4m3fn

# CUTLASS 3.x / CuTe headers as the nvidia-cutlass wheel ships them (a dependency of this
# package); kernels-jit adds the directory to the include path and keys builds on its version.
CUTLASS_DIST = "nvidia-cutlass"
CUTLASS_HEADERS = ((CUTLASS_DIST, "cutlass_library/source/include"),)


@functools.cache
def _cutlass_installed() -> bool:
    try:
        importlib.metadata.distribution(CUTLASS_DIST)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@functools.cache
def _is_sm90(index: int) -> bool:
    return torch.cuda.get_device_capability(index) == (9, 0)


def cutlass_gemm_reason(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> str | None:
    """Why the sm90a CUTLASS kernels cannot take ``a [M, K] @ b [K, N] -> out``, or None.

    TMA needs 16-byte rows: K and N multiples of 16, a row-major and b column-major with row
    strides that are multiples of 16, every base 16-byte aligned, out contiguous."""
    if not _is_sm90(a.device.index if a.device.index is not None else 0):
        return "needs an sm90 GPU (the kernels are built for sm_90a)"
    if not _cutlass_installed():
        return f"needs the {CUTLASS_DIST} distribution (CUTLASS headers)"
    m, k = a.shape
    n = b.shape[1]
    if k == 0:
        return "K = 0 (an empty sum)"
    if k % 16 or n % 16:
        return "needs K and N multiples of 16"
    if a.stride(1) != 1 or a.stride(0) % 16 or b.stride(0) != 1 or b.stride(1) % 16:
        return "needs a row-major and b column-major with row strides that are multiples of 16"
    if a.data_ptr() % 16 or b.data_ptr() % 16 or out.data_ptr() % 16:
        return "needs 16-byte aligned a, b and out"
    if not out.is_contiguous():
        return "needs a contiguous out"
    if max(m, n, k) >= 2**31:
        return "needs M, N and K below 2^31"
    return None


def check_fp8_operands(op_id: str, a: torch.Tensor, b: torch.Tensor) -> tuple[int, int, int]:
    """Validate the fp8 GEMM operands every backend takes, ``a [M, K]`` row-major and ``b [K, N]``
    column-major (``w.t()`` of a row-major weight); return ``(M, N, K)``."""
    check_tensor(op_id, "a", a, dtypes=(FP8,), ndim=2)
    check_tensor(op_id, "b", b, dtypes=(FP8,), ndim=2)
    if a.shape[1] > 1 and a.stride(1) != 1:
        raise ValueError(
            f"{op_id}: a [M, K] must be row-major (stride 1 along K), got strides {a.stride()}"
        )
    if b.shape[0] > 1 and b.stride(0) != 1:
        raise ValueError(
            f"{op_id}: b [K, N] must be column-major (stride 1 along K; pass w.t() of a "
            f"row-major [N, K] weight), got strides {b.stride()}"
        )
    m, k = a.shape
    if b.shape[0] != k:
        raise ValueError(
            f"{op_id}: a [M, K] and b [K, N] must share K, got a {tuple(a.shape)} and "
            f"b {tuple(b.shape)}"
        )
    return m, b.shape[1], k
