"""Argument checks shared by the MoE ops (beyond :mod:`kernels_jit.validation`)."""

from __future__ import annotations


def check_int(op: str, arg: str, value: object, *, minimum: int) -> int:
    """A Python int (not bool) >= ``minimum``."""
    if type(value) is not int:
        raise TypeError(f"{op}: {arg} must be a Python int, got {type(value).__name__}")
    if value < minimum:
        raise ValueError(f"{op}: {arg} must be >= {minimum}, got {value}")
    return value


def check_float(op: str, arg: str, value: object) -> float:
    """A Python float or int (not a tensor, not bool)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{op}: {arg} must be a Python float, got {type(value).__name__}")
    return float(value)
