"""kernels-moe: MoE routing, token alignment and top-k reduction.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_moe
    weights, ids = kernels_moe.gate_topk_renorm(logits, bias, 8, n_group=8, topk_group=4)
"""

from kernels_jit.registry import FLOATS, lazy_ops, op, register_group
from kernels_moe.version import __version__

OPS = register_group(
    __name__,
    op(
        "topk_softmax",
        "softmax top-k routing: fp32 weights, int32 ids, renormalise",
        "cuda",
        dtypes=FLOATS,
    ),
    op(
        "gate_topk_renorm",
        "sigmoid + bias grouped top-k routing (DeepSeek-V3 noaux_tc)",
        "cuda",
        dtypes=("float32", "bfloat16"),
    ),
    op(
        "moe_align_block_size",
        "sort token slots by expert, padded to the block size",
        "cuda",
        dtypes=("int32", "int64"),
    ),
    op(
        "moe_sum_reduce",
        "weighted sum of the k expert outputs per token",
        "cuda",
        dtypes=FLOATS,
    ),
    op(
        "fused_moe",
        "top-k MoE expert MLPs: grouped gate/up GEMM + activation, down GEMM, weighted k-sum",
        "triton",
        dtypes=("bfloat16", "float16"),
    ),
)

__all__ = [
    "OPS",
    "__version__",
    "fused_moe",
    "gate_topk_renorm",
    "moe_align_block_size",
    "moe_sum_reduce",
    "topk_softmax",
]
__getattr__ = lazy_ops(__name__, OPS)
