"""Sessions: tests-<group> (each group alone), tests-jit, tests-ops, tests (all), lint, build.

Every session's venv reuses one torch: the CPU build is installed once into ``.nox/_torch-site``
and each venv sees it through a ``.pth`` file, so no session downloads or unpacks torch again.
"""

from __future__ import annotations

import sys
from pathlib import Path

import nox

ROOT = Path(__file__).parent
sys.path.insert(0, str(ROOT))
from shared.release.generate import GROUPS, dist_name  # noqa: E402

nox.options.default_venv_backend = "venv"
nox.options.error_on_missing_interpreters = True

TORCH = "torch==2.13.0"  # the CPU build on the CI machines' disk; GPU machines bring their own
SHARED_SITE_PACKAGES = [TORCH, "numpy>=1.26", "triton==3.9.0"]
TEST_TOOLS = ["pytest>=8", "hypothesis>=6.100"]
TORCH_SITE = ROOT / ".nox" / "_torch-site"


def _with_shared_torch(session: nox.Session) -> None:
    """Make the session's venv see the one shared torch (installed on first use)."""
    marker = TORCH_SITE / ".complete"
    if not marker.exists():
        session.run(
            "python",
            "-m",
            "pip",
            "install",
            "-q",
            "--target",
            str(TORCH_SITE),
            *SHARED_SITE_PACKAGES,
        )
        marker.touch()
    query = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    purelib = session.run("python", "-c", query, silent=True).strip().splitlines()[-1]
    Path(purelib, "_kernels_shared_torch.pth").write_text(str(TORCH_SITE) + "\n")


# The packages' build backend, installed once per venv: building each local package without
# isolation saves pip a fresh build environment per package (about 3 s each on a 2-core CI host).
BUILD_BACKEND = "hatchling>=1.27"


def _install(session: nox.Session, *dists: str) -> None:
    _with_shared_torch(session)
    session.install("-q", BUILD_BACKEND, *TEST_TOOLS)
    session.install("-q", "--no-build-isolation", *(str(ROOT / "packages" / d) for d in dists))


def _pytest(session: nox.Session, *paths: str) -> None:
    session.run("python", "-m", "pytest", "-q", "-p", "no:cacheprovider", *paths, *session.posargs)


for _group in GROUPS:

    @nox.session(name=f"tests-{_group.replace('_', '-')}", tags=["groups"])
    def _tests_group(session: nox.Session, group: str = _group) -> None:
        """One group alone: a fresh venv holding only kernels-jit and this group."""
        _install(session, "kernels-jit", dist_name(group))
        _pytest(session, f"tests/{group}")


@nox.session(name="tests-jit")
def tests_jit(session: nox.Session) -> None:
    """The JIT utility end to end (it builds the reference kernel's CPU and CUDA sources)."""
    _install(session, "kernels-jit", "kernels-elementwise")
    _pytest(session, "tests/jit")


@nox.session(name="tests-ops")
def tests_ops(session: nox.Session) -> None:
    """The umbrella and the repository's invariants, with every distribution installed."""
    _install(session, "kernels-jit", *(dist_name(g) for g in GROUPS), "kernels-ops")
    _pytest(session, "tests/ops")


@nox.session(name="tests", default=False)
def tests(session: nox.Session) -> None:
    """Everything in one venv (quicker locally; CI runs the isolated sessions)."""
    _install(session, "kernels-jit", *(dist_name(g) for g in GROUPS), "kernels-ops")
    _pytest(session, "tests")


@nox.session(default=False)
def check(session: nox.Session) -> None:
    """The main job: install everything and run `kernels-ops check` on the best device present."""
    _install(session, "kernels-jit", *(dist_name(g) for g in GROUPS), "kernels-ops")
    session.run("kernels-ops", "check", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check, ruff format --check, and generated files up to date."""
    session.install("-q", "ruff==0.17.6")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("python", "-m", "shared.release.generate", "--check")


@nox.session
def build(session: nox.Session) -> None:
    """Every sdist and wheel, then a check of what each wheel carries."""
    session.install("-q", "build>=1.2", BUILD_BACKEND)
    out = ROOT / "dist"
    for package in sorted((ROOT / "packages").iterdir()):
        session.run(
            "python",
            "-m",
            "build",
            "--no-isolation",
            "--outdir",
            str(out),
            str(package),
            silent=True,
        )
    session.run("python", "-m", "shared.release.check_wheels", str(out))
