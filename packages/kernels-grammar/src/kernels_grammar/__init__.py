"""kernels-grammar: grammar-constrained decoding (token bitmasks applied to logits).

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_grammar
    kernels_grammar.apply_token_bitmask_inplace(logits, bitmask)  # forbidden tokens -> -inf
"""

from kernels_grammar.version import __version__
from kernels_jit.registry import FLOATS, lazy_ops, op, register_group

OPS = register_group(
    __name__,
    op("apply_token_bitmask_inplace", "logits of tokens whose bitmask bit is 0 -> -inf, in place",
       "cuda", dtypes=FLOATS),
)  # fmt: skip

__all__ = ["OPS", "__version__", "apply_token_bitmask_inplace"]
__getattr__ = lazy_ops(__name__, OPS)
