"""kernels-lplb: linear-programming load balancing of MoE experts over redundant replicas, and the
batched small-LP solver it runs on.

Importing this package registers metadata only (no torch, no compilation); each op loads on
first attribute access::

    import kernels_lplb
    x, status = kernels_lplb.solve_lp(A, b, c)          # P problems min c.x, Ax = b, x >= 0
    ids, shares = kernels_lplb.lplb_dispatch(topk, phy2log, log2phy, G, counts=counts)
    ids2, _ = kernels_lplb.lplb_dispatch(topk2, phy2log, log2phy, G, shares=shares)  # draw only
"""

from kernels_jit.registry import lazy_ops, op, register_group
from kernels_lplb.version import __version__

OPS = register_group(
    __name__,
    op("solve_lp", "batched small dense LPs min c.x, Ax = b, x >= 0 (primal-dual interior point)",
       "cuda", dtypes=("float32", "float64")),
    op("lplb_dispatch", "LP replica shares from expert load (or given shares), then reproducible "
       "token -> replica dispatch", "cuda", dtypes=("int32", "int64")),
)  # fmt: skip

__all__ = ["OPS", "__version__", "lplb_dispatch", "solve_lp"]
__getattr__ = lazy_ops(__name__, OPS)
