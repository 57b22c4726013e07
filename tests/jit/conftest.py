"""The sandbox of the JIT tests: a private cache, a throwaway package, compiler wrappers, children.

Every test gets its own ``KERNELS_CACHE_DIR`` under ``tmp_path`` and a package named
``kjtest_<hex>`` on ``sys.path`` whose C++ headers it writes itself. Compiles are counted with a
``CXX`` wrapper script that appends one line per compiler invocation to a log (``--version``
probes, which the cache key needs, are not logged). Multi-process properties run real children
(``sys.executable -c``) with a copy of the environment.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from kernels_jit import loader, module
from kernels_jit.module import ModuleSpec

PREFIX = "kjtest_"
REAL_CXX = shutil.which("c++") or shutil.which("g++")
KERNELS_VARS = (
    "KERNELS_NO_JIT",
    "KERNELS_PREFER_PREBUILT",
    "KERNELS_CUDA_ARCH",
    "KERNELS_BUILD_TIMEOUT",
    "KERNELS_MAX_JOBS",
    "KERNELS_VERBOSE",
    "KERNELS_BACKEND",
    "CXX",
)

ADDER = """\
// A tiny module: add_ints(a, b) = a + b + OFFSET (OFFSET comes from the included headers).
#pragma once
#include <cstdint>
#include "{name}/offset.h"
inline int64_t add_ints(int64_t a, int64_t b) {{ return a + b + offset(); }}
"""
OFFSET = """\
#pragma once
#include "value.h"
inline int64_t offset() { return OFFSET_VALUE; }
"""
VALUE = """\
#pragma once
#ifndef OFFSET_VALUE
#define OFFSET_VALUE {offset}
#endif
"""


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def wait_until(predicate, timeout: float, interval: float = 0.05) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


class Sandbox:
    """One test's private world (see the module docstring)."""

    real_cxx = REAL_CXX
    pid_alive = staticmethod(pid_alive)
    wait_until = staticmethod(wait_until)

    # Child body: load the adder module and print add(2, 3) as JSON.
    CALL_ADD = """
    m = load_module(spec)
    print(json.dumps({"sum": int(m.add(2, 3))}))
    """

    def __init__(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.tmp = tmp_path
        self.cache = tmp_path / "cache"
        self.pkg_root = tmp_path / "pkgs"
        self.package = f"{PREFIX}{uuid.uuid4().hex[:10]}"
        self.pkg_dir = self.pkg_root / self.package
        self.pkg_dir.mkdir(parents=True)
        (self.pkg_dir / "__init__.py").write_text("")
        self.compile_log = tmp_path / "compiler.log"
        self.pid_log = tmp_path / "compiler.pids"
        monkeypatch.setenv("KERNELS_CACHE_DIR", str(self.cache))
        for var in KERNELS_VARS:
            monkeypatch.delenv(var, raising=False)
        monkeypatch.syspath_prepend(str(self.pkg_root))

    # --- sources and specs -------------------------------------------------------------------
    def write(self, relative: str, text: str) -> Path:
        path = self.pkg_dir / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        return path

    def adder(self, name: str = "adder", offset: int = 0, **fields) -> ModuleSpec:
        """A module ``name`` exporting ``add(a, b) = a + b + offset`` from three nested headers:
        ``csrc/<name>.h`` -> ``csrc/<name>/offset.h`` -> ``csrc/<name>/value.h`` (the value
        header, two levels down, is :meth:`value_header`)."""
        self.write(f"csrc/{name}.h", ADDER.format(name=name))
        self.write(f"csrc/{name}/offset.h", OFFSET)
        self.write(f"csrc/{name}/value.h", VALUE.format(offset=offset))
        return self.spec(name, (f"csrc/{name}.h",), (("add", "add_ints"),), **fields)

    def value_header(self, name: str = "adder") -> Path:
        return self.pkg_dir / "csrc" / name / "value.h"

    def spec(self, name: str, sources, exports, **fields) -> ModuleSpec:
        fields.setdefault("device", "cpu")
        return ModuleSpec(
            name=name, package=self.package, sources=sources, exports=exports, **fields
        )

    # --- compilers -----------------------------------------------------------------------------
    def cxx_wrapper(
        self,
        name: str = "cxx",
        sleep: float = 0,
        version: str | None = None,
        slow_link: bool = False,
    ) -> Path:
        """A CXX that logs each compiler invocation, then runs the real c++.

        ``sleep``: each compile first sleeps that long (its shell and sleep pids go to
        :meth:`pids`). ``slow_link``: the link instead runs, leaves its output half written (as a
        link in progress would) and then sleeps ``sleep``. ``version``: what ``--version`` prints.
        """
        probe = f"echo {version!r}; exit 0" if version else f'exec {REAL_CXX} "$@"'
        pause = (
            f'echo $$ >> "{self.pid_log}"\nsleep {sleep} &\necho $! >> "{self.pid_log}"\nwait $!\n'
        )
        if slow_link:
            body = (
                'case " $* " in *" -shared "*)\n'
                f'{REAL_CXX} "$@" || exit $?\n'
                'out=""; prev=""\n'
                'for arg in "$@"; do [ "$prev" = "-o" ] && out="$arg"; prev="$arg"; done\n'
                'size=$(wc -c < "$out")\n'
                'head -c $((size / 2)) "$out" > "$out.half" && mv "$out.half" "$out"\n'
                f"{pause}"
                "exit 0;;\n"
                "esac\n"
            )
        else:
            body = pause if sleep else ""
        script = self.tmp / "bin" / name
        script.parent.mkdir(exist_ok=True)
        script.write_text(
            "#!/bin/sh\n"
            'for arg in "$@"; do\n'
            f'  if [ "$arg" = "--version" ]; then {probe}; fi\n'
            "done\n"
            f'echo "$$ $*" >> "{self.compile_log}"\n'
            f"{body}"
            f'exec {REAL_CXX} "$@"\n'
        )
        script.chmod(0o755)
        return script

    def invocations(self) -> list[str]:
        return self.compile_log.read_text().splitlines() if self.compile_log.exists() else []

    def compiles(self) -> list[str]:
        """Compiler invocations that compiled a translation unit (not the link)."""
        return [line for line in self.invocations() if " -c " in f"{line} "]

    def pids(self) -> list[int]:
        return [int(p) for p in self.pid_log.read_text().split()] if self.pid_log.exists() else []

    # --- children ------------------------------------------------------------------------------
    def env(self, torch: bool = False, **overrides: str | None) -> dict[str, str]:
        """The environment of a child. kernels-jit needs no torch, but tvm_ffi imports it when it
        can (over a second per child); unless ``torch``, a stub makes that import fail fast."""
        env = dict(os.environ)
        paths = [str(self.pkg_root), *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))]
        if not torch:
            stub = self.tmp / "no-torch"
            stub.mkdir(exist_ok=True)
            (stub / "torch.py").write_text("raise ImportError('torch hidden by the JIT tests')\n")
            paths.insert(0, str(stub))
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["KERNELS_CACHE_DIR"] = str(self.cache)
        for key, value in overrides.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def child_code(self, spec: ModuleSpec, body: str) -> str:
        """Python for a child: declares ``spec`` as ``spec`` and runs ``body``."""
        fields = {
            "name": spec.name,
            "package": spec.package,
            "sources": spec.sources,
            "exports": spec.exports,
            "device": spec.device,
            "flags": spec.flags,
            "include_dirs": spec.include_dirs,
        }
        prelude = (
            "import json, sys\n"
            "from kernels_jit import ModuleSpec, load_module, errors\n"
            f"spec = ModuleSpec(**{fields!r})\n"
        )
        return prelude + textwrap.dedent(body)

    def spawn(self, code: str, env: dict[str, str]) -> subprocess.Popen:
        return subprocess.Popen(
            [sys.executable, "-c", code],
            env=env,
            cwd=self.tmp,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def python(self, code: str, env: dict[str, str], timeout: float = 120) -> dict:
        """Run ``code`` in a child that prints one JSON object last; return that object."""
        done = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            cwd=self.tmp,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        assert done.returncode == 0, f"child failed ({done.returncode}):\n{done.stderr[-4000:]}"
        return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def sandbox(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Sandbox:
    return Sandbox(tmp_path, monkeypatch)


@pytest.fixture(autouse=True)
def _isolated_registry():
    """Forget the test's throwaway modules (declared and loaded) after each test, so the rest of
    the session (e.g. tests/ops, which walks every declared module) never sees them."""
    loaded = dict(loader._LOADED)
    yield
    for spec in list(module._DECLARED):
        if spec.package.startswith(PREFIX):
            del module._DECLARED[spec]
    loader._LOADED.clear()
    loader._LOADED.update(loaded)
