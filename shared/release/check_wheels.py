"""Check built wheels and sdists: each wheel ships its CUDA/C++ sources and headers, nothing
test-like, and declares its dependencies; every wheel and sdist carries the LICENSE, the package's
``py.typed`` and (sdists) its CHANGELOG.md; kernels-jit and kernels-ops install their commands.

    python -m shared.release.check_wheels dist/
"""

from __future__ import annotations

import re
import sys
import tarfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_SUFFIXES = {".cu", ".cuh", ".h", ".hpp", ".cc", ".cpp"}
TEST_LIKE = re.compile(r"(^|/)(test_[^/]*\.py|[^/]*_test\.py|conftest\.py|tests?/)")
SCRIPTS = {"kernels_jit": "kernels-jit", "kernels_ops": "kernels-ops"}


def _module(archive: Path) -> str:
    """kernels_layernorm-0.1.0-py3-none-any.whl or kernels_layernorm-0.1.0.tar.gz -> the module."""
    return archive.name.split("-")[0].replace(".", "_")


def _licence_problems(label: str, names: set[str], licence_names: list[str], read) -> list[str]:
    if not licence_names:
        return [f"{label}: ships no LICENSE"]
    expected = (ROOT / "LICENSE").read_bytes()
    if read(licence_names[0]) != expected:
        return [f"{label}: its LICENSE differs from the repository's LICENSE"]
    return []


def problems_of(wheel: Path) -> list[str]:
    module = _module(wheel)
    package_dir = ROOT / "packages" / module.replace("_", "-") / "src" / module
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = next((archive.read(n).decode() for n in names if n.endswith("/METADATA")), "")
        entry_points = next(
            (archive.read(n).decode() for n in names if n.endswith("/entry_points.txt")), ""
        )
        licences = sorted(n for n in names if re.search(r"\.dist-info/licenses/LICENSE$", n))
        problems = _licence_problems(wheel.name, names, licences, archive.read)
    problems += [f"{wheel.name}: ships test-like file {n}" for n in names if TEST_LIKE.search(n)]
    if f"{module}/py.typed" not in names:
        problems.append(f"{wheel.name}: missing {module}/py.typed")
    if not re.search(r"^License-Expression: Apache-2\.0$", metadata, re.MULTILINE):
        problems.append(f"{wheel.name}: METADATA lacks License-Expression: Apache-2.0")
    if "Project-URL:" not in metadata:
        problems.append(f"{wheel.name}: METADATA has no Project-URL")
    for source in package_dir.rglob("*"):
        if source.suffix in SOURCE_SUFFIXES:
            inside = f"{module}/{source.relative_to(package_dir).as_posix()}"
            if inside not in names:
                problems.append(f"{wheel.name}: missing source {inside}")
    requires = re.findall(r"^Requires-Dist: (\S+)", metadata, re.MULTILINE)
    if module not in ("kernels_jit", "kernels_ops"):
        for needed in ("kernels-jit", "torch"):
            if not any(r.startswith(needed) for r in requires):
                problems.append(f"{wheel.name}: does not declare {needed}")
    headers = [n for n in names if n.startswith("kernels_jit/include/kernels/")]
    if module == "kernels_jit" and not headers:
        problems.append(f"{wheel.name}: ships no C++ headers")
    script = SCRIPTS.get(module)
    if script and not re.search(rf"^{script} = {module}\.cli:main$", entry_points, re.MULTILINE):
        problems.append(f"{wheel.name}: does not install the {script} command")
    return problems


def sdist_problems(sdist: Path) -> list[str]:
    module = _module(sdist)
    with tarfile.open(sdist) as archive:
        members = {m.name.partition("/")[2]: m for m in archive.getmembers() if m.isfile()}

        def read(name: str) -> bytes:
            handle = archive.extractfile(members[name])
            return handle.read() if handle else b""

        problems = _licence_problems(
            sdist.name, set(members), ["LICENSE"] * ("LICENSE" in members), read
        )
    problems += [f"{sdist.name}: ships test-like file {n}" for n in members if TEST_LIKE.search(n)]
    for needed in (f"src/{module}/py.typed", "CHANGELOG.md", "README.md", "pyproject.toml"):
        if needed not in members:
            problems.append(f"{sdist.name}: missing {needed}")
    return problems


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else ROOT / "dist")
    wheels = sorted(out.glob("*.whl"))
    sdists = sorted(out.glob("*.tar.gz"))
    expected = len([p for p in (ROOT / "packages").iterdir() if (p / "pyproject.toml").exists()])
    problems = [p for w in wheels for p in problems_of(w)]
    problems += [p for s in sdists for p in sdist_problems(s)]
    if len(wheels) < expected or len(sdists) < expected:
        problems.append(
            f"expected {expected} wheels and sdists, found {len(wheels)} and {len(sdists)} in {out}"
        )
    for problem in problems:
        print(problem, file=sys.stderr)
    if not problems:
        print(f"{len(wheels)} wheels and {len(sdists)} sdists checked: ok")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
