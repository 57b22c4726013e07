"""Loading a module: a cache hit loads without running ninja; a miss or a broken artifact builds."""

from __future__ import annotations

import sys
import threading
from typing import Any

from kernels_jit import arch, build, cache, settings
from kernels_jit.errors import ModuleNotBuiltError
from kernels_jit.module import ModuleSpec

_LOADED: dict[ModuleSpec, Any] = {}
_THREAD_LOCK = threading.Lock()


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
    with _THREAD_LOCK:
        module = _LOADED.get(spec)
        if module is None:
            module = _LOADED[spec] = _load_or_build(spec)
    return module


def _load_or_build(spec: ModuleSpec) -> Any:
    key = cache.cache_key(spec)
    target = cache.artifact_path(spec, key)
    reason = "not in the cache"
    if target.exists():
        try:
            module = _load_so(target)
            if settings.verbose():
                print(f"kernels-jit: cache hit {spec.uri} ({target})", file=sys.stderr)
            return module
        except Exception as exc:  # a truncated or foreign .so: rebuild it
            reason = f"cached artifact failed to load ({exc})"
    if settings.no_jit():
        raise ModuleNotBuiltError(
            f"module {spec.uri!r} of {spec.package} (key {key}, arch "
            f"{arch.arch_tag(spec.device)}) is {reason} under {settings.cache_dir()}, and "
            "KERNELS_NO_JIT=1 forbids compiling it. Build it ahead of time with "
            f"`kernels-ops build --group {spec.package.removeprefix('kernels_')}` "
            "(with KERNELS_CUDA_ARCH set for the target GPU), or unset KERNELS_NO_JIT."
        )
    if settings.verbose():
        print(f"kernels-jit: building {spec.uri}: {reason}", file=sys.stderr)
    with build.build_lock(spec, key):
        if target.exists():  # another process published while we waited
            try:
                return _load_so(target)
            except Exception:
                pass
        build.build(spec, key)
    return _load_so(target)


def is_cached(spec: ModuleSpec) -> bool:
    return cache.artifact_path(spec, cache.cache_key(spec)).exists()
