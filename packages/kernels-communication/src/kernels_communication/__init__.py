"""kernels-communication: single-node all-reduce for tensor parallelism, alone and fused with the
residual add and RMSNorm.

Importing this package registers metadata only (no torch, no compilation); each op (and the
``CustomAllReduce`` communicator) loads on first attribute access::

    import kernels_communication as kc
    comm = kc.CustomAllReduce(group)          # once per tensor-parallel group
    y = kc.custom_all_reduce(x, comm)          # collective: every rank calls it
"""

from kernels_communication.version import __version__
from kernels_jit.registry import OpSpec, lazy_attributes, reference_op, register_group

_FLOATS = ("float32", "float16", "bfloat16")


def _op(name: str, description: str) -> OpSpec:
    """An op of this group; for now its only backend is the pure-torch reference."""
    return reference_op(
        "communication",
        name,
        description,
        dtypes=_FLOATS,
        reference="torch.distributed.all_reduce in fp32 (identity without a group)",
    )


OPS = register_group(
    "communication",
    [
        _op("custom_all_reduce", "single-node all-reduce (sum), fp32 accumulation, out of place"),
        _op("all_reduce_add_rmsnorm", "all-reduce fused with residual add and RMSNorm, in place"),
    ],
)

__all__ = ["OPS", "CustomAllReduce", "__version__", "all_reduce_add_rmsnorm", "custom_all_reduce"]

_ops_getattr = lazy_attributes(__name__, OPS)


def __getattr__(name: str):
    if name == "CustomAllReduce":
        from kernels_communication.comm import CustomAllReduce

        globals()[name] = CustomAllReduce
        return CustomAllReduce
    return _ops_getattr(name)
