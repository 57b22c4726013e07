"""kernels-speculative: speculative-decoding verification (greedy trees, rejection-sampled chains)
and the bit packing of tree attention masks.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_speculative
    tokens, accepted, emitted = kernels_speculative.chain_speculative_sampling(
        draft_probs, draft_ids, target_probs, seed=1234, offset=step
    )
"""

from kernels_jit.registry import OpSpec, lazy_attributes, reference_op, register_group
from kernels_speculative.version import __version__


def _op(name: str, description: str, dtypes: tuple[str, ...]) -> OpSpec:
    """An op of this group; for now its only backend is the pure-torch reference."""
    return reference_op("speculative", name, description, dtypes=dtypes)


OPS = register_group(
    "speculative",
    [
        _op(
            "verify_tree_greedy",
            "accept the longest draft-tree path matching the target's greedy tokens",
            ("int32", "int64"),
        ),
        _op(
            "chain_speculative_sampling",
            "rejection sampling of a draft chain; outputs follow the target distribution",
            ("float32", "float16", "bfloat16"),
        ),
        _op(
            "segment_packbits",
            "pack boolean masks per segment into bytes (little or big bit order)",
            ("bool",),
        ),
    ],
)

__all__ = [
    "OPS",
    "__version__",
    "chain_speculative_sampling",
    "segment_packbits",
    "verify_tree_greedy",
]
__getattr__ = lazy_attributes(__name__, OPS)
