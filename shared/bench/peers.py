"""Peer implementations that benchmarks compare against, each only where it is available, and
the record of which peers ran.

- ``torch_compile``: ``torch.compile`` of the op's torch reference. By default (``--static-compile
  targets``) each target shape (tokens 8192/32768) and decode shape (tokens <= 128) gets a static
  graph of its own (``dynamic=False``, a fresh code object per shape, so no shape reuses another's
  graph); the other shapes share the default automatic-dynamic graph. Every row says which
  (``compile``: ``static`` or ``auto``) and how long its first call took (``compile_s``).
- ``liger``: Liger-Kernel (Triton), where ``liger_kernel`` is importable.
- ``flashinfer``: FlashInfer's CUDA kernels, built from its headers by
  ``shared/bench/build_flashinfer_peer.py`` into ``.peers/flashinfer/flashinfer_<library>.so``
  (``norm_act``: norm and activation; ``sampling``: its sampling module; ``decode``: its paged
  decode attention for bf16, head_dim 128), or into the folder
  named by ``KERNELS_PEER_FLASHINFER``, and loaded with ``tvm_ffi.load_module``.
- ``sglang``: sglang-kernel 0.4.5's sm90 library (``sgl_kernel/sm90/common_ops.abi3.so``, the
  torch-2.11 era release), extracted by ``python -m shared.bench.fetch_peers sglang`` into
  ``.peers/sglang/`` (or the path in ``KERNELS_PEER_SGLANG``) and loaded with
  ``torch.ops.load_library``: its ops are ``torch.ops.sgl_kernel.<op>``.
- ``vllm``: vLLM 0.33.0's stable-ABI libraries (``_C_stable_libtorch.abi3.so``,
  ``_moe_C_stable_libtorch.abi3.so``) in ``.peers/vllm/`` (or ``KERNELS_PEER_VLLM``, a folder),
  each loaded where present (``.xz``-compressed copies are unpacked to /tmp first): ops under
  ``torch.ops._C``, ``torch.ops._moe_C`` and ``torch.ops._C_cache_ops``.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import json
import os
import sys
import time
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from shared.bench.shapes import DECODE_MAX_TOKENS, PREFILL_TOKENS

ROOT = Path(__file__).resolve().parents[2]
PEERS_DIR = ROOT / ".peers"  # ignored: peer binaries and sources never enter the repository
FLASHINFER_ENV = "KERNELS_PEER_FLASHINFER"
FLASHINFER_DEFAULT = PEERS_DIR / "flashinfer"
FLASHINFER_LIBRARIES = ("norm_act", "sampling", "decode")  # build_flashinfer_peer.LIBRARIES
COMPILE_ENV = "KERNELS_BENCH_STATIC_COMPILE"

# --static-compile: which shapes the torch_compile peer compiles with a static graph of their own.
COMPILE_MODES = {
    "targets": "tokens 8192/32768 (the bandwidth targets), tokens <= 128 (decode), 1-D sizes",
    "large": "tokens 8192/32768 and 1-D sizes",
    "all": "every shape",
    "none": "no shape (default torch.compile everywhere)",
}
DEFAULT_COMPILE_MODE = "targets"
_compile_mode = os.environ.get(COMPILE_ENV, DEFAULT_COMPILE_MODE)


def has(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


# --- torch.compile -------------------------------------------------------------------------------


def set_compile_mode(mode: str) -> None:
    global _compile_mode
    if mode not in COMPILE_MODES:
        raise ValueError(f"static-compile mode {mode!r}: choose one of {sorted(COMPILE_MODES)}")
    _compile_mode = mode


def compile_mode() -> str:
    if _compile_mode not in COMPILE_MODES:
        raise ValueError(f"{COMPILE_ENV}={_compile_mode!r}: choose one of {sorted(COMPILE_MODES)}")
    return _compile_mode


def static_compile_wanted(shape: Sequence[int], mode: str | None = None) -> bool:
    """Whether the torch_compile peer at ``shape`` ([tokens, ...]) gets a static graph."""
    mode = mode or compile_mode()
    if mode == "none":
        return False
    if mode == "all" or len(shape) < 2:  # 1-D sizes (add_constant: 6 shapes up to 1 GiB)
        return True
    tokens = shape[0]
    if mode == "large":
        return tokens in PREFILL_TOKENS
    return tokens in PREFILL_TOKENS or tokens <= DECODE_MAX_TOKENS


def compile_note(mode: str | None = None) -> str:
    mode = mode or compile_mode()
    return (
        f"torch_compile is torch.compile(reference); --static-compile {mode}: a static graph per "
        f"shape (dynamic=False, compiled fresh for that shape) at {COMPILE_MODES[mode]}, rows "
        "'compile': 'static'; elsewhere default options, rows 'compile': 'auto' (the first shape "
        "of a reference compiles static, later ones reuse one automatic-dynamic graph, which is "
        "weaker at large shapes); 'compile_s' is the host time of the first call at that shape "
        "(trace and compile), outside the CUDA graph"
    )


def _raise_recompile_limit(limit: int = 64) -> None:
    """Past ``recompile_limit`` (8) cache entries of one function torch.compile silently runs it
    eagerly: allow every shape of a sweep, and fail loudly (a skipped record) past that."""
    import torch._dynamo.config as dynamo

    dynamo.recompile_limit = max(dynamo.recompile_limit, limit)
    dynamo.accumulated_recompile_limit = max(dynamo.accumulated_recompile_limit, 4 * limit)
    dynamo.fail_on_recompile_limit_hit = True


@functools.cache
def compiled(reference: Callable) -> Callable:
    """``torch.compile`` of a reference with default options, one per reference: the first shape
    compiles static, later shapes share an automatic-dynamic graph (the 'auto' rows)."""
    _raise_recompile_limit()
    return torch.compile(reference)


def fresh_copy(fn: Callable, tag: str) -> Callable:
    """``fn`` with a code object of its own: dynamo keeps its graphs (and the recompile count) per
    code object, so a copy compiled for one shape shares nothing with other shapes' copies."""
    code = getattr(fn, "__code__", None)
    if code is None:  # not a plain function: compile it as it is
        return fn
    copy = types.FunctionType(
        code.replace(co_name=f"{code.co_name}__{tag}"),
        fn.__globals__,
        f"{fn.__name__}__{tag}",
        fn.__defaults__,
        fn.__closure__,
    )
    copy.__kwdefaults__ = fn.__kwdefaults__
    copy.__qualname__ = f"{fn.__qualname__}__{tag}"
    copy.__module__ = fn.__module__
    return copy


def static_compiled(reference: Callable, shape: Sequence[int]) -> Callable:
    """A static ``torch.compile`` (``dynamic=False``) of a fresh copy of ``reference``, for one
    shape: it compiles at its first call (the harness's warm-up, outside CUDA-graph capture)."""
    _raise_recompile_limit()
    tag = "x".join(map(str, shape))
    return torch.compile(fresh_copy(reference, tag), dynamic=False)


class CompilePeer:
    """The torch_compile implementation of one case: ``call(fn, inputs)`` runs the compiled
    reference ``fn`` on one input set. ``record_extra`` goes into the case's record."""

    def __init__(
        self,
        reference: Callable,
        shape: Sequence[int],
        call: Callable[[Callable, Any], Any],
        static: bool | None = None,
    ):
        self.static = static_compile_wanted(shape) if static is None else static
        self.reference, self.shape, self.call = reference, list(shape), call
        self.record_extra: dict[str, Any] = {"compile": "static" if self.static else "auto"}
        self._fn: Callable | None = None

    def __call__(self, inputs: Any) -> Any:
        if self._fn is not None:
            return self.call(self._fn, inputs)
        self._fn = (
            static_compiled(self.reference, self.shape) if self.static else compiled(self.reference)
        )
        before = _graph_cache_counts()
        start = time.perf_counter()
        result = self.call(self._fn, inputs)
        self.record_extra["compile_s"] = round(time.perf_counter() - start, 2)
        # Whether inductor's on-disk FX-graph cache served the graphs (shared.bench.precompile
        # fills it): a slow first call with misses after a precompile says the graphs differ.
        after = _graph_cache_counts()
        cache = {k: after[k] - before[k] for k in after}
        self.record_extra["fx_graph_cache"] = cache
        if self.record_extra["compile_s"] > 20:  # shows where a long sweep's time went
            print(
                f"  torch_compile {getattr(self.reference, '__name__', '?')} {self.shape}: first "
                f"call {self.record_extra['compile_s']:.0f} s, fx graph cache "
                + ", ".join(f"{n} {k}" for k, n in cache.items()),
                flush=True,
            )
        return result


def _graph_cache_counts() -> dict[str, int]:
    from torch._dynamo.utils import counters

    graphs = {k: counters["inductor"][f"fxgraph_cache_{k}"] for k in ("hit", "miss", "bypass")}
    aot = {f"aot_{k}": counters["aot_autograd"][f"autograd_cache_{k}"] for k in ("hit", "miss")}
    return graphs | aot


def torch_compile(
    reference: Callable,
    shape: Sequence[int],
    call: Callable[[Callable, Any], Any],
    static: bool | None = None,
) -> CompilePeer:
    """The torch_compile impl of a case at ``shape``; static or auto per ``--static-compile``
    unless ``static`` says."""
    return CompilePeer(reference, shape, call, static)


# --- peers checked against the reference --------------------------------------------------------


class Checked:
    """A peer that is compared with the torch reference at its first call (the harness's warm-up,
    outside capture), on the same inputs: ``expected(inputs)`` runs before the peer (the peer may
    work in place), ``outputs(inputs, returned)`` picks what to compare. A peer whose results
    differ is not timed (the harness reports it skipped), so a wrong binding cannot pass for a
    fast kernel."""

    def __init__(
        self,
        impl: Callable[[Any], Any],
        expected: Callable[[Any], Any],
        outputs: Callable[[Any, Any], Any],
        atol: float = 6e-2,
        rtol: float = 2e-2,
    ):
        self.impl, self.expected, self.outputs = impl, expected, outputs
        self.atol, self.rtol = atol, rtol
        self.record_extra: dict[str, Any] = {}
        self._checked = False

    def __call__(self, inputs: Any) -> Any:
        if self._checked:
            return self.impl(inputs)
        want = _as_tuple(self.expected(inputs))
        returned = self.impl(inputs)
        got = _as_tuple(self.outputs(inputs, returned))
        err = 0.0
        for g, w in zip(got, want, strict=True):
            torch.testing.assert_close(
                g.float(), w.float(), atol=self.atol, rtol=self.rtol, check_device=False
            )
            err = max(err, (g.float() - w.float()).abs().max().item())
        self.record_extra["check_max_abs_err"] = round(err, 5)
        self._checked = True
        return returned


def _as_tuple(value: Any) -> tuple:
    return tuple(value) if isinstance(value, (tuple, list)) else (value,)


# --- FlashInfer ---------------------------------------------------------------------------------

_status: dict[str, dict] = {}
_flashinfer_status: dict[str, dict] = {}  # per library


def flashinfer_path(library: str = "norm_act") -> Path | None:
    """The library to load: ``flashinfer_<library>.so`` in the folder ``$KERNELS_PEER_FLASHINFER``
    (a path to a .so stands for its folder; ``0``/``off`` disables the peer), else in
    ``.peers/flashinfer/``."""
    value = os.environ.get(FLASHINFER_ENV, "")
    if value.lower() in ("0", "off", "no", "false"):
        return None
    folder = Path(value).expanduser().resolve() if value else FLASHINFER_DEFAULT
    if folder.suffix == ".so":
        folder = folder.parent
    return folder / f"flashinfer_{library}.so"


@functools.cache
def flashinfer(library: str = "norm_act") -> Any | None:
    """One of FlashInfer's libraries (a tvm-ffi module), or None when absent.

    ``norm_act`` calls follow its Python wrappers: ``rmsnorm(out, x, w, eps, enable_pdl)``,
    ``fused_add_rmsnorm(x, residual, w, eps, enable_pdl)`` (in place), the ``gemma_`` variants
    alike, ``layernorm(out, x, gamma_fp32, beta_fp32, eps)`` (bf16 x only),
    ``silu_and_mul(out, x, enable_pdl)`` and ``gelu_and_mul``/``gelu_tanh_and_mul``.
    ``sampling`` and ``decode`` calls: see shared/bench/suites/sampling.py and attention.py.
    """
    if library not in FLASHINFER_LIBRARIES:
        raise ValueError(f"flashinfer: unknown library {library!r} ({FLASHINFER_LIBRARIES})")
    path = flashinfer_path(library)
    if path is None:
        _flashinfer_status[library] = {"status": "disabled", "by": f"{FLASHINFER_ENV}=0"}
        return None
    if not path.is_file():
        _flashinfer_status[library] = {
            "status": "absent",
            "looked_for": str(path),
            "hint": "python -m shared.bench.build_flashinfer_peer, then carry .peers/flashinfer",
        }
        if os.environ.get(FLASHINFER_ENV):
            print(f"peers: {path} does not exist: flashinfer {library} skipped")
        return None
    try:
        import tvm_ffi

        module = tvm_ffi.load_module(str(path))
    except Exception as exc:  # a library that does not load is reported, not fatal
        _flashinfer_status[library] = {
            "status": "failed",
            "path": str(path),
            "error": f"{type(exc).__name__}: {exc}"[:500],
        }
        print(f"peers: flashinfer at {path} did not load ({type(exc).__name__}: {exc})")
        return None
    status: dict[str, Any] = {"status": "loaded", "path": str(path)}
    manifest = path.with_suffix(".json")  # written by build_flashinfer_peer.py
    if manifest.is_file():
        info = json.loads(manifest.read_text())
        keys = ("flashinfer_version", "path", "built_with_tvm_ffi", "nvcc", "arch", "cccl")
        status["build"] = {key: info[key] for key in keys if key in info}
    _flashinfer_status[library] = status
    return module


def flashinfer_status() -> dict:
    """The peer's record: that of the first library loaded (else of the first asked for), and
    ``libraries``: each library asked for and its status."""
    if not _flashinfer_status:
        return {"status": "not requested"}
    infos = list(_flashinfer_status.values())
    first = next((i for i in infos if i["status"] == "loaded"), infos[0])
    return dict(first) | {"libraries": {k: v["status"] for k, v in _flashinfer_status.items()}}


def flashinfer_pdl() -> bool:
    """FlashInfer's default ``enable_pdl``: on for sm_90 and newer (``device_support_pdl``)."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


# --- sglang-kernel and vLLM (torch op libraries) ------------------------------------------------

SGLANG_ENV, VLLM_ENV = "KERNELS_PEER_SGLANG", "KERNELS_PEER_VLLM"
SGLANG_DEFAULT = PEERS_DIR / "sglang" / "common_ops.abi3.so"
VLLM_DEFAULT = PEERS_DIR / "vllm"
VLLM_LIBRARIES = ("_C_stable_libtorch.abi3.so", "_moe_C_stable_libtorch.abi3.so")


def _env_path(env: str, default: Path) -> Path | None:
    value = os.environ.get(env, "")
    if value.lower() in ("0", "off", "no", "false"):
        return None
    return Path(value).expanduser().resolve() if value else default


def _load_library(name: str, path: Path) -> bool:
    try:
        torch.ops.load_library(str(path))
    except Exception as exc:  # a library that does not load is reported, not fatal
        _status.setdefault(name, {"status": "failed", "errors": []})["errors"].append(
            f"{path.name}: {type(exc).__name__}: {exc}"[:500]
        )
        print(f"peers: {name} library {path} did not load ({type(exc).__name__}: {exc})")
        return False
    return True


@functools.cache
def sglang() -> Any | None:
    """``torch.ops.sgl_kernel`` from sglang-kernel 0.4.5's sm90 library, or None when absent."""
    path = _env_path(SGLANG_ENV, SGLANG_DEFAULT)
    if path is None or not path.is_file():
        _status["sglang"] = {
            "status": "absent" if path else "disabled",
            "looked_for": str(path),
            "hint": "python -m shared.bench.fetch_peers sglang, then carry .peers/sglang",
        }
        return None
    if not _load_library("sglang", path):
        return None
    _status["sglang"] = {"status": "loaded", "path": str(path), "version": "sglang-kernel 0.4.5"}
    return torch.ops.sgl_kernel


@functools.cache
def vllm() -> Any | None:
    """``torch.ops`` once vLLM 0.33.0's stable-ABI libraries present in the vLLM folder are
    loaded (ops under ``_C``, ``_moe_C``, ``_C_cache_ops``), or None when none is there."""
    folder = _env_path(VLLM_ENV, VLLM_DEFAULT)
    loaded = []
    for name in VLLM_LIBRARIES if folder else ():
        path = folder / name
        packed = folder / f"{name}.xz"
        if not path.is_file() and packed.is_file():
            import lzma

            path = Path("/tmp/kernels-peers-vllm") / name
            if not path.is_file():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(lzma.decompress(packed.read_bytes()))
        if path.is_file() and _load_library("vllm", path):
            loaded.append(name)
    if not loaded:
        _status.setdefault("vllm", {"status": "absent", "looked_for": str(folder)})
        return None
    _status["vllm"] = {"status": "loaded", "libraries": loaded, "version": "vllm 0.33.0"}
    return torch.ops


# --- Triton peers as source ----------------------------------------------------------------------

# The impl name of each source peer: the release it is cut from and its cuts under .peers/.
SOURCE_PEERS = {
    "vllm_triton": ("vLLM 0.33.0", ("vllm_fused_moe", "vllm_decode_attention")),
    "sglang_triton": ("sglang 0.5.23", ("sglang_memory",)),
}


def source_path(name: str) -> Path:
    """Where ``shared.bench.fetch_peers <name>`` puts a source peer's cut."""
    return PEERS_DIR / name / "kernel.py"


@functools.cache
def peer_source(name: str, entry: str) -> types.ModuleType | None:
    """The peer source that ``shared.bench.fetch_peers <name>`` cut into
    ``.peers/<name>/kernel.py``, imported as a module of its own, or None where it is absent,
    does not load or lacks ``entry`` (a peer's function or kernel the suite calls)."""
    path = source_path(name)
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location(f"kernels_peer_{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # triton reads the kernels' source through their module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:  # a source the cut cannot load is reported absent
        sys.modules.pop(spec.name, None)
        print(f"peer {name}: {path} does not load ({type(exc).__name__}: {exc})")
        return None
    return module if hasattr(module, entry) else None


# --- what ran ------------------------------------------------------------------------------------


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def describe(ran: set[str] | None = None) -> dict:
    """Every known peer: available or not (and why), its version, and whether it has records in
    this result (``ran``: the impl names that produced records)."""
    ran = ran or set()
    liger = _version("liger-kernel") if has("liger_kernel") else None
    peers = {
        "torch_eager": {"status": "loaded", "version": torch.__version__},
        "torch_compile": {
            "status": "loaded",
            "version": torch.__version__,
            "static_compile": compile_mode(),
            "static_at": COMPILE_MODES[compile_mode()],
        },
        "liger": {"status": "loaded", "version": liger}
        if liger or has("liger_kernel")
        else {"status": "absent"},
        "flashinfer": flashinfer_status(),
        "sglang": dict(_status.get("sglang", {"status": "not requested"})),
        "vllm": dict(_status.get("vllm", {"status": "not requested"})),
    }
    for impl, (release, names) in SOURCE_PEERS.items():
        cuts = [n for n in names if source_path(n).is_file()]
        peers[impl] = (
            {"status": "found", "version": release, "cuts": cuts} if cuts else {"status": "absent"}
        )
    for name, info in peers.items():
        info["ran"] = name in ran
    return peers
