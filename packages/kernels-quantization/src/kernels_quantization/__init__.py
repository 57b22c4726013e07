"""kernels-quantization: FP8/INT8 quantization and the Hadamard rotation.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_quantization
    q, s = kernels_quantization.per_token_group_quant_8bit(x, 128)
"""

from kernels_jit.registry import FLOATS, lazy_ops, op, register_group
from kernels_quantization.version import __version__

OPS = register_group(
    __name__,
    op(
        "per_token_quant_fp8",
        "fp8 e4m3 with one dynamic fp32 scale per row",
        "cuda",
        dtypes=FLOATS,
    ),
    op(
        "per_tensor_quant_fp8",
        "fp8 e4m3 with one dynamic (absmax/448) or static scale",
        "cuda",
        dtypes=FLOATS,
    ),
    op(
        "per_token_group_quant_8bit",
        "fp8/int8 with one scale per group; row/column-major, TMA-aligned, UE8M0 scales",
        "cuda",
        dtypes=FLOATS,
    ),
    op(
        "hadamard_transform",
        "Walsh-Hadamard transform of the last dim, times a scale",
        "cuda",
        dtypes=FLOATS,
    ),
)

__all__ = [
    "OPS",
    "__version__",
    "hadamard_transform",
    "per_tensor_quant_fp8",
    "per_token_group_quant_8bit",
    "per_token_quant_fp8",
]
__getattr__ = lazy_ops(__name__, OPS)
