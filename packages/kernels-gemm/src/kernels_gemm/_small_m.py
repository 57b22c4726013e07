"""What the small-M GEMM engine (csrc/small_m_gemm.cuh) accepts, shared by its two ops."""

from __future__ import annotations

import torch

MAX_ROWS = 16  # the CUDA kernel's M: one tensor-core tile of rows

# The engine's switches: module attributes of each op (ops/dsv3_*.py), read on every call and
# passed to the C++ entry, so one process can time every setting (`python -m
# shared.bench.switches --group gemm --op dsv3_router_gemm --grid _RING_MAX_M=0,16 ...`) and the
# GPU tests can force each one:
# - _RING_MAX_M: runs of >= 16 chunks a warp take the ring kernel (cp.async through a shared-memory
#   ring, one CTA per SM) at M <= this; 0: never (gemm_kernel, two CTAs per SM).
# - _CLUSTER_PUSH: the split-K cluster reduction pushes partials with st.async onto the owner's
#   mbarrier; False: DSMEM stores and a second cluster barrier.
# - _WEIGHT_FIRST: under PDL the first stages' weight is loaded before griddepcontrol.wait;
#   False: everything after it, the head of each run prefetched into L2 before it.


def rows_fit(t: torch.Tensor, k: int) -> bool:
    """16-byte rows of bf16: an aligned start and (past one row) a row stride % 8 == 0."""
    return k == 0 or (t.data_ptr() % 16 == 0 and (t.shape[0] <= 1 or t.stride(0) % 8 == 0))


def cuda_refusal(x: torch.Tensor, w: torch.Tensor, misaligned: str) -> str | None:
    """Why the CUDA kernel cannot take activations ``x`` [M, K] against the weight rows ``w``
    [N, K] (both contiguous along K), or None: M <= 16 (one tile of rows; cuBLAS wins past it),
    K % 8 == 0 and 16-byte aligned rows (else ``misaligned``). Malformed arguments get None:
    the kernel rejects them."""
    if x.dim() != 2 or w.dim() != 2:
        return None
    if x.shape[1] > 1 and (x.stride(1) != 1 or w.stride(1) != 1):
        return None
    if x.shape[0] > MAX_ROWS:
        return f"M = {x.shape[0]} > {MAX_ROWS} rows (cuBLAS territory)"
    k = x.shape[1]
    if k % 8:
        return f"K = {k} is not a multiple of 8 (16-byte rows)"
    if not (rows_fit(x, k) and rows_fit(w, k)):
        return misaligned
    return None
