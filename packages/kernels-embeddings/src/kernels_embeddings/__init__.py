"""kernels-embeddings: vocab-parallel embedding lookup and multimodal embedding scatter.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_embeddings
    h = kernels_embeddings.vocab_parallel_embedding(ids, weight_shard, start, end)
"""

from kernels_embeddings.version import __version__
from kernels_jit.registry import OpSpec, lazy_attributes, reference_op, register_group

_FLOATS = ("float32", "float16", "bfloat16")


def _op(name: str, description: str) -> OpSpec:
    """An op of this group; for now its only backend is the pure-torch reference."""
    return reference_op(
        "embeddings",
        name,
        description,
        dtypes=_FLOATS,
        reference="pure-torch reference (exact row copies)",
    )


OPS = register_group(
    "embeddings",
    [
        _op(
            "vocab_parallel_embedding",
            "embedding rows of this shard's vocab range (and added tokens), zeros elsewhere",
        ),
        _op(
            "scatter_embeddings",
            "place multimodal embeddings into the text embeddings at placeholder positions",
        ),
    ],
)

__all__ = ["OPS", "__version__", "scatter_embeddings", "vocab_parallel_embedding"]
__getattr__ = lazy_attributes(__name__, OPS)
