"""The benchmark report (markdown table and target summary) on synthetic records: no GPU."""

from __future__ import annotations

import json

import pytest

from shared.bench import report
from shared.bench.shapes import BANDWIDTH_SHAPES, DECODE_TOKENS, token_grid


def _record(op: str, impl: str, shape: tuple[int, int], us: float, pct: float = 50.0) -> dict:
    return {
        "op": op,
        "impl": impl,
        "shape": list(shape),
        "dtype": "bfloat16",
        "us": us,
        "gbps": 1.0,
        "pct_of_copy": pct,
    }


def _result() -> dict:
    records = []
    for i, shape in enumerate(BANDWIDTH_SHAPES):
        records.append(_record("relu2", "cuda", shape, 10.0, pct=91.0 + i))
        records.append(_record("relu2", "liger", shape, 12.0))
    records.append(_record("relu2", "cuda", (16, 4096), 1.5))
    records.append(_record("relu2", "liger", (16, 4096), 1.2))  # the peer wins here
    records.append(_record("relu2", "cuda", (64, 4096), 1.9) | {"copy_us": 1.25})
    return {
        "gpu": "H200",
        "date": "2026-12-02",
        "commit": "abc",
        "copy_gbps": 4000.0,
        "records": records,
    }


def test_summary_reports_targets_and_worst_peer_ratio():
    lines = report.summary({"activation": _result()}).splitlines()
    row = next(line for line in lines if line.startswith("| activation.relu2 "))
    assert "91 / 92 / 93 / 94" in row
    assert "| 1.90 (1.25) |" in row  # the slowest decode time, and torch's copy there
    assert "liger 4/5 (0.80 at [16, 4096])" in row


def test_markdown_ratio_is_peer_over_ours():
    table = report.markdown("activation", _result())
    assert "| relu2 | [16, 4096] | bfloat16 | cuda | 1.50 | 50.0 | - | 0.80 |" in table
    assert "| relu2 | [64, 4096] | bfloat16 | cuda | 1.90 | 50.0 | 1.25 | - |" in table


def test_cli_prints_summary_of_a_folder(tmp_path, capsys):
    (tmp_path / "activation.json").write_text(json.dumps(_result()))
    assert report.main([str(tmp_path)]) == 0
    assert "activation.relu2" in capsys.readouterr().out
    assert report.main([str(tmp_path / "missing")]) == 2


def test_grid_covers_the_target_shapes():
    grid = set(token_grid(quick=False))
    assert set(BANDWIDTH_SHAPES) <= grid
    assert all((t, 4096) in grid for t in DECODE_TOKENS)
    assert set(token_grid(quick=True)) <= grid


# --- torch_compile modes and peers (CPU only: no compile, no GPU) ---------------------------------


def _peers(monkeypatch):
    pytest.importorskip("torch")
    from shared.bench import peers

    monkeypatch.setattr(peers, "_compile_mode", "targets")
    return peers


def test_static_compile_modes_pick_the_target_and_decode_shapes(monkeypatch):
    peers = _peers(monkeypatch)
    wanted = peers.static_compile_wanted
    for tokens in (1, 16, 64, 128, 8192, 32768):
        assert wanted([tokens, 7168])
    assert not wanted([1024, 4096])
    assert wanted([8192, 32, 8, 128])  # qk_rmsnorm: tokens first
    assert wanted([2**28])  # 1-D sizes (add_constant)
    assert wanted([32768, 8192], "large") and not wanted([16, 4096], "large")
    assert wanted([1024, 4096], "all")
    assert not wanted([32768, 8192], "none") and not wanted([2**28], "none")
    with pytest.raises(ValueError):
        peers.set_compile_mode("sometimes")
    assert "--static-compile targets" in peers.compile_note()


def test_compile_peer_records_its_mode_and_first_call(monkeypatch):
    peers = _peers(monkeypatch)
    built = []

    def fake_static(reference, shape):
        built.append(("static", list(shape)))
        return reference

    def fake_auto(reference):
        built.append(("auto", None))
        return reference

    monkeypatch.setattr(peers, "static_compiled", fake_static)
    monkeypatch.setattr(peers, "compiled", fake_auto)
    static = peers.torch_compile(lambda a, b: a + b, [8192, 4096], lambda f, s: f(*s))
    auto = peers.torch_compile(lambda a, b: a * b, [1024, 4096], lambda f, s: f(*s))
    assert static.record_extra == {"compile": "static"}
    assert auto.record_extra == {"compile": "auto"}
    assert static((2, 3)) == 5 and static((4, 5)) == 9
    assert auto((2, 3)) == 6
    assert built == [("static", [8192, 4096]), ("auto", None)]  # built once, at the first call
    assert set(static.record_extra) == {"compile", "compile_s", "fx_graph_cache"}
    # inductor's cache counts over the first call (none here: the fake compiles nothing)
    assert static.record_extra["fx_graph_cache"] == dict.fromkeys(
        ("hit", "miss", "bypass", "aot_hit", "aot_miss"), 0
    )
    forced = peers.torch_compile(lambda a: a, [1024, 4096], lambda f, s: f(s), static=True)
    assert forced.record_extra["compile"] == "static"


def test_fresh_copy_has_a_code_object_of_its_own(monkeypatch):
    peers = _peers(monkeypatch)

    def ref(x, scale=2):
        return x * scale

    copy = peers.fresh_copy(ref, "8192x4096")
    assert copy.__code__ is not ref.__code__
    assert copy.__code__.co_name == "ref__8192x4096"
    assert copy(3) == ref(3) == 6


def test_checked_peer_must_match_the_reference(monkeypatch):
    peers = _peers(monkeypatch)
    import torch

    x = torch.randn(4, 8)
    good = peers.Checked(lambda s: s * 2, expected=lambda s: s + s, outputs=lambda s, r: r)
    assert torch.equal(good(x), x * 2)
    assert good.record_extra == {"check_max_abs_err": 0.0}
    bad = peers.Checked(lambda s: s * 3, expected=lambda s: s + s, outputs=lambda s, r: r)
    with pytest.raises(AssertionError):
        bad(x + 1)


def test_flashinfer_peer_absent_or_disabled_is_recorded(monkeypatch, tmp_path):
    peers = _peers(monkeypatch)
    monkeypatch.setenv(peers.FLASHINFER_ENV, str(tmp_path / "missing.so"))
    peers.flashinfer.cache_clear()
    try:
        assert peers.flashinfer() is None
        info = peers.describe({"cuda", "torch_compile"})
        assert info["flashinfer"]["status"] == "absent" and not info["flashinfer"]["ran"]
        assert info["torch_compile"]["ran"] and info["torch_compile"]["static_compile"] == "targets"
        monkeypatch.setenv(peers.FLASHINFER_ENV, "0")
        peers.flashinfer.cache_clear()
        assert peers.flashinfer() is None
        assert peers.describe()["flashinfer"]["status"] == "disabled"
    finally:
        peers.flashinfer.cache_clear()


def _compile_result() -> dict:
    result = _result()
    for shape, mode in ((BANDWIDTH_SHAPES[0], "static"), ((16, 4096), "auto")):
        result["records"].append(
            _record("relu2", "torch_compile", shape, 20.0) | {"compile": mode, "compile_s": 2.0}
        )
    result["static_compile"] = "targets"
    result["peers"] = {
        "torch_compile": {"status": "loaded", "version": "2.11.0", "ran": True},
        "flashinfer": {"status": "absent", "ran": False},
    }
    return result


def test_report_shows_how_torch_compile_was_compiled():
    table = report.markdown("activation", _compile_result())
    assert "`--static-compile targets`" in table
    assert "torch_compile (2.11.0, ran), flashinfer (absent)" in table
    auto_row = "| relu2 | [16, 4096] | bfloat16 | cuda | 1.50 | 50.0 | - | 0.80 | 13.33 (auto) |"
    assert auto_row in table
    # a static row carries no mark
    assert "| relu2 | [8192, 4096] | bfloat16 | cuda | 10.00 | 91.0 | - | 1.20 | 2.00 |" in table
    row = next(
        line
        for line in report.summary({"activation": _compile_result()}).splitlines()
        if line.startswith("| activation.relu2 ")
    )
    assert "torch_compile [auto+static] 2/2" in row


def test_flashinfer_activation_template_renders_like_its_jit(tmp_path):
    from shared.bench import build_flashinfer_peer as build

    template = (
        "{% set func_name = act_func_name ~ '_and_mul' %}\n{{ act_func_def }}\n"
        "void {{ func_name }}() { kernel<{{ act_func_name }}>(); }\n"
        "TVM_FFI_DLL_EXPORT_TYPED_FUNC({{ func_name }}, {{ func_name }});\n"
    )
    text = build.render_activation(template, "silu", "float silu(float v);")
    assert text == (
        "\nfloat silu(float v);\nvoid silu_and_mul() { kernel<silu>(); }\n"
        "TVM_FFI_DLL_EXPORT_TYPED_FUNC(silu_and_mul, silu_and_mul);\n"
    )
    with pytest.raises(SystemExit):
        build.render_activation(template + "{{ other }}", "silu", "")
    source = tmp_path / "activation.py"
    source.write_text('a_templ = r"""x"""\nsilu_def = "s"\ndefs = {"silu": silu_def}\n')
    assert build._string_constants(source) == {
        "a_templ": "x",
        "silu_def": "s",
        "defs": {"silu": "s"},
    }
