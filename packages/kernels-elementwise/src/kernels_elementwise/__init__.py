"""kernels-elementwise: cross-cutting pointwise kernels.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_elementwise
    y = kernels_elementwise.add_constant(x, 3.0)
"""

from kernels_elementwise.version import __version__
from kernels_jit.registry import Backend, OpSpec, lazy_attributes, register_group

_FLOATS_INT32 = ("float32", "float16", "bfloat16", "int32")

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
    ],
)

__all__ = ["OPS", "__version__", "add_constant"]
__getattr__ = lazy_attributes(__name__, OPS)
