"""kernels-kvcache: KV-cache writes into token-major, paged and MLA latent caches.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_kvcache
    kernels_kvcache.store_cache(k, v, k_cache, v_cache, out_cache_loc)  # in place
"""

from kernels_jit.registry import Backend, OpSpec, lazy_attributes, register_group
from kernels_kvcache.version import __version__

_ROWS = ("float32", "float16", "bfloat16")


def _op(name: str, description: str) -> OpSpec:
    """An op of this group whose only backend, for now, is the pure-torch reference."""
    module = f"kernels_kvcache.{name}"
    return OpSpec(
        group="kvcache",
        name=name,
        public=f"{module}:{name}",
        description=description,
        samples=f"{module}:samples",
        dtypes=_ROWS,
        backends=(
            Backend(
                "torch",
                f"{module}:_{name}_torch",
                devices=("cpu", "cuda"),
                description="pure-torch reference",
            ),
        ),
    )


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
