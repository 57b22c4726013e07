"""memory.alloc_decode: one new KV slot per request for a decode step, from a paged free list.

CUDA: one CTA scans the batch in chunks of 1024 (the rank of each request needing a page), no
host sync, one kernel for every batch size (csrc/alloc_decode.cuh).
"""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_memory import reference
from kernels_memory._checks import (
    check_alloc_decode_values,
    check_flag,
    check_index_vector,
    check_page_size,
)

OP_ID = "memory.alloc_decode"

ALLOC_DECODE_CUDA = ModuleSpec(
    name="alloc_decode",
    package="kernels_memory",
    sources=("csrc/alloc_decode.cuh", "csrc/memory_common.cuh"),
    exports=(("alloc_decode", "alloc_decode"),),
    description="CUDA: one CTA, a chunked block scan of the requests needing a page",
)
_alloc_decode_cuda = CompiledFunction(ALLOC_DECODE_CUDA, "alloc_decode")


def _alloc_decode_torch(
    out: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    page_size: int,
) -> None:
    out.copy_(reference.alloc_decode(seq_lens, last_loc, free_pages, page_size))


ALLOC_DECODE = Op(_alloc_decode_torch, mutates=("out",), device="seq_lens")


def alloc_decode(
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    page_size: int,
    *,
    validate: bool = False,
    backend: str | None = None,
) -> torch.Tensor:
    """The slot of each request's new token: ``last_loc + 1`` when ``(seq_len - 1) % page_size``
    is nonzero (the last page has room), else ``free_pages[rank] * page_size`` where rank is the
    request's position among the requests that need a page. The caller then drops that many pages
    from its free list.

    Parameters
    ----------
    seq_lens : [B] int64 (or int32), lengths after appending the new token (>= 1).
    last_loc : [B] int64 (or int32), slot of each request's current last token (get_last_loc):
        >= -1 (-1 = empty); where the request continues its page, a slot (>= 0) at page offset
        ``(seq_len - 2) % page_size``.
    free_pages : [F] int64 (or int32) free page ids, taken in order; the P pages taken
        (``free_pages[:P]``, P = requests needing a page) must be >= 0 and distinct, F >= P.
    page_size : slots per page, >= 1.
    validate : check the values of the arguments above before launching (ValueError naming the
        argument, the first bad index and its value). This reads them on the host: a
        device-to-host sync on CUDA, so not for CUDA graphs; skipped while torch.compile traces.

    Returns
    -------
    out [B] int64.

    Checks and their cost
    ---------------------
    Types, dtypes, shapes, devices and ``page_size`` are always checked (host metadata, no sync).
    The value preconditions need the values: the torch reference (the backend on CPU, and the
    CUDA fallback) always checks them, reading them on the host as it
    computes; a CUDA kernel must not (no host sync), so there ``validate=True`` is the way to get
    them. Without it a kernel treats them as preconditions and never faults: a request whose page
    rank is >= F gets slot -1 (never read past the list), a negative page id gives the negative
    slot ``page * page_size``, last_loc is used as given; the kvcache ops skip negative slots, so
    that KV is dropped.
    SGLang's allocator checks free space on the host before calling.
    """
    device = seq_lens.device if isinstance(seq_lens, torch.Tensor) else None
    check_index_vector(OP_ID, "seq_lens", seq_lens, None, device)
    check_index_vector(OP_ID, "last_loc", last_loc, seq_lens.shape[0], device)
    check_index_vector(OP_ID, "free_pages", free_pages, None, device)
    check_page_size(OP_ID, page_size)
    check_flag(OP_ID, "validate", validate)
    if validate and not torch.compiler.is_compiling():
        check_alloc_decode_values(OP_ID, seq_lens, last_loc, free_pages, page_size)
    out = torch.empty(seq_lens.shape[0], dtype=torch.int64, device=device)
    if out.numel():
        ALLOC_DECODE.run(out, seq_lens, last_loc, free_pages, page_size, backend=backend)
    return out


def _alloc_decode_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: requests that do and do not cross a page."""
    seq = torch.tensor([1, 17, 18, 32, 33, 5], dtype=torch.int64)
    last = torch.tensor([-1, 255, 80, 94, 127, 3], dtype=torch.int64)
    free = torch.tensor([9, 4, 11, 2], dtype=torch.int64)
    return [
        ((seq.to(device), last.to(device), free.to(device), 16), {}),
        ((seq.to(device), last.to(device), torch.arange(10, device=device), 1), {}),
        ((seq.int().to(device), last.int().to(device), free.int().to(device), 16), {}),
    ]
