"""kernels-communication: single-node all-reduce for tensor parallelism, alone and fused with the
residual add and RMSNorm.

Importing this package registers metadata only (no torch, no compilation); each op (and the
``CustomAllReduce`` communicator) loads on first attribute access::

    import kernels_communication as kc
    comm = kc.CustomAllReduce(group)          # once per tensor-parallel group
    y = kc.custom_all_reduce(x, comm)          # collective: every rank calls it
"""

from kernels_communication.version import __version__
from kernels_jit.registry import FLOATS, lazy_ops, op, register_group

OPS = register_group(
    __name__,
    op("custom_all_reduce", "single-node all-reduce (sum), fp32 accumulation, out of place",
       "cuda", dtypes=FLOATS),
    op("all_reduce_add_rmsnorm", "all-reduce fused with residual add and RMSNorm, in place",
       "cuda", dtypes=FLOATS),
)  # fmt: skip

__all__ = [
    "OPS",
    "CommunicationError",
    "CustomAllReduce",
    "__version__",
    "all_reduce_add_rmsnorm",
    "custom_all_reduce",
]

__getattr__ = lazy_ops(
    __name__,
    OPS,
    extras={
        "CustomAllReduce": "kernels_communication.comm:CustomAllReduce",
        "CommunicationError": "kernels_communication.comm:CommunicationError",
    },
)
