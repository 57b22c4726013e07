"""kernels-activation: gated activations (SiLU/GELU and-mul) and relu2 for LLM inference.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_activation
    y = kernels_activation.silu_and_mul(x)        # x [..., 2d] -> y [..., d]
"""

from kernels_activation.version import __version__
from kernels_jit.registry import FLOATS, lazy_ops, op, register_group

OPS = register_group(
    __name__,
    op("silu_and_mul", "silu(x[..., :d]) * x[..., d:], x [..., 2d] -> [..., d]", "cuda",
       dtypes=FLOATS, file="activation"),
    op("gelu_and_mul", "gelu(x[..., :d]) * x[..., d:] with the exact erf GELU", "cuda",
       dtypes=FLOATS, file="activation"),
    op("gelu_tanh_and_mul", "gelu(x[..., :d]) * x[..., d:] with the tanh-approximated GELU",
       "cuda", dtypes=FLOATS, file="activation"),
    op("relu2", "relu(x)^2, same shape (in place with out=x)", "cuda", dtypes=FLOATS,
       file="activation"),
)  # fmt: skip

__all__ = ["OPS", "__version__", "gelu_and_mul", "gelu_tanh_and_mul", "relu2", "silu_and_mul"]
__getattr__ = lazy_ops(__name__, OPS)
