"""kernels-elementwise: cross-cutting pointwise kernels.

``add_constant`` (the reference JIT kernel), ``softcap``, ``sigmoid_mul``,
``gate_sigmoid_mul_add`` and ``fused_dual_residual_rmsnorm``. Importing this package registers
metadata only (no torch, no compilation); each op loads on first attribute access::

    import kernels_elementwise
    y = kernels_elementwise.add_constant(x, 3.0)
"""

from kernels_elementwise.version import __version__
from kernels_jit.registry import FLOATS, lazy_ops, op, register_group

OPS = register_group(
    __name__,
    op("add_constant", "out = x + constant (the reference JIT kernel)", "cuda cpu",
       dtypes=(*FLOATS, "int32")),
    op("softcap", "cap * tanh(x / cap); in place or fp32 out", "cuda", dtypes=FLOATS),
    op("sigmoid_mul", "x * sigmoid(gate), gate [T, H, D] (strided) or per head [T, H, 1]",
       "cuda", dtypes=FLOATS),
    op("gate_sigmoid_mul_add", "sigmoid(h @ w)[:, None] * shared (+ routed): a shared-expert "
       "gate", "cuda", dtypes=FLOATS),
    op("fused_dual_residual_rmsnorm", "mid = residual + rms(x) * w1; out = rms(mid) * w2; "
       "returns (out, mid)", "cuda", dtypes=FLOATS),
)  # fmt: skip

__all__ = [
    "OPS",
    "__version__",
    "add_constant",
    "fused_dual_residual_rmsnorm",
    "gate_sigmoid_mul_add",
    "sigmoid_mul",
    "softcap",
]
__getattr__ = lazy_ops(__name__, OPS)
