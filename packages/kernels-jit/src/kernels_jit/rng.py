"""The project RNG (OPS.md section 0): splitmix64 hashing on int64 tensors.

``U(seed, offset, row, j) = (mix(mix(mix(mix(seed) ^ offset) ^ row) ^ j) >> 40) * 2^-24`` is a
float32 in [0, 1) that the torch reference and every kernel compute bit for bit. uint64 arithmetic
is emulated on int64: addition and multiplication wrap identically in two's complement, and right
shifts are made logical by masking off the sign bits that an arithmetic shift drags in.

It lives in kernels-jit because several groups (sampling, speculative, lplb, kv_canary) use it
and each installs alone with kernels-jit; tests/jit/test_rng.py pins it to a Python-int oracle.
"""

from __future__ import annotations

import torch

from kernels_jit.validation import check_tensor

_MASK64 = (1 << 64) - 1


def to_int64(value: int) -> int:
    """A Python int reduced mod 2^64 and read as a signed int64 (the storage of a uint64)."""
    value &= _MASK64
    return value - (1 << 64) if value >= 1 << 63 else value


_M1 = to_int64(0xBF58476D1CE4E5B9)
_M2 = to_int64(0x94D049BB133111EB)
_GOLDEN = to_int64(0x9E3779B97F4A7C15)


def shr(x: torch.Tensor, k: int) -> torch.Tensor:
    """Logical right shift of the uint64 bit pattern held in an int64 tensor."""
    return (x >> k) & ((1 << (64 - k)) - 1)


def fmix(x: torch.Tensor) -> torch.Tensor:
    """splitmix64 finalizer: x^=x>>30; x*=M1; x^=x>>27; x*=M2; x^=x>>31 (all mod 2^64)."""
    x = x ^ shr(x, 30)
    x = x * _M1
    x = x ^ shr(x, 27)
    x = x * _M2
    return x ^ shr(x, 31)


def mix(x: torch.Tensor) -> torch.Tensor:
    """The full splitmix64 step: fmix(x + 0x9E3779B97F4A7C15)."""
    return fmix(x + _GOLDEN)


def uniform(
    seed: torch.Tensor, offset: torch.Tensor, row: torch.Tensor, j: int | torch.Tensor
) -> torch.Tensor:
    """``U(seed, offset, row, j)`` as float32; all arguments broadcast (int64 tensors or ints)."""
    h = mix(mix(mix(mix(seed) ^ offset) ^ row) ^ j)
    return shr(h, 40).to(torch.float32) * (2.0**-24)


def _rng_arg(op: str, name: str, value: object, rows: int, device: torch.device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        check_tensor(op, name, value, dtypes=(torch.int64,), ndim=1, device=device)
        if value.shape[0] not in (1, rows):
            raise ValueError(
                f"{op}: {name} must have shape (1,) or ({rows},) (one per output row), "
                f"got {tuple(value.shape)}"
            )
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(
            f"{op}: {name} must be an int or an int64 tensor, got {type(value).__name__}"
        )
    return torch.tensor([to_int64(value)], dtype=torch.int64, device=device)


def seed_offset(
    op: str, seed: object, offset: object, rows: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """int64 ``(seed, offset)`` tensors of shape [1] or [rows].

    ``seed=None`` draws a fresh seed from torch's generator of ``device`` (reproducible after
    ``torch.manual_seed``, advances that generator, no host sync, CUDA-graph safe), offset 0.
    """
    if seed is None:
        if offset is not None:
            raise ValueError(
                f"{op}: offset={offset!r} was given without a seed; pass both or neither"
            )
        drawn = torch.randint(-(2**63), 2**63 - 1, (1,), dtype=torch.int64, device=device)
        return drawn, torch.zeros(1, dtype=torch.int64, device=device)
    seed_t = _rng_arg(op, "seed", seed, rows, device)
    offset_t = (
        torch.zeros(1, dtype=torch.int64, device=device)
        if offset is None
        else _rng_arg(op, "offset", offset, rows, device)
    )
    return seed_t, offset_t
