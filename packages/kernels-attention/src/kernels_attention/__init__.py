"""kernels-attention: RoPE, attention-state merging and MLA key assembly.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_attention
    kernels_attention.rope_inplace(q, k, cos_sin_cache, positions, is_neox=True)  # in place
"""

from kernels_attention.version import __version__
from kernels_jit.registry import OpSpec, lazy_attributes, reference_op, register_group

_FLOATS = ("float32", "float16", "bfloat16")


def _op(name: str, description: str, dtypes: tuple[str, ...] = _FLOATS) -> OpSpec:
    """An op of this group; for now its only backend is the pure-torch reference."""
    return reference_op("attention", name, description, dtypes=dtypes)


OPS = register_group(
    "attention",
    [
        _op("rope_inplace", "rotary embedding in place from a cos/sin cache; NeoX/GPT-J, partial"),
        _op("merge_state", "merge two partial attention outputs by their (natural-log) LSE"),
        _op(
            "concat_mla_k",
            "MLA key [T, H, nope+rope] from per-head nope and a shared rope part",
            (*_FLOATS, "float8_e4m3fn"),
        ),
    ],
)

__all__ = ["OPS", "__version__", "concat_mla_k", "merge_state", "rope_inplace"]
__getattr__ = lazy_attributes(__name__, OPS)
