"""`check`: run every op's sample calls on every backend that can run here and compare each
result (returned tensors and tensors mutated in place) with the torch reference."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import torch

from kernels_jit.dispatch import BackendUnavailableError, static_reason
from kernels_jit.errors import ModuleNotBuiltError
from kernels_jit.registry import OpSpec, resolve_target
from kernels_jit.tolerances import TOLERANCES

# Outcome.status values, and whether each fails the check.
AGREE, REFERENCE, NOT_RUNNABLE = "agree", "reference only", "not runnable here"
NOT_BUILT, DISAGREE, ERROR = "not built", "disagree", "error"
FAILING = (NOT_BUILT, DISAGREE, ERROR)


@dataclass
class Outcome:
    op: str
    backend: str
    device: str
    cases: int = 0
    skipped: int = 0
    worst: float = 0.0
    error: str = ""
    status: str = ""

    @property
    def ok(self) -> bool:
        return self.final_status not in FAILING

    @property
    def final_status(self) -> str:
        if self.status:
            return self.status
        if self.error:
            return ERROR
        if self.backend == "torch":
            return REFERENCE
        return AGREE if self.cases else NOT_RUNNABLE

    @property
    def compared(self) -> bool:
        """Whether any result of this backend was compared with the reference."""
        return self.backend != "torch" and self.cases > 0

    @property
    def label(self) -> str:
        status = self.final_status
        if status == NOT_BUILT:
            return f"not built (KERNELS_NO_JIT=1): {self.error}"
        if status in (DISAGREE, ERROR):
            return f"{status.upper()}: {self.error}"
        return {AGREE: "ok", REFERENCE: "ok (reference only)"}.get(status, status)

    def as_dict(self) -> dict:
        record = asdict(self)
        record["status"] = self.final_status
        record["worst"] = self.worst if self.compared else None
        return record


def summary(outcomes: list[Outcome], device: torch.device) -> tuple[str, bool]:
    """(one line counting each status, whether anything failed)."""
    counts = {s: 0 for s in (AGREE, DISAGREE, ERROR, NOT_BUILT, NOT_RUNNABLE, REFERENCE)}
    for outcome in outcomes:
        counts[outcome.final_status] += 1
    ops = len({o.op for o in outcomes})
    parts = [f"{n} {s}" for s, n in counts.items() if n or s in (AGREE, DISAGREE)]
    failed = any(counts[s] for s in FAILING)
    verdict = "FAILED" if failed else "passed"
    line = f"check {verdict} on {device}: {ops} op(s); backends: {', '.join(parts)}"
    if counts[NOT_BUILT]:
        line += " (build the missing modules with `kernels-jit build`, or unset KERNELS_NO_JIT)"
    return line, failed


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
    try:
        public = resolve_target(spec.public)
        samples = resolve_target(spec.samples)(device)
    except Exception as exc:  # a broken op file must not hide the other ops
        error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
        return [Outcome(spec.id, "torch", device.type, error=error)]
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
            except ModuleNotBuiltError as exc:
                outcome.status, outcome.error = NOT_BUILT, str(exc).splitlines()[0][:200]
                break
            except Exception as exc:
                outcome.error = f"{type(exc).__name__}: {exc}".splitlines()[0][:200]
                break
            outcome.cases += 1
            for index, (a, e) in enumerate(zip(actual, expected, strict=True)):
                rel, problem = mismatch(a, e)
                outcome.worst = max(outcome.worst, rel)
                if problem:
                    outcome.status, outcome.error = DISAGREE, f"tensor {index}: {problem}"
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
