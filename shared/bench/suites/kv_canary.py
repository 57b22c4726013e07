"""Benchmarks of the kv_canary group: our CUDA kernels against torch eager (the byte-exact
reference) and torch.compile of it. No binary peer has these ops (SGLang's canary is Triton/torch
engine code). The references check slot ranges on the host (a sync), which CUDA-graph capture
rejects: where that happens the harness reports them skipped.

Shapes: N in (64, 8192, 65536) slots written / verified, in requests of 8 entries, over a paged
K and V cache of 8 heads x 128 bf16 per token (2 KiB each, page size 16).
bytes: write = N (8 + 8 + 4) index bytes + R (4 + 8) + 2 N 2048 KV bytes hashed + N 32 canary
bytes written; verify = 4 N 8 index bytes + 2 N 2048 KV bytes hashed + N 32 + N 32 canary rows
read (the slot's and the prev slot's) + N 4 written.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from kernels_kv_canary import KVSource, kv_canary_verify, kv_canary_write, reference
from shared.bench.harness import Case
from shared.bench.peers import torch_compile

PAGE, HEADS, DIM = 16, 8, 128
PER_TOKEN = HEADS * DIM * 2
PER_REQUEST = 8


def _inputs(entries: int) -> dict:
    slots_total = 2 * entries + PAGE
    pages = (slots_total + PAGE - 1) // PAGE
    k = torch.randn(pages, PAGE, HEADS, DIM, device="cuda").to(torch.bfloat16)
    v = torch.randn(pages, PAGE, HEADS, DIM, device="cuda").to(torch.bfloat16)
    sources = [KVSource(k, PAGE, PER_TOKEN, PER_TOKEN), KVSource(v, PAGE, PER_TOKEN, PER_TOKEN)]
    slots = torch.randperm(pages * PAGE, device="cuda")[:entries]
    requests = (entries + PER_REQUEST - 1) // PER_REQUEST
    indptr = torch.arange(requests + 1, device="cuda", dtype=torch.int32) * PER_REQUEST
    indptr[-1] = entries
    canary = torch.zeros(pages * PAGE, 4, dtype=torch.int64, device="cuda")
    tokens = torch.randint(0, 150_000, (entries,), device="cuda")
    positions = torch.arange(entries, device="cuda", dtype=torch.int32)
    seeds = torch.full((requests,), -1, dtype=torch.int64, device="cuda")
    kv_canary_write(canary, sources, slots, tokens, positions, indptr, seeds)
    prev = torch.full_like(slots, -1)
    return {
        "canary": canary,
        "sources": sources,
        "slots": slots,
        "tokens": tokens,
        "positions": positions,
        "indptr": indptr,
        "seeds": seeds,
        "prev": prev,
    }


def _write_args(s):
    return (s["canary"], s["sources"], s["slots"], s["tokens"], s["positions"], s["indptr"],
            s["seeds"])  # fmt: skip


def _verify_args(s):
    return (s["canary"], s["sources"], s["slots"], s["prev"], s["positions"], s["tokens"])


def cases(quick: bool) -> Iterator[Case]:
    grid = (64, 65536) if quick else (64, 8192, 65536)
    for entries in grid:
        requests = (entries + PER_REQUEST - 1) // PER_REQUEST
        hashed = 2 * entries * PER_TOKEN
        yield Case(
            op="kv_canary_write",
            shape=[entries, PER_TOKEN],
            dtype=torch.int64,
            bytes=entries * 20 + requests * 12 + hashed + entries * 32,
            make_inputs=lambda entries=entries: _inputs(entries),
            impls={
                "cuda": lambda s: kv_canary_write(*_write_args(s), backend="cuda"),
                "torch_eager": lambda s: reference.kv_canary_write(*_write_args(s)),
                "torch_compile": torch_compile(
                    reference.kv_canary_write, [entries], lambda f, s: f(*_write_args(s))
                ),
            },
        )
        yield Case(
            op="kv_canary_verify",
            shape=[entries, PER_TOKEN],
            dtype=torch.int64,
            bytes=entries * 32 + hashed + entries * 64 + entries * 4,
            make_inputs=lambda entries=entries: _inputs(entries),
            impls={
                "cuda": lambda s: kv_canary_verify(*_verify_args(s), backend="cuda"),
                "torch_eager": lambda s: reference.kv_canary_verify(*_verify_args(s)),
                "torch_compile": torch_compile(
                    reference.kv_canary_verify, [entries], lambda f, s: f(*_verify_args(s))
                ),
            },
            note="bytes: KV bytes hashed + canary rows + index vectors",
        )
