"""``new-op`` and ``new-group`` (shared/release/stamp.py) in a copy of the repository: the stamped
op and group pass their own tests as stamped (and the repository's invariants), the CUDA source
builds for sm_90a, the output is ruff-clean, the generated files are current, and a second stamp
of an existing op, file or group is refused without writing anything."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
COPIED = ("packages", "shared", "tests", "noxfile.py", "pyproject.toml", "README.md", "LICENSE")
IGNORED = shutil.ignore_patterns(
    "__pycache__", "*.egg-info", ".pytest_cache", ".ruff_cache", "build", "dist", "*.so"
)
OP, GROUP, FIRST_OP = "stamped_copy", "scratch", "scratch_copy"
TORCH_OP = "canary_copy"  # a torch-only op of int64, in a group with no bench suite yet


def _copy(dest: Path) -> Path:
    for name in COPIED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, dest / name, ignore=IGNORED)
        else:
            shutil.copy2(source, dest / name)
    return dest


def _env(repo: Path) -> dict[str, str]:
    """The copy first on the path, ahead of any installed (or editable) kernels package."""
    paths = [str(repo), *(str(p) for p in sorted((repo / "packages").glob("*/src")))]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths), PYTHONDONTWRITEBYTECODE="1")


def _run(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=repo, env=_env(repo), capture_output=True, text=True
    )


def _generate(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return _run(repo, "-m", "shared.release.generate", *args)


def _snapshot(repo: Path) -> dict[str, str]:
    return {
        str(p.relative_to(repo)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(repo.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """A copy with a new op of elementwise (with --cuda), a torch-only op of lplb and a 19th
    group (all in the copy only)."""
    repo = _copy(tmp_path_factory.mktemp("stamp"))
    done = _generate(repo, "new-op", "elementwise", OP, "--cuda", "--description", "a copy of x")
    assert done.returncode == 0, done.stdout + done.stderr
    done = _generate(repo, "new-op", "lplb", TORCH_OP, "--dtypes", "int64")
    assert done.returncode == 0, done.stdout + done.stderr
    done = _generate(
        repo,
        "new-group",
        GROUP,
        "Scratch kernels stamped by the template test",
        "--first-op",
        FIRST_OP,
        "--cuda",
        "--dtypes",
        "float32,bfloat16,int32",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return repo


def test_new_op_stamps_every_file_and_declares_the_op(repo):
    pkg = repo / "packages" / "kernels-elementwise" / "src" / "kernels_elementwise"
    for path in (
        pkg / "ops" / f"{OP}.py",
        pkg / "csrc" / f"{OP}.cuh",
        repo / "tests" / "elementwise" / f"test_{OP}.py",
    ):
        assert path.is_file(), path
    init = (pkg / "__init__.py").read_text()
    assert f'op("{OP}", "a copy of x", "cuda", dtypes=FLOATS),' in init
    assert f'"{OP}",' in init.partition("__all__")[2]
    assert f"def {OP}(x: torch.Tensor)" in (pkg / "reference.py").read_text()
    assert "KERNELS_REQUIRE_HEADERS_API(2);" in (pkg / "csrc" / f"{OP}.cuh").read_text()
    builds = (repo / "tests" / "elementwise" / "test_elementwise_builds.py").read_text()
    assert f'"{OP}_cuda",' in builds
    suite = (repo / "shared" / "bench" / "suites" / "elementwise.py").read_text()
    assert f"def {OP}_cases(quick: bool)" in suite
    assert f"    yield from {OP}_cases(quick)\n" in suite
    readme = (repo / "packages" / "kernels-elementwise" / "README.md").read_text()
    assert f"| `{OP}(x, *, out=None)` | a copy of x | `cuda`, `torch` |" in readme


def test_torch_only_op_has_no_cuda_parts(repo):
    pkg = repo / "packages" / "kernels-lplb" / "src" / "kernels_lplb"
    op_file = (pkg / "ops" / f"{TORCH_OP}.py").read_text()
    assert "ModuleSpec" not in op_file and "_cuda" not in op_file
    assert not (pkg / "csrc" / f"{TORCH_OP}.cuh").exists()
    init = (pkg / "__init__.py").read_text()
    assert f'op("{TORCH_OP}", "out = x (TODO: what the op computes)", dtypes=("int64",)),' in init
    suite = (repo / "shared" / "bench" / "suites" / "lplb.py").read_text()
    assert f"    yield from {TORCH_OP}_cases(quick)\n" in suite
    stamped_case = suite.partition(f"def {TORCH_OP}_cases(")[2].partition("\ndef ")[0]
    assert stamped_case and '"cuda": lambda' not in stamped_case


def test_new_group_stamps_a_whole_package(repo):
    package = repo / "packages" / "kernels-scratch"
    for name in (
        "pyproject.toml",
        "README.md",
        "CHANGELOG.md",
        "LICENSE",
        "src/kernels_scratch/__init__.py",
        "src/kernels_scratch/version.py",
        "src/kernels_scratch/reference.py",
        "src/kernels_scratch/py.typed",
        "src/kernels_scratch/ops/__init__.py",
        f"src/kernels_scratch/ops/{FIRST_OP}.py",
        f"src/kernels_scratch/csrc/{FIRST_OP}.cuh",
    ):
        assert (package / name).is_file(), name
    for path in ("tests/scratch/test_scratch_builds.py", f"tests/scratch/test_{FIRST_OP}.py"):
        assert (repo / path).is_file(), path
    assert (repo / "shared" / "bench" / "suites" / "scratch.py").is_file()
    registry = (repo / "packages/kernels-jit/src/kernels_jit/registry.py").read_text()
    assert '    "scratch": "Scratch kernels stamped by the template test",\n}' in registry
    assert 'name = "kernels-scratch"' in (package / "pyproject.toml").read_text()
    assert f"| `{FIRST_OP}(x, *, out=None)` |" in (package / "README.md").read_text()
    assert (
        '"kernels-scratch>=0.1.0,<0.2"'
        in (repo / "packages" / "kernels-ops" / "pyproject.toml").read_text()
    )
    assert "| scratch | `kernels-scratch` |" in (repo / "README.md").read_text()
    assert _generate(repo, "--check").returncode == 0


def test_stamped_tests_pass(repo):
    """The stamped op tests (CPU), the new group's build test (sm_90a, where nvcc is) and the
    repository's invariants over the stamped ops, in one pytest process on the copy."""
    args = [
        f"tests/elementwise/test_{OP}.py",
        f"tests/lplb/test_{TORCH_OP}.py",
        "tests/scratch",
        "tests/ops/test_invariants.py",
        "--deselect",
        "tests/ops/test_invariants.py::test_groups_are_exactly_the_eighteen",  # now nineteen
    ]
    if shutil.which("nvcc") is None:
        args += ["--deselect", "tests/scratch/test_scratch_builds.py"]
    done = _run(repo, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "not gpu", *args)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    assert " passed" in done.stdout and " failed" not in done.stdout


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff is not installed")
def test_stamped_python_is_ruff_clean(repo):
    paths = [
        "packages/kernels-elementwise/src/kernels_elementwise",
        "packages/kernels-scratch",
        "packages/kernels-jit/src/kernels_jit/registry.py",
        f"tests/elementwise/test_{OP}.py",
        "tests/elementwise/test_elementwise_builds.py",
        "tests/scratch",
        "packages/kernels-lplb/src/kernels_lplb",
        f"tests/lplb/test_{TORCH_OP}.py",
        "shared/bench/suites",
    ]
    for command in (["check"], ["format", "--check"]):
        done = _run(repo, "-m", "ruff", *command, "--no-cache", *paths)
        assert done.returncode == 0, done.stdout + done.stderr


def test_refuses_existing_ops_files_and_groups(repo):
    (repo / "tests" / "elementwise" / "test_clashing.py").write_text("")
    before = _snapshot(repo)
    refusals = {
        ("new-op", "elementwise", "softcap"): "already has an op",
        ("new-op", "elementwise", OP, "--cuda"): "already has an op",
        ("new-op", "elementwise", "clashing"): "exists; refusing to overwrite",
        ("new-op", "nosuchgroup", "thing"): "no group 'nosuchgroup'",
        ("new-op", "elementwise", "half_only", "--cuda", "--dtypes", "float64"): "CUDA template",
        ("new-group", "elementwise", "again", "--first-op", "x"): "exists",
        ("new-group", GROUP, "again", "--first-op", "other"): "exists",
    }
    for args, message in refusals.items():
        done = _generate(repo, *args)
        assert done.returncode != 0, args
        assert message in done.stderr, (args, done.stderr)
    assert _snapshot(repo) == before, "a refused stamp wrote something"
