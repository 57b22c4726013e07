"""memory.write_req_to_token_pool: record newly allocated KV slots in the request-to-token table.

CUDA: one launch of B x Y blocks, each summing the lengths of the earlier requests itself (the
device prefix sum: no host sync, no second launch), then copying its request's slots; radix-cache
``prefixes`` are written by the same blocks, their pointers and lengths passed as a table in the
kernel parameters (csrc/write_req_to_token_pool.cuh).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_tensor
from kernels_memory import reference
from kernels_memory._checks import INDEX_DTYPES, check_index_vector

OP_ID = "memory.write_req_to_token_pool"

WRITE_REQ_TO_TOKEN_POOL_CUDA = ModuleSpec(
    name="write_req_to_token_pool",
    package="kernels_memory",
    sources=("csrc/write_req_to_token_pool.cuh", "csrc/memory_common.cuh"),
    exports=(("write_req_to_token_pool", "write_req_to_token_pool"),),
    description="CUDA: B x Y blocks, a per-block prefix sum, then the slot copy",
)
_write_req_to_token_pool_compiled = CompiledFunction(
    WRITE_REQ_TO_TOKEN_POOL_CUDA, "write_req_to_token_pool"
)


def _write_req_to_token_pool_torch(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    out_cache_loc: torch.Tensor,
    prefixes: list[torch.Tensor],
) -> None:
    reference.write_req_to_token_pool(
        req_to_token, req_pool_indices, starts, ends, out_cache_loc, prefixes=prefixes
    )


_NO_PREFIXES = torch.empty(0, 2, dtype=torch.int64)


def _write_req_to_token_pool_cuda(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    out_cache_loc: torch.Tensor,
    prefixes: list[torch.Tensor],
) -> None:
    if prefixes:
        table = torch.tensor(
            [(q.data_ptr(), q.shape[0] << 1 | (q.dtype == torch.int64)) for q in prefixes],
            dtype=torch.int64,
        )
        tokens = sum(q.shape[0] for q in prefixes)
    else:
        table, tokens = _NO_PREFIXES, 0
    _write_req_to_token_pool_compiled(
        req_to_token, req_pool_indices, starts, ends, out_cache_loc, table, tokens
    )


def _write_req_to_token_pool_cuda_eligible(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    out_cache_loc: torch.Tensor,
    prefixes: list[torch.Tensor],
) -> str | None:
    if not all(q.shape[0] <= 1 or q.stride(0) == 1 for q in prefixes):
        return "needs contiguous prefixes"
    if req_to_token.shape[1] > 1 and req_to_token.stride(1) != 1:
        return "needs req_to_token with a contiguous last dim"
    return None


WRITE_REQ_TO_TOKEN_POOL = Op(
    _write_req_to_token_pool_torch, mutates=("req_to_token",), device="req_to_token"
)


def write_req_to_token_pool(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    out_cache_loc: torch.Tensor,
    *,
    prefixes: Sequence[torch.Tensor] | None = None,
    backend: str | None = None,
) -> None:
    """In place: ``req_to_token[req_pool_indices[i], starts[i]:ends[i]] = out_cache_loc[o_i :
    o_i + n_i]`` with ``n_i = ends[i] - starts[i]`` and ``o_i = sum_{j<i} n_j`` (a prefix sum).

    Parameters
    ----------
    req_to_token : [R, L] int32 (or int64), modified in place.
    req_pool_indices : [B] int64 (or int32) rows in [0, R).
    starts, ends : [B] int64 (or int32), ``0 <= starts <= ends <= L`` (SGLang: prefix and
        sequence lengths).
    out_cache_loc : [N] int32/int64 slots, ``N == sum(ends - starts)``; cast to the table dtype.
    prefixes : optional B 1-D int tensors (radix-cache hits): ``req_to_token[row_i, :len(p_i)]
        = p_i``, written before the new slots.
    """
    check_tensor(OP_ID, "req_to_token", req_to_token, dtypes=INDEX_DTYPES, ndim=2)
    device = req_to_token.device
    check_index_vector(OP_ID, "req_pool_indices", req_pool_indices, None, device)
    batch = req_pool_indices.shape[0]
    check_index_vector(OP_ID, "starts", starts, batch, device)
    check_index_vector(OP_ID, "ends", ends, batch, device)
    check_index_vector(OP_ID, "out_cache_loc", out_cache_loc, None, device)
    prefix_list = [] if prefixes is None else list(prefixes)
    if prefixes is not None and len(prefix_list) != batch:
        raise ValueError(
            f"{OP_ID}: prefixes must hold one tensor per request ({batch}), got {len(prefix_list)}"
        )
    for i, prefix in enumerate(prefix_list):
        check_index_vector(OP_ID, f"prefixes[{i}]", prefix, None, device)
    if batch:
        WRITE_REQ_TO_TOKEN_POOL.run(
            req_to_token,
            req_pool_indices,
            starts,
            ends,
            out_cache_loc,
            prefix_list,
            backend=backend,
        )


def _write_req_to_token_pool_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: an empty extend and radix-cache prefixes."""
    g = torch.Generator().manual_seed(0)
    table = torch.zeros(6, 32, dtype=torch.int32)
    rows = torch.tensor([5, 1, 2], dtype=torch.int64)
    starts = torch.tensor([0, 4, 9], dtype=torch.int64)
    ends = torch.tensor([3, 4, 20], dtype=torch.int64)
    slots = torch.randperm(1000, generator=g)[:14]
    prefixes = [torch.empty(0, dtype=torch.int64), torch.arange(4) + 500, torch.arange(9) + 600]
    args = tuple(t.to(device) for t in (table, rows, starts, ends, slots))
    wide = (args[0].long(), args[1].int(), args[2].int(), args[3], args[4])
    return [
        (args, {}),
        (wide, {}),
        (args, {"prefixes": [p.to(device) for p in prefixes]}),
    ]
