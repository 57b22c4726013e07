"""The content-addressed cache key, where each artifact lives, and how an artifact is verified.

The key hashes what can change the binary: the generated binding, the bytes of every source and
of every header they include (transitively), the flags, the target arch, the compiler's version,
and the versions of tvm-ffi and kernels-jit. File mtimes and absolute paths play no part: pip
resets mtimes (a stale object reused because of an mtime is how other libraries ended up loading
deadlocking binaries), and a cache built on one machine must hit on another.

Layout::

    <KERNELS_CACHE_DIR>/<arch tag>/<uri>/<key>.lock            the key's build lock (flock)
    <KERNELS_CACHE_DIR>/<arch tag>/<uri>/<key>/<uri>.so        the artifact
    <KERNELS_CACHE_DIR>/<arch tag>/<uri>/<key>/<uri>.meta.json its size and sha256, source key
    <KERNELS_CACHE_DIR>/<arch tag>/<uri>/.staging-<uuid>/      a build in progress (private)

A truncated ``.so`` does not fail ``dlopen`` cleanly: it kills the process with SIGBUS. So every
artifact is checked against its recorded size and sha256 before it is loaded.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import re
import time
from pathlib import Path

from kernels_jit import arch, settings, toolchain
from kernels_jit.errors import ToolchainError
from kernels_jit.module import ModuleSpec
from kernels_jit.version import __version__

INCLUDE_DIR = Path(__file__).parent / "include"
_INCLUDE = re.compile(rb'^[ \t]*#[ \t]*include[ \t]*([<"])([^>"\r\n]+)[>"]', re.MULTILINE)
_META_FORMAT = 1


def include_dirs(spec: ModuleSpec) -> list[Path]:
    """Search path for a module's own headers: the package, its extra dirs, kernels-jit's."""
    root = spec.package_dir
    return [root, *(root / d for d in spec.include_dirs), INCLUDE_DIR]


def dist_include_dirs(spec: ModuleSpec) -> list[Path]:
    """The directories of ``spec.dist_include_dirs``, inside their installed distributions.

    Raises :class:`ToolchainError` when a distribution is not installed or lacks the directory.
    Their headers are not followed by the key: the distribution's version stands for them."""
    found = []
    for dist, sub in spec.dist_include_dirs:
        try:
            path = Path(str(importlib.metadata.distribution(dist).locate_file(sub)))
        except importlib.metadata.PackageNotFoundError:
            raise ToolchainError(
                f"module {spec.name!r} needs the headers of the distribution {dist!r}, which is "
                f"not installed (pip install {dist})"
            ) from None
        if not path.is_dir():
            raise ToolchainError(
                f"module {spec.name!r}: the distribution {dist!r} has no directory {sub!r} "
                f"(looked at {path})"
            )
        found.append(path)
    return found


def _closure(spec: ModuleSpec) -> dict[str, bytes]:
    """{name: bytes} of every source and every project header it reaches, searched like the
    compiler does: ``"x.h"`` next to the including file first, then the include dirs; ``<x.h>``
    in the include dirs only. Names are relative to the first include root holding the file."""
    roots = include_dirs(spec)
    resolved_roots = [r.resolve() for r in roots]
    found: dict[str, bytes] = {}
    seen: set[Path] = set()
    pending = [(s, spec.package_dir / s) for s in spec.sources]
    while pending:
        name, path = pending.pop()
        if not path.is_file():
            raise FileNotFoundError(f"module {spec.name!r}: {name!r} not found at {path}")
        real = path.resolve()
        if real in seen:
            continue
        seen.add(real)
        data = path.read_bytes()
        found[_relative_name(real, resolved_roots)] = data
        for quote, include in _INCLUDE.findall(data):
            include_name = include.decode("utf-8", "surrogateescape").strip()
            bases = [path.parent, *roots] if quote == b'"' else roots
            for base in bases:
                candidate = base / include_name
                if candidate.is_file():
                    pending.append((include_name, candidate))
                    break
    return dict(sorted(found.items()))


def header_closure(spec: ModuleSpec) -> dict[str, str]:
    """{path relative to its include root: text} for every source and project header it reaches.

    System and tvm-ffi headers are not followed: they are covered by the compiler and tvm-ffi
    versions in the key.
    """
    return {name: data.decode("utf-8", "replace") for name, data in _closure(spec).items()}


def _relative_name(path: Path, roots: list[Path]) -> str:
    for root in roots:
        try:
            return path.relative_to(root).as_posix()
        except ValueError:
            continue
    return path.as_posix()  # outside every root: only its absolute path names it uniquely


def compile_flags(spec: ModuleSpec) -> list[str]:
    """Flags that reach the compiler (include paths are added at build time and not keyed).

    ``-fno-gnu-unique``: a function-local static of a header's inline function (a per-kernel
    opt-in or cache) is otherwise one STB_GNU_UNIQUE object for the whole process, shared by every
    module that includes the header; one module's "done" then stands for another module's kernel
    (2026-12-04: the router's shared-memory opt-in made fused_a's launch fail, and an A/B base
    twin shares its statics with the new module). Each module keeps its own."""
    if spec.device == "cuda":
        base = [
            "-std=c++17",
            "-O3",
            "-DNDEBUG",
            "-lineinfo",
            "--expt-relaxed-constexpr",
            "-Xcompiler=-fPIC",
            "-Xcompiler=-fno-gnu-unique",
            *arch.gencode_flags(arch.cuda_archs()),
        ]
    else:
        base = ["-std=c++17", "-O3", "-DNDEBUG", "-fPIC", "-fno-gnu-unique"]
    return base + list(spec.flags)


class _Digest:
    def __init__(self) -> None:
        self._hash = hashlib.sha256()

    def feed(self, label: str, data: str | bytes) -> None:
        raw = data.encode() if isinstance(data, str) else data
        self._hash.update(f"{label}\0{len(raw)}\0".encode())
        self._hash.update(raw)

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def _source_digest(spec: ModuleSpec) -> str:
    """Everything in the key except the compiler, which needs no toolchain to compute."""
    import tvm_ffi

    digest = _Digest()
    digest.feed("binding", spec.binding_source())
    for name, data in _closure(spec).items():
        digest.feed(f"file:{name}", data)
    digest.feed("flags", "\n".join(compile_flags(spec)))
    digest.feed("arch", arch.arch_tag(spec.device))
    digest.feed("tvm_ffi", tvm_ffi.__version__)
    digest.feed("kernels_jit", __version__)
    for dist, sub in spec.dist_include_dirs:
        try:
            version = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            version = "not installed"  # building fails with the reason (dist_include_dirs)
        digest.feed(f"dist:{dist}:{sub}", version)
    return digest.hexdigest()


def source_key(spec: ModuleSpec) -> str:
    """The key without the compiler's version: finds a prebuilt artifact where no compiler is."""
    return _source_digest(spec)[:24]


def cache_key(spec: ModuleSpec) -> str:
    """The content-addressed key of ``spec`` for the current arch and toolchain.

    Raises :class:`ToolchainError` when the compiler is missing (see :func:`find_prebuilt`).
    """
    digest = _Digest()
    digest.feed("source", _source_digest(spec))
    digest.feed("compiler", toolchain.compiler_version(spec.device))
    return digest.hexdigest()[:24]


def module_dir(spec: ModuleSpec) -> Path:
    return settings.cache_dir() / arch.arch_tag(spec.device) / spec.uri


def artifact_path(spec: ModuleSpec, key: str) -> Path:
    return module_dir(spec) / key / f"{spec.uri}.so"


def meta_path(artifact: Path) -> Path:
    """The record published next to an artifact: ``<uri>.meta.json``."""
    return artifact.with_name(artifact.name.removesuffix(".so") + ".meta.json")


def file_digest(path: Path) -> tuple[int, str]:
    """(size, sha256) of a file."""
    digest = hashlib.sha256()
    size = 0
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
            size += len(chunk)
    return size, digest.hexdigest()


def artifact_record(spec: ModuleSpec, key: str, artifact: Path) -> dict:
    """The content of ``<uri>.meta.json`` for a freshly built ``artifact``."""
    import tvm_ffi

    size, sha256 = file_digest(artifact)
    try:
        compiler = toolchain.compiler_version(spec.device)
    except ToolchainError:
        compiler = "unknown"
    return {
        "format": _META_FORMAT,
        "uri": spec.uri,
        "name": spec.name,
        "package": spec.package,
        "key": key,
        "source_key": source_key(spec),
        "arch": arch.arch_tag(spec.device),
        "size": size,
        "sha256": sha256,
        "compiler": compiler,
        "tvm_ffi": tvm_ffi.__version__,
        "kernels_jit": __version__,
        "built_at": time.time(),
    }


def read_record(artifact: Path) -> dict | None:
    try:
        record = json.loads(meta_path(artifact).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def verify(artifact: Path, key: str | None = None) -> str | None:
    """Why the artifact at ``artifact`` must not be loaded, or None when it is intact.

    Checks that it exists, that its record is readable (and names ``key`` when given), and that
    its size and sha256 match the record, so a truncated or overwritten ``.so`` is never
    ``dlopen``ed.
    """
    try:
        size = artifact.stat().st_size
    except FileNotFoundError:
        return "not in the cache"
    except OSError as exc:
        return f"its artifact {artifact} cannot be read ({exc.strerror})"
    record = read_record(artifact)
    if record is None or record.get("format") != _META_FORMAT:
        return f"its record {meta_path(artifact)} is missing or unreadable"
    if key is not None and record.get("key") != key:
        return f"its record {meta_path(artifact)} is for another key"
    if size != record.get("size"):
        return (
            f"its artifact {artifact} is truncated or overwritten ({size} bytes, expected "
            f"{record.get('size')})"
        )
    try:
        _, sha256 = file_digest(artifact)
    except OSError as exc:
        return f"its artifact {artifact} cannot be read ({exc.strerror})"
    if sha256 != record.get("sha256"):
        return f"its artifact {artifact} is corrupted (sha256 differs from its record)"
    return None


def find_prebuilt(spec: ModuleSpec) -> Path | None:
    """An intact artifact of ``spec`` built by any compiler, for machines without one.

    A cache prebuilt with ``kernels-jit build`` is shipped to machines that have no nvcc, where
    :func:`cache_key` cannot be computed; the source key (sources, flags, arch, versions) still
    identifies the right artifact. The newest intact one wins.
    """
    wanted = source_key(spec)
    directory = module_dir(spec)
    best: tuple[float, Path] | None = None
    try:
        records = sorted(directory.glob(f"*/{spec.uri}.meta.json"))
    except OSError:
        return None
    for meta in records:
        artifact = meta.with_name(f"{spec.uri}.so")
        record = read_record(artifact)
        if record is None or record.get("source_key") != wanted:
            continue
        if verify(artifact, record.get("key")) is not None:
            continue
        built = float(record.get("built_at", 0.0))
        if best is None or built > best[0]:
            best = (built, artifact)
    return None if best is None else best[1]


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable (best effort: not every filesystem allows it)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
