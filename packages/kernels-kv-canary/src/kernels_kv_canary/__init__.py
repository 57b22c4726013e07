"""kernels-kv-canary: a debug aid that detects KV-cache corruption and misrouted slots with
per-slot, hash-chained canaries.

Importing this package registers metadata only (no torch, no compilation); each op (and the
``KVSource`` descriptor) loads on first attribute access::

    import kernels_kv_canary as kc
    sources = [kc.KVSource(k_cache, page_size, bytes_per_token, bytes_per_token)]
    kc.kv_canary_write(canary, sources, slots, tokens, positions, req_indptr, seed_slots)
    bad = kc.kv_canary_verify(canary, sources, slots, prev_slots, positions).nonzero()
"""

from kernels_jit.registry import Backend, OpSpec, lazy_attributes, register_group
from kernels_kv_canary.version import __version__


def _op(name: str, description: str) -> OpSpec:
    """An op of this group whose module is named after it; torch reference backend only."""
    module = f"kernels_kv_canary.{name}"
    return OpSpec(
        group="kv_canary",
        name=name,
        public=f"{module}:{name}",
        description=description,
        samples=f"{module}:samples",
        dtypes=("int64",),
        backends=(
            Backend(
                "torch",
                f"{module}:_{name}_torch",
                devices=("cpu", "cuda"),
                description="pure-torch reference, byte exact (uint64 emulated on int64)",
            ),
        ),
    )


OPS = register_group(
    "kv_canary",
    [
        _op("kv_canary_write", "per-slot 64-bit KV hash chained with token id and position"),
        _op(
            "kv_canary_verify", "report every slot whose KV bytes, position, token or chain differ"
        ),
    ],
)

__all__ = ["OPS", "KVSource", "__version__", "kv_canary_verify", "kv_canary_write"]

_ops_getattr = lazy_attributes(__name__, OPS)


def __getattr__(name: str):
    if name == "KVSource":
        from kernels_kv_canary.sources import KVSource

        globals()[name] = KVSource
        return KVSource
    return _ops_getattr(name)
