"""kernels-elementwise: cross-cutting pointwise kernels.

``add_constant`` (the reference JIT kernel), ``softcap``, ``sigmoid_mul``,
``gate_sigmoid_mul_add`` and ``fused_dual_residual_rmsnorm``. Importing this package registers
metadata only (no torch, no compilation); each op loads on first attribute access::

    import kernels_elementwise
    y = kernels_elementwise.add_constant(x, 3.0)
"""

from kernels_elementwise.version import __version__
from kernels_jit.registry import Backend, OpSpec, lazy_attributes, register_group

_FLOATS_INT32 = ("float32", "float16", "bfloat16", "int32")
_FLOATS = ("float32", "float16", "bfloat16")


def _op(name: str, description: str, eligible: str, cuda: str) -> OpSpec:
    """An op with a CUDA backend (through kernels-jit) and the torch reference."""
    module = f"kernels_elementwise.{name}"
    return OpSpec(
        group="elementwise",
        name=name,
        public=f"{module}:{name}",
        description=description,
        samples=f"{module}:samples",
        dtypes=_FLOATS,
        backends=(
            Backend(
                "cuda",
                f"{module}:_{name}_cuda",
                devices=("cuda",),
                dtypes=_FLOATS,
                eligible=f"{module}:{eligible}",
                description=cuda,
            ),
            Backend(
                "torch",
                f"{module}:_{name}_torch",
                devices=("cpu", "cuda"),
                description="pure-torch reference",
            ),
        ),
    )


OPS = register_group(
    "elementwise",
    [
        OpSpec(
            group="elementwise",
            name="add_constant",
            public="kernels_elementwise.add_constant:add_constant",
            description="out = x + constant (the reference JIT kernel)",
            samples="kernels_elementwise.add_constant:samples",
            dtypes=_FLOATS_INT32,
            backends=(
                Backend(
                    "cuda",
                    "kernels_elementwise.add_constant:_add_constant_cuda",
                    devices=("cuda",),
                    dtypes=_FLOATS_INT32,
                    eligible="kernels_elementwise.add_constant:_contiguous",
                    description="CUDA C++ via kernels-jit, 16-byte vectors when aligned",
                ),
                Backend(
                    "cpu",
                    "kernels_elementwise.add_constant:_add_constant_cpu",
                    devices=("cpu",),
                    dtypes=_FLOATS_INT32,
                    eligible="kernels_elementwise.add_constant:_contiguous",
                    description="C++ for the host CPU via kernels-jit",
                ),
                Backend(
                    "torch",
                    "kernels_elementwise.add_constant:_add_constant_torch",
                    devices=("cpu", "cuda"),
                    description="pure-torch reference",
                ),
            ),
        ),
        _op(
            "softcap",
            "cap * tanh(x / cap); in place or fp32 out",
            "_row_layout",
            "CUDA C++ via kernels-jit: 16-byte packs over rows, scalar fallback",
        ),
        _op(
            "sigmoid_mul",
            "x * sigmoid(gate), gate [T, H, D] (strided) or per head [T, H, 1]",
            "_last_dims",
            "CUDA C++ via kernels-jit: flat grid over (token, head, pack), any strides",
        ),
        _op(
            "gate_sigmoid_mul_add",
            "sigmoid(h @ w)[:, None] * shared (+ routed): a shared-expert gate",
            "_last_dims",
            "CUDA C++ via kernels-jit: one block per token, dot product and gating fused",
        ),
        _op(
            "fused_dual_residual_rmsnorm",
            "mid = residual + rms(x) * w1; out = rms(mid) * w2; returns (out, mid)",
            "_last_dims",
            "CUDA C++ via kernels-jit: one block per token, row kept in registers",
        ),
    ],
)

__all__ = [
    "OPS",
    "__version__",
    "add_constant",
    "fused_dual_residual_rmsnorm",
    "gate_sigmoid_mul_add",
    "sigmoid_mul",
    "softcap",
]
__getattr__ = lazy_attributes(__name__, OPS)
