"""Comparing a kernel's output with its reference: one tolerance table, verbose failures."""

from __future__ import annotations

import torch

# (atol, rtol, max relative L2 error) per output dtype. Half types round each output once, so
# one ulp of the largest values bounds the error: bf16 has 8 mantissa bits, fp16 11.
TOLERANCES: dict[torch.dtype, tuple[float, float, float]] = {
    torch.float64: (1e-10, 1e-10, 1e-10),
    torch.float32: (1e-5, 1e-5, 1e-5),
    torch.float16: (1e-3, 1e-3, 1e-3),
    torch.bfloat16: (1.6e-2, 1.6e-2, 8e-3),
    torch.float8_e4m3fn: (0.0, 0.13, 0.07),
}


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
