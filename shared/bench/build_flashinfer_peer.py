"""Build FlashInfer's CUDA kernels into tvm-ffi libraries, benchmark peers: norm and activation
(``flashinfer_norm_act.so``), sampling (``flashinfer_sampling.so``) and paged decode attention
(``flashinfer_decode.so``).

    python -m shared.bench.build_flashinfer_peer [--library norm_act sampling decode] [--jobs 8]

No GPU is needed: run it on the CPU machine (nvcc 13 and apache-tvm-ffi installed) and carry the
result to the H200, where FlashInfer itself cannot be imported (GPU.md, "Peers on the H200").
Steps, all under the ignored folder ``.peers/`` (FlashInfer's code is never committed here):

1. ``pip download --no-deps`` the flashinfer-python wheel into ``.peers/build/flashinfer/``;
2. unpack ``flashinfer/data/include/flashinfer/`` (its header-only kernels), its vendored CCCL,
   ``tvm_ffi_utils.h`` and each library's entry points, the sources of one of its JIT modules
   (exported with ``TVM_FFI_DLL_EXPORT_TYPED_FUNC``): ``norm`` (``norm.cu`` +
   ``flashinfer_norm_binding.cu``) plus the ``*_and_mul`` sources rendered from the template in
   ``flashinfer/jit/activation.py`` exactly as its JIT does (silu, gelu, gelu_tanh); ``sampling``
   (``sampling.cu``, ``renorm.cu``, ``flashinfer_sampling_binding.cu``, as
   ``jit/sampling.py: gen_sampling_module``); ``decode``: the batch decode module that
   ``BatchDecodeWithPagedKVCacheWrapper.plan`` builds for bf16 q/kv/o, int32 indices, head_dim
   128 (``DECODE_URI``), its jinja templates rendered with jinja2 from the kwargs of
   ``jit/attention/modules.py: gen_customize_batch_decode_module``, with FlashInfer's own dtype
   maps and ``generate_additional_params`` (its JIT helper files import only torch);
3. compile them for sm_90a with the flags its JIT passes (``jit/core.py: gen_jit_spec``: -O3,
   -use_fast_math, -DNDEBUG, the FLASHINFER_ENABLE_* dtype switches, plus the norm module's
   -DENABLE_BF16 -DENABLE_FP8) and its include order (``jit/cpp_ext.py``: the vendored CCCL
   before the toolkit's), against the installed apache-tvm-ffi's headers. Sampling draws with
   cuRAND's Philox (device functions, header-only): where the toolkit lacks cuRAND's headers they
   come from the ``nvidia-curand`` wheel of the toolkit's CUDA release. Headers that no library
   uses anything from (cuBLAS, and cuRAND for norm/act) get empty stubs where the toolkit lacks
   them;
4. link ``.peers/flashinfer/flashinfer_<library>.so`` (cudart static, ``-ltvm_ffi``, like the
   project's own JIT modules) and write ``flashinfer_<library>.json`` beside it: versions, flags
   and the exported functions, which the benchmark records.

Carry ``.peers/flashinfer`` to the device (a few MB); ``shared/bench/peers.py`` finds the
libraries there or in the folder that ``KERNELS_PEER_FLASHINFER`` names. This is FlashInfer's CUDA
path (``FLASHINFER_USE_CUDA_NORM=1``); its default Hopper norms are CuTe-DSL, not built here.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / ".peers"
OUT_DIR = PEERS / "flashinfer"
BUILD_DIR = PEERS / "build" / "flashinfer"
VERSION = "0.7.2.post1"  # reference/peers-and-targets.md section 1
# cuRAND of CUDA 13.0 (nvcc's release here), for its device headers only (the wheel's
# libcurand.so is not used: Philox is header-only).
CURAND_VERSION = "10.4.0.35"
ACTIVATIONS = ("silu", "gelu", "gelu_tanh")
NORM_FUNCTIONS = (
    "rmsnorm",
    "fused_add_rmsnorm",
    "gemma_rmsnorm",
    "gemma_fused_add_rmsnorm",
    "layernorm",
)
# Every function of flashinfer_sampling_binding.cu (its JIT module exports them all).
SAMPLING_FUNCTIONS = (
    "softmax",
    "sampling_from_probs",
    "sampling_from_logits",
    "top_k_sampling_from_probs",
    "min_p_sampling_from_probs",
    "top_p_sampling_from_probs",
    "top_k_top_p_sampling_from_probs",
    "top_k_renorm_probs",
    "top_p_renorm_probs",
    "top_k_mask_logits",
    "chain_speculative_sampling",
)
GENCODE = "-gencode=arch=compute_90a,code=sm_90a"
# What flashinfer/jit/core.py (gen_jit_spec, use_fast_math=True, not debug) and cpp_ext.py pass
# to nvcc for every module; without the FLASHINFER_ENABLE_* switches every bf16 call fails to
# dispatch.
COMMON_FLAGS = (
    "-std=c++17",
    "-use_fast_math",
    "-Xfatbin=-compress-all",
    "--compress-mode=size",
    "-DFLASHINFER_ENABLE_F16",
    "-DFLASHINFER_ENABLE_BF16",
    "-DFLASHINFER_ENABLE_FP8_E4M3",
    "-DFLASHINFER_ENABLE_FP8_E5M2",
    "-DNDEBUG",
    "-O3",
    "--compiler-options=-fPIC",
    "--expt-relaxed-constexpr",
    "-static-global-template-stub=false",
    "-DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED",
    "-DFLASHINFER_ENABLE_FP8_E8M0",
    "-DFLASHINFER_ENABLE_FP4_E2M1",
)
# jit/env.py: CCCL_INCLUDE_DIRS, put before the toolkit's CCCL with -I (jit/cpp_ext.py)
CCCL_DIRS = ("cccl/cub", "cccl/libcudacxx/include", "cccl/thrust")
STUB_HEADERS = ("cublasLt.h", "cublas_v2.h", "curand_kernel.h")
CURAND_HEADER = "curand_kernel.h"


# The wheel's files the libraries need: headers, entry points, templates and the JIT's Python
# files whose strings and helpers render them.
WHEEL_MEMBERS = (
    "flashinfer/data/include/flashinfer/",
    # only the header trees of the three CCCL folders
    "flashinfer/data/cccl/cub/cub/",
    "flashinfer/data/cccl/libcudacxx/include/",
    "flashinfer/data/cccl/thrust/thrust/",
    "flashinfer/data/csrc/norm.cu",
    "flashinfer/data/csrc/flashinfer_norm_binding.cu",
    "flashinfer/data/csrc/sampling.cu",
    "flashinfer/data/csrc/renorm.cu",
    "flashinfer/data/csrc/flashinfer_sampling_binding.cu",
    "flashinfer/data/csrc/sampling_utils.h",
    "flashinfer/data/csrc/batch_decode.cu",
    "flashinfer/data/csrc/batch_decode_jit_binding.cu",
    "flashinfer/data/csrc/batch_decode_customize_config.jinja",
    "flashinfer/data/csrc/batch_decode_kernel_inst.jinja",
    "flashinfer/data/csrc/tvm_ffi_utils.h",
    "flashinfer/jit/activation.py",
    "flashinfer/jit/utils.py",
    "flashinfer/jit/attention/utils.py",
    "flashinfer/__init__.py",
)


def log(message: str) -> None:
    print(f"build_flashinfer_peer: {message}", flush=True)


def download(dist: str, version: str, wheel_dir: Path, size: str) -> Path:
    """The wheel of ``dist==version`` in ``wheel_dir``, fetched with ``pip download`` once."""
    pattern = f"{dist.replace('-', '_')}-{version}-*.whl"
    found = sorted(wheel_dir.glob(pattern))
    if not found:
        log(f"downloading {dist}=={version} (about {size})")
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary=:all:",
                "-q",
                "-d",
                str(wheel_dir),
                f"{dist}=={version}",
            ],
            check=True,
        )
        found = sorted(wheel_dir.glob(pattern))
    if not found:
        raise SystemExit(f"no {pattern} in {wheel_dir} after pip download")
    return found[-1]


def unpack(wheel: Path, dest: Path) -> Path:
    """Extract only the headers and entry points; returns the folder holding ``flashinfer/``."""
    if dest.exists():
        shutil.rmtree(dest)
    with zipfile.ZipFile(wheel) as archive:
        names = [n for n in archive.namelist() if n.startswith(WHEEL_MEMBERS)]
        missing = [m for m in WHEEL_MEMBERS if not any(n.startswith(m) for n in names)]
        if missing:
            raise SystemExit(f"{wheel.name} lacks {missing}: the recipe needs updating")
        archive.extractall(dest, members=names)
    return dest


def _string_constants(path: Path) -> dict[str, object]:
    """Module-level constants of a Python file, read without importing it (its imports need the
    whole flashinfer package)."""
    constants = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                try:
                    constants[target.id] = ast.literal_eval(node.value)
                except ValueError:
                    # dicts of names (act_func_def_str): resolve their values by name
                    if isinstance(node.value, ast.Dict):
                        constants[target.id] = {
                            ast.literal_eval(k): constants[v.id]
                            for k, v in zip(node.value.keys, node.value.values, strict=True)
                            if isinstance(v, ast.Name) and k is not None
                        }
    return constants


def render_activation(template: str, act: str, act_def: str) -> str:
    """What ``jit/activation.py: get_act_and_mul_cu_str`` renders with jinja2, for the three
    placeholders its template uses (checked: nothing else may remain)."""
    func_name = f"{act}_and_mul"
    text = re.sub(r"\{%\s*set func_name = act_func_name ~ '_and_mul'\s*%\}", "", template)
    text = re.sub(r"\{\{\s*func_name\s*\}\}", func_name, text)
    text = re.sub(r"\{\{\s*act_func_name\s*\}\}", act, text)
    text = re.sub(r"\{\{\s*act_func_def\s*\}\}", lambda _: act_def, text)
    if "{{" in text or "{%" in text:
        raise SystemExit("flashinfer's activation template changed: unrendered placeholders left")
    return text


def activation_sources(src: Path, gen: Path) -> list[Path]:
    constants = _string_constants(src / "flashinfer" / "jit" / "activation.py")
    template = constants["activation_templ"]
    defs = constants["act_func_def_str"]
    gen.mkdir(parents=True, exist_ok=True)
    sources = []
    for act in ACTIVATIONS:
        path = gen / f"{act}_and_mul.cu"
        path.write_text(render_activation(template, act, defs[act]))
        sources.append(path)
    return sources


# The decode module that BatchDecodeWithPagedKVCacheWrapper.plan builds by default
# (use_tensor_cores False) for Llama GQA: bf16 q/kv/o, int32 indices, head_dim 128, no positional
# encoding, no sliding window (window_left -1), no logits cap.
DECODE_URI = (
    "batch_decode_with_kv_cache_dtype_q_bf16_dtype_kv_bf16_dtype_o_bf16_dtype_idx_i32_"
    "head_dim_qk_128_head_dim_vo_128_posenc_0_use_swa_False_use_logits_cap_False"
)
DECODE_FUNCTIONS = ("plan", "workspace_size", "run")


def _load(path: Path, name: str):
    """A FlashInfer JIT helper file that imports only torch, loaded without its package."""
    spec = importlib.util.spec_from_file_location(f"kernels_peer_fi_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def decode_sources(src: Path, gen: Path) -> list[Path]:
    """What ``jit/attention/modules.py: gen_batch_decode_module`` writes for ``DECODE_URI``: its
    kwargs (FlashInfer's own dtype maps and ``generate_additional_params``), the two jinja
    templates rendered with jinja2 as its JIT does, and the copied ``batch_decode.cu`` and binding
    beside the generated ``batch_decode_config.inc`` they include."""
    import jinja2
    import torch

    jit, csrc = src / "flashinfer" / "jit", src / "flashinfer" / "data" / "csrc"
    utils = _load(jit / "utils.py", "jit_utils")
    decl, func_params, setter = _load(
        jit / "attention" / "utils.py", "attention_utils"
    ).generate_additional_params(
        ["maybe_alibi_slopes"],
        ["float"],
        ["logits_soft_cap", "sm_scale", "rope_rcp_scale", "rope_rcp_theta"],
        ["double", "double", "double", "double"],
    )
    pos_encoding_mode, use_sliding_window, use_logits_soft_cap = 0, False, False
    kwargs = {
        "additional_params_decl": decl,
        "additional_func_params": func_params,
        "additional_params_setter": setter,
        "variant_decl": "#include<flashinfer/attention/variants.cuh>",
        "variant_name": f"DefaultAttention<false, {str(use_sliding_window).lower()}, "
        f"{str(use_logits_soft_cap).lower()}, {str(pos_encoding_mode == 2).lower()}>",
        "dtype_q": utils.dtype_map[torch.bfloat16],
        "dtype_kv": utils.dtype_map_kv[torch.bfloat16],
        "dtype_o": utils.dtype_map[torch.bfloat16],
        "idtype": utils.dtype_map[torch.int32],
        "head_dim_qk": 128,
        "head_dim_vo": 128,
        "pos_encoding_mode": utils.pos_encoding_mode_literal[pos_encoding_mode],
        "use_sliding_window": str(use_sliding_window).lower(),
        "use_logits_soft_cap": str(use_logits_soft_cap).lower(),
    }
    gen = gen / DECODE_URI
    gen.mkdir(parents=True, exist_ok=True)

    def render(template: str) -> str:
        return jinja2.Template((csrc / template).read_text()).render(**kwargs)

    (gen / "batch_decode_config.inc").write_text(render("batch_decode_customize_config.jinja"))
    (gen / "batch_decode_kernel.cu").write_text(render("batch_decode_kernel_inst.jinja"))
    for name in ("batch_decode.cu", "batch_decode_jit_binding.cu"):
        shutil.copyfile(csrc / name, gen / name)
    return [
        gen / n
        for n in ("batch_decode_kernel.cu", "batch_decode.cu", "batch_decode_jit_binding.cu")
    ]


@dataclass(frozen=True)
class Library:
    """One library: the sources of one FlashInfer JIT module (``csrc`` from ``data/csrc``, and
    what ``generate(src, folder)`` renders as its JIT would), compiled with its
    ``extra_cuda_cflags``; ``functions`` must all be exported."""

    functions: tuple[str, ...]
    csrc: tuple[str, ...] = ()
    generate: Callable[[Path, Path], list[Path]] | None = None
    flags: tuple[str, ...] = ()
    curand: bool = False  # uses cuRAND's Philox: the real headers, never a stub
    note: str = ""


LIBRARIES = {
    "norm_act": Library(
        functions=(*NORM_FUNCTIONS, *(f"{a}_and_mul" for a in ACTIVATIONS)),
        csrc=("norm.cu", "flashinfer_norm_binding.cu"),
        generate=activation_sources,
        flags=("-DENABLE_BF16", "-DENABLE_FP8"),  # jit/norm.py
        note="CUDA (FLASHINFER_USE_CUDA_NORM=1), not the CuTe-DSL Hopper default",
    ),
    "sampling": Library(
        functions=SAMPLING_FUNCTIONS,
        csrc=("sampling.cu", "renorm.cu", "flashinfer_sampling_binding.cu"),
        curand=True,
        note="CUDA sampling module (jit/sampling.py: gen_sampling_module)",
    ),
    # _fa2_head_dim_nvcc_flags adds no flags at head_dim 128
    "decode": Library(
        functions=DECODE_FUNCTIONS,
        generate=decode_sources,
        note=f"FA2 paged decode module {DECODE_URI} (jit/attention/modules.py)",
    ),
}


def toolkit_include(nvcc: str) -> Path:
    """The CUDA toolkit's include folder, as nvcc itself reports it (``nvcc`` may be a wrapper
    script outside the toolkit)."""
    dry = subprocess.run(
        [nvcc, "-dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
        capture_output=True,
        text=True,
    )
    found = re.search(r'INCLUDES="-I([^"]+?)"', dry.stdout + dry.stderr)
    if found is None:
        raise SystemExit(f"{nvcc} -dryrun names no include folder")
    return Path(found.group(1).strip()).resolve()


def curand_headers(toolkit: Path, wheel_dir: Path, build: Path) -> tuple[Path | None, str]:
    """The folder of cuRAND's headers to add (None: the toolkit has them) and where they are
    from. FlashInfer's JIT finds them in ``$CUDA_HOME/include``; a toolkit installed without
    cuRAND gets those of the ``nvidia-curand`` wheel of its release."""
    if (toolkit / CURAND_HEADER).exists():
        return None, f"toolkit {toolkit}"
    wheel = download("nvidia-curand", CURAND_VERSION, wheel_dir, "60 MB")
    dest = build / "curand" / "include"
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as archive:
        headers = [
            n for n in archive.namelist() if re.fullmatch(r"nvidia/cu\d+/include/[^/]+\.h", n)
        ]
        for name in headers:
            (dest / Path(name).name).write_bytes(archive.read(name))
    if not (dest / CURAND_HEADER).exists():
        raise SystemExit(f"{wheel.name} has no {CURAND_HEADER}: the recipe needs updating")
    return dest, wheel.name


def stub_dir(toolkit: Path, build: Path, provided: tuple[Path, ...]) -> Path:
    """Empty headers for those of ``STUB_HEADERS`` found neither in the toolkit nor in
    ``provided`` folders: trtllm's cudaUtils.h includes them for declarations the norm and
    activation kernels never use."""
    stubs = build / "stubs"
    if stubs.exists():
        shutil.rmtree(stubs)
    stubs.mkdir(parents=True)
    for header in STUB_HEADERS:
        if not any((folder / header).exists() for folder in (toolkit, *provided)):
            (stubs / header).write_text(
                f"// empty stub: {header} is not in this CUDA toolkit and the kernels built "
                "with it use nothing from it\n"
            )
    return stubs


def compile_all(
    nvcc: str, sources: list[Path], flags: list[str], objs: Path, jobs: int
) -> list[Path]:
    objs.mkdir(parents=True, exist_ok=True)

    def one(source: Path) -> Path:
        obj = objs / (source.stem + ".o")
        cmd = [nvcc, *flags, "-c", str(source), "-o", str(obj)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            sys.stderr.write(done.stdout + done.stderr)
            raise SystemExit(f"nvcc failed on {source.name}")
        log(f"compiled {source.name}")
        return obj

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        return list(pool.map(one, sources))


def exported(library: Path) -> list[str]:
    """Names exported with TVM_FFI_DLL_EXPORT_TYPED_FUNC (symbols ``__tvm_ffi_<name>``)."""
    nm = subprocess.run(
        ["nm", "-D", "--defined-only", str(library)], capture_output=True, text=True, check=True
    )
    return sorted(
        line.split()[-1].removeprefix("__tvm_ffi_")
        for line in nm.stdout.splitlines()
        if line.split() and line.split()[-1].startswith("__tvm_ffi_")
    )


def needed(library: Path) -> list[str]:
    dump = subprocess.run(
        ["objdump", "-p", str(library)], capture_output=True, text=True, check=True
    )
    return [line.split()[-1] for line in dump.stdout.splitlines() if "NEEDED" in line]


def cccl_version(src: Path) -> str:
    header = src / "flashinfer/data/cccl/libcudacxx/include/cuda/std/__cccl/version.h"
    found = re.search(r"#define CCCL_VERSION (\d+)", header.read_text())
    if found is None:
        return "?"
    v = int(found.group(1))
    return f"{v // 1000000}.{v // 1000 % 1000}.{v % 1000}"


def build(
    name: str, args: argparse.Namespace, wheel: Path, src: Path, toolkit: Path, nvcc_version: str
) -> Path:
    """Compile, link and check ``flashinfer_<name>.so``; write its manifest; return its path."""
    from tvm_ffi import __version__ as tvm_ffi_version
    from tvm_ffi import libinfo

    lib = LIBRARIES[name]
    work = args.build / name
    data = src / "flashinfer" / "data"
    sources = [data / "csrc" / f for f in lib.csrc]
    if lib.generate is not None:
        sources += lib.generate(src, work / "generated")
    curand, curand_from = (
        curand_headers(toolkit, args.build / "wheel", args.build) if lib.curand else (None, "")
    )
    stubs = stub_dir(toolkit, work, (curand,) if curand else ())
    flags = [
        *COMMON_FLAGS,
        *lib.flags,
        GENCODE,
        *(f"-I{data / d}" for d in CCCL_DIRS),
        f"-I{data / 'include'}",
        f"-I{data / 'csrc'}",
        f"-I{libinfo.find_include_path()}",
        f"-I{libinfo.find_dlpack_include_path()}",
        *(["-isystem", str(curand)] if curand else []),
        "-Xcompiler",
        "-idirafter",
        "-Xcompiler",
        str(stubs),
    ]
    objects = compile_all(args.nvcc, sources, flags, work / "obj", args.jobs)
    args.out.mkdir(parents=True, exist_ok=True)
    library = args.out / f"flashinfer_{name}.so"
    tvm_lib = Path(libinfo.find_libtvm_ffi()).parent
    subprocess.run(
        [
            args.nvcc,
            "-shared",
            GENCODE,
            *map(str, objects),
            "-o",
            str(library),
            f"-L{tvm_lib}",
            "-ltvm_ffi",
        ],
        check=True,
    )
    functions = exported(library)
    absent = [f for f in lib.functions if f not in functions]
    if absent:
        raise SystemExit(f"{library} does not export {absent}")
    manifest = {
        "peer": "flashinfer",
        "library": name,
        "flashinfer_version": args.version,
        "wheel": wheel.name,
        "path": lib.note,
        "sources": [s.name for s in sources],
        "built_with_tvm_ffi": tvm_ffi_version,
        "nvcc": nvcc_version,
        "arch": GENCODE,
        "flags": [*COMMON_FLAGS, *lib.flags],
        "cccl": f"flashinfer's vendored CCCL {cccl_version(src)}",
        **({"curand_headers": curand_from} if lib.curand else {}),
        "stubbed_headers": sorted(p.name for p in stubs.glob("*.h")),
        "needed": needed(library),
        "functions": functions,
        "bytes": library.stat().st_size,
    }
    library.with_suffix(".json").write_text(json.dumps(manifest, indent=1) + "\n")
    log(
        f"wrote {library} ({library.stat().st_size / 2**20:.1f} MiB; needs "
        f"{', '.join(manifest['needed'])}; exports {', '.join(lib.functions)})"
    )
    return library


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default=VERSION, help="flashinfer-python version")
    parser.add_argument(
        "--library",
        nargs="+",
        choices=sorted(LIBRARIES),
        default=list(LIBRARIES),
        help="which libraries to build (default: all)",
    )
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="folder of the .so to carry")
    parser.add_argument("--build", type=Path, default=BUILD_DIR, help="wheels, sources, objects")
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1))
    parser.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    args = parser.parse_args(argv)

    wheel = download("flashinfer-python", args.version, args.build / "wheel", "62 MB")
    src = unpack(wheel, args.build / "src")
    toolkit = toolkit_include(args.nvcc)
    nvcc_version = subprocess.run(
        [args.nvcc, "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    for name in args.library:
        build(name, args, wheel, src, toolkit, nvcc_version.splitlines()[-1])
    log(f"carry {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
