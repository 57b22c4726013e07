"""kernels-kvcache: KV-cache writes into token-major, paged and MLA latent caches.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_kvcache
    kernels_kvcache.store_cache(k, v, k_cache, v_cache, out_cache_loc)  # in place
"""

from kernels_jit.registry import FLOATS, lazy_ops, op, register_group
from kernels_kvcache.version import __version__

OPS = register_group(
    __name__,
    op("store_cache", "write K/V rows into token-major caches at slots, optional fp8",
       "cuda", dtypes=FLOATS),
    op("reshape_and_cache_flash", "write K/V into a paged [blocks, block_size, H, D] cache by "
       "slot mapping", "cuda", dtypes=FLOATS),
    op("set_mla_kv_buffer", "write packed [nope | rope] MLA latent rows at slots", "cuda",
       dtypes=FLOATS),
)  # fmt: skip

__all__ = ["OPS", "__version__", "reshape_and_cache_flash", "set_mla_kv_buffer", "store_cache"]
__getattr__ = lazy_ops(__name__, OPS)
