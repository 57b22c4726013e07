"""kernels-sampling: top-k / top-p / min-p filtering and seeded, reproducible sampling.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_sampling
    probs = kernels_sampling.top_k_renorm_probs(probs, 50)
    tokens = kernels_sampling.sampling_from_probs(probs, seed=1234, offset=step)
"""

from kernels_jit.registry import FLOATS, lazy_ops, op, register_group
from kernels_sampling.version import __version__

OPS = register_group(
    __name__,
    op(
        "top_k_renorm_probs",
        "keep each row's top-k probabilities (ties together), renormalise",
        "cuda",
        dtypes=FLOATS,
    ),
    op(
        "top_p_renorm_probs",
        "keep tokens whose strictly-greater mass is < top_p, renormalise",
        "cuda",
        dtypes=FLOATS,
    ),
    op(
        "min_p_renorm_probs",
        "keep tokens with p >= min_p * max(p), renormalise",
        "cuda",
        dtypes=FLOATS,
    ),
    op(
        "top_k_mask_logits",
        "set logits outside each row's top-k values to -inf",
        "cuda",
        dtypes=FLOATS,
    ),
    op(
        "sampling_from_probs",
        "seeded inverse-CDF sampling, one token per row",
        "cuda",
        dtypes=FLOATS,
    ),
    op(
        "top_k_top_p_sampling_from_probs",
        "seeded sampling among the top-k and top-p tokens (top_k_first or joint)",
        "cuda",
        dtypes=FLOATS,
    ),
)

__all__ = [
    "OPS",
    "__version__",
    "min_p_renorm_probs",
    "sampling_from_probs",
    "top_k_mask_logits",
    "top_k_renorm_probs",
    "top_k_top_p_sampling_from_probs",
    "top_p_renorm_probs",
]
__getattr__ = lazy_ops(__name__, OPS)
