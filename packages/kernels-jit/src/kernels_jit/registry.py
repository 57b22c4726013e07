"""Op specs as plain data. Declaring and registering them imports nothing heavy.

A group's ``__init__`` declares each op once, in one line, and registers them::

    OPS = register_group(
        __name__,
        op("add_constant", "out = x + constant", "cuda cpu", dtypes=FLOATS + ("int32",)),
        op("softcap", "cap * tanh(x / cap)", "cuda", dtypes=FLOATS),
    )
    __getattr__ = lazy_ops(__name__, OPS)

Every target of an op follows fixed names in its op file ``kernels_<group>.ops.<name>`` (or
``ops.<file>`` for a family of ops that share one file):

==========================  =============================================================
``<name>``                  the public function
``_<name>_torch``           the torch reference backend (destination-passing; its signature
                            is the op's torch schema)
``_<name>_<backend>``       each fast backend (``cuda``, ``triton``, ``cpu``), same arguments
``_<name>_<backend>_eligible``  optional: ``f(*args) -> str | None``, why this call cannot use
                            that backend (shape, alignment), or None
``_<name>_samples``         ``f(device) -> [(args, kwargs)]``: small random public calls
==========================  =============================================================

Backends run in the order declared, and the ``torch`` reference always comes last: it runs
anywhere and is the correctness oracle.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from dataclasses import dataclass

# The 18 groups and what each holds: the one place they are written (the packaging generator,
# the nox sessions and the umbrella read them from here).
GROUP_SUMMARIES: dict[str, str] = {
    "activation": "Gated activations (SiLU/GELU and-mul, relu2) for LLM inference",
    "attention": "RoPE, attention-state merging and MLA key assembly",
    "communication": "Single-node all-reduce and all-reduce fused with residual RMSNorm",
    "diffusion": "Diffusion-model kernels: timestep embedding, group norm + SiLU, adaLN modulation",
    "elementwise": "Pointwise kernels: add_constant, softcap, sigmoid gates, dual residual RMSNorm",
    "embeddings": "Vocab-parallel embedding lookup and multimodal embedding scatter",
    "gemm": "DeepSeek-V3 router GEMM and FP8 scaled matrix multiplication",
    "grammar": "Grammar-constrained decoding: token bitmask application",
    "kvcache": "KV-cache writes: token-major, paged and MLA latent caches",
    "layernorm": "RMSNorm, fused add + RMSNorm, Gemma variants, QK norm and LayerNorm",
    "mamba": "Mamba kernels: causal conv1d and selective state update",
    "memory": "Request-to-token tables, paged slot allocation and KV block copies",
    "moe": "MoE routing (top-k softmax, biased grouped top-k), token alignment, top-k sum",
    "quantization": "FP8/INT8 quantization and the Hadamard rotation",
    "sampling": "Top-k/top-p/min-p renormalisation and seeded sampling",
    "speculative": "Speculative decoding: tree verification, chain rejection sampling, bit packing",
    "lplb": "Linear-programming load balancing of MoE experts over replicas",
    "kv_canary": "KV-cache integrity canaries: per-slot hash chains and verification",
}
GROUPS: tuple[str, ...] = tuple(GROUP_SUMMARIES)

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
FLOATS: tuple[str, ...] = ("float32", "float16", "bfloat16")

# What each kind of backend is, and where it runs. ``torch`` is the reference; the others are
# compiled through kernels-jit (``cuda``, ``cpu``) or JIT-compiled by Triton.
KINDS: dict[str, tuple[tuple[str, ...], str]] = {
    "cuda": (("cuda",), "CUDA C++ via kernels-jit"),
    "cpu": (("cpu",), "host C++ via kernels-jit"),
    "triton": (("cuda",), "Triton"),
    "torch": (("cpu", "cuda"), "pure-torch reference"),
}
_NAME = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Backend:
    """One implementation of an op: its ``kind`` (a key of :data:`KINDS`), its ``target``
    (``"module:attr"``, the op's destination-passing signature) and where it can run.

    ``eligible`` is ``"module:attr"`` of an optional per-call predicate (resolved only if the op
    file defines it)."""

    name: str
    kind: str
    target: str
    devices: tuple[str, ...]
    dtypes: tuple[str, ...] = ()
    min_sm: int | None = None
    max_sm: int | None = None
    eligible: str | None = None
    description: str = ""

    @property
    def compiled(self) -> bool:
        """Built by kernels-jit (needs its compiler or a prebuilt cache)."""
        return self.kind in ("cuda", "cpu")


@dataclass(frozen=True)
class OpSpec:
    """An op: ``<group>.<name>``, its op file, public function, samples and backends in
    priority order (the ``torch`` reference last)."""

    group: str
    name: str
    module: str
    backends: tuple[Backend, ...]
    description: str
    dtypes: tuple[str, ...] = ()

    @property
    def id(self) -> str:
        return f"{self.group}.{self.name}"

    @property
    def public(self) -> str:
        return f"{self.module}:{self.name}"

    @property
    def samples(self) -> str:
        return f"{self.module}:_{self.name}_samples"

    @property
    def fast_backends(self) -> tuple[Backend, ...]:
        return tuple(b for b in self.backends if b.kind != "torch")

    def backend(self, name: str) -> Backend:
        for b in self.backends:
            if b.name == name:
                return b
        raise KeyError(
            f"op {self.id!r} has no backend {name!r}; it has {[b.name for b in self.backends]}"
        )


@dataclass(frozen=True)
class OpDecl:
    """What :func:`op` declares; :func:`register_group` turns it into an :class:`OpSpec`."""

    name: str
    description: str
    backends: tuple[str, ...]
    dtypes: tuple[str, ...]
    file: str | None
    min_sm: int | None


def op(
    name: str,
    description: str,
    backends: str = "",
    *,
    dtypes: tuple[str, ...],
    file: str | None = None,
    min_sm: int | None = None,
) -> OpDecl:
    """Declare an op in one line.

    ``backends`` are the fast backends' kinds in priority order, space-separated (``"cuda"``,
    ``"cuda cpu"``, ``"triton"``; empty: the torch reference only). ``dtypes`` are the dtypes of
    the input dispatch looks at; every fast backend takes them all (a narrower case is an
    eligibility predicate). ``file`` names a shared op file (``ops/<file>.py``) for a family of
    ops; ``min_sm`` applies to the GPU backends.
    """
    return OpDecl(name, description, tuple(backends.split()), tuple(dtypes), file, min_sm)


def _spec(group: str, decl: OpDecl) -> OpSpec:
    module = f"kernels_{group}.ops.{decl.file or decl.name}"
    backends = []
    for kind in (*decl.backends, "torch"):
        devices, what = KINDS.get(kind, ((), "?"))
        target = f"{module}:_{decl.name}_{kind}"
        backends.append(
            Backend(
                name=kind,
                kind=kind,
                target=target,
                devices=devices,
                dtypes=decl.dtypes if kind != "torch" else (),
                min_sm=decl.min_sm if "cuda" in devices and kind != "torch" else None,
                eligible=f"{target}_eligible" if kind != "torch" else None,
                description=what,
            )
        )
    return OpSpec(
        group=group,
        name=decl.name,
        module=module,
        backends=tuple(backends),
        description=decl.description,
        dtypes=decl.dtypes,
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
    if not spec.backends or spec.backends[-1].kind != "torch":
        problems.append(f"op {spec.id!r} has no 'torch' reference backend last")
    if len(set(names)) != len(names):
        problems.append(f"op {spec.id!r} lists a backend twice: {names}")
    if not spec.module.startswith(f"kernels_{group}.ops."):
        problems.append(f"op {spec.id!r}: op file {spec.module!r} is not kernels_{group}.ops.*")
    unknown = set(spec.dtypes) - DTYPE_NAMES
    if unknown:
        problems.append(f"op {spec.id!r}: unknown dtypes {sorted(unknown)}")
    if not spec.dtypes:
        problems.append(f"op {spec.id!r}: declares no dtypes")
    for b in spec.backends:
        if b.kind not in KINDS:
            problems.append(f"op {spec.id!r}: unknown backend kind {b.kind!r}; kinds: {[*KINDS]}")
        for text in (b.target, *(x for x in [b.eligible] if x)):
            if ":" not in text or not text.startswith(f"kernels_{group}."):
                problems.append(
                    f"op {spec.id!r}: target {text!r} is not kernels_{group}.<mod>:<attr>"
                )
    return problems


def register_group(package: str, *decls: OpDecl) -> tuple[OpSpec, ...]:
    """Validate and register the ops of the group package ``kernels_<group>`` (pass
    ``__name__``); idempotent for identical declarations."""
    group = package.removeprefix("kernels_")
    if not package.startswith("kernels_") or group not in GROUPS:
        raise ValueError(f"unknown group package {package!r}; the groups are {GROUPS}")
    specs = [_spec(group, d) for d in decls]
    problems = [p for spec in specs for p in _problems(spec, group)]
    for spec in specs:
        existing = _REGISTRY.get(spec.id)
        if existing is not None and existing != spec:
            problems.append(f"op {spec.id!r} is registered twice with different specs")
    if problems:
        raise ValueError("invalid op registration:\n  " + "\n  ".join(problems))
    for spec in specs:
        _REGISTRY[spec.id] = spec
    return tuple(specs)


def get(op_id: str) -> OpSpec:
    """The spec of ``op_id``, importing its group package (metadata only) if needed."""
    try:
        return _REGISTRY[op_id]
    except KeyError:
        group = op_id.split(".", maxsplit=1)[0]
        if group in GROUPS and f"kernels_{group}" not in sys.modules:
            try:
                importlib.import_module(f"kernels_{group}")
            except ModuleNotFoundError:
                raise KeyError(
                    f"no op {op_id!r}: the group package kernels-{group.replace('_', '-')} is "
                    "not installed"
                ) from None
            return get(op_id)
        raise KeyError(f"no op {op_id!r} is registered") from None


def all_ops() -> list[OpSpec]:
    return [_REGISTRY[k] for k in sorted(_REGISTRY)]


def resolve_target(target: str):
    """Import ``"module:attr"`` and return the attribute."""
    module, _, attr = target.partition(":")
    obj = importlib.import_module(module)
    for part in attr.split("."):
        obj = getattr(obj, part)
    return obj


def resolve_optional(target: str):
    """The attribute of ``"module:attr"``, or None where the module does not define it."""
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr, None)


def target_exists(target: str) -> bool:
    """Whether the module of ``"module:attr"`` exists, without importing it."""
    module = target.partition(":")[0]
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def lazy_ops(package: str, ops: tuple[OpSpec, ...], extras: dict[str, str] | None = None):
    """A PEP 562 ``__getattr__`` for a group package: ``kernels_<group>.<op>`` imports the op
    file on first access and is always the public function (op files live in ``ops/``, so no
    submodule import rebinds a package attribute). ``extras`` maps more lazy names (a class the
    group exports, say) to their ``"module:attr"``."""
    publics = {spec.name: spec.public for spec in ops} | dict(extras or {})

    def __getattr__(name: str):
        if name in publics:
            value = resolve_target(publics[name])
            setattr(sys.modules[package], name, value)
            return value
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


def backend_overrides() -> tuple[str | None, dict[str, str]]:
    """``KERNELS_BACKEND`` parsed and checked against the registry: (backend for every op or
    None, {op id: backend}). An unknown op or backend is a ValueError naming the variable and
    the entry. Imports group packages (metadata only), never torch."""
    from kernels_jit import settings

    every, per_op = settings.backend_overrides()
    for op_id, backend in per_op.items():
        try:
            spec = get(op_id)
        except KeyError as exc:
            raise ValueError(f"KERNELS_BACKEND: entry {op_id}={backend}: {exc.args[0]}") from None
        names = [b.name for b in spec.backends]
        if backend not in names:
            raise ValueError(
                f"KERNELS_BACKEND: entry {op_id}={backend}: {op_id} has no backend "
                f"{backend!r}; it has {', '.join(names)}"
            )
    return every, per_op
