"""`check`: run every op's sample calls on every backend that can run here and compare each
result (returned tensors and tensors mutated in place) with the torch reference."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from kernels_jit.dispatch import BackendUnavailableError, static_reason
from kernels_jit.registry import OpSpec, resolve_target
from kernels_jit.tolerances import TOLERANCES


@dataclass
class Outcome:
    op: str
    backend: str
    device: str
    cases: int = 0
    skipped: int = 0
    worst: float = 0.0
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


def best_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a NamedTuple
        return type(value)(*(_clone(v) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


def _tensors(value) -> Iterator[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def mismatch(actual: torch.Tensor, expected: torch.Tensor) -> tuple[float, str]:
    """(relative L2 error, problem or '') of ``actual`` against ``expected``."""
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        return float(
            "inf"
        ), f"got {actual.dtype}{list(actual.shape)}, want {expected.dtype}{list(expected.shape)}"
    a, e = actual.detach().cpu(), expected.detach().cpu()
    if not a.is_floating_point():
        bad = int((a != e).sum())
        return (0.0, "") if bad == 0 else (1.0, f"{bad} of {a.numel()} elements differ")
    atol, rtol, max_rel = TOLERANCES.get(str(a.dtype).removeprefix("torch."), (1e-5, 1e-5, 1e-5))
    a, e = a.double(), e.double()
    if not torch.equal(a.isnan(), e.isnan()):
        return float("inf"), "NaN pattern differs"
    finite = a.isfinite() & e.isfinite()
    if not torch.equal(a[~finite].nan_to_num(), e[~finite].nan_to_num()):
        return float("inf"), "inf pattern differs"
    a, e = a[finite], e[finite]
    if a.numel() == 0:
        return 0.0, ""
    norm = e.norm().item()
    rel = (a - e).norm().item() / norm if norm > 0 else a.norm().item()
    bad = int(((a - e).abs() > atol + rtol * e.abs()).sum())
    if bad or rel > max_rel:
        return rel, f"{bad} elements outside atol={atol} rtol={rtol}, rel L2 {rel:.2e}"
    return rel, ""


def _run(public: Callable, args, kwargs, backend: str):
    args, kwargs = _clone(args), _clone(kwargs)
    result = public(*args, **kwargs, backend=backend)
    return list(_tensors(result)) + list(_tensors(args)) + list(_tensors(kwargs))


def check_op(spec: OpSpec, device: torch.device) -> list[Outcome]:
    public = resolve_target(spec.public)
    samples = resolve_target(spec.samples)(device)
    outcomes = []
    for backend in spec.backends:
        if backend.name == "torch":
            continue
        outcome = Outcome(spec.id, backend.name, device.type)
        for args, kwargs in samples:
            first = next(iter(_tensors(args)), None)
            dtype = first.dtype if first is not None else torch.float32
            if static_reason(backend, device, dtype) is not None:
                outcome.skipped += 1
                continue
            try:
                expected = _run(public, args, kwargs, "torch")
                actual = _run(public, args, kwargs, backend.name)
            except BackendUnavailableError:
                outcome.skipped += 1
                continue
            except Exception as exc:
                outcome.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
                break
            outcome.cases += 1
            for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
                rel, problem = mismatch(a, e)
                outcome.worst = max(outcome.worst, rel)
                if problem:
                    outcome.error = f"tensor {index}: {problem}"
                    break
            if outcome.error:
                break
        outcomes.append(outcome)
    if len(outcomes) == 0:  # reference-only op: run it, so a broken reference still shows
        outcome = Outcome(spec.id, "torch", device.type)
        try:
            for args, kwargs in samples:
                _run(public, args, kwargs, "torch")
                outcome.cases += 1
        except Exception as exc:
            outcome.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        outcomes.append(outcome)
    return outcomes
