"""memory.get_last_loc: the KV slot of each request's last prefix token (-1 for an empty prefix).

CUDA: one thread per request, no host sync, one kernel for every batch size and dtype mix
(csrc/get_last_loc.cuh). The torch reference checks index ranges on the host; the kernel gives -1
for a row or prefix length out of range.
"""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_tensor
from kernels_memory import reference
from kernels_memory._checks import INDEX_DTYPES, check_index_vector

OP_ID = "memory.get_last_loc"

GET_LAST_LOC_CUDA = ModuleSpec(
    name="get_last_loc",
    package="kernels_memory",
    sources=("csrc/get_last_loc.cuh", "csrc/memory_common.cuh"),
    exports=(("get_last_loc", "get_last_loc"),),
    description="CUDA: one thread per request (a gather)",
)
_get_last_loc_cuda = CompiledFunction(GET_LAST_LOC_CUDA, "get_last_loc")


def _get_last_loc_torch(
    last: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
) -> None:
    last.copy_(reference.get_last_loc(req_to_token, req_pool_indices, prefix_lens))


def _get_last_loc_cuda_eligible(
    last: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
) -> str | None:
    if req_to_token.shape[1] > 1 and req_to_token.stride(1) != 1:
        return "needs req_to_token with a contiguous last dim"
    return None


GET_LAST_LOC = Op(_get_last_loc_torch, mutates=("last",), device="req_to_token")


def get_last_loc(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """``req_to_token[req_pool_indices[i], prefix_lens[i] - 1]`` if ``prefix_lens[i] > 0``, else -1.

    Parameters
    ----------
    req_to_token : [R, L] int32 (or int64) request-to-token table.
    req_pool_indices : [B] int32/int64 rows of req_to_token, in [0, R).
    prefix_lens : [B] int32/int64 prefix lengths, in [0, L].

    Returns
    -------
    last [B] in the dtype of prefix_lens.
    """
    check_tensor(OP_ID, "req_to_token", req_to_token, dtypes=INDEX_DTYPES, ndim=2)
    device = req_to_token.device
    check_index_vector(OP_ID, "req_pool_indices", req_pool_indices, None, device)
    check_index_vector(OP_ID, "prefix_lens", prefix_lens, req_pool_indices.shape[0], device)
    last = torch.empty_like(prefix_lens)
    if last.numel():
        GET_LAST_LOC.run(last, req_to_token, req_pool_indices, prefix_lens, backend=backend)
    return last


def _get_last_loc_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: empty and full prefixes."""
    g = torch.Generator().manual_seed(0)
    table = torch.randint(0, 10_000, (8, 40), generator=g, dtype=torch.int32)
    rows = torch.tensor([3, 0, 7, 3], dtype=torch.int64)
    prefix = torch.tensor([0, 1, 40, 17], dtype=torch.int64)
    return [
        ((table.to(device), rows.to(device), prefix.to(device)), {}),
        ((table.long().to(device), rows.int().to(device), prefix.int().to(device)), {}),
    ]
