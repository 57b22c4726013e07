"""Random inputs for kernel tests: never zeros, reproducible, with hostile layouts on request."""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
HALF_DTYPES = (torch.float16, torch.bfloat16)


def devices() -> list[str]:
    """'cpu', plus 'cuda' where a GPU is present."""
    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def randn(*shape: int, dtype=torch.float32, device="cpu", seed: int = 0, scale=1.0) -> torch.Tensor:
    g = torch.Generator(device="cpu").manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype=dtype, device=device)


def row_strided(t: torch.Tensor, extra: int = 8) -> torch.Tensor:
    """The same values as a view whose rows sit ``extra`` elements apart in a wider buffer."""
    rows, cols = t.reshape(-1, t.shape[-1]).shape
    wide = torch.full((rows, cols + extra), float("nan"), dtype=t.dtype, device=t.device)
    if not t.is_floating_point():
        wide = torch.zeros((rows, cols + extra), dtype=t.dtype, device=t.device)
    wide[:, :cols] = t.reshape(rows, cols)
    return wide[:, :cols].view(*t.shape[:-1], cols) if t.dim() == 2 else wide[:, :cols]


def misaligned(t: torch.Tensor) -> torch.Tensor:
    """The same values starting one element past a 16-byte boundary (forces scalar paths)."""
    flat = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    view = flat[1:].view(t.shape)
    view.copy_(t)
    return view


def poison(t: torch.Tensor) -> torch.Tensor:
    """Fill an output buffer with NaN (or a sentinel for integers) so unwritten entries show."""
    return t.fill_(float("nan") if t.is_floating_point() else -12345)
