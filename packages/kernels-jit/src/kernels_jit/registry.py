"""Op specs as plain data. Declaring and registering them imports nothing heavy.

Every group's ``__init__`` calls :func:`register_group` with its :class:`OpSpec` list. Each op lists
its backends in priority order (the first eligible one runs); the last is always the ``torch``
reference, which runs anywhere and is the correctness oracle.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import types
from dataclasses import dataclass, field

GROUPS: tuple[str, ...] = (
    "activation",
    "attention",
    "communication",
    "diffusion",
    "elementwise",
    "embeddings",
    "gemm",
    "grammar",
    "kvcache",
    "layernorm",
    "mamba",
    "memory",
    "moe",
    "quantization",
    "sampling",
    "speculative",
    "lplb",
    "kv_canary",
)

DTYPE_NAMES = frozenset(
    {
        "float32",
        "float16",
        "bfloat16",
        "float64",
        "float8_e4m3fn",
        "int8",
        "int32",
        "int64",
        "uint8",
        "bool",
    }
)
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Backend:
    """One implementation of an op.

    ``target`` is ``"module:attr"``, a callable with the op's destination-passing signature.
    ``eligible`` (optional) is ``"module:attr"`` of ``f(*args) -> str | None`` returning why this
    call cannot use the backend (shape, alignment), or None.
    """

    name: str
    target: str
    devices: tuple[str, ...]
    dtypes: tuple[str, ...] = ()
    min_sm: int | None = None
    max_sm: int | None = None
    eligible: str | None = None
    description: str = ""


@dataclass(frozen=True)
class OpSpec:
    """An op: ``<group>.<name>``, its public function and its backends in priority order.

    ``samples`` is ``"module:attr"`` of ``f(device) -> list[(args, kwargs)]``: small random calls of
    the public function that ``kernels-ops check`` runs on every backend against the reference.
    """

    group: str
    name: str
    public: str
    backends: tuple[Backend, ...]
    description: str
    samples: str
    dtypes: tuple[str, ...] = field(default=())

    @property
    def id(self) -> str:
        return f"{self.group}.{self.name}"

    def backend(self, name: str) -> Backend:
        for b in self.backends:
            if b.name == name:
                return b
        raise KeyError(
            f"op {self.id!r} has no backend {name!r}; it has {[b.name for b in self.backends]}"
        )


def reference_op(
    group: str,
    name: str,
    description: str,
    *,
    dtypes: tuple[str, ...] = (),
    reference: str = "pure-torch reference",
    backends: tuple[Backend, ...] = (),
) -> OpSpec:
    """An OpSpec following the op-file convention: the op lives in ``kernels_<group>.<name>``,
    which defines the public ``<name>``, ``samples`` and the torch backend ``_<name>_torch``;
    ``backends`` (fast ones, in priority order) come before that reference."""
    module = f"kernels_{group}.{name}"
    torch_backend = Backend(
        "torch", f"{module}:_{name}_torch", devices=("cpu", "cuda"), description=reference
    )
    return OpSpec(
        group=group,
        name=name,
        public=f"{module}:{name}",
        backends=(*backends, torch_backend),
        description=description,
        samples=f"{module}:samples",
        dtypes=dtypes,
    )


_REGISTRY: dict[str, OpSpec] = {}


def _problems(spec: OpSpec, group: str) -> list[str]:
    problems = []
    if spec.group != group:
        problems.append(f"op {spec.id!r} is registered by group {group!r}")
    if not _NAME.match(spec.name) or not _NAME.match(spec.group):
        problems.append(f"op id {spec.id!r} is not <group>.<snake_case_name>")
    for text in (spec.name, *(b.name for b in spec.backends)):
        if text.startswith("jit") or "_jit" in text:
            problems.append(f"op {spec.id!r}: name {text!r} carries a 'jit' prefix")
    names = [b.name for b in spec.backends]
    if "torch" not in names:
        problems.append(f"op {spec.id!r} has no 'torch' reference backend")
    if len(set(names)) != len(names):
        problems.append(f"op {spec.id!r} lists a backend twice: {names}")
    for b in spec.backends:
        for text in (b.target, spec.public, spec.samples, *(x for x in [b.eligible] if x)):
            if ":" not in text or not text.startswith(f"kernels_{group}."):
                problems.append(
                    f"op {spec.id!r}: target {text!r} is not kernels_{group}.<mod>:<attr>"
                )
        unknown = set(b.dtypes) - DTYPE_NAMES
        if unknown:
            problems.append(f"op {spec.id!r} backend {b.name!r}: unknown dtypes {sorted(unknown)}")
        if not b.devices or set(b.devices) - {"cpu", "cuda"}:
            problems.append(f"op {spec.id!r} backend {b.name!r}: devices {b.devices}")
    return problems


def register_group(group: str, ops: list[OpSpec]) -> tuple[OpSpec, ...]:
    """Validate and register a group's ops (idempotent for identical specs)."""
    if group not in GROUPS:
        raise ValueError(f"unknown group {group!r}; the groups are {GROUPS}")
    problems = [p for spec in ops for p in _problems(spec, group)]
    for spec in ops:
        existing = _REGISTRY.get(spec.id)
        if existing is not None and existing != spec:
            problems.append(f"op {spec.id!r} is registered twice with different specs")
    if problems:
        raise ValueError("invalid op registration:\n  " + "\n  ".join(problems))
    for spec in ops:
        _REGISTRY[spec.id] = spec
    return tuple(ops)


def get(op_id: str) -> OpSpec:
    try:
        return _REGISTRY[op_id]
    except KeyError:
        group = op_id.split(".", maxsplit=1)[0]
        if group in GROUPS and f"kernels_{group}" not in _imported_groups():
            importlib.import_module(f"kernels_{group}")
            return get(op_id)
        raise KeyError(f"no op {op_id!r} is registered") from None


def _imported_groups() -> set[str]:
    import sys

    return {name for name in sys.modules if name.startswith("kernels_")}


def all_ops() -> list[OpSpec]:
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def resolve_target(target: str):
    """Import ``"module:attr"`` and return the attribute."""
    module, _, attr = target.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def target_exists(target: str) -> bool:
    """Whether the module of ``"module:attr"`` exists, without importing it."""
    module = target.partition(":")[0]
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


class _GroupModule(types.ModuleType):
    """A group package whose public op names stay bound to the op functions.

    Op files are named after their op (``kernels_moe/topk_softmax.py`` defines ``topk_softmax``).
    Importing such a submodule makes Python bind the package attribute to the *module*; this
    class rebinds it to the function, so ``kernels_moe.topk_softmax(...)`` keeps working whatever
    was imported first.
    """

    _publics: dict[str, str]

    def __setattr__(self, name: str, value: object) -> None:
        if isinstance(value, types.ModuleType) and name in self.__dict__.get("_publics", {}):
            value = resolve_target(self._publics[name])
        super().__setattr__(name, value)


def lazy_attributes(group_module: str, ops: tuple[OpSpec, ...]):
    """A PEP 562 ``__getattr__`` that resolves a group's public ops on first access."""
    import sys

    publics = {spec.name: spec.public for spec in ops}
    module = sys.modules[group_module]
    module.__class__ = _GroupModule
    module.__dict__["_publics"] = publics

    def __getattr__(name: str):
        if name in publics:
            value = resolve_target(publics[name])
            setattr(sys.modules[group_module], name, value)
            return value
        raise AttributeError(f"module {group_module!r} has no attribute {name!r}")

    return __getattr__
