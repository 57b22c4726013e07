"""kernels-speculative: speculative-decoding verification (greedy trees, rejection-sampled chains)
and the bit packing of tree attention masks.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_speculative
    tokens, accepted, emitted = kernels_speculative.chain_speculative_sampling(
        draft_probs, draft_ids, target_probs, seed=1234, offset=step
    )
"""

from kernels_jit.registry import FLOATS, lazy_ops, op, register_group
from kernels_speculative.version import __version__

OPS = register_group(
    __name__,
    op(
        "verify_tree_greedy",
        "accept the longest draft-tree path matching the target's greedy tokens",
        "cuda",
        dtypes=("int32", "int64"),
    ),
    op(
        "chain_speculative_sampling",
        "rejection sampling of a draft chain; outputs follow the target distribution",
        "cuda",
        dtypes=FLOATS,
    ),
    op(
        "segment_packbits",
        "pack boolean masks per segment into bytes (little or big bit order)",
        "cuda",
        dtypes=("bool",),
    ),
)

__all__ = [
    "OPS",
    "__version__",
    "chain_speculative_sampling",
    "segment_packbits",
    "verify_tree_greedy",
]
__getattr__ = lazy_ops(__name__, OPS)
