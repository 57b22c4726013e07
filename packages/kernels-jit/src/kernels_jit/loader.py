"""Loading a module: a cache hit loads without running ninja; a miss or a broken artifact builds.

An artifact is loaded only after it matches the size and sha256 of its record (a truncated
``.so`` would kill the process with SIGBUS inside ``dlopen``). Where no compiler is installed
(a prebuilt cache shipped to GPU machines), the artifact is found by its source key instead.
"""

from __future__ import annotations

import shlex
import sys
import threading
from pathlib import Path
from typing import Any

from kernels_jit import arch, build, cache, settings
from kernels_jit.errors import LoadError, ModuleNotBuiltError, ToolchainError
from kernels_jit.module import ModuleSpec

_LOADED: dict[ModuleSpec, Any] = {}
_THREAD_LOCK = threading.Lock()
_SPEC_LOCKS: dict[ModuleSpec, threading.Lock] = {}


class CompiledFunction:
    """One exported function of a module, loaded (and built if needed) on first call.

    An op file declares its compiled backends with it (``_softcap_cuda =
    CompiledFunction(SOFTCAP_CUDA, "softcap")``); dispatch swaps the handle for the raw tvm-ffi
    function on first use, so calls skip this wrapper."""

    __slots__ = ("_fn", "export", "spec")

    def __init__(self, spec: ModuleSpec, export: str) -> None:
        if export not in dict(spec.exports):
            raise KeyError(f"module {spec.name!r} exports no {export!r}")
        self.spec = spec
        self.export = export
        self._fn = None

    def resolve(self):
        """The raw tvm-ffi function."""
        if self._fn is None:
            self._fn = getattr(load_module(self.spec), self.export)
        return self._fn

    def __call__(self, *args):
        return self.resolve()(*args)

    def __repr__(self) -> str:
        return f"<compiled {self.spec.uri}.{self.export}>"


def _load_so(path) -> Any:
    import tvm_ffi

    return tvm_ffi.load_module(str(path))


def load_module(spec: ModuleSpec) -> Any:
    """The loaded tvm-ffi module of ``spec``, built first if the cache has no valid artifact.

    Memoised per spec for the life of the process; the hot path is one dict lookup.
    """
    module = _LOADED.get(spec)
    if module is not None:
        return module
    with _THREAD_LOCK:  # one lock per spec: threads loading other modules do not wait
        spec_lock = _SPEC_LOCKS.setdefault(spec, threading.Lock())
    with spec_lock:
        module = _LOADED.get(spec)
        if module is None:
            module = _LOADED[spec] = _load_or_build(spec)
    return module


def _identity(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return st.st_dev, st.st_ino, st.st_mtime_ns


def build_command(spec: ModuleSpec) -> str:
    """The ``kernels-jit build`` command that puts ``spec`` into the current cache
    (``kernels-ops build`` takes the same arguments)."""
    words = ["kernels-jit", "build", "--group", spec.package.removeprefix("kernels_")]
    if spec.device == "cuda":
        for target in arch.cuda_archs():
            words += ["--arch", target]
    else:
        words.append("--cpu")
    words += ["--cache-dir", str(settings.cache_dir())]
    return " ".join(shlex.quote(w) for w in words)


def _not_built(spec: ModuleSpec, key: str | None, reason: str) -> ModuleNotBuiltError:
    where = f"key {key}, " if key else ""
    return ModuleNotBuiltError(
        f"module {spec.uri!r} of {spec.package} ({where}arch {arch.arch_tag(spec.device)}) is "
        f"not usable from the cache under {settings.cache_dir()}: {reason}; and "
        "KERNELS_NO_JIT=1 forbids compiling it. Build it ahead of time with "
        f"`{build_command(spec)}` (on a machine with the compiler; then ship that cache "
        "directory), or unset KERNELS_NO_JIT."
    )


def _load_prebuilt(spec: ModuleSpec, missing: ToolchainError) -> Any:
    """No compiler here: load an intact artifact with the same source key, whoever built it."""
    try:
        found = cache.find_prebuilt(spec)
    except ToolchainError:  # not even the arch can be determined: that is the error to report
        raise missing from None
    if found is None:
        if settings.no_jit():
            raise _not_built(spec, None, f"not in the cache, and no compiler here ({missing})")
        raise missing
    if settings.verbose():
        print(f"kernels-jit: prebuilt hit {spec.uri} ({found})", file=sys.stderr)
    try:
        return _load_so(found)
    except Exception as exc:
        raise LoadError(f"module {spec.uri!r}: prebuilt {found} failed to load: {exc}") from exc


def _load_or_build(spec: ModuleSpec) -> Any:
    try:
        key = cache.cache_key(spec)
    except ToolchainError as exc:
        return _load_prebuilt(spec, exc)
    target = cache.artifact_path(spec, key)
    reason = cache.verify(target, key)
    failed: tuple[int, int, int] | None = None
    if reason is None:
        failed = _identity(target)
        try:
            module = _load_so(target)
        except Exception as exc:  # intact but not loadable here: rebuild it once
            reason = f"the cached artifact failed to load ({exc})"
        else:
            if settings.verbose():
                print(f"kernels-jit: cache hit {spec.uri} ({target})", file=sys.stderr)
            return module
    no_jit = settings.no_jit()
    if no_jit or settings.prefer_prebuilt():
        # A shipped cache built by another compiler version: same sources, flags, arch and
        # versions (the source key), so use it rather than fail (KERNELS_NO_JIT) or compile
        # (KERNELS_PREFER_PREBUILT, which still compiles what the shipped cache lacks).
        found = cache.find_prebuilt(spec)
        if found is not None and found != target:
            if settings.verbose():
                print(f"kernels-jit: prebuilt hit {spec.uri} ({found})", file=sys.stderr)
            try:
                return _load_so(found)
            except Exception as exc:
                if no_jit:
                    raise LoadError(
                        f"module {spec.uri!r}: prebuilt {found} failed to load: {exc}"
                    ) from exc
                reason = f"the prebuilt artifact {found} failed to load ({exc})"
        elif no_jit:
            raise _not_built(spec, key, reason)
    if settings.verbose():
        print(f"kernels-jit: building {spec.uri}: {reason}", file=sys.stderr)
    with build.build_lock(spec, key, reason):
        # Another process may have published while we waited (not the file that just failed).
        if cache.verify(target, key) is None and _identity(target) != failed:
            try:
                return _load_so(target)
            except Exception:
                pass
        target = build.build(spec, key)
    try:
        return _load_so(target)
    except Exception as exc:
        raise LoadError(
            f"module {spec.uri!r} was built at {target} but failed to load: {exc}"
        ) from exc


def ensure_built(spec: ModuleSpec) -> Path:
    """The intact artifact of ``spec``, built (under the key's lock) if missing; not loaded.

    For ahead-of-time builds: it ignores KERNELS_NO_JIT and needs the compiler. With
    KERNELS_PREFER_PREBUILT=1 an intact artifact of the same source key (a shipped cache built by
    another compiler version) counts as built.
    """
    key = cache.cache_key(spec)
    target = cache.artifact_path(spec, key)
    reason = cache.verify(target, key)
    if reason is None:
        return target
    if settings.prefer_prebuilt():
        found = cache.find_prebuilt(spec)
        if found is not None:
            return found
    with build.build_lock(spec, key, reason):
        if cache.verify(target, key) is None:
            return target
        return build.build(spec, key)


def is_cached(spec: ModuleSpec) -> bool:
    """Whether an intact artifact of ``spec`` is in the cache (by key, else by source key)."""
    try:
        key = cache.cache_key(spec)
    except ToolchainError:
        try:
            return cache.find_prebuilt(spec) is not None
        except ToolchainError:  # the arch cannot be determined
            return False
    return cache.verify(cache.artifact_path(spec, key), key) is None


def artifact_of(spec: ModuleSpec) -> Path:
    """Where ``spec``'s artifact is (or would be) for the current arch and toolchain."""
    return cache.artifact_path(spec, cache.cache_key(spec))
