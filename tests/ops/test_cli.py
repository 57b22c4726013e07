"""The `kernels-ops` command: list (no torch), doctor, check, build."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest


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


def test_bare_command_prints_help_and_version():
    out = run()
    assert out.returncode == 0, out.stderr
    for command in ("list", "doctor", "build", "check", "bench"):
        assert command in out.stdout
    version = run("--version")
    assert version.returncode == 0 and version.stdout.startswith("kernels-ops ")
    assert "kernels-jit" in version.stdout


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("check", "--device", "foo"), ("--device", "foo")),
        (("check", "--op", "nope.x"), ("unknown op", "nope.x")),
        (("check", "--group", "nope"), ("unknown group",)),
        (("list", "--group", "nope"), ("unknown group",)),
        (("build", "--arch", "foo"), ("--arch", "foo")),
        (("build", "--jobs", "0"), ("--jobs",)),
    ],
)
def test_user_errors_exit_2_without_traceback(args, words):
    out = run(*args)
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr
    for word in words:
        assert word in out.stderr


def test_check_plain_lines_dash_and_summary():
    out = run("check", "--op", "elementwise.add_constant", "--op", "layernorm.rmsnorm")
    assert out.returncode == 0, out.stdout + out.stderr
    lines = out.stdout.splitlines()
    rows = {tuple(line.split()[:2]): line for line in lines if line.startswith(("elem", "layer"))}
    for op in ("elementwise.add_constant", "layernorm.rmsnorm"):
        cuda_row = rows[(op, "cuda")]
        if "not runnable here" in cuda_row:  # no GPU: nothing was compared
            assert cuda_row.split()[4] == "-"
    assert lines[-1].startswith("check passed on ")


def test_check_json():
    out = run("check", "--op", "elementwise.add_constant", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["ok"] is True
    cpu = next(o for o in report["outcomes"] if o["backend"] == "cpu")
    assert cpu["status"] == "agree" and cpu["cases"] > 0


def test_check_labels_a_module_missing_under_no_jit(tmp_path):
    env = {"KERNELS_NO_JIT": "1", "KERNELS_CACHE_DIR": str(tmp_path / "empty")}
    out = run("check", "--op", "elementwise.add_constant", env=env)
    assert out.returncode == 1, out.stdout + out.stderr
    cpu_row = next(line for line in out.stdout.splitlines() if " cpu " in line)
    assert "not built (KERNELS_NO_JIT=1)" in cpu_row
    assert "DISAGREE" not in out.stdout
    assert "1 not built" in out.stdout.splitlines()[-1]


def test_doctor_reports_a_missing_group():
    code = (
        "import importlib.util, sys\n"
        "real = importlib.util.find_spec\n"
        "importlib.util.find_spec = lambda n, *a: None if n == 'kernels_moe' else real(n, *a)\n"
        "from kernels_ops.cli import main\n"
        "sys.exit(main(['doctor', '--json']))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    groups = json.loads(out.stdout)["groups"]
    assert "kernels-moe" in groups["not installed"]
    assert "17 of 18" in groups["installed"]
