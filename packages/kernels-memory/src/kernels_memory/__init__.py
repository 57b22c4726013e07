"""kernels-memory: the KV memory bookkeeping of a serving engine: request-to-token tables, paged
slot allocation and KV block copies.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_memory
    last = kernels_memory.get_last_loc(req_to_token, req_pool_indices, prefix_lens)
    slots = kernels_memory.alloc_decode(seq_lens, last, free_pages, page_size=16)
"""

from kernels_jit.registry import lazy_ops, op, register_group
from kernels_memory.version import __version__

_INDEX = ("int32", "int64")

OPS = register_group(
    __name__,
    op(
        "get_last_loc",
        "slot of each request's last prefix token, -1 if the prefix is empty",
        "cuda",
        dtypes=_INDEX,
    ),
    op(
        "write_req_to_token_pool",
        "write allocated slots into the request-to-token table for [start, end) per request",
        "cuda",
        dtypes=_INDEX,
    ),
    op(
        "alloc_decode",
        "one slot per request: continue the last page or take a free page",
        "cuda",
        dtypes=_INDEX,
    ),
    op(
        "alloc_extend",
        "slots for extend tokens: rest of the last page, then new pages from the free list",
        "cuda",
        dtypes=_INDEX,
    ),
    op(
        "copy_blocks",
        "copy KV blocks src -> dst across every layer's key and value cache (any cache dtype)",
        "cuda",
        dtypes=_INDEX,  # of block_mapping, the tensor dispatch looks at
    ),
)

__all__ = [
    "OPS",
    "__version__",
    "alloc_decode",
    "alloc_extend",
    "copy_blocks",
    "get_last_loc",
    "write_req_to_token_pool",
]
__getattr__ = lazy_ops(__name__, OPS)
