"""shared.bench.ab's preparation and handle swapping, without a GPU or a build."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")
from kernels_jit.loader import CompiledFunction
from shared.bench import ab


def test_prepare_copies_the_headers_and_the_group_sources_of_a_commit(tmp_path, monkeypatch):
    monkeypatch.setattr(ab, "AB", tmp_path)
    ab.prepare("HEAD", ["elementwise"])
    package = tmp_path / "ab_elementwise"
    assert (package / "kernels" / "rowwise.cuh").is_file()
    assert (package / "csrc" / "add_constant.cuh").is_file()
    assert (package / "__init__.py").is_file()


def test_every_compiled_handle_of_a_group_is_found():
    handles = ab.compiled_functions("layernorm")
    assert handles and all(isinstance(h, CompiledFunction) for h in handles)
    assert {h.export for h in handles} >= {"rmsnorm", "fused_add_rmsnorm", "layernorm"}
    only = ab.compiled_functions("layernorm", ["layernorm"])
    assert {h.export for h in only} == {"layernorm"}
    fused = ab.compiled_functions("layernorm", ["fused_add"])  # an export of ops/rmsnorm.py
    assert {h.export for h in fused} == {"fused_add_rmsnorm"}
    with pytest.raises(SystemExit, match="no compiled kernel"):
        ab.compiled_functions("layernorm", ["nonsense"])


def test_kernels_switch_every_handle_between_base_and_new(monkeypatch):
    from kernels_jit import loader, module

    # The base twins are ModuleSpecs too: keep them out of the process's declared modules.
    monkeypatch.setattr(module, "_DECLARED", dict(module._DECLARED))

    built = []

    class Module:
        def __init__(self, spec):
            self.spec = spec

        def __getattr__(self, export):
            return (self.spec.name, export)

    def fake_load(spec):
        built.append(spec)
        return Module(spec)

    monkeypatch.setattr("kernels_jit.aot.precompile", built.extend)
    monkeypatch.setattr(loader, "load_module", fake_load)
    monkeypatch.setattr("kernels_jit.load_module", fake_load)
    handles = ab.compiled_functions("layernorm")
    saved = [h._fn for h in handles]
    for h in handles:
        h._fn = None  # resolved through the fake loader below
    try:
        kernels = ab.Kernels("layernorm")
        twins = [s for s in built if s.name.endswith("_base")]
        assert twins and all(s.package == "ab_layernorm" for s in twins)
        kernels.use("base")
        assert all(h._fn[0] == f"{h.spec.name}_base" for h in handles)
        kernels.use("new")
        assert all(h._fn[0] == h.spec.name for h in handles)
    finally:
        for h, fn in zip(handles, saved, strict=True):
            h._fn = fn


def test_base_twin_leaves_out_exports_the_base_lacks(tmp_path, monkeypatch):
    """A test hook exported since the base commit is left out of the base build; an unprepared
    copy keeps every export (its build fails naming the missing source)."""
    from kernels_jit import module
    from kernels_layernorm.ops.rmsnorm import RMSNORM_CUDA

    # The twins are ModuleSpecs too: keep them out of the process's declared modules.
    monkeypatch.setattr(module, "_DECLARED", dict(module._DECLARED))
    monkeypatch.setattr(ab, "AB", tmp_path)
    name, expression = RMSNORM_CUDA.exports[0]
    assert ab._base_twin(RMSNORM_CUDA, "layernorm").exports == RMSNORM_CUDA.exports
    for source in RMSNORM_CUDA.sources:
        path = tmp_path / "ab_layernorm" / source
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(
            f"inline void {expression}() {{}}\n" if source == RMSNORM_CUDA.sources[0] else ""
        )
    twin = ab._base_twin(RMSNORM_CUDA, "layernorm")
    assert twin.exports == ((name, expression),) and twin.package == "ab_layernorm"
