"""`doctor`: toolchain, arch, cache and versions, the groups installed, and which backends can run
here (or why not).

:func:`report` gathers it as plain data (the ``--json`` output); :func:`sections` turns that into
(title, rows) tables. Nothing here raises for a broken machine: a missing compiler, a cache path
that is a file, a bad ``KERNELS_*`` value or a group that is not installed is reported as such.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kernels_jit import arch, availability, settings, toolchain
from kernels_jit.errors import ToolchainError
from kernels_jit.registry import GROUPS, all_ops


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _dir_size(path: Path) -> tuple[int, int]:
    files = size = 0
    for root, _, names in os.walk(path):
        for name in names:
            try:
                size += os.path.getsize(os.path.join(root, name))
                files += 1
            except OSError:
                pass
    return files, size


def _checked_backend_override() -> str:
    """The raw KERNELS_BACKEND, after checking its entries against the registry."""
    from kernels_jit.registry import backend_overrides

    backend_overrides()
    return settings.backend_override()


def _setting(read: Callable[[], Any]) -> str:
    """A setting's value, or the error its bad value raises (the message names the variable)."""
    try:
        return str(read())
    except ValueError as exc:
        return f"invalid: {exc}"


def _cache(cache_dir: Path) -> dict[str, str]:
    if cache_dir.is_dir():
        files, size = _dir_size(cache_dir)
        state = "directory"
        writable = os.access(cache_dir, os.W_OK | os.X_OK)
    elif cache_dir.exists():
        files = size = 0
        state = (
            "NOT A DIRECTORY: builds and cache hits will fail; remove it or set KERNELS_CACHE_DIR"
        )
        writable = False
    else:
        files = size = 0
        state = "absent (created by the first build)"
        parent = cache_dir.parent
        while not parent.exists() and parent != parent.parent:
            parent = parent.parent
        writable = parent.is_dir() and os.access(parent, os.W_OK | os.X_OK)
    return {
        "cache dir": str(cache_dir),
        "state": state,
        "cache size": f"{size / 2**20:.1f} MiB in {files} files",
        "writable": str(writable),
    }


def _installed(group: str) -> bool:
    try:
        return importlib.util.find_spec(f"kernels_{group}") is not None
    except (ImportError, ValueError):
        return False


def report(groups: list[str] | None = None, *, umbrella: bool = False) -> dict[str, Any]:
    """Everything doctor shows, as JSON-ready data.

    ``groups``: the groups whose backends to list (default: every installed group).
    ``umbrella``: a missing group is a broken kernels-ops install, so say so.
    """
    env = {"python": sys.version.split()[0], "platform": platform.platform()}
    for dist in ("kernels-jit", "apache-tvm-ffi", "torch", "triton", "ninja", "rich"):
        env[dist] = _version(dist)

    tools: dict[str, str] = {}
    try:
        nvcc = toolchain.nvcc_path()
        release = toolchain.nvcc_release()
        tools["nvcc"] = f"{nvcc} ({'.'.join(map(str, release)) if release else '?'})"
    except ToolchainError as exc:
        tools["nvcc"] = f"missing: {exc}"
    try:
        tools["c++"] = str(toolchain.cxx_path())
    except ToolchainError as exc:
        tools["c++"] = f"missing: {exc}"
    tools["gpu present"] = str(availability.gpu_present())
    try:
        tools["cuda arch"] = ", ".join(arch.cuda_archs())
    except (ToolchainError, ValueError) as exc:  # no GPU and no override, or a bad override
        tools["cuda arch"] = f"undetermined ({exc})"
    tools["cpu arch"] = arch.cpu_arch()

    cache = _cache(settings.cache_dir())
    cache["KERNELS_NO_JIT"] = _setting(settings.no_jit)
    cache["KERNELS_PREFER_PREBUILT"] = _setting(settings.prefer_prebuilt)
    cache["max jobs"] = _setting(settings.max_jobs)
    cache["build timeout"] = _setting(settings.build_timeout)
    cache["KERNELS_BACKEND"] = _setting(_checked_backend_override) or "(unset)"
    if hasattr(settings, "strict"):
        cache["KERNELS_STRICT"] = _setting(settings.strict)

    installed = [g for g in GROUPS if _installed(g)]
    missing = [g for g in GROUPS if g not in installed]
    broken: dict[str, str] = {}
    for group in groups if groups is not None else installed:
        try:
            importlib.import_module(f"kernels_{group}")
        except Exception as exc:  # a group that fails to import must not hide the others
            broken[group] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    group_rows = {
        "installed": f"{len(installed)} of {len(GROUPS)}: {', '.join(installed) or '-'}",
        "not installed": ", ".join(f"kernels-{g.replace('_', '-')}" for g in missing) or "-",
    }
    if umbrella and missing:
        group_rows["not installed"] += " (kernels-ops needs every group: reinstall kernels-ops)"
    for group, error in broken.items():
        group_rows[f"kernels_{group}"] = f"fails to import: {error}"

    chosen = set(groups if groups is not None else installed)
    backends = []
    for spec in all_ops():
        if spec.group not in chosen:
            continue
        for backend in spec.backends:
            try:
                reason = availability.unavailable_reason(backend)
            except ValueError as exc:  # a bad KERNELS_* value
                reason = f"undetermined: {exc}"
            backends.append(
                {
                    "op": spec.id,
                    "backend": backend.name,
                    "available": reason is None,
                    "reason": reason,
                }
            )
    return {
        "environment": env,
        "toolchain": tools,
        "cache": cache,
        "groups": group_rows,
        "backends": backends,
    }


def sections(data: dict[str, Any] | None = None) -> list[tuple[str, list[tuple[str, str]]]]:
    """(title, [(key, value)]) sections of :func:`report`; the CLI renders them as tables."""
    data = report() if data is None else data
    out = [(title, list(data[title].items())) for title in ("environment", "toolchain", "cache")]
    out.append(("groups", list(data["groups"].items())))
    out.append(
        (
            "backends",
            [
                (f"{b['op']} [{b['backend']}]", "ok" if b["available"] else b["reason"])
                for b in data["backends"]
            ],
        )
    )
    return out
