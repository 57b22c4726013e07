"""Per-call backend selection, explanation, and the torch custom-op registration of every op.

An op file builds one :class:`Op` from its torch reference backend, whose typed,
destination-passing signature (outputs are arguments, the return is ``None``) is the op's
torch schema; every other backend takes the same arguments, plus the op's launch knobs::

    def _rmsnorm_torch(out: Tensor, input: Tensor, weight: Tensor, eps: float) -> None: ...
    RMSNORM = Op(_rmsnorm_torch, mutates=("out",), device="input", knobs={"enable_pdl": -1})

The op id (``layernorm.rmsnorm``) comes from the reference's module and name, which the registry
fixed. ``RMSNORM.run(out, x, w, eps, pdl, backend=None)`` runs the best eligible backend. In
eager mode it calls the backend directly (the custom-op dispatcher costs microseconds per call);
while ``torch.compile`` traces, it goes through ``torch.ops.kernels_ops.<group>__<name>``, whose
fake implementation does nothing because every output is preallocated by the caller. Launch knobs
(PDL and the like) never enter that schema: compiled backends take them as trailing arguments,
the torch reference never sees them, and a traced call runs with their defaults.

A GPU call that a fast backend cannot take falls back to the torch reference with a
:class:`~kernels_jit.errors.KernelsFallbackWarning` (once per op and reason), or an error under
``KERNELS_STRICT=1``.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Callable
from typing import Any

import torch

from kernels_jit import registry, settings
from kernels_jit.errors import FallbackError, KernelsFallbackWarning
from kernels_jit.loader import CompiledFunction

LIBRARY_NAMESPACE = "kernels_ops"
_LIBRARY = torch.library.Library(LIBRARY_NAMESPACE, "FRAGMENT")
_OPS: dict[str, Op] = {}
_is_compiling = torch.compiler.is_compiling


def _cache_key(x: torch.Tensor, backend: str | None) -> tuple[Any, ...]:
    """The selection cache key of a call (as the hot path in ``Op._fast_call`` spells it):
    the device index of a CUDA tensor, the device itself otherwise (CPU, meta)."""
    index = x.get_device()
    return (index, x.dtype, backend) if index >= 0 else (x.device, x.dtype, backend)


_DEFINED: set[str] = set()
_WARNED: set[tuple[str, str]] = set()
_OVERRIDES: dict[str, tuple[str | None, dict[str, str]]] = {}


class BackendUnavailableError(ValueError):
    """The requested backend cannot run this call; the message says why."""


class _Candidate:
    """A backend that can run on one (device, dtype): its function and per-call predicate.

    ``fallback`` marks the torch reference where a fast backend was declared for this device:
    choosing it is a performance cliff that warns."""

    __slots__ = ("eligible", "fallback", "fn", "name")

    def __init__(self, name: str, fn: Callable[..., None], eligible: Callable | None) -> None:
        self.name = name
        self.fn = fn
        self.eligible = eligible
        self.fallback = False


def _overrides() -> tuple[str | None, dict[str, str]]:
    """``KERNELS_BACKEND`` parsed and checked against the registry (once per value)."""
    text = settings.backend_override()
    parsed = _OVERRIDES.get(text)
    if parsed is None:
        parsed = _OVERRIDES[text] = registry.backend_overrides()
    return parsed


def _override_for(op_id: str) -> str | None:
    """The backend forced by ``KERNELS_BACKEND`` for this op, if any."""
    every, per_op = _overrides()
    return per_op.get(op_id, every)


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
    if backend.kind == "triton":
        import importlib.util

        if importlib.util.find_spec("triton") is None:
            return "triton is not installed"
    return None


def _op_id_of(reference: Callable[..., None]) -> str:
    """``<group>.<name>`` from the reference ``kernels_<group>.ops.<file>:_<name>_torch``."""
    group = reference.__module__.split(".")[0].removeprefix("kernels_")
    name = reference.__name__
    if not (name.startswith("_") and name.endswith("_torch")):
        raise ValueError(f"an Op is built from its reference _<name>_torch, got {name!r}")
    return f"{group}.{name[1 : -len('_torch')]}"


class Op:
    """A registered op: selection, explanation and the torch custom-op entry.

    ``mutates`` names the arguments the op writes, ``device`` the tensor whose device and dtype
    choose the backend, ``knobs`` the launch options (name: default) that compiled backends take
    after the op's arguments.
    """

    def __init__(
        self,
        reference: Callable[..., None],
        *,
        mutates: tuple[str, ...],
        device: str,
        knobs: dict[str, int] | None = None,
    ) -> None:
        op_id = _op_id_of(reference)
        self.spec = registry.get(op_id)
        if reference.__module__ != self.spec.module:
            raise ValueError(
                f"{op_id}: the reference lives in {reference.__module__}, the registry "
                f"declares the op file {self.spec.module}"
            )
        self.id = op_id
        self.reference = reference
        parameters = list(inspect.signature(reference).parameters)
        self.device_arg = parameters.index(device)
        self._arity = len(parameters)
        self.knobs = dict(knobs or {})
        self._knob_defaults = tuple(self.knobs.values())
        self.dtypes = tuple(getattr(torch, name) for name in self.spec.dtypes)
        self._cache: dict[tuple[Any, ...], tuple[_Candidate, ...]] = {}
        self._qualname = op_id.replace(".", "__")
        schema = torch.library.infer_schema(reference, mutates_args=mutates)
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
        self.run = self._call = self._fast_call()
        _OPS[op_id] = self

    def __call__(self, *args: Any, backend: str | None = None) -> None:
        """Run the best eligible backend for these arguments (launch knobs included)."""
        self.run(*args, backend=backend)

    def _fast_call(self) -> Callable[..., None]:
        """The hot path as a closure over this op's state.

        A plain function with its state in cells costs about half of a method reading ``self.``
        attributes; ``__init__`` stores it as ``self.run``.
        """
        cache, device_arg, arity = self._cache, self.device_arg, self._arity
        resolve, choose = self._resolve, self._choose

        def call(*args: Any, backend: str | None = None) -> None:
            if _is_compiling():
                self.torch_op(*args[:arity], backend)
                return
            x = args[device_arg]
            # A CUDA tensor's key holds its device index: building ``x.device`` costs ~0.2 us.
            index = x.get_device()
            key = (index, x.dtype, backend) if index >= 0 else (x.device, x.dtype, backend)
            candidates = cache.get(key) or resolve(x, backend)
            # The first candidate taking the call is the common case, checked inline (a call
            # into the loop costs ~0.3 us on a slow host); anything else goes through the one
            # candidate loop, which checks it again.
            candidate = candidates[0]
            eligible = candidate.eligible
            if (eligible is not None and eligible(*args) is not None) or candidate.fallback:
                candidate = choose(candidates, args)
            fn = candidate.fn
            if type(fn) is CompiledFunction:  # first use: load, keep the raw function
                fn = candidate.fn = fn.resolve()
            fn(*args)

        return call

    def _choose(
        self,
        candidates: tuple[_Candidate, ...],
        args: tuple[Any, ...],
        notes: dict[str, str] | None = None,
    ) -> _Candidate:
        """The one candidate loop: the first backend whose predicate takes ``args``.

        ``notes`` (when explaining) collects each rejection and suppresses the fall-back
        warning."""
        why_not = None
        for candidate in candidates:
            reason = None if candidate.eligible is None else candidate.eligible(*args)
            if reason is None:
                if candidate.fallback and notes is None:
                    self._fell_back(why_not or "no fast backend runs here")
                return candidate
            why_not = why_not or f"{candidate.name}: {reason}"
            if notes is not None:
                notes[candidate.name] = reason
        if notes is not None:
            raise BackendUnavailableError(f"{self.id}: no backend can run this call")
        raise BackendUnavailableError(self.explain_call(args))

    def _fell_back(self, reason: str) -> None:
        message = (
            f"{self.id}: a CUDA call runs on the torch reference because {reason} "
            "(set KERNELS_STRICT=1 to make this an error)"
        )
        if settings.strict():
            raise FallbackError(message.replace("set KERNELS_STRICT=1", "KERNELS_STRICT=1 is set"))
        key = (self.id, reason)
        if key not in _WARNED:
            _WARNED.add(key)
            warnings.warn(message, KernelsFallbackWarning, stacklevel=4)

    def _impl(self, *args: Any, backend: str | None = None) -> None:
        # The dispatcher drops trailing arguments equal to their default, so ``backend`` may be
        # missing, passed positionally, or passed by keyword.
        if len(args) > self._arity:
            *args, backend = args
        self.select(tuple(args), backend)(*args, *self._knob_defaults)

    def _resolve(self, x: Any, backend: str | None) -> tuple[_Candidate, ...]:
        candidates = self._candidates(x.device, x.dtype, backend)
        self._cache[_cache_key(x, backend)] = candidates
        return candidates

    def select(self, args: tuple[Any, ...], backend: str | None = None) -> Callable[..., None]:
        """The function of the first eligible backend for these arguments (which take the
        launch knobs after the op's arguments)."""
        args = tuple(args)[: self._arity] + self._knob_defaults
        x = args[self.device_arg]
        candidates = self._cache.get(_cache_key(x, backend)) or self._resolve(x, backend)
        candidate = self._choose(candidates, args)
        fn = candidate.fn
        if type(fn) is CompiledFunction:
            fn = candidate.fn = fn.resolve()
        return fn

    def _torch_function(self) -> Callable[..., None]:
        if not self.knobs:
            return self.reference
        reference, arity = self.reference, self._arity

        def without_knobs(*args: Any) -> None:
            reference(*args[:arity])

        without_knobs.__name__ = reference.__name__
        return without_knobs

    def _candidates(
        self, device: torch.device, dtype: torch.dtype, backend: str | None
    ) -> tuple[_Candidate, ...]:
        forced = backend or _override_for(self.id)
        if forced is not None:
            chosen = self.spec.backend(forced)
            reason = static_reason(chosen, device, dtype)
            if reason is not None:
                where = f"backend={forced!r}" if backend else f"KERNELS_BACKEND forces {forced!r}"
                raise BackendUnavailableError(
                    f"{self.id}: backend {forced!r} cannot run here ({where}): {reason}"
                )
            backends = [chosen]
        else:
            backends = []
            skipped = None
            for b in self.spec.backends:
                reason = static_reason(b, device, dtype)
                if reason is None:
                    backends.append(b)
                elif skipped is None and device.type in b.devices:
                    skipped = f"{b.name}: {reason}"
            if skipped and device.type == "cuda" and backends and backends[0].kind == "torch":
                self._fell_back(skipped)
        if not backends:
            raise BackendUnavailableError(self.explain_static(device, dtype))
        candidates = []
        for b in backends:
            if b.kind == "torch":
                candidate = _Candidate(b.name, self._torch_function(), None)
            else:
                fn = registry.resolve_target(b.target)
                candidate = _Candidate(b.name, fn, registry.resolve_optional(b.eligible))
            candidates.append(candidate)
        # The reference after a fast backend that declares this device: a fall-back, which warns.
        fast_here = device.type == "cuda" and any(
            "cuda" in b.devices for b in self.spec.fast_backends
        )
        candidates[-1].fallback = forced is None and fast_here and len(candidates) > 1
        return tuple(candidates)

    def explain_static(self, device: torch.device, dtype: torch.dtype) -> str:
        lines = [f"{self.id} on {device} with {str(dtype).removeprefix('torch.')}:"]
        for b in self.spec.backends:
            reason = static_reason(b, device, dtype)
            lines.append(f"  {b.name}: {'eligible' if reason is None else 'no, ' + reason}")
        return "\n".join(lines)

    def explain_call(self, args: tuple[Any, ...], backend: str | None = None) -> str:
        """Which backend these destination-passing arguments would use, and why not the others."""
        args = tuple(args)[: self._arity] + self._knob_defaults
        x = args[self.device_arg]
        forced = backend or _override_for(self.id)
        head = f"{self.id} on {x.device} with {str(x.dtype).removeprefix('torch.')}"
        verdicts: dict[str, str] = {}
        for b in self.spec.backends:
            reason = static_reason(b, x.device, x.dtype)
            if reason is None and forced and b.name != forced:
                reason = f"not the forced backend {forced!r}"
            verdicts[b.name] = "eligible, lower priority" if reason is None else f"no, {reason}"
        tail = []
        if any(v.startswith("eligible") for v in verdicts.values()):
            notes: dict[str, str] = {}
            candidates = self._cache.get(_cache_key(x, backend)) or self._resolve(x, backend)
            try:
                verdicts[self._choose(candidates, args, notes).name] = "chosen"
            except BackendUnavailableError:
                tail = ["  no backend can run this call"]
            verdicts.update((name, f"no, {reason}") for name, reason in notes.items())
        else:
            tail = ["  no backend can run this call"]
        lines = [head + (f" (backend forced to {forced!r})" if forced else "") + ":"]
        lines += [f"  {name}: {verdict}" for name, verdict in verdicts.items()]
        return "\n".join(lines + tail)

    def clear_cache(self) -> None:
        self._cache.clear()


def _fake_nothing(*args: Any) -> None:
    return None


def get_op(op_id: str) -> Op:
    """The :class:`Op` of ``op_id`` (imports its op file)."""
    if op_id not in _OPS:
        registry.resolve_target(registry.get(op_id).public)
    return _OPS[op_id]


def explain(op_id: str, *args: Any, **kwargs: Any) -> str:
    """Which backend the public call ``<op>(*args, **kwargs)`` would run, and why.

    The public function runs as usual (validation, output allocation) up to its dispatch, which
    is recorded instead of launched: nothing is computed or written."""
    op = get_op(op_id)
    public = registry.resolve_target(op.spec.public)
    seen: list[str] = []

    def record(*args: Any, backend: str | None = None) -> None:
        seen.append(op.explain_call(args, backend))

    op.run = record
    try:
        public(*args, **kwargs)
    finally:
        op.run = op._call
    return seen[0] if seen else f"{op_id}: this call launches nothing (an empty input)"


def clear_caches() -> None:
    """Forget every resolved selection and parsed override (after changing KERNELS_BACKEND)."""
    _OVERRIDES.clear()
    _WARNED.clear()
    for op in _OPS.values():
        op.clear_cache()
