"""Declaring a compiled module: plain data, no building, no GPU probing.

A group declares each module once, at import of its op file::

    ADD_CONSTANT_CUDA = ModuleSpec(
        name="add_constant",
        package="kernels_elementwise",
        sources=("csrc/add_constant.cuh",),
        exports=(("add_constant", "add_constant"),),
    )

``sources`` are headers relative to the package directory; kernels-jit generates one translation
unit that includes them and exports each ``(name, C++ function expression)`` pair with
``TVM_FFI_DLL_EXPORT_TYPED_FUNC``. A template instantiation such as ``rmsnorm<4096>`` is a valid
expression: that is how a module is specialised on compile-time constants.
"""

from __future__ import annotations

import importlib.util
import re
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

DEVICES = ("cuda", "cpu")

# Every distinct spec declared so far, in declaration order (a dict used as an ordered set): two
# specialisations of one module share a name and differ in their exports or flags.
_DECLARED: dict[ModuleSpec, None] = {}

_NAME = re.compile(r"[A-Za-z0-9_]+")
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class ModuleSpec:
    """One compiled module: a shared library loaded with ``tvm_ffi.load_module``."""

    name: str
    package: str
    sources: tuple[str, ...]
    exports: tuple[tuple[str, str], ...]
    device: str = "cuda"
    flags: tuple[str, ...] = ()
    include_dirs: tuple[str, ...] = ()
    # Headers shipped by an installed distribution: (distribution, directory inside it) pairs,
    # e.g. ("nvidia-cutlass", "cutlass_library/source/include"). Searched after the package's own
    # headers and keyed by the distribution's version, not by the content of what they reach.
    dist_include_dirs: tuple[tuple[str, str], ...] = ()
    description: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        # Lists are accepted and stored as tuples, so that a spec stays hashable (it keys the
        # loaded-module memo) and immutable.
        for name in ("sources", "flags", "include_dirs"):
            value = getattr(self, name)
            if isinstance(value, str):
                raise TypeError(f"ModuleSpec {self.name!r}: {name} must be a tuple of strings")
            object.__setattr__(self, name, tuple(value))
        object.__setattr__(self, "exports", tuple(tuple(pair) for pair in self.exports))
        object.__setattr__(
            self, "dist_include_dirs", tuple(tuple(pair) for pair in self.dist_include_dirs)
        )
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(f"ModuleSpec name {self.name!r} must be [A-Za-z0-9_]")
        if self.device not in DEVICES:
            raise ValueError(f"ModuleSpec {self.name!r}: device must be one of {DEVICES}")
        if not self.sources or not self.exports:
            raise ValueError(f"ModuleSpec {self.name!r}: needs at least one source and export")
        for source in self.sources:
            path = PurePosixPath(source)
            if path.is_absolute() or ".." in path.parts:
                raise ValueError(
                    f"ModuleSpec {self.name!r}: source {source!r} must be a path inside the package"
                )
        for pair in self.dist_include_dirs:
            path = PurePosixPath(pair[1]) if len(pair) == 2 and isinstance(pair[1], str) else None
            if (
                path is None
                or not isinstance(pair[0], str)
                or not pair[0].strip()
                or path.is_absolute()
                or ".." in path.parts
            ):
                raise ValueError(
                    f"ModuleSpec {self.name!r}: each dist_include_dirs entry must be "
                    f"(distribution, relative directory inside it), got {pair!r}"
                )
        names = [pair[0] for pair in self.exports]
        for pair in self.exports:
            if len(pair) != 2 or not _IDENTIFIER.fullmatch(pair[0]) or not pair[1].strip():
                raise ValueError(
                    f"ModuleSpec {self.name!r}: each export must be (C identifier, C++ "
                    f"expression), got {pair!r}"
                )
        if len(set(names)) != len(names):
            raise ValueError(f"ModuleSpec {self.name!r}: duplicate export names {names}")
        _DECLARED.setdefault(self, None)

    @property
    def uri(self) -> str:
        """The module name plus the device: names its cache directory and shared object.

        Two specialisations of one module (same name, other exports or flags) share it and are
        told apart by their cache keys."""
        return f"{self.name}_{self.device}"

    @property
    def package_dir(self) -> Path:
        spec = importlib.util.find_spec(self.package)
        if spec is None or not spec.submodule_search_locations:
            raise ModuleNotFoundError(f"package {self.package!r} of module {self.name!r}")
        return Path(next(iter(spec.submodule_search_locations)))

    def source_paths(self) -> list[Path]:
        return [self.package_dir / s for s in self.sources]

    def binding_source(self) -> str:
        """The generated translation unit: includes every source, then one export per function."""
        lines = [f"// Generated by kernels-jit for module {self.name} ({self.device})."]
        lines += ["#include <tvm/ffi/function.h>"]
        lines += [f'#include "{s}"' for s in self.sources]
        lines += [f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({n}, ({e}));" for n, e in self.exports]
        return "\n".join(lines) + "\n"


def declared_modules(package: str | None = None) -> list[ModuleSpec]:
    """Modules declared so far in this process (import a group's op files to declare its own)."""
    chosen = [m for m in _DECLARED if package in (None, m.package)]
    return sorted(chosen, key=lambda m: (m.package, m.uri, m.sources, m.exports, m.flags))
