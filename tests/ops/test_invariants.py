"""The shape of the repository must not rot (DESIGN.md section 5): exactly 18 groups, each a
package, a distribution, an umbrella re-export, a nox session and a tests folder; registry
specs that resolve; metadata-only imports; no tests inside packages; no `jit` prefixes."""

from __future__ import annotations

import ast
import importlib
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import tomllib

import kernels_ops
from kernels_jit import declared_modules
from kernels_jit.cache import header_closure
from kernels_jit.registry import GROUPS, all_ops, resolve_target, target_exists
from shared.release import generate

ROOT = Path(__file__).resolve().parents[2]
EXPECTED_GROUPS = {
    "activation", "attention", "communication", "diffusion", "elementwise", "embeddings", "gemm",
    "grammar", "kvcache", "layernorm", "mamba", "memory", "moe", "quantization", "sampling",
    "speculative", "lplb", "kv_canary",
}  # fmt: skip


def package_dir(group: str) -> Path:
    return ROOT / "packages" / generate.dist_name(group)


def test_groups_are_exactly_the_eighteen():
    assert set(GROUPS) == EXPECTED_GROUPS
    assert len(GROUPS) == 18
    assert set(generate.GROUPS) == EXPECTED_GROUPS
    on_disk = {p.name for p in (ROOT / "packages").iterdir() if p.is_dir()}
    assert on_disk == {generate.dist_name(g) for g in GROUPS} | {"kernels-jit", "kernels-ops"}
    assert {
        p.name for p in (ROOT / "tests").iterdir() if p.is_dir() and p.name != "__pycache__"
    } >= EXPECTED_GROUPS


@pytest.mark.parametrize("group", sorted(EXPECTED_GROUPS))
def test_group_is_complete(group):
    pyproject = tomllib.loads((package_dir(group) / "pyproject.toml").read_text())
    assert pyproject["project"]["name"] == generate.dist_name(group)
    assert any(d.startswith("kernels-jit") for d in pyproject["project"]["dependencies"])
    assert (package_dir(group) / "README.md").is_file()
    module = importlib.import_module(f"kernels_{group}")
    assert getattr(kernels_ops, group) is module
    assert importlib.import_module(f"kernels_ops.{group}") is module
    assert module.OPS, f"group {group} registers no op"
    assert all(spec.group == group for spec in module.OPS)
    assert list((ROOT / "tests" / group).glob("test_*.py")), f"tests/{group} has no tests"
    umbrella = tomllib.loads((ROOT / "packages/kernels-ops/pyproject.toml").read_text())
    assert any(d.startswith(generate.dist_name(group)) for d in umbrella["project"]["dependencies"])


def test_every_group_has_a_nox_session():
    noxfile = (ROOT / "noxfile.py").read_text()
    assert "name=f\"tests-{_group.replace('_', '-')}\"" in noxfile
    assert "for _group in GROUPS:" in noxfile


def test_generated_files_are_current():
    assert generate.main(["--check"]) == 0, "run: python -m shared.release.generate"


def test_registry_targets_resolve():
    for spec in all_ops():
        for target in [spec.public, spec.samples] + [b.target for b in spec.backends]:
            assert target_exists(target), f"{spec.id}: module of {target!r} does not exist"
            resolve_target(target)


def test_op_files_define_only_declared_backends():
    """Every ``_<op>_<backend>`` / ``_<op>_<backend>_eligible`` in an op file belongs to a
    declared backend: a backend written but not declared (or a misspelt predicate) would never
    run."""
    by_module: dict[str, list] = {}
    for spec in all_ops():
        by_module.setdefault(spec.module, []).append(spec)
    for module_name, specs in by_module.items():
        module = importlib.import_module(module_name)
        expected = {b.target.partition(":")[2] for s in specs for b in s.backends}
        expected |= {b.eligible.partition(":")[2] for s in specs for b in s.backends if b.eligible}
        pattern = re.compile(
            "^_(" + "|".join(s.name for s in specs) + ")_(cuda|cpu|triton|torch)(_eligible)?$"
        )
        defined = {name for name in vars(module) if pattern.match(name)}
        assert defined <= expected, f"{module_name}: undeclared {sorted(defined - expected)}"


def test_samples_cover_every_declared_dtype():
    """Dtypes are declared once (the one-line ``op(...)``): the op file's ``Op.dtypes`` and every
    fast backend take them from there. The samples must call the op with each of them, so that
    ``kernels-ops check`` on a GPU runs every backend (and its C++ dtype dispatch) on every
    declared dtype, and a backend that lacks one fails there. (Ops with only the torch
    reference are exempt until their fast backend lands.)"""
    import torch

    from kernels_jit.dispatch import get_op

    for spec in all_ops():
        op = get_op(spec.id)
        if not spec.fast_backends:
            continue
        assert op.dtypes == tuple(getattr(torch, d) for d in spec.dtypes), spec.id
        seen = set()

        def record(*args, backend=None, op=op, seen=seen):
            seen.add(args[op.device_arg].dtype)

        op.run = record
        try:
            public = resolve_target(spec.public)
            for args, kwargs in resolve_target(spec.samples)(torch.device("cpu")):
                public(*args, **kwargs)
        finally:
            op.run = op._call
        missing = set(op.dtypes) - seen
        assert not missing, f"{spec.id}: samples never call it with {sorted(map(str, missing))}"


def test_declared_modules_have_their_sources_inside_the_package():
    for spec in all_ops():
        resolve_target(spec.public)
    modules = declared_modules()
    assert any(m.uri == "add_constant_cuda" for m in modules)
    for module in modules:
        closure = header_closure(module)  # raises if a named source is missing
        for source in module.source_paths():
            assert source.is_file()
            assert module.package_dir in source.resolve().parents, f"{source} outside package"
        assert closure


def test_op_ids_and_names():
    ids = [spec.id for spec in all_ops()]
    assert len(ids) == len(set(ids))
    for spec in all_ops():
        assert re.fullmatch(r"[a-z_]+\.[a-z0-9_]+", spec.id)
        assert spec.backends[-1].name == "torch", f"{spec.id}: the reference must come last"


def test_no_jit_prefixes_anywhere():
    offenders = []
    for path in (ROOT / "packages").rglob("*"):
        if "kernels_jit" in path.parts or "kernels-jit" in path.parts:
            continue
        if re.search(r"(^|_)jit(_|$)", path.stem):
            offenders.append(str(path))
        if path.suffix == ".py":
            tree = ast.parse(path.read_text())
            for node in ast.walk(tree):
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and re.match(
                    r"_*jit_", node.name
                ):
                    offenders.append(f"{path}:{node.name}")
    for spec in all_ops():
        for name in [spec.name, *(b.name for b in spec.backends)]:
            if "jit" in name:
                offenders.append(spec.id)
    for module in declared_modules():
        if "jit" in module.name:
            offenders.append(module.name)
    assert not offenders, offenders


def test_no_tests_inside_packages():
    test_like = re.compile(r"^(test_.*\.py|.*_test\.py|conftest\.py)$")
    offenders = [
        str(p) for p in (ROOT / "packages").rglob("*")
        if test_like.match(p.name) or (p.is_dir() and p.name in ("tests", "test"))
    ]  # fmt: skip
    assert not offenders, offenders


def test_import_is_metadata_only():
    code = """
import json, sys
import kernels_ops
from kernels_jit.registry import GROUPS
for g in GROUPS:
    __import__(f"kernels_{g}")
heavy = [m for m in sys.modules if m.split(".")[0] in ("torch", "triton", "tvm_ffi", "numpy")]
backends = [m for m in sys.modules if m.startswith("kernels_") and m.count(".") >= 1
            and m.split(".")[1] not in ("version",) and not m.startswith("kernels_ops.")
            and not m.startswith("kernels_jit.")]
print(json.dumps({"heavy": heavy, "backends": backends}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = json.loads(out.stdout)
    assert loaded == {"heavy": [], "backends": []}


def test_public_ops_stay_functions_after_importing_their_modules():
    """Regression: importing ``kernels_moe.topk_softmax`` (the op file) used to rebind the
    package attribute to the module, so ``kernels_moe.topk_softmax(...)`` was not callable."""
    code = """
import importlib, kernels_ops
from kernels_jit.registry import all_ops
for spec in all_ops():
    importlib.import_module(spec.public.partition(":")[0])
    group = importlib.import_module(f"kernels_{spec.group}")
    assert callable(getattr(group, spec.name)), spec.id
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "ok", out.stderr
