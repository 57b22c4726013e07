"""kernels-embeddings: vocab-parallel embedding lookup and multimodal embedding scatter.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_embeddings
    h = kernels_embeddings.vocab_parallel_embedding(ids, weight_shard, start, end)
"""

from kernels_embeddings.version import __version__
from kernels_jit.registry import FLOATS, lazy_ops, op, register_group

OPS = register_group(
    __name__,
    op("vocab_parallel_embedding", "embedding rows of this shard's vocab range (and added "
       "tokens), zeros elsewhere", "cuda", dtypes=FLOATS),
    op("scatter_embeddings", "place multimodal embeddings into the text embeddings at "
       "placeholder positions", "cuda", dtypes=FLOATS),
)  # fmt: skip

__all__ = ["OPS", "__version__", "scatter_embeddings", "vocab_parallel_embedding"]
__getattr__ = lazy_ops(__name__, OPS)
