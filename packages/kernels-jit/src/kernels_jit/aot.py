"""Ahead-of-time builds: precompile modules for chosen archs into the current cache directory.

The cache directory (``KERNELS_CACHE_DIR``) can then be shipped to machines without nvcc and used
there with ``KERNELS_NO_JIT=1``: a module is found by its source key where no compiler exists to
compute the full key (see :func:`kernels_jit.cache.find_prebuilt`).

Each CUDA module is built once per arch, into that arch's directory (``sm_90a/``, ``sm_100a/``),
which is where a process on such a GPU looks for it; a CPU module is built once. Builds run in
parallel threads (each drives its own ninja), bounded by ``jobs``.
"""

from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor, as_completed
from pathlib import Path

from kernels_jit import arch, loader, settings
from kernels_jit.errors import PrecompileError
from kernels_jit.module import ModuleSpec

Task = tuple[ModuleSpec, str | None]


def _label(task: Task) -> str:
    spec, target = task
    return f"{spec.package}:{spec.uri}" + (f" [{target}]" if target else "")


def plan(modules: list[ModuleSpec], archs: list[str] | None = None) -> list[Task]:
    """The (module, arch) builds :func:`precompile` runs, in order, without duplicates.

    ``archs`` None: the archs of ``KERNELS_CUDA_ARCH``, else the GPU's. CPU modules get None.
    """
    if archs is not None:
        targets = tuple(sorted({arch.normalize_cuda_arch(a) for a in archs}))
        if not targets:
            raise ValueError("precompile(archs=[]): give at least one CUDA arch, or None")
    elif any(m.device == "cuda" for m in modules):
        targets = arch.cuda_archs()
    else:
        targets = ()
    tasks: dict[Task, None] = {}
    for spec in modules:
        if spec.device == "cpu":
            tasks.setdefault((spec, None), None)
        else:
            for target in targets:
                tasks.setdefault((spec, target), None)
    return list(tasks)


def _build(task: Task) -> Path:
    spec, target = task
    if target is None:
        return loader.ensure_built(spec)
    with arch.targeting([target]):
        return loader.ensure_built(spec)


def precompile(
    modules: list[ModuleSpec],
    archs: list[str] | None = None,
    jobs: int | None = None,
    *,
    progress: bool = True,
) -> list[Path]:
    """Build every module (CUDA ones for each of ``archs``, CPU ones once) into the cache.

    Parameters
    ----------
    modules : the modules to build (e.g. ``declared_modules("kernels_elementwise")``).
    archs : CUDA archs in any spelling (``sm_90a``, ``9.0a``, ``100a``); None: KERNELS_CUDA_ARCH,
        else the GPU's.
    jobs : parallel builds; None: ``settings.max_jobs()`` (KERNELS_MAX_JOBS, else min(cores, 8)).
    progress : show a rich progress bar on stderr.

    Returns the artifact paths, one per (module, arch), in :func:`plan` order. Modules already
    built are not rebuilt. Every build runs even when some fail; then :class:`PrecompileError`
    lists all failures, each with its compiler output and command.
    """
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    if jobs is None:
        jobs = settings.max_jobs()
    if not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"precompile(jobs={jobs!r}): jobs must be a positive integer")
    tasks = plan(modules, archs)
    if not tasks:
        return []
    results: dict[int, Path] = {}
    failures: list[tuple[int, BaseException]] = []
    console = Console(stderr=True)
    columns = (
        SpinnerColumn(),
        TextColumn("[progress.description]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=console, disable=not progress) as bar:
        overall = bar.add_task(f"precompiling into {settings.cache_dir()}", total=len(tasks))
        pool = ThreadPoolExecutor(max_workers=min(jobs, len(tasks)), thread_name_prefix="aot")
        try:
            futures: dict[Future[Path], int] = {
                pool.submit(_build, task): i for i, task in enumerate(tasks)
            }
            for future in as_completed(futures):
                index = futures[future]
                try:
                    results[index] = future.result()
                except Exception as exc:
                    failures.append((index, exc))
                    bar.console.print(f"[red]failed[/red] {_label(tasks[index])}")
                bar.advance(overall)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
    if failures:
        failures.sort(key=lambda failure: failure[0])
        console.print(
            f"[red]{len(failures)} of {len(tasks)} build(s) failed:[/red] "
            + ", ".join(_label(tasks[i]) for i, _ in failures)
        )
        raise PrecompileError([(_label(tasks[i]), exc) for i, exc in failures])
    return [results[i] for i in range(len(tasks))]
