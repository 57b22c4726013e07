"""kernels-mamba: Mamba-2 kernels: causal conv1d (prefill and decode) and the selective state
update of the SSM.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_mamba
    kernels_mamba.causal_conv1d_update(x, conv_state, weight, bias, "silu")  # x overwritten
"""

from kernels_jit.registry import FLOATS, lazy_ops, op, register_group
from kernels_mamba.version import __version__

OPS = register_group(
    __name__,
    op(
        "causal_conv1d_fwd",
        "depthwise causal conv1d over varlen or batched sequences, states in and out",
        "cuda",
        dtypes=FLOATS,
    ),
    op(
        "causal_conv1d_update",
        "one decode step of the causal conv1d, state in place",
        "cuda",
        dtypes=FLOATS,
    ),
    op(
        "selective_state_update",
        "Mamba-2 decode step of the SSM state, in place",
        "cuda",
        dtypes=FLOATS,
    ),
)

__all__ = [
    "OPS",
    "__version__",
    "causal_conv1d_fwd",
    "causal_conv1d_update",
    "selective_state_update",
]
__getattr__ = lazy_ops(__name__, OPS)
