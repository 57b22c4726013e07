"""Per-call backend selection, explanation, and the torch custom-op registration of every op.

An op file builds one :class:`Op` from its registered spec and its torch backend, whose typed,
destination-passing signature (outputs are arguments, the return is ``None``) is the op's schema;
every other backend takes the same arguments::

    def _add_constant_torch(out: Tensor, x: Tensor, constant: float) -> None: ...
    ADD_CONSTANT = Op("elementwise.add_constant", _add_constant_torch, mutates_args=("out",))

``ADD_CONSTANT.run(out, x, 3.0, backend=None)`` (or calling the Op) runs the best eligible
backend. In eager mode it calls the backend directly (the custom-op dispatcher costs
microseconds per call); while ``torch.compile`` traces, it goes through
``torch.ops.kernels_ops.<group>__<name>``, whose fake implementation does nothing because every
output is preallocated by the caller. That keeps every op usable under
``torch.compile(fullgraph=True)`` and CUDA-graph capture.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import torch

from kernels_jit import registry, settings
from kernels_jit.module import CompiledFunction

LIBRARY_NAMESPACE = "kernels_ops"
_LIBRARY = torch.library.Library(LIBRARY_NAMESPACE, "FRAGMENT")
_OPS: dict[str, Op] = {}
_is_compiling = torch.compiler.is_compiling
_DEFINED: set[str] = set()


class BackendUnavailableError(ValueError):
    """The requested backend cannot run this call; the message says why."""


class _Candidate:
    __slots__ = ("eligible", "fn", "name")

    def __init__(self, name: str, fn: Callable[..., None], eligible: Callable | None) -> None:
        self.name = name
        self.fn = fn
        self.eligible = eligible


def _override_for(op_id: str) -> str | None:
    """The backend forced by ``KERNELS_BACKEND`` for this op, if any."""
    text = settings.backend_override()
    if not text:
        return None
    forced = None
    for part in text.split(","):
        part = part.strip()
        if "=" in part:
            name, _, backend = part.partition("=")
            if name.strip() == op_id:
                return backend.strip()
        elif part:
            forced = part
    return forced


def _sm(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    major, minor = torch.cuda.get_device_capability(device)
    return major * 10 + minor


def static_reason(
    backend: registry.Backend, device: torch.device, dtype: torch.dtype
) -> str | None:
    """Why ``backend`` can never run on this device/dtype, or None."""
    if device.type not in backend.devices:
        return f"runs on {'/'.join(backend.devices)}, the input is on {device.type}"
    dtype_name = str(dtype).removeprefix("torch.")
    if backend.dtypes and dtype_name not in backend.dtypes:
        return f"supports {', '.join(backend.dtypes)}, not {dtype_name}"
    sm = _sm(device)
    if sm is not None and backend.min_sm is not None and sm < backend.min_sm:
        return f"needs sm_{backend.min_sm}+, the device is sm_{sm}"
    if sm is not None and backend.max_sm is not None and sm > backend.max_sm:
        return f"needs at most sm_{backend.max_sm}, the device is sm_{sm}"
    if backend.name == "triton":
        import importlib.util

        if importlib.util.find_spec("triton") is None:
            return "triton is not installed"
    return None


class Op:
    """A registered op: selection, explanation and the torch custom-op entry."""

    def __init__(
        self,
        op_id: str,
        prototype: Callable[..., None],
        *,
        mutates_args: tuple[str, ...],
        device_arg: int = 0,
    ) -> None:
        self.spec = registry.get(op_id)
        self.device_arg = device_arg
        self._arity = len(inspect.signature(prototype).parameters)
        self._cache: dict[tuple[Any, ...], tuple[_Candidate, ...]] = {}
        self._qualname = op_id.replace(".", "__")
        schema = torch.library.infer_schema(prototype, mutates_args=mutates_args)
        head, arrow, tail = schema.rpartition(") ->")
        schema = f"{head}, str? backend=None{arrow}{tail}"
        if self._qualname not in _DEFINED:
            _DEFINED.add(self._qualname)
            _LIBRARY.define(self._qualname + schema)
            _LIBRARY.impl(self._qualname, self._impl, "CompositeExplicitAutograd")
            torch.library.register_fake(
                f"{LIBRARY_NAMESPACE}::{self._qualname}", _fake_nothing, lib=_LIBRARY
            )
        self.torch_op = getattr(getattr(torch.ops, LIBRARY_NAMESPACE), self._qualname)
        self.run = self._fast_call()
        _OPS[op_id] = self

    def __call__(self, *args: Any, backend: str | None = None) -> None:
        """Run the best eligible backend for these arguments."""
        self.run(*args, backend=backend)

    def _fast_call(self) -> Callable[..., None]:
        """The hot path as a closure over this op's state.

        A plain function with its state in cells costs about half of a method reading ``self.``
        attributes (1.0 vs 1.5 us over the raw kernel call on a 2-core CI host); ``__init__``
        stores it as ``self.run``, which ``__call__`` forwards to.
        """
        cache, device_arg = self._cache, self.device_arg
        resolve, explain = self._resolve, self.explain

        def call(*args: Any, backend: str | None = None) -> None:
            if _is_compiling():
                self.torch_op(*args, backend)
                return
            # One dict lookup keyed by (device, dtype, backend); eligibility checks only for the
            # candidates that declare one.
            x = args[device_arg]
            candidates = cache.get((x.device, x.dtype, backend))
            if candidates is None:
                candidates = resolve(x, backend)
            for candidate in candidates:
                eligible = candidate.eligible
                if eligible is None or eligible(*args) is None:
                    fn = candidate.fn
                    if type(fn) is CompiledFunction:  # first use: load, keep the raw function
                        fn = candidate.fn = fn.resolve()
                    fn(*args)
                    return
            raise BackendUnavailableError(explain(args, backend))

        return call

    def _impl(self, *args: Any, backend: str | None = None) -> None:
        # The dispatcher drops trailing arguments equal to their default, so ``backend`` may be
        # missing, passed positionally, or passed by keyword.
        if len(args) > self._arity:
            *args, backend = args
        self.select(tuple(args), backend)(*args)

    def _resolve(self, x: Any, backend: str | None) -> tuple[_Candidate, ...]:
        key = (x.device, x.dtype, backend)
        candidates = self._cache[key] = self._candidates(x.device, x.dtype, backend)
        return candidates

    def select(self, args: tuple[Any, ...], backend: str | None = None) -> Callable[..., None]:
        """The function of the first eligible backend for these arguments."""
        x = args[self.device_arg]
        candidates = self._cache.get((x.device, x.dtype, backend)) or self._resolve(x, backend)
        for candidate in candidates:
            if candidate.eligible is None or candidate.eligible(*args) is None:
                fn = candidate.fn
                if type(fn) is CompiledFunction:
                    fn = candidate.fn = fn.resolve()
                return fn
        raise BackendUnavailableError(self.explain(args, backend))

    def _candidates(
        self, device: torch.device, dtype: torch.dtype, backend: str | None
    ) -> tuple[_Candidate, ...]:
        forced = backend or _override_for(self.spec.id)
        if forced is not None:
            chosen = self.spec.backend(forced)
            reason = static_reason(chosen, device, dtype)
            if reason is not None:
                raise BackendUnavailableError(
                    f"{self.spec.id}: backend {forced!r} cannot run here: {reason}"
                )
            backends = [chosen]
        else:
            backends = [b for b in self.spec.backends if static_reason(b, device, dtype) is None]
        if not backends:
            raise BackendUnavailableError(self.explain_static(device, dtype))
        return tuple(
            _Candidate(
                b.name,
                registry.resolve_target(b.target),
                registry.resolve_target(b.eligible) if b.eligible else None,
            )
            for b in backends
        )

    def explain_static(self, device: torch.device, dtype: torch.dtype) -> str:
        lines = [f"{self.spec.id} on {device} with {str(dtype).removeprefix('torch.')}:"]
        for b in self.spec.backends:
            reason = static_reason(b, device, dtype)
            lines.append(f"  {b.name}: {'eligible' if reason is None else 'no, ' + reason}")
        return "\n".join(lines)

    def explain(self, args: tuple[Any, ...], backend: str | None = None) -> str:
        """Which backend this call would use, and why each other one would not."""
        x = args[self.device_arg]
        forced = backend or _override_for(self.spec.id)
        lines = [
            f"{self.spec.id} on {x.device} with {str(x.dtype).removeprefix('torch.')}"
            + (f" (backend forced to {forced!r})" if forced else "")
            + ":"
        ]
        chosen = None
        for b in self.spec.backends:
            reason = static_reason(b, x.device, x.dtype)
            if reason is None and forced and b.name != forced:
                reason = f"not the forced backend {forced!r}"
            if reason is None and b.eligible:
                reason = registry.resolve_target(b.eligible)(*args)
            if reason is None and chosen is None:
                chosen = b.name
                lines.append(f"  {b.name}: chosen")
            else:
                verdict = "eligible, lower priority" if reason is None else f"no, {reason}"
                lines.append(f"  {b.name}: {verdict}")
        if chosen is None:
            lines.append("  no backend can run this call")
        return "\n".join(lines)

    def clear_cache(self) -> None:
        self._cache.clear()


def _fake_nothing(*args: Any) -> None:
    return None


def get_op(op_id: str) -> Op:
    """The :class:`Op` of ``op_id`` (imports its public module)."""
    if op_id not in _OPS:
        registry.resolve_target(registry.get(op_id).public)
    return _OPS[op_id]


def explain(op_id: str, *args: Any, backend: str | None = None) -> str:
    return get_op(op_id).explain(args, backend)


def clear_caches() -> None:
    """Forget every resolved selection (after changing KERNELS_BACKEND, for example)."""
    for op in _OPS.values():
        op.clear_cache()
