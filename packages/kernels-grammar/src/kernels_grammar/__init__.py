"""kernels-grammar: grammar-constrained decoding (token bitmasks applied to logits).

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_grammar
    kernels_grammar.apply_token_bitmask_inplace(logits, bitmask)  # forbidden tokens -> -inf
"""

from kernels_grammar.version import __version__
from kernels_jit.registry import Backend, OpSpec, lazy_attributes, register_group

_LOGITS = ("float32", "float16", "bfloat16")

OPS = register_group(
    "grammar",
    [
        OpSpec(
            group="grammar",
            name="apply_token_bitmask_inplace",
            public="kernels_grammar.apply_token_bitmask_inplace:apply_token_bitmask_inplace",
            description="logits of tokens whose bitmask bit is 0 -> -inf, in place",
            samples="kernels_grammar.apply_token_bitmask_inplace:samples",
            dtypes=_LOGITS,
            backends=(
                Backend(
                    "torch",
                    "kernels_grammar.apply_token_bitmask_inplace:_apply_token_bitmask_inplace_torch",
                    devices=("cpu", "cuda"),
                    description="pure-torch reference",
                ),
            ),
        ),
    ],
)

__all__ = ["OPS", "__version__", "apply_token_bitmask_inplace"]
__getattr__ = lazy_attributes(__name__, OPS)
