"""One module per operator group, each with ``cases(quick) -> Iterator[Case]``."""

from __future__ import annotations

import importlib


def cases(group: str, quick: bool, ops: list[str] | None = None) -> list:
    """The group's benchmark cases, only the ops whose name starts with one of ``ops`` when given
    (the ``--op`` filter of run, precompile and ab)."""
    suite = importlib.import_module(f"{__name__}.{group}")
    prefixes = tuple(ops or ())
    return [c for c in suite.cases(quick) if not prefixes or c.op.startswith(prefixes)]
