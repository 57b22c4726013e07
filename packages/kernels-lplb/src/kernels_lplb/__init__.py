"""kernels-lplb: linear-programming load balancing of MoE experts over redundant replicas, and the
batched small-LP solver it runs on.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_lplb
    x, status = kernels_lplb.solve_lp(A, b, c)          # P problems min c.x, Ax = b, x >= 0
"""

from kernels_jit.registry import OpSpec, lazy_attributes, reference_op, register_group
from kernels_lplb.version import __version__


def _op(name: str, description: str, dtypes: tuple[str, ...]) -> OpSpec:
    """An op of this group; for now its only backend is the pure-torch reference."""
    return reference_op(
        "lplb",
        name,
        description,
        dtypes=dtypes,
        reference="pure-torch reference (float64 interior point)",
    )


OPS = register_group(
    "lplb",
    [
        _op(
            "solve_lp",
            "batched small dense LPs min c.x, Ax = b, x >= 0 (primal-dual interior point)",
            ("float32", "float64"),
        ),
        _op(
            "lplb_dispatch",
            "LP replica shares from expert load, then reproducible token -> replica dispatch",
            ("int32", "int64"),
        ),
    ],
)

__all__ = ["OPS", "__version__", "lplb_dispatch", "solve_lp"]
__getattr__ = lazy_attributes(__name__, OPS)
