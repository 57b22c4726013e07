"""Arch spellings and KERNELS_CUDA_ARCH; every KERNELS_* setting's parsing and validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from kernels_jit import ToolchainError, arch, settings


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("sm_90a", "sm_90a"),
        ("9.0a", "sm_90a"),
        ("90a", "sm_90a"),
        ("sm_90", "sm_90a"),  # Hopper features need the arch-specific target
        ("9.0", "sm_90a"),
        ("SM90A", "sm_90a"),
        ("compute_90a", "sm_90a"),
        (" sm_100a ", "sm_100a"),
        ("10.0", "sm_100a"),
        ("100f", "sm_100f"),
        ("12.0f", "sm_120f"),
        ("8.0", "sm_80"),
        ("sm_86", "sm_86"),
        ("7.5", "sm_75"),
    ],
)
def test_normalize_cuda_arch(text, expected):
    assert arch.normalize_cuda_arch(text) == expected


@pytest.mark.parametrize(
    "text", ["", "9", "sm_9", "hopper", "90af", "9.0.1", "8.0a", "90f", "sm_90b", "8.0+PTX", "9.10"]
)
def test_normalize_rejects_non_archs(text):
    with pytest.raises(ValueError):
        arch.normalize_cuda_arch(text)


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("sm_90a", ("sm_90a",)),
        ("9.0a,10.0a", ("sm_100a", "sm_90a")),
        ("sm_100a; sm_90a", ("sm_100a", "sm_90a")),
        ("8.0 9.0a 9.0", ("sm_80", "sm_90a")),  # duplicates collapse
    ],
)
def test_kernels_cuda_arch(monkeypatch, value, expected):
    monkeypatch.setenv("KERNELS_CUDA_ARCH", value)
    assert arch.cuda_archs() == expected
    assert arch.arch_tag("cuda") == "-".join(expected)
    assert arch.gencode_flags(expected)[0] == (
        f"-gencode=arch=compute_{expected[0][3:]},code={expected[0]}"
    )


@pytest.mark.parametrize("value", [",", " ; ", "sm_90a,bogus"])
def test_kernels_cuda_arch_rejects_bad_lists(monkeypatch, value):
    monkeypatch.setenv("KERNELS_CUDA_ARCH", value)
    with pytest.raises(ValueError, match="KERNELS_CUDA_ARCH"):
        arch.cuda_archs()


def test_targeting_overrides_the_environment_for_this_thread_only(monkeypatch):
    import threading

    monkeypatch.setenv("KERNELS_CUDA_ARCH", "sm_80")
    seen = []
    with arch.targeting(["9.0a"]):
        assert arch.cuda_archs() == ("sm_90a",)
        thread = threading.Thread(target=lambda: seen.append(arch.cuda_archs()))
        thread.start()
        thread.join()
    assert seen == [("sm_80",)]
    assert arch.cuda_archs() == ("sm_80",)


def test_no_gpu_and_no_override_is_a_toolchain_error(monkeypatch):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: detection succeeds")
    monkeypatch.delenv("KERNELS_CUDA_ARCH", raising=False)
    with pytest.raises(ToolchainError, match="KERNELS_CUDA_ARCH"):
        arch.cuda_archs()


def test_loading_a_cuda_module_with_no_arch_is_a_clear_error(sandbox):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present: detection succeeds")
    from kernels_jit import load_module

    sandbox.write("csrc/k.cuh", "#pragma once\ninline int one() { return 1; }\n")
    spec = sandbox.spec("k", ("csrc/k.cuh",), (("one", "one"),), device="cuda")
    with pytest.raises(ToolchainError, match="set KERNELS_CUDA_ARCH") as caught:
        load_module(spec)
    assert caught.value.__context__ is None or caught.value.__suppress_context__


def test_nvcc_supports(monkeypatch):
    from kernels_jit import toolchain

    monkeypatch.setattr(toolchain, "nvcc_release", lambda: (13, 0))
    assert arch.nvcc_supports("sm_90a") and arch.nvcc_supports("10.0a")
    assert arch.nvcc_supports("sm_110a") and arch.nvcc_supports("12.0f")
    assert not arch.nvcc_supports("sm_70")  # CUDA 13 dropped Volta
    monkeypatch.setattr(toolchain, "nvcc_release", lambda: (12, 4))
    assert arch.nvcc_supports("sm_90a") and arch.nvcc_supports("sm_70")
    assert not arch.nvcc_supports("sm_100a")
    assert "sm_70" in arch.nvcc_archs() and "sm_110a" not in arch.nvcc_archs()
    monkeypatch.setattr(toolchain, "nvcc_release", lambda: None)
    assert not arch.nvcc_supports("sm_90a")
    assert arch.nvcc_archs() == ()


def test_max_jobs(monkeypatch):
    monkeypatch.delenv("KERNELS_MAX_JOBS", raising=False)
    assert 1 <= settings.max_jobs() <= 8
    monkeypatch.setenv("KERNELS_MAX_JOBS", " 3 ")
    assert settings.max_jobs() == 3
    for bad in ("0", "-2", "four", "2.5"):
        monkeypatch.setenv("KERNELS_MAX_JOBS", bad)
        with pytest.raises(ValueError, match="KERNELS_MAX_JOBS"):
            settings.max_jobs()


def test_build_timeout(monkeypatch):
    monkeypatch.delenv("KERNELS_BUILD_TIMEOUT", raising=False)
    assert settings.build_timeout() == 900
    monkeypatch.setenv("KERNELS_BUILD_TIMEOUT", "2.5")
    assert settings.build_timeout() == 2.5
    for bad in ("0", "-1", "soon", "nan", "inf"):
        monkeypatch.setenv("KERNELS_BUILD_TIMEOUT", bad)
        with pytest.raises(ValueError, match="KERNELS_BUILD_TIMEOUT"):
            settings.build_timeout()


def test_boolean_switches(monkeypatch):
    for value, expected in (("1", True), ("Yes", True), ("0", False), ("off", False), ("", False)):
        monkeypatch.setenv("KERNELS_NO_JIT", value)
        monkeypatch.setenv("KERNELS_VERBOSE", value)
        assert settings.no_jit() is expected and settings.verbose() is expected
    monkeypatch.setenv("KERNELS_NO_JIT", "maybe")
    with pytest.raises(ValueError, match="KERNELS_NO_JIT"):
        settings.no_jit()


def test_cache_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("KERNELS_CACHE_DIR", "relative/cache")
    monkeypatch.chdir(tmp_path)
    assert settings.cache_dir() == tmp_path / "relative" / "cache"
    monkeypatch.delenv("KERNELS_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert settings.cache_dir() == tmp_path / "xdg" / "kernels-ops"
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert settings.cache_dir() == Path("~/.cache/kernels-ops").expanduser()


def test_every_setting_is_documented():
    names = {v.name for v in settings.VARIABLES}
    source = Path(settings.__file__).read_text()
    import re

    used = set(re.findall(r'"(KERNELS_[A-Z_]+)"', source))
    assert used <= names, used - names
