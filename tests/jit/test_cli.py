"""The `kernels-jit` command: list, doctor and build over the groups installed (here at least
kernels-elementwise); user errors are one line and exit 2, never a traceback."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys

import pytest

from kernels_jit import cli, toolchain


def run(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("KERNELS_")}
    return subprocess.run(
        [sys.executable, "-m", "kernels_jit.cli", *args],
        capture_output=True,
        text=True,
        env={**base, **(env or {})},
        timeout=300,
    )


def assert_usage_error(out: subprocess.CompletedProcess, *words: str) -> None:
    assert out.returncode == 2, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    for word in words:
        assert word in out.stderr, out.stderr


def test_bare_command_prints_help():
    out = run()
    assert out.returncode == 0, out.stderr
    for command in ("list", "doctor", "build"):
        assert command in out.stdout


def test_version():
    from kernels_jit.version import __version__

    out = run("--version")
    assert out.returncode == 0 and out.stdout.strip() == f"kernels-jit {__version__}"


def test_list_piped_prints_whole_op_ids_and_imports_no_torch():
    code = (
        "import sys; from kernels_jit.cli import main; rc = main(['list']); "
        "assert 'torch' not in sys.modules, 'list imported torch'; sys.exit(rc)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "…" not in out.stdout
    lines = out.stdout.splitlines()
    assert any(line.startswith("elementwise.fused_dual_residual_rmsnorm ") for line in lines)


def test_list_json():
    out = run("list", "--group", "elementwise", "--json")
    assert out.returncode == 0, out.stderr
    records = json.loads(out.stdout)
    add = next(r for r in records if r["id"] == "elementwise.add_constant")
    assert {b["name"] for b in add["backends"]} >= {"cuda", "torch"}
    assert all(r["group"] == "elementwise" for r in records)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("list", "--group", "nope"), ("unknown group", "nope")),
        (("list", "--op", "elementwise.nope"), ("unknown op", "elementwise.nope")),
        (("build", "--arch", "sm_9"), ("--arch", "sm_9")),
        (("build", "--jobs", "0"), ("--jobs",)),
        (("build", "--cache-dir", __file__), ("--cache-dir", "not a directory")),
    ],
)
def test_user_errors_are_one_line(args, words):
    assert_usage_error(run(*args), *words)


@pytest.mark.skipif(toolchain.nvcc_release() is None, reason="needs nvcc to know its archs")
@pytest.mark.parametrize(
    ("arch", "words"),
    [("sm_77", ("--arch sm_77:", "sm_90a")), ("sm_90a,77", ("--arch sm_77:",))],
)
def test_an_arch_nvcc_cannot_compile_is_a_user_error(arch, words):
    assert_usage_error(run("build", "--arch", arch), *words, "does not compile")


def test_bad_setting_is_a_user_error():
    out = run("list", env={"KERNELS_NO_JIT": "maybe"})
    assert_usage_error(out, "KERNELS_NO_JIT")


@pytest.mark.skipif(os.path.exists("/dev/nvidiactl"), reason="a GPU gives build its arch")
def test_build_without_gpu_or_arch_says_to_pass_arch():
    assert_usage_error(run("build", "--group", "elementwise"), "--arch")


def test_doctor_json_reports_groups_and_a_cache_dir_that_is_a_file(tmp_path):
    cache = tmp_path / "cache"
    cache.write_text("not a directory")
    out = run("doctor", "--json", env={"KERNELS_CACHE_DIR": str(cache), "KERNELS_MAX_JOBS": "x"})
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert "NOT A DIRECTORY" in report["cache"]["state"]
    assert report["cache"]["writable"] == "False"
    assert report["cache"]["max jobs"].startswith("invalid: KERNELS_MAX_JOBS")
    assert "elementwise" in report["groups"]["installed"]
    assert any(b["op"] == "elementwise.add_constant" for b in report["backends"])


def test_doctor_plain_text():
    out = run("doctor")
    assert out.returncode == 0, out.stderr
    for text in ("# toolchain", "nvcc", "cache dir", "elementwise.add_constant [torch]"):
        assert text in out.stdout


def _table(width: int, rows) -> str:
    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, width=width, force_terminal=True, color_system=None)
    cli.Output(console=console).table("t", ("op", "backends", "description"), rows)
    return buffer.getvalue()


def test_tables_never_cut_op_ids():
    long_id = "elementwise.fused_dual_residual_rmsnorm"
    rows = [[long_id, "cuda, torch", "mid = residual + rms(x) * w1; out = rms(mid) * w2"]]
    wide = _table(120, rows)
    assert long_id in wide and "┃" in wide  # a rich table, the id whole
    narrow = _table(50, rows)
    assert long_id in narrow and "…" not in narrow  # too narrow for a table: plain lines
