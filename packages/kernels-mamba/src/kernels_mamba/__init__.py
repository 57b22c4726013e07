"""kernels-mamba: Mamba-2 kernels: causal conv1d (prefill and decode) and the selective state
update of the SSM.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_mamba
    kernels_mamba.causal_conv1d_update(x, conv_state, weight, bias, "silu")  # x overwritten
"""

from kernels_jit.registry import OpSpec, lazy_attributes, reference_op, register_group
from kernels_mamba.version import __version__

_FLOATS = ("float32", "float16", "bfloat16")


def _op(name: str, description: str) -> OpSpec:
    """An op of this group; for now its only backend is the pure-torch reference."""
    return reference_op(
        "mamba",
        name,
        description,
        dtypes=_FLOATS,
        reference="pure-torch reference (fp32 math, rounded once)",
    )


OPS = register_group(
    "mamba",
    [
        _op(
            "causal_conv1d_fwd",
            "depthwise causal conv1d over varlen or batched sequences, states in and out",
        ),
        _op("causal_conv1d_update", "one decode step of the causal conv1d, state in place"),
        _op("selective_state_update", "Mamba-2 decode step of the SSM state, in place"),
    ],
)

__all__ = [
    "OPS",
    "__version__",
    "causal_conv1d_fwd",
    "causal_conv1d_update",
    "selective_state_update",
]
__getattr__ = lazy_attributes(__name__, OPS)
