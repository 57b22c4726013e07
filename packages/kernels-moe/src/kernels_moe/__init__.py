"""kernels-moe: MoE routing, token alignment and top-k reduction.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_moe
    weights, ids = kernels_moe.gate_topk_renorm(logits, bias, 8, n_group=8, topk_group=4)
"""

from kernels_jit.registry import OpSpec, lazy_attributes, reference_op, register_group
from kernels_moe.version import __version__


def _op(name: str, description: str, dtypes: tuple[str, ...]) -> OpSpec:
    """An op of this group; for now its only backend is the pure-torch reference."""
    return reference_op("moe", name, description, dtypes=dtypes)


_FLOATS = ("float32", "float16", "bfloat16")

OPS = register_group(
    "moe",
    [
        _op("topk_softmax", "softmax top-k routing: fp32 weights, int32 ids, renormalise", _FLOATS),
        _op(
            "gate_topk_renorm",
            "sigmoid + bias grouped top-k routing (DeepSeek-V3 noaux_tc)",
            ("float32", "bfloat16"),
        ),
        _op(
            "moe_align_block_size",
            "sort token slots by expert, padded to the block size",
            ("int32", "int64"),
        ),
        _op("moe_sum_reduce", "weighted sum of the k expert outputs per token", _FLOATS),
    ],
)

__all__ = [
    "OPS",
    "__version__",
    "gate_topk_renorm",
    "moe_align_block_size",
    "moe_sum_reduce",
    "topk_softmax",
]
__getattr__ = lazy_attributes(__name__, OPS)
