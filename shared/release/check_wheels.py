"""Check built wheels: each ships its CUDA/C++ sources and headers, nothing test-like, and
declares its dependencies.

    python -m shared.release.check_wheels dist/
"""

from __future__ import annotations

import re
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCE_SUFFIXES = {".cu", ".cuh", ".h", ".hpp", ".cc", ".cpp"}
TEST_LIKE = re.compile(r"(^|/)(test_[^/]*\.py|[^/]*_test\.py|conftest\.py|tests?/)")


def problems_of(wheel: Path) -> list[str]:
    dist = wheel.name.split("-")[0]  # kernels_layernorm
    module = dist
    package_dir = ROOT / "packages" / dist.replace("_", "-") / "src" / module
    if dist == "kernels_kv_canary":
        package_dir = ROOT / "packages" / "kernels-kv-canary" / "src" / module
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = next((archive.read(n).decode() for n in names if n.endswith("/METADATA")), "")
    problems = [f"{wheel.name}: ships test-like file {n}" for n in names if TEST_LIKE.search(n)]
    for source in package_dir.rglob("*"):
        if source.suffix in SOURCE_SUFFIXES:
            inside = f"{module}/{source.relative_to(package_dir).as_posix()}"
            if inside not in names:
                problems.append(f"{wheel.name}: missing source {inside}")
    requires = re.findall(r"^Requires-Dist: (\S+)", metadata, re.MULTILINE)
    if dist not in ("kernels_jit", "kernels_ops"):
        for needed in ("kernels-jit", "torch"):
            if not any(r.startswith(needed) for r in requires):
                problems.append(f"{wheel.name}: does not declare {needed}")
    headers = [n for n in names if n.startswith("kernels_jit/include/kernels/")]
    if dist == "kernels_jit" and not headers:
        problems.append(f"{wheel.name}: ships no C++ headers")
    return problems


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else ROOT / "dist")
    wheels = sorted(out.glob("*.whl"))
    sdists = sorted(out.glob("*.tar.gz"))
    expected = len(list((ROOT / "packages").iterdir()))
    problems = [p for w in wheels for p in problems_of(w)]
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
