"""Comparing a kernel's output with its reference: one tolerance table, verbose failures."""

from __future__ import annotations

import torch

from kernels_jit.tolerances import TOLERANCES as _TOLERANCES

# One tolerance table for tests and `kernels-ops check`: kernels_jit.tolerances.
TOLERANCES = {getattr(torch, name): tol for name, tol in _TOLERANCES.items()}


def assert_close(
    actual: torch.Tensor,
    expected: torch.Tensor,
    *,
    atol: float | None = None,
    rtol: float | None = None,
    name: str = "output",
) -> None:
    """Exact for integer/bool dtypes; for floats, allclose within the dtype's tolerance and a
    relative L2 error bound. The message counts mismatches and shows the first few."""
    assert actual.shape == expected.shape, (
        f"{name}: shape {tuple(actual.shape)} != expected {tuple(expected.shape)}"
    )
    assert actual.dtype == expected.dtype, f"{name}: dtype {actual.dtype} != {expected.dtype}"
    actual = actual.detach().cpu()
    expected = expected.detach().cpu()
    if not actual.is_floating_point():
        mismatch = actual != expected
        if mismatch.any():
            idx = mismatch.nonzero()[:5].tolist()
            raise AssertionError(
                f"{name}: {int(mismatch.sum())} of {actual.numel()} elements differ; first at "
                f"{idx}: {[actual[tuple(i)].item() for i in idx]} vs "
                f"{[expected[tuple(i)].item() for i in idx]}"
            )
        return
    default_atol, default_rtol, max_rel = TOLERANCES[actual.dtype]
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol
    a, e = actual.double(), expected.double()
    nan_mismatch = a.isnan() != e.isnan()
    finite = ~(a.isnan() | e.isnan())
    bad = nan_mismatch | (finite & ((a - e).abs() > atol + rtol * e.abs()))
    inf_mismatch = (a.isinf() | e.isinf()) & (a != e) & finite
    bad |= inf_mismatch
    if bad.any():
        idx = bad.nonzero()[:5].tolist()
        raise AssertionError(
            f"{name}: {int(bad.sum())} of {a.numel()} elements outside atol={atol} rtol={rtol}; "
            f"first at {idx}: got {[a[tuple(i)].item() for i in idx]}, "
            f"expected {[e[tuple(i)].item() for i in idx]}"
        )
    good = finite & ~a.isinf() & ~e.isinf()
    if good.any():
        denom = e[good].norm().item()
        rel = (a[good] - e[good]).norm().item() / denom if denom > 0 else (a[good]).norm().item()
        assert rel <= max_rel, f"{name}: relative L2 error {rel:.3g} > {max_rel}"
