"""memory.alloc_extend: KV slots for a prefill/extend batch, continuing each request's last page.

CUDA: one launch of B x Y blocks, each summing the tokens and new pages of the earlier requests
itself (no host sync, no second launch), then writing its request's slots; one kernel for every
batch size (csrc/alloc_extend.cuh).
"""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_memory import reference
from kernels_memory._checks import (
    check_alloc_extend_values,
    check_flag,
    check_index_vector,
    check_page_size,
)

OP_ID = "memory.alloc_extend"

ALLOC_EXTEND_CUDA = ModuleSpec(
    name="alloc_extend",
    package="kernels_memory",
    sources=("csrc/alloc_extend.cuh", "csrc/memory_common.cuh"),
    exports=(("alloc_extend", "alloc_extend"),),
    description="CUDA: B x Y blocks, per-block prefix sums of tokens and pages",
)
_alloc_extend_cuda = CompiledFunction(ALLOC_EXTEND_CUDA, "alloc_extend")


def _alloc_extend_torch(
    out: torch.Tensor,
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    page_size: int,
) -> None:
    out.copy_(
        reference.alloc_extend(
            prefix_lens,
            seq_lens,
            last_loc,
            free_pages,
            page_size,
            extend_num_tokens=out.shape[0],
        )
    )


ALLOC_EXTEND = Op(_alloc_extend_torch, mutates=("out",), device="prefix_lens")


def alloc_extend(
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    page_size: int,
    *,
    extend_num_tokens: int,
    validate: bool = False,
    backend: str | None = None,
) -> torch.Tensor:
    """Slots for tokens ``[prefix_lens[i], seq_lens[i])`` of every request, in request then token
    order. Request i first fills the rest of its last page (``last_loc + 1, ...``), then takes
    ``new_i = ceil(s/ps) - ceil(p/ps)`` pages ``free_pages[sum_{j<i} new_j : ...]`` in order.
    The caller then drops ``sum(new_i)`` pages from its free list.

    Parameters
    ----------
    prefix_lens, seq_lens : [B] int64 (or int32), ``seq_lens >= prefix_lens``.
    last_loc : [B] int64 (or int32), slot of the last prefix token: >= -1 (-1 = empty); where
        it is used (``prefix_len % page_size != 0`` and ``seq_len > prefix_len``), a slot (>= 0)
        at page offset ``(prefix_len - 1) % page_size``; ignored elsewhere.
    free_pages : [F] int64 (or int32) free page ids; the P = ``sum(new_i)`` pages taken
        (``free_pages[:P]``) must be >= 0 and distinct, F >= P.
    page_size : slots per page, >= 1.
    extend_num_tokens : ``sum(seq_lens - prefix_lens)``, known on the host, so the output shape
        is static (no device sync).
    validate : check the values of the arguments above before launching (ValueError naming the
        argument, the first bad index and its value). This reads them on the host: a
        device-to-host sync on CUDA, so not for CUDA graphs; skipped while torch.compile traces.

    Returns
    -------
    out [extend_num_tokens] int64.

    Checks and their cost
    ---------------------
    Types, dtypes, shapes, devices, ``page_size`` and ``extend_num_tokens >= 0`` are always
    checked (host metadata, no sync). The value preconditions (``seq_lens >= prefix_lens >= 0``,
    ``extend_num_tokens == sum(seq_lens - prefix_lens)``, last_loc, free_pages) need the values:
    the torch reference (the backend on CPU, and the CUDA fallback) always
    checks them, reading them on the host as it computes; a CUDA kernel must not (no host sync),
    so there ``validate=True`` is the way to get them. Without it a kernel treats them as
    preconditions and never faults: it writes only ``out[:extend_num_tokens]``, a slot whose page
    index is >= F is -1 (never read past the list), a negative page id gives negative slots
    ``page * page_size + offset``, last_loc is used as given; the kvcache ops skip negative slots,
    so that KV is dropped.
    SGLang's allocator checks free space on the host before calling.
    """
    device = prefix_lens.device if isinstance(prefix_lens, torch.Tensor) else None
    check_index_vector(OP_ID, "prefix_lens", prefix_lens, None, device)
    batch = prefix_lens.shape[0]
    check_index_vector(OP_ID, "seq_lens", seq_lens, batch, device)
    check_index_vector(OP_ID, "last_loc", last_loc, batch, device)
    check_index_vector(OP_ID, "free_pages", free_pages, None, device)
    check_page_size(OP_ID, page_size)
    if isinstance(extend_num_tokens, bool) or not isinstance(extend_num_tokens, int):
        raise TypeError(
            f"{OP_ID}: extend_num_tokens must be an int, got {type(extend_num_tokens).__name__}"
        )
    if extend_num_tokens < 0:
        raise ValueError(f"{OP_ID}: extend_num_tokens must be >= 0, got {extend_num_tokens}")
    check_flag(OP_ID, "validate", validate)
    if validate and not torch.compiler.is_compiling():
        check_alloc_extend_values(
            OP_ID, prefix_lens, seq_lens, last_loc, free_pages, page_size, extend_num_tokens
        )
    out = torch.empty(extend_num_tokens, dtype=torch.int64, device=device)
    if batch:
        ALLOC_EXTEND.run(
            out, prefix_lens, seq_lens, last_loc, free_pages, page_size, backend=backend
        )
    return out


def _alloc_extend_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: partial pages, s == p, page_size 1."""
    prefix = torch.tensor([0, 5, 16, 7, 3], dtype=torch.int64)
    seq = torch.tensor([20, 9, 16, 40, 4], dtype=torch.int64)
    last = torch.tensor([-1, 404, 99, 70, 50], dtype=torch.int64)
    free = torch.arange(30, 10, -1, dtype=torch.int64)
    args = tuple(t.to(device) for t in (prefix, seq, last, free))
    total = int((seq - prefix).sum())
    return [
        ((*args, 16), {"extend_num_tokens": total}),
        ((*args[:3], torch.arange(100, device=device), 1), {"extend_num_tokens": total}),
        ((*(a.int() for a in args), 16), {"extend_num_tokens": total}),
    ]
