"""Packaging: licence, py.typed, changelog, URLs and classifiers in every distribution; package
READMEs cite only files that exist; summaries claim only ops that exist; the wheel check catches
a missing LICENSE or py.typed."""

from __future__ import annotations

import io
import re
import tarfile
import zipfile
from pathlib import Path

import pytest
import tomllib

from kernels_jit.registry import GROUPS, all_ops
from shared.release import check_wheels, generate

ROOT = Path(__file__).resolve().parents[2]
DISTS = generate.distributions()


@pytest.mark.parametrize(("directory", "module"), DISTS.items())
def test_distribution_metadata(directory, module):
    package = ROOT / "packages" / directory
    project = tomllib.loads((package / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert (package / "LICENSE").read_text() == (ROOT / "LICENSE").read_text()
    assert (package / "src" / module / "py.typed").exists()
    assert {"Homepage", "Documentation", "Changelog"} <= set(project["urls"])
    assert all(url.startswith(generate.REPOSITORY) for url in project["urls"].values())
    assert "Environment :: GPU :: NVIDIA CUDA" in project["classifiers"]
    version = generate.version_of(package / "src" / module)
    assert f"## {version}" in (package / "CHANGELOG.md").read_text()


def test_commands_are_declared():
    def scripts(directory: str) -> dict:
        text = (ROOT / "packages" / directory / "pyproject.toml").read_text()
        return tomllib.loads(text)["project"]["scripts"]

    assert scripts("kernels-jit") == {"kernels-jit": "kernels_jit.cli:main"}
    assert scripts("kernels-ops") == {"kernels-ops": "kernels_ops.cli:main"}


_CITED = re.compile(r"`([\w./-]+\.(?:md|py|cuh|h|toml))`|\]\(([\w./-]+)\)")


@pytest.mark.parametrize("directory", DISTS)
def test_package_readmes_cite_files_that_exist(directory):
    package = ROOT / "packages" / directory
    text = re.sub(r"```.*?```", "", (package / "README.md").read_text(), flags=re.DOTALL)
    roots = [ROOT, package, package / "src", ROOT / "packages" / "kernels-jit" / "src"]
    for match in _CITED.finditer(text):
        cited = match.group(1) or match.group(2)
        if "://" in cited:
            continue
        assert any((root / cited).exists() for root in roots), f"{directory}/README.md: {cited}"


# Words in a summary that promise a specific op.
CLAIMS = {
    "decode attention": "attention.decode_attention",
    "fused moe": "moe.fused_moe",
    "blockwise": "gemm.fp8_blockwise_mm",
    "fused a": "gemm.dsv3_fused_a_gemm",
    "latency gemms": "gemm.dsv3_fused_a_gemm",
}


def test_summaries_claim_only_registered_ops():
    import kernels_ops  # noqa: F401  (registers every group)

    registered = {spec.id for spec in all_ops()}
    for group in GROUPS:
        for text in (
            generate.GROUPS[group],
            (ROOT / "packages" / generate.dist_name(group) / "README.md").read_text(),
        ):
            for words, op_id in CLAIMS.items():
                if op_id.startswith(f"{group}.") and words in text.lower():
                    assert op_id in registered or "later release" in text, f"{group}: {words!r}"


def _wheel(tmp_path: Path, files: dict[str, bytes]) -> Path:
    path = tmp_path / "kernels_grammar-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


def _sdist(tmp_path: Path, files: dict[str, bytes]) -> Path:
    path = tmp_path / "kernels_grammar-0.1.0.tar.gz"
    with tarfile.open(path, "w:gz") as archive:
        for name, data in files.items():
            info = tarfile.TarInfo(f"kernels_grammar-0.1.0/{name}")
            info.size = len(data)
            archive.addfile(info, io.BytesIO(data))
    return path


def test_wheel_check_requires_license_and_py_typed(tmp_path):
    licence = (ROOT / "LICENSE").read_bytes()
    metadata = (
        b"Metadata-Version: 2.4\nName: kernels-grammar\nLicense-Expression: Apache-2.0\n"
        b"Project-URL: Homepage, https://example.org\n"
        b"Requires-Dist: kernels-jit<0.2,>=0.1\nRequires-Dist: torch<3,>=2.9\n"
    )
    package = ROOT / "packages" / "kernels-grammar" / "src" / "kernels_grammar"
    sources = {  # the group's CUDA sources, which a wheel must ship
        f"kernels_grammar/{p.relative_to(package)}": b"" for p in package.glob("csrc/*")
    }
    good = {
        "kernels_grammar/__init__.py": b"",
        "kernels_grammar/py.typed": b"",
        **sources,
        "kernels_grammar-0.1.0.dist-info/METADATA": metadata,
        "kernels_grammar-0.1.0.dist-info/licenses/LICENSE": licence,
    }
    assert check_wheels.problems_of(_wheel(tmp_path, good)) == []
    bare = {k: v for k, v in good.items() if "LICENSE" not in k and "py.typed" not in k}
    problems = "\n".join(check_wheels.problems_of(_wheel(tmp_path, bare)))
    assert "no LICENSE" in problems and "py.typed" in problems

    sdist = {
        "LICENSE": licence,
        "README.md": b"",
        "CHANGELOG.md": b"",
        "pyproject.toml": b"",
        "src/kernels_grammar/py.typed": b"",
    }
    assert check_wheels.sdist_problems(_sdist(tmp_path, sdist)) == []
    bare_sdist = {k: v for k, v in sdist.items() if k not in ("LICENSE", "CHANGELOG.md")}
    problems = "\n".join(check_wheels.sdist_problems(_sdist(tmp_path, bare_sdist)))
    assert "no LICENSE" in problems and "CHANGELOG.md" in problems
