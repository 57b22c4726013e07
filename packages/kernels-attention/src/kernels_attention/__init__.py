"""kernels-attention: RoPE, attention-state merging and MLA key assembly.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_attention
    kernels_attention.rope_inplace(q, k, cos_sin_cache, positions, is_neox=True)  # in place
"""

from kernels_attention.version import __version__
from kernels_jit.registry import FLOATS, lazy_ops, op, register_group

OPS = register_group(
    __name__,
    op("rope_inplace", "rotary embedding in place from a cos/sin cache; NeoX/GPT-J, partial",
       "cuda", dtypes=FLOATS),
    op("merge_state", "merge two partial attention outputs by their (natural-log) LSE",
       "cuda", dtypes=FLOATS),
    op("concat_mla_k", "MLA key [T, H, nope+rope] from per-head nope and a shared rope part",
       "cuda", dtypes=(*FLOATS, "float8_e4m3fn")),
    op("decode_attention", "paged GQA/MLA decode attention, split-KV; logit cap, sinks, fp8 KV",
       "triton", dtypes=("float16", "bfloat16")),
)  # fmt: skip

__all__ = [
    "OPS",
    "__version__",
    "concat_mla_k",
    "decode_attention",
    "merge_state",
    "rope_inplace",
]
__getattr__ = lazy_ops(__name__, OPS)
