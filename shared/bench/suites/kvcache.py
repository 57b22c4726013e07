"""Benchmarks of the kvcache group: our CUDA kernels against torch eager, torch.compile of the same
torch expression, and vLLM 0.33.0's CUDA cache kernels (``_C_cache_ops.reshape_and_cache_flash``,
also standing in for store_cache through a block-size-1 view, and ``concat_and_cache_mla``).

The torch peers are the sync-free index writes an engine runs in eager mode (``cache[slots] =
rows``): the group's torch references validate slots on the host (a sync, not capturable in the
CUDA graphs the harness times), so they are the oracle, not the timed peer.

Shapes: N rows (1, 16, 64 decode; 8192, 32768 prefill) of Hk = 8 x D = 128 bf16 (Llama-3-8B per
TP rank: 2 KB per K or V row) written to distinct random slots of a 262144-slot cache; MLA rows of
512 + 64 bf16 (1152 B) into a 262144-slot latent buffer, N up to 65536. ``bytes`` is the minimum
traffic: every input row read once and written once (2 x N x row bytes per cache), plus the slots.
The caches are shared by every input set of an op (one allocation each, 0.3-1 GB); each set has its
own rows and slots.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

import kernels_kvcache as kvcache
from shared.bench.harness import Case
from shared.bench.peers import Checked, torch_compile, vllm

DTYPE = torch.bfloat16
SLOTS = 262144
HEADS, HEAD_DIM = 8, 128
WIDTH = HEADS * HEAD_DIM
BLOCK_SIZE = 16
NOPE, ROPE = 512, 64
TOKENS = (1, 16, 64, 8192, 32768)
MLA_TOKENS = (1, 16, 64, 8192, 65536)
QUICK_TOKENS = (16, 8192)

_CACHES: dict[str, tuple[torch.Tensor, ...]] = {}


def _cache(kind: str) -> tuple[torch.Tensor, ...]:
    """One pair of caches (or one MLA buffer) per kind, shared by every set and shape."""
    if kind not in _CACHES:
        if kind == "token":  # store_cache: [S, Hk*D]
            shape = (SLOTS, WIDTH)
            _CACHES[kind] = tuple(torch.zeros(shape, dtype=DTYPE, device="cuda") for _ in "kv")
        elif kind == "nhd":  # [NB, bs, Hk, D]
            shape = (SLOTS // BLOCK_SIZE, BLOCK_SIZE, HEADS, HEAD_DIM)
            _CACHES[kind] = tuple(torch.zeros(shape, dtype=DTYPE, device="cuda") for _ in "kv")
        elif kind == "hnd":  # [NB, Hk, bs, D] seen as [NB, bs, Hk, D]
            shape = (SLOTS // BLOCK_SIZE, HEADS, BLOCK_SIZE, HEAD_DIM)
            _CACHES[kind] = tuple(
                torch.zeros(shape, dtype=DTYPE, device="cuda").permute(0, 2, 1, 3) for _ in "kv"
            )
        else:  # MLA latent buffer [S, 1, 576]
            _CACHES[kind] = (torch.zeros(SLOTS, 1, NOPE + ROPE, dtype=DTYPE, device="cuda"),)
    return _CACHES[kind]


def _slots(n: int) -> torch.Tensor:
    return torch.randperm(SLOTS, device="cuda")[:n]


def store_cache_cases(quick: bool) -> Iterator[Case]:
    peer = vllm()
    for n in QUICK_TOKENS if quick else TOKENS:

        def make(n=n):
            k_cache, v_cache = _cache("token")
            return {
                "k": torch.randn(n, WIDTH, device="cuda").to(DTYPE),
                "v": torch.randn(n, WIDTH, device="cuda").to(DTYPE),
                "k_cache": k_cache,
                "v_cache": v_cache,
                "idx": _slots(n),
                "one": torch.ones(1, device="cuda"),
            }

        def torch_write(k, v, k_cache, v_cache, idx):
            k_cache[idx] = k
            v_cache[idx] = v

        impls = {
            "cuda": lambda s: kvcache.store_cache(
                s["k"], s["v"], s["k_cache"], s["v_cache"], s["idx"], backend="cuda"
            ),
            "torch_eager": lambda s: torch_write(
                s["k"], s["v"], s["k_cache"], s["v_cache"], s["idx"]
            ),
            "torch_compile": torch_compile(
                torch_write,
                [n, WIDTH],
                lambda f, s: f(s["k"], s["v"], s["k_cache"], s["v_cache"], s["idx"]),
            ),
        }
        if peer is not None:  # reshape_and_cache_flash on [S, 1, Hk, D] views (block size 1)
            impls["vllm"] = Checked(
                lambda s: peer._C_cache_ops.reshape_and_cache_flash(
                    s["k"].view(-1, HEADS, HEAD_DIM),
                    s["v"].view(-1, HEADS, HEAD_DIM),
                    s["k_cache"].view(SLOTS, 1, HEADS, HEAD_DIM),
                    s["v_cache"].view(SLOTS, 1, HEADS, HEAD_DIM),
                    s["idx"],
                    "auto",
                    s["one"],
                    s["one"],
                ),
                expected=lambda s: (s["k"], s["v"]),
                outputs=lambda s, _: (s["k_cache"][s["idx"]], s["v_cache"][s["idx"]]),
            )
        yield Case(
            op="store_cache",
            shape=[n, WIDTH],
            dtype=DTYPE,
            # read k, v [N, Hk*D] + write N rows of each cache + the int64 slots
            bytes=4 * n * WIDTH * DTYPE.itemsize + 8 * n,
            make_inputs=make,
            impls=impls,
            note="vllm: reshape_and_cache_flash on block-size-1 views",
        )


def reshape_and_cache_flash_cases(quick: bool) -> Iterator[Case]:
    peer = vllm()
    for layout in ("nhd", "hnd"):
        for n in QUICK_TOKENS if quick else TOKENS:

            def make(n=n, layout=layout):
                key_cache, value_cache = _cache(layout)
                return {
                    "key": torch.randn(n, HEADS, HEAD_DIM, device="cuda").to(DTYPE),
                    "value": torch.randn(n, HEADS, HEAD_DIM, device="cuda").to(DTYPE),
                    "key_cache": key_cache,
                    "value_cache": value_cache,
                    "slots": _slots(n),
                    "one": torch.ones(1, device="cuda"),
                }

            def torch_write(key, value, key_cache, value_cache, slots):
                block, offset = slots // BLOCK_SIZE, slots % BLOCK_SIZE
                key_cache[block, offset] = key
                value_cache[block, offset] = value

            def args(s):
                return s["key"], s["value"], s["key_cache"], s["value_cache"], s["slots"]

            def written(s):
                block, offset = s["slots"] // BLOCK_SIZE, s["slots"] % BLOCK_SIZE
                return s["key_cache"][block, offset], s["value_cache"][block, offset]

            impls = {
                "cuda": lambda s, args=args: kvcache.reshape_and_cache_flash(
                    *args(s), backend="cuda"
                ),
                "torch_eager": lambda s, f=torch_write, args=args: f(*args(s)),
                "torch_compile": torch_compile(
                    torch_write, [n, HEADS, HEAD_DIM], lambda f, s, args=args: f(*args(s))
                ),
            }
            if peer is not None:
                impls["vllm"] = Checked(
                    lambda s, args=args: peer._C_cache_ops.reshape_and_cache_flash(
                        *args(s), "auto", s["one"], s["one"]
                    ),
                    expected=lambda s: (s["key"], s["value"]),
                    outputs=lambda s, _, written=written: written(s),
                )
            yield Case(
                op="reshape_and_cache_flash",
                shape=[n, HEADS, HEAD_DIM],
                dtype=DTYPE,
                # read key, value [N, Hk, D] + write N tokens of each cache + the int64 slots
                bytes=4 * n * WIDTH * DTYPE.itemsize + 8 * n,
                make_inputs=make,
                impls=impls,
                note=f"{layout.upper()} cache, block size {BLOCK_SIZE}",
            )


def set_mla_kv_buffer_cases(quick: bool) -> Iterator[Case]:
    peer = vllm()
    for n in QUICK_TOKENS if quick else MLA_TOKENS:

        def make(n=n):
            latent = torch.randn(n, 1, NOPE + ROPE + 64, device="cuda").to(DTYPE)
            return {  # k_nope / k_rope as views of one projection output, as engines pass them
                "k_nope": latent[..., :NOPE],
                "k_rope": latent[..., NOPE : NOPE + ROPE],
                "buf": _cache("mla")[0],
                "loc": _slots(n),
                "one": torch.ones(1, device="cuda"),
            }

        def torch_write(buf, loc, k_nope, k_rope):
            buf[loc] = torch.cat((k_nope, k_rope), dim=-1)

        def args(s):
            return s["buf"], s["loc"], s["k_nope"], s["k_rope"]

        impls = {
            "cuda": lambda s, args=args: kvcache.set_mla_kv_buffer(*args(s), backend="cuda"),
            "torch_eager": lambda s, args=args: torch_write(*args(s)),
            "torch_compile": torch_compile(
                torch_write, [n, NOPE + ROPE], lambda f, s, args=args: f(*args(s))
            ),
        }
        if peer is not None:  # kv_cache [num_blocks, block_size, 576]: the buffer as bs = 1
            impls["vllm"] = Checked(
                lambda s: peer._C_cache_ops.concat_and_cache_mla(
                    s["k_nope"][:, 0], s["k_rope"][:, 0], s["buf"], s["loc"], "auto", s["one"]
                ),
                expected=lambda s: torch.cat((s["k_nope"], s["k_rope"]), dim=-1),
                outputs=lambda s, _: s["buf"][s["loc"]],
            )
        yield Case(
            op="set_mla_kv_buffer",
            shape=[n, NOPE + ROPE],
            dtype=DTYPE,
            # read k_nope + k_rope, write the [N, 576] rows, + the int64 slots
            bytes=2 * n * (NOPE + ROPE) * DTYPE.itemsize + 8 * n,
            make_inputs=make,
            impls=impls,
            note="k_nope/k_rope strided views; vllm: concat_and_cache_mla",
        )


def cases(quick: bool) -> Iterator[Case]:
    yield from store_cache_cases(quick)
    yield from reshape_and_cache_flash_cases(quick)
    yield from set_mla_kv_buffer_cases(quick)
