"""kernels/version.h: a source that needs a newer headers API fails to compile with a message
naming both versions; every CUDA/CPU source of the groups on the shared headers states its need."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INCLUDE = ROOT / "packages" / "kernels-jit" / "src" / "kernels_jit" / "include"
CXX = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")


def _api() -> int:
    text = (INCLUDE / "kernels" / "version.h").read_text()
    return int(re.search(r"#define KERNELS_HEADERS_API (\d+)", text).group(1))


@pytest.mark.skipif(CXX is None, reason="needs a host C++ compiler")
@pytest.mark.parametrize("delta, ok", [(0, True), (-1, True), (1, False)])
def test_require_headers_api(tmp_path, delta, ok):
    need = _api() + delta
    src = tmp_path / "needs.cc"
    src.write_text(f"#include <kernels/version.h>\nKERNELS_REQUIRE_HEADERS_API({need});\n")
    result = subprocess.run(
        [CXX, "-std=c++17", "-fsyntax-only", f"-I{INCLUDE}", str(src)],
        capture_output=True,
        text=True,
    )
    assert (result.returncode == 0) == ok, result.stderr
    if not ok:
        assert f"headers API {need} or newer" in result.stderr
        assert f"provides API {_api()}" in result.stderr


def test_every_source_on_the_headers_states_its_api():
    sources = [
        p
        for p in ROOT.glob("packages/kernels-*/src/*/csrc/*")
        if p.suffix in (".cuh", ".h", ".cu", ".cc") and "#include <kernels/" in p.read_text()
    ]
    assert sources
    missing = [
        str(p.relative_to(ROOT))
        for p in sources
        if "KERNELS_REQUIRE_HEADERS_API(" not in p.read_text()
    ]
    assert not missing, missing
