"""The content-addressed cache key and where each artifact lives.

The key hashes what can change the binary: the generated binding, the text of every source and of
every header they include (transitively), the flags, the target arch, the compiler's version, and
the versions of tvm-ffi and kernels-jit. File mtimes play no part: pip resets them, and a stale
object reused because of an mtime is how other libraries ended up loading deadlocking binaries.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from kernels_jit import arch, settings, toolchain
from kernels_jit.module import ModuleSpec
from kernels_jit.version import __version__

INCLUDE_DIR = Path(__file__).parent / "include"
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^>"]+)[>"]', re.MULTILINE)


def include_dirs(spec: ModuleSpec) -> list[Path]:
    """Search path for a module's own headers: the package, its extra dirs, kernels-jit's."""
    root = spec.package_dir
    return [root, *(root / d for d in spec.include_dirs), INCLUDE_DIR]


def header_closure(spec: ModuleSpec) -> dict[str, str]:
    """{path relative to its include root: text} for every source and project header it reaches.

    System and tvm-ffi headers are not followed: they are covered by the compiler and tvm-ffi
    versions in the key.
    """
    roots = include_dirs(spec)
    found: dict[str, str] = {}
    pending = [(s, spec.package_dir / s) for s in spec.sources]
    while pending:
        name, path = pending.pop()
        if name in found:
            continue
        if not path.is_file():
            raise FileNotFoundError(f"module {spec.name!r}: source {name!r} not found at {path}")
        text = path.read_text()
        found[name] = text
        for include in _INCLUDE.findall(text):
            for base in (path.parent, *roots):
                candidate = base / include
                if candidate.is_file():
                    rel = _relative_name(candidate, roots, include)
                    pending.append((rel, candidate))
                    break
    return dict(sorted(found.items()))


def _relative_name(path: Path, roots: list[Path], fallback: str) -> str:
    for root in roots:
        try:
            return path.resolve().relative_to(root.resolve()).as_posix()
        except ValueError:
            continue
    return fallback


def compile_flags(spec: ModuleSpec) -> list[str]:
    """Flags that reach the compiler (include paths are added at build time and not keyed)."""
    if spec.device == "cuda":
        base = [
            "-std=c++17",
            "-O3",
            "-DNDEBUG",
            "-lineinfo",
            "--expt-relaxed-constexpr",
            "-Xcompiler=-fPIC",
            *arch.gencode_flags(arch.cuda_archs()),
        ]
    else:
        base = ["-std=c++17", "-O3", "-DNDEBUG", "-fPIC"]
    return base + list(spec.flags)


def cache_key(spec: ModuleSpec) -> str:
    import tvm_ffi

    digest = hashlib.sha256()

    def feed(label: str, text: str) -> None:
        digest.update(f"{label}\0{len(text)}\0".encode())
        digest.update(text.encode())

    feed("binding", spec.binding_source())
    for name, text in header_closure(spec).items():
        feed(f"file:{name}", text)
    feed("flags", "\n".join(compile_flags(spec)))
    feed("arch", arch.arch_tag(spec.device))
    feed("compiler", toolchain.compiler_version(spec.device))
    feed("tvm_ffi", tvm_ffi.__version__)
    feed("kernels_jit", __version__)
    return digest.hexdigest()[:24]


def module_dir(spec: ModuleSpec) -> Path:
    return settings.cache_dir() / arch.arch_tag(spec.device) / spec.uri


def artifact_path(spec: ModuleSpec, key: str) -> Path:
    return module_dir(spec) / key / f"{spec.uri}.so"
