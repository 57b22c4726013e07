"""Build FlashInfer's CUDA norm and activation kernels into one tvm-ffi library, a benchmark peer.

    python -m shared.bench.build_flashinfer_peer [--version 0.7.2.post1] [--jobs 8]

No GPU is needed: run it on the CPU machine (nvcc 13 and apache-tvm-ffi installed) and carry the
result to the H200, where FlashInfer itself cannot be imported (GPU.md, "Peers on the H200").
Steps, all under the ignored folder ``.peers/`` (FlashInfer's code is never committed here):

1. ``pip download --no-deps`` the flashinfer-python wheel into ``.peers/build/flashinfer/``;
2. unpack ``flashinfer/data/include/flashinfer/`` (its header-only kernels), the entry points
   ``data/csrc/norm.cu`` + ``flashinfer_norm_binding.cu`` (exported with
   ``TVM_FFI_DLL_EXPORT_TYPED_FUNC``, as its ``norm`` JIT module) and ``tvm_ffi_utils.h``, and
   render the ``*_and_mul`` sources from the template in ``flashinfer/jit/activation.py`` exactly
   as its JIT does (silu, gelu, gelu_tanh);
3. compile them for sm_90a with the flags its JIT passes (``jit/core.py: gen_jit_spec``: -O3,
   -use_fast_math, -DNDEBUG, the FLASHINFER_ENABLE_* dtype switches, plus the norm module's
   -DENABLE_BF16 -DENABLE_FP8), against the installed apache-tvm-ffi's headers, with empty stub
   headers for the cuBLAS/cuRAND headers the toolkit lacks (only declarations nobody uses);
4. link ``.peers/flashinfer/flashinfer_norm_act.so`` (cudart static, ``-ltvm_ffi``, like the
   project's own JIT modules) and write ``flashinfer_norm_act.json`` beside it: versions, flags
   and the exported functions, which the benchmark records.

Carry ``.peers/flashinfer`` to the device (a few MB); ``shared/bench/peers.py`` finds the library
there or through ``KERNELS_PEER_FLASHINFER=<path to the .so>``. This is FlashInfer's CUDA path
(``FLASHINFER_USE_CUDA_NORM=1``); its default Hopper norms are CuTe-DSL, not built here.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PEERS = ROOT / ".peers"
OUT_DIR = PEERS / "flashinfer"
BUILD_DIR = PEERS / "build" / "flashinfer"
LIBRARY = "flashinfer_norm_act.so"
VERSION = "0.7.2.post1"  # reference/peers-and-targets.md section 1
ACTIVATIONS = ("silu", "gelu", "gelu_tanh")
NORM_FUNCTIONS = (
    "rmsnorm",
    "fused_add_rmsnorm",
    "gemma_rmsnorm",
    "gemma_fused_add_rmsnorm",
    "layernorm",
)
GENCODE = "-gencode=arch=compute_90a,code=sm_90a"
# What flashinfer/jit/core.py (gen_jit_spec, use_fast_math=True, not debug) and cpp_ext.py pass
# to nvcc for every module, then what jit/norm.py adds; without the FLASHINFER_ENABLE_* switches
# every bf16 call fails to dispatch.
JIT_FLAGS = (
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
    "-DENABLE_BF16",
    "-DENABLE_FP8",
)
STUB_HEADERS = ("cublasLt.h", "cublas_v2.h", "curand_kernel.h")
WHEEL_MEMBERS = (
    "flashinfer/data/include/flashinfer/",
    "flashinfer/data/csrc/norm.cu",
    "flashinfer/data/csrc/flashinfer_norm_binding.cu",
    "flashinfer/data/csrc/tvm_ffi_utils.h",
    "flashinfer/jit/activation.py",
    "flashinfer/__init__.py",
)


def log(message: str) -> None:
    print(f"build_flashinfer_peer: {message}", flush=True)


def download(version: str, wheel_dir: Path) -> Path:
    pattern = f"flashinfer_python-{version}-*.whl"
    found = sorted(wheel_dir.glob(pattern))
    if not found:
        log(f"downloading flashinfer-python=={version} (about 62 MB)")
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
                f"flashinfer-python=={version}",
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


def stub_dir(nvcc: str, build: Path) -> Path:
    """Empty headers for those of ``STUB_HEADERS`` that the toolkit does not have: trtllm's
    cudaUtils.h includes them for declarations the norm kernels never use."""
    toolkit_include = Path(nvcc).resolve().parent.parent / "include"
    stubs = build / "stubs"
    stubs.mkdir(parents=True, exist_ok=True)
    for header in STUB_HEADERS:
        if not (toolkit_include / header).exists():
            (stubs / header).write_text(
                f"// empty stub: {header} is not in this CUDA toolkit and the norm and activation "
                "kernels use nothing from it\n"
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--version", default=VERSION, help="flashinfer-python version")
    parser.add_argument("--out", type=Path, default=OUT_DIR, help="folder of the .so to carry")
    parser.add_argument("--build", type=Path, default=BUILD_DIR, help="wheel, sources, objects")
    parser.add_argument("--jobs", type=int, default=min(8, os.cpu_count() or 1))
    parser.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    args = parser.parse_args(argv)

    import tvm_ffi
    from tvm_ffi import libinfo

    wheel = download(args.version, args.build / "wheel")
    src = unpack(wheel, args.build / "src")
    data = src / "flashinfer" / "data"
    sources = [data / "csrc" / "norm.cu", data / "csrc" / "flashinfer_norm_binding.cu"]
    sources += activation_sources(src, args.build / "generated")
    stubs = stub_dir(args.nvcc, args.build)
    flags = [
        *JIT_FLAGS,
        GENCODE,
        f"-I{data / 'include'}",
        f"-I{data / 'csrc'}",
        f"-I{libinfo.find_include_path()}",
        f"-I{libinfo.find_dlpack_include_path()}",
        "-Xcompiler",
        "-idirafter",
        "-Xcompiler",
        str(stubs),
    ]
    objects = compile_all(args.nvcc, sources, flags, args.build / "obj", args.jobs)
    args.out.mkdir(parents=True, exist_ok=True)
    library = args.out / LIBRARY
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
    wanted = [*NORM_FUNCTIONS, *(f"{a}_and_mul" for a in ACTIVATIONS)]
    absent = [f for f in wanted if f not in functions]
    if absent:
        raise SystemExit(f"{library} does not export {absent}")
    nvcc_version = subprocess.run(
        [args.nvcc, "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    manifest = {
        "peer": "flashinfer",
        "flashinfer_version": args.version,
        "wheel": wheel.name,
        "path": "CUDA (FLASHINFER_USE_CUDA_NORM=1), not the CuTe-DSL Hopper default",
        "built_with_tvm_ffi": tvm_ffi.__version__,
        "nvcc": nvcc_version.splitlines()[-1],
        "arch": GENCODE,
        "flags": list(JIT_FLAGS),
        "stubbed_headers": sorted(p.name for p in stubs.glob("*.h")),
        "needed": needed(library),
        "functions": functions,
        "bytes": library.stat().st_size,
    }
    (args.out / "flashinfer_norm_act.json").write_text(json.dumps(manifest, indent=1) + "\n")
    log(
        f"wrote {library} ({library.stat().st_size / 2**20:.1f} MiB; needs "
        f"{', '.join(manifest['needed'])}; exports {', '.join(wanted)})"
    )
    log(f"carry {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
