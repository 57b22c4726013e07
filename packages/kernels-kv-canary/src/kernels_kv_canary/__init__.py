"""kernels-kv-canary: a debug aid that detects KV-cache corruption and misrouted slots with
per-slot, hash-chained canaries.

Importing this package registers metadata only (no torch, no compilation); each op (and the
``KVSource`` descriptor) loads on first attribute access::

    import kernels_kv_canary as kc
    sources = [kc.KVSource(k_cache, page_size, bytes_per_token, bytes_per_token)]
    kc.kv_canary_write(canary, sources, slots, tokens, positions, req_indptr, seed_slots)
    bad = kc.kv_canary_verify(canary, sources, slots, prev_slots, positions).nonzero()
"""

from kernels_jit.registry import lazy_ops, op, register_group
from kernels_kv_canary.version import __version__

OPS = register_group(
    __name__,
    op(
        "kv_canary_write",
        "per-slot 64-bit KV hash chained with token id and position",
        "cuda",
        dtypes=("int64",),
    ),
    op(
        "kv_canary_verify",
        "report every slot whose KV bytes, position, token or chain differ",
        "cuda",
        dtypes=("int64",),
    ),
)

__all__ = ["OPS", "KVSource", "__version__", "kv_canary_verify", "kv_canary_write"]

__getattr__ = lazy_ops(__name__, OPS, extras={"KVSource": "kernels_kv_canary.sources:KVSource"})
