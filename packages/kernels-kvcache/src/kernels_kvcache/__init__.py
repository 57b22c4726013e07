"""kernels-kvcache: KV-cache writes into token-major, paged and MLA latent caches.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_kvcache
    kernels_kvcache.store_cache(k, v, k_cache, v_cache, out_cache_loc)  # in place
"""

from kernels_jit.registry import OpSpec, lazy_attributes, reference_op, register_group
from kernels_kvcache.version import __version__

_ROWS = ("float32", "float16", "bfloat16")


def _op(name: str, description: str) -> OpSpec:
    """An op of this group; for now its only backend is the pure-torch reference."""
    return reference_op("kvcache", name, description, dtypes=_ROWS)


OPS = register_group(
    "kvcache",
    [
        _op("store_cache", "write K/V rows into token-major caches at slots, optional fp8"),
        _op(
            "reshape_and_cache_flash",
            "write K/V into a paged [blocks, block_size, H, D] cache by slot mapping",
        ),
        _op("set_mla_kv_buffer", "write packed [nope | rope] MLA latent rows at slots"),
    ],
)

__all__ = ["OPS", "__version__", "reshape_and_cache_flash", "set_mla_kv_buffer", "store_cache"]
__getattr__ = lazy_attributes(__name__, OPS)
