"""kernels-ops: every kernels-* group in one namespace.

``kernels_ops.<group>`` is the very module ``kernels_<group>``, so ``import kernels_ops.layernorm``
and ``from kernels_ops import layernorm`` both work. Importing registers metadata only: no torch,
no compiler, no backend import.

    import kernels_ops
    kernels_ops.layernorm.rmsnorm(x, w)
    kernels_ops.list_ops()          # the inventory, without importing torch
"""

from __future__ import annotations

import importlib
import sys

from kernels_jit.registry import GROUPS, OpSpec, all_ops
from kernels_ops.version import __version__

for _group in GROUPS:
    _module = importlib.import_module(f"kernels_{_group}")
    globals()[_group] = _module
    sys.modules[f"{__name__}.{_group}"] = _module
del _group, _module


def list_ops() -> list[OpSpec]:
    """Every registered op of every group, sorted by id."""
    return all_ops()


def explain(op_id: str, *args, **kwargs) -> str:
    """Which backend the call ``<op_id>(*args, **kwargs)`` would run, and why not the others
    (the public function's own arguments; nothing is launched)."""
    from kernels_jit.dispatch import explain as _explain

    return _explain(op_id, *args, **kwargs)


__all__ = ["GROUPS", "__version__", "explain", "list_ops", *GROUPS]  # noqa: PLE0604
