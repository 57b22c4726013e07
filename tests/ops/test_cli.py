"""The `kernels-ops` command: list (no torch), doctor, check, build."""

from __future__ import annotations

import os
import subprocess
import sys


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kernels_ops", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200", **(env or {})},
        timeout=600,
    )


def test_list_imports_no_torch():
    code = (
        "import sys; from kernels_ops.cli import main; main(['list']); "
        "assert 'torch' not in sys.modules, 'list imported torch'"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "COLUMNS": "200"},
    )
    assert out.returncode == 0, out.stderr
    assert "elementwise.add_constant" in out.stdout


def test_doctor_reports_toolchain_and_backends():
    out = run("doctor")
    assert out.returncode == 0, out.stderr
    for text in ("nvcc", "cache dir", "apache-tvm-ffi", "elementwise.add_constant [cuda]"):
        assert text in out.stdout


def test_check_passes_on_cpu():
    out = run("check", "--group", "elementwise")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "elementwise.add_constant" in out.stdout


def test_build_then_load_without_jit(tmp_path):
    cache = str(tmp_path / "aot")
    out = run("build", "--group", "elementwise", "--cpu", "--arch", "sm_90a", "--cache-dir", cache)
    assert out.returncode == 0, out.stdout + out.stderr
    assert list((tmp_path / "aot" / "sm_90a").rglob("add_constant_cuda.so"))
    code = (
        "import torch; from kernels_elementwise import add_constant; "
        "print(add_constant(torch.arange(4.0), 1.0, backend='cpu').tolist())"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "KERNELS_CACHE_DIR": cache, "KERNELS_NO_JIT": "1"},
    )
    assert loaded.returncode == 0, loaded.stderr
    assert loaded.stdout.strip() == "[1.0, 2.0, 3.0, 4.0]"
