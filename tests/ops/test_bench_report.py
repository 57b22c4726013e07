"""The benchmark report (markdown table and target summary) on synthetic records: no GPU."""

from __future__ import annotations

import json
from pathlib import Path

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


def test_cases_of_one_shape_keep_their_rows_and_lines(tmp_path):
    # Two mask densities of one shape: each gets its row (named by its note) and its plot line;
    # a shape measured once keeps its plain row.
    result = _result()
    for note, ours, peer in (("mask random50", 19.0, 21.0), ("mask allowed95", 6.3, 6.9)):
        result["records"] += [
            _record("bitmask", "cuda", (64, 128256), ours) | {"note": note},
            _record("bitmask", "sglang", (64, 128256), peer) | {"note": note},
        ]
    table = report.markdown("grammar", result)
    assert "| bitmask | [64, 128256] mask random50 | bfloat16 | cuda | 19.00 |" in table
    assert "| bitmask | [64, 128256] mask allowed95 | bfloat16 | cuda | 6.30 |" in table
    assert "| relu2 | [16, 4096] | bfloat16 |" in table
    lines = report.summary({"grammar": result}).splitlines()
    row = next(line for line in lines if "bitmask" in line)
    assert "sglang 2/2" in row
    pytest.importorskip("matplotlib")
    assert (tmp_path / "grammar-bitmask.png") in report.plots("grammar", result, tmp_path)


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


def test_flashinfer_libraries_are_found_in_one_folder(monkeypatch, tmp_path):
    peers = _peers(monkeypatch)
    monkeypatch.delenv(peers.FLASHINFER_ENV, raising=False)
    assert peers.flashinfer_path("sampling") == peers.FLASHINFER_DEFAULT / "flashinfer_sampling.so"
    monkeypatch.setenv(peers.FLASHINFER_ENV, str(tmp_path))
    assert peers.flashinfer_path() == tmp_path / "flashinfer_norm_act.so"
    # a path to one library stands for its folder (gpu_session.sh once exported the first .so)
    monkeypatch.setenv(peers.FLASHINFER_ENV, str(tmp_path / "flashinfer_decode.so"))
    assert peers.flashinfer_path("sampling") == tmp_path / "flashinfer_sampling.so"
    monkeypatch.setattr(peers, "_flashinfer_status", {})
    assert peers.flashinfer_status() == {"status": "not requested"}
    peers._flashinfer_status["norm_act"] = {"status": "absent"}
    peers._flashinfer_status["sampling"] = {"status": "loaded", "path": "x.so"}
    assert peers.flashinfer_status() == {
        "status": "loaded",
        "path": "x.so",
        "libraries": {"norm_act": "absent", "sampling": "loaded"},
    }
    with pytest.raises(ValueError):
        peers.flashinfer("decoder")


def test_flashinfer_builder_stubs_only_what_nobody_provides(tmp_path):
    from shared.bench import build_flashinfer_peer as build

    toolkit, curand = tmp_path / "cuda" / "include", tmp_path / "curand"
    toolkit.mkdir(parents=True)
    curand.mkdir()
    (toolkit / "cublas_v2.h").write_text("")
    (curand / "curand_kernel.h").write_text("")
    stubs = build.stub_dir(toolkit, tmp_path / "norm_act", ())
    assert sorted(p.name for p in stubs.iterdir()) == ["cublasLt.h", "curand_kernel.h"]
    stubs = build.stub_dir(toolkit, tmp_path / "sampling", (curand,))
    assert sorted(p.name for p in stubs.iterdir()) == ["cublasLt.h"]
    # every library's sources are unpacked from the wheel; sampling needs cuRAND for real
    for lib in build.LIBRARIES.values():
        assert all(f"flashinfer/data/csrc/{f}" in build.WHEEL_MEMBERS for f in lib.csrc)
    assert build.LIBRARIES["sampling"].curand and not build.LIBRARIES["norm_act"].curand


def test_flashinfer_builder_takes_curand_headers_from_the_toolkit_or_its_wheel(tmp_path):
    import zipfile

    from shared.bench import build_flashinfer_peer as build

    toolkit, wheels = tmp_path / "include", tmp_path / "wheel"
    toolkit.mkdir()
    wheels.mkdir()
    wheel = wheels / f"nvidia_curand-{build.CURAND_VERSION}-py3-none-manylinux_2_27_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in ("curand_kernel.h", "curand_philox4x32_x.h"):
            archive.writestr(f"nvidia/cu13/include/{name}", f"// {name}\n")
        archive.writestr("nvidia/cu13/lib/libcurand.so.10", "not extracted")
    folder, origin = build.curand_headers(toolkit, wheels, tmp_path / "build")
    assert origin == wheel.name
    assert sorted(p.name for p in folder.iterdir()) == [
        "curand_kernel.h",
        "curand_philox4x32_x.h",
    ]
    (toolkit / "curand_kernel.h").write_text("")
    assert build.curand_headers(toolkit, wheels, tmp_path / "build") == (None, f"toolkit {toolkit}")


def test_flashinfer_builder_reads_the_toolkit_include_from_nvcc(tmp_path):
    from shared.bench import build_flashinfer_peer as build

    nvcc = tmp_path / "nvcc"
    nvcc.write_text(
        "#!/bin/sh\necho '#$ TOP=/opt/cuda/bin/..'\n"
        "echo '#$ INCLUDES=\"-I/opt/cuda/bin/../targets/x86_64-linux/include\"  '\n"
    )
    nvcc.chmod(0o755)
    assert build.toolkit_include(str(nvcc)) == Path("/opt/cuda/targets/x86_64-linux/include")


def _built_flashinfer(monkeypatch, library: str):
    """The library ``.peers/flashinfer`` holds (skips where it is not built), loaded."""
    peers = _peers(monkeypatch)
    monkeypatch.delenv(peers.FLASHINFER_ENV, raising=False)
    path = peers.flashinfer_path(library)
    if not path.is_file():
        pytest.skip(f"{path} not built (python -m shared.bench.build_flashinfer_peer)")
    pytest.importorskip("tvm_ffi")
    peers.flashinfer.cache_clear()
    try:
        return peers.flashinfer(library)
    finally:
        peers.flashinfer.cache_clear()


def test_flashinfer_sampling_calls_match_its_binding(monkeypatch):
    """Where the library is built, the suite's calls get past tvm-ffi's signature check (a
    TypeError) to the binding's own CUDA-tensor check: argument count and types match."""
    module = _built_flashinfer(monkeypatch, "sampling")
    import torch

    from shared.bench.suites import sampling

    x = torch.rand(2, 4096)
    inputs = {
        "x": x,
        "out": torch.empty_like(x),
        "fi_row_states": torch.zeros(sampling.FI_ROW_STATES_BYTES, dtype=torch.uint8),
        "fi_workspace": torch.empty(sampling.fi_top_p_workspace_bytes(2, 4096), dtype=torch.uint8),
    }
    for name, call in sampling._FI_CALLS.items():
        value = sampling.TOP_P if "top_p" in name else sampling.TOP_K
        with pytest.raises(RuntimeError, match="must be a CUDA tensor"):
            call(getattr(module, name), inputs, value)


def test_flashinfer_decode_calls_match_its_binding(monkeypatch):
    """The suite's workspace_size, plan and run calls pass the signature check; on this machine
    they fail at the CUDA runtime (plan, workspace_size) or at the plan's length (run)."""
    module = _built_flashinfer(monkeypatch, "decode")
    import torch

    from shared.bench.suites import attention

    batch, length = 2, 64
    pages = batch * length // attention.PAGE
    k = torch.randn(pages * attention.PAGE, attention.HK, attention.HEAD).to(attention.DTYPE)
    s = {
        "q": torch.randn(batch, attention.HQ, attention.HEAD).to(attention.DTYPE),
        "k": k,
        "v": k,
        "scale": attention.HEAD**-0.5,
        "block_table": torch.arange(pages, dtype=torch.int32).view(batch, -1),
        "out": torch.empty(batch, attention.HQ, attention.HEAD, dtype=attention.DTYPE),
    }
    with pytest.raises(RuntimeError, match="CUDA"):
        attention._fi_decode_plan(module, s, batch, length)
    ws = torch.empty(1 << 20, dtype=torch.uint8)
    indptr = torch.arange(batch + 1, dtype=torch.int32) * (length // attention.PAGE)
    s["fi"] = {
        "float_ws": ws,
        "int_ws": ws,
        "plan": [0] * 3,
        "indptr": indptr,
        "indices": s["block_table"].flatten(),
        "last_page_len": torch.full((batch,), attention.PAGE, dtype=torch.int32),
        "out": s["out"],
    }
    with pytest.raises(RuntimeError, match="DecodePlanInfo"):
        attention._fi_decode_run(module, s)


def test_flashinfer_decode_module_renders_like_its_jit(tmp_path):
    """Where the wheel is unpacked (.peers/build), the decode sources render completely: the
    config with the default attention variant, the kernel instantiated for head_dim 128."""
    from shared.bench import build_flashinfer_peer as build

    src = build.BUILD_DIR / "src"
    if not (src / "flashinfer" / "jit" / "attention" / "utils.py").is_file():
        pytest.skip(f"{src} holds no unpacked wheel (python -m shared.bench.build_flashinfer_peer)")
    pytest.importorskip("jinja2")
    sources = build.decode_sources(src, tmp_path)
    assert [p.name for p in sources] == [
        "batch_decode_kernel.cu",
        "batch_decode.cu",
        "batch_decode_jit_binding.cu",
    ]
    folder = tmp_path / build.DECODE_URI
    config = (folder / "batch_decode_config.inc").read_text()
    kernel = (folder / "batch_decode_kernel.cu").read_text()
    for text in (config, kernel):
        assert "{{" not in text and "{%" not in text
    assert "using AttentionVariant = DefaultAttention<false, false, false, false>;" in config
    assert "using DTypeKV = nv_bfloat16;" in config and "using IdType = int32_t;" in config
    assert "double sm_scale;" in config and "Optional<ffi::Tensor> maybe_alibi_slopes" in config
    assert "BatchDecodeWithPagedKVCacheDispatched<128, PosEncodingMode::kNone," in kernel


def test_merge_keeps_a_peer_the_run_did_not_time():
    """A run without a peer (not carried that day) replaces ours but keeps the peer's figures."""
    from shared.bench import merge

    recorded = _result() | {"peers": {"liger": {"status": "loaded", "ran": True}}}
    partial = {
        "commit": "def",
        "date": "2026-12-04",
        "copy_gbps": 4100.0,
        "peers": {"liger": {"status": "absent", "ran": False}},
        "records": [_record("relu2", "cuda", (16, 4096), 1.1)],
    }
    merged = merge.merge(recorded, partial)
    ours = [r for r in merged["records"] if r["impl"] == "cuda"]
    assert [r["us"] for r in ours] == [1.1] and ours[0]["run"]["commit"] == "def"
    liger = [r for r in merged["records"] if r["impl"] == "liger"]
    assert len(liger) == len(BANDWIDTH_SHAPES) + 1
    assert all(r["run"]["commit"] == "abc" for r in liger)
    assert merged["peers"]["liger"]["ran"] and merged["peers"]["liger"]["ran_in"] == "abc"
