"""Benchmarks of the memory group: our CUDA kernels against the sync-free torch expressions an
engine would run in eager mode (``torch_eager``) and torch.compile of them. The group's torch
references validate index values on the host (a device-to-host sync, not capturable in the CUDA
graphs the harness times), so they are the oracle, not the timed peer. Peer ``sglang_triton``:
SGLang's Triton kernels of alloc_decode, alloc_extend and get_last_loc (sglang 0.5.23, cut by
``python -m shared.bench.fetch_peers sglang_memory`` into the ignored ``.peers/sglang_memory/``;
skipped where absent), launched as SGLang's allocator launches them (one program per request,
the batch's next power of two as a constant) and checked exactly against the torch expressions.
SGLang's write_req_to_token_pool kernel also copies each request's radix prefix (another op's
work) and has no peer row; vLLM 0.33.0 has no copy_blocks (v1 dropped it).

Shapes: B in (1, 64, 256, 1024) requests; req_to_token [4096, 16384] int32 (one table shared by
every set); decode (one new token per request) and extend (prefix 0-4095, 1-512 new tokens, page
size 16) batches; write_req_to_token_pool also at 64 x 65536 tokens (16 MB written, 32 MB of int64
slots read); copy_blocks 16 and 1024 pairs of 16 KB blocks (bf16 [16, 8, 64]) across 4 layers
(8 caches of 4096 blocks). ``bytes`` is the minimum traffic: every index read once, every output
written once (copy_blocks: each block read and written once per cache).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

import kernels_memory as memory
from shared.bench.harness import Case
from shared.bench.peers import Checked, peer_source, torch_compile

ROWS, COLS = 4096, 16384
BATCHES = (1, 64, 256, 1024)
QUICK_BATCHES = (1, 256)
PAGE = 16
LONG = 65536
_TABLE: list[torch.Tensor] = []


def _table() -> torch.Tensor:
    if not _TABLE:
        _TABLE.append(torch.randint(0, 1 << 30, (ROWS, COLS), device="cuda", dtype=torch.int32))
    return _TABLE[0]


# --- sync-free torch expressions (what an engine runs eagerly) -----------------------------------


def _torch_last_loc(table, index, prefix):
    return torch.where(prefix > 0, table[index, (prefix - 1).clamp(min=0)].long(), -1)


def _torch_write(table, index, starts, ends, locs):
    lens = ends - starts
    total = locs.shape[0]
    request = torch.repeat_interleave(
        torch.arange(lens.shape[0], device=lens.device), lens, output_size=total
    )
    within = torch.arange(total, device=lens.device) - (torch.cumsum(lens, 0) - lens)[request]
    table[index[request], starts[request] + within] = locs.to(table.dtype)


def _torch_decode(seq, last, free, ps):
    needs = (seq - 1) % ps == 0
    rank = (torch.cumsum(needs.long(), 0) - 1).clamp(min=0)
    return torch.where(needs, free[rank] * ps, last + 1)


def _torch_extend(prefix, seq, last, free, ps, total):
    extend = seq - prefix
    first_new = (prefix + ps - 1) // ps * ps
    new_pages = (seq + ps - 1) // ps - first_new // ps
    request = torch.repeat_interleave(
        torch.arange(extend.shape[0], device=extend.device), extend, output_size=total
    )
    within = torch.arange(total, device=extend.device) - (torch.cumsum(extend, 0) - extend)[request]
    position = prefix[request] + within
    page_index = (torch.cumsum(new_pages, 0) - new_pages)[request] + (
        position - first_new[request]
    ).div(ps, rounding_mode="floor")
    page = free[page_index.clamp(0, free.shape[0] - 1)]
    fresh = page * ps + position % ps
    return torch.where(position < first_new[request], last[request] + 1 + within, fresh)


def _torch_copy_blocks(caches, mapping):
    src, dst = mapping[:, 0], mapping[:, 1]
    for cache in caches:
        cache[dst] = cache[src]


# --- SGLang's Triton kernels, launched as its allocator and scheduler do --------------------------


def _sglang_kernels():
    return peer_source("sglang_memory", "alloc_decode_kernel")


def _sglang_last_loc(k, table, index, prefix):
    out = torch.empty_like(prefix)
    n = prefix.shape[0]
    k.get_last_loc_kernel[(-(-n // 256),)](table, index, prefix, out, n, table.stride(0), 256)
    return out


def _sglang_decode(k, seq, last, free):
    bs = seq.shape[0]
    out = torch.empty(bs, dtype=torch.int64, device=seq.device)
    k.alloc_decode_kernel[(bs,)](seq, last, free, out, _next_pow2(bs), PAGE)
    return out


def _sglang_extend(k, prefix, seq, last, free, total):
    bs = seq.shape[0]
    out = torch.empty(total, dtype=torch.int64, device=seq.device)
    k.alloc_extend_kernel[(bs,)](prefix, seq, last, free, out, _next_pow2(bs), PAGE)
    return out


def _next_pow2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _sglang_peer(impls: dict, call, expected) -> None:
    """impls["sglang_triton"] where the source is there: ``call(kernels, inputs)`` checked
    exactly (slots split in 16-bit halves, each exact in the check's fp32) against ``expected``."""
    kernels = _sglang_kernels()
    if kernels is None:
        return

    def halves(_, out):
        return out >> 16, out & 0xFFFF

    impls["sglang_triton"] = Checked(
        lambda s: call(kernels, s),
        expected=lambda s: halves(s, expected(s)),
        outputs=halves,
        atol=0,
        rtol=0,
    )


# --- the requests --------------------------------------------------------------------------------


def _requests(batch: int, extend: bool, seed: int) -> dict:
    """Consistent paged state: distinct rows and pages, last_loc the real last slot."""
    g = torch.Generator().manual_seed(seed)
    prefix = torch.randint(0, 4096, (batch,), generator=g)
    new = torch.randint(1, 513, (batch,), generator=g) if extend else torch.ones(batch, dtype=int)
    seq = prefix + new
    pages = torch.randperm(1 << 20, generator=g)
    own = pages[:batch]
    last = torch.where(prefix > 0, own * PAGE + (prefix - 1) % PAGE, -1)
    free = pages[batch : batch + int(((seq + PAGE - 1) // PAGE).sum()) + 64]
    return {
        "index": torch.randperm(ROWS, generator=g)[:batch],
        "prefix": prefix,
        "seq": seq,
        "last": last,
        "free": free,
        "total": int(new.sum()),
    }


def _on_gpu(r: dict) -> dict:
    return {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in r.items()}


def last_loc_cases(quick: bool) -> Iterator[Case]:
    for batch in QUICK_BATCHES if quick else BATCHES:

        def make(batch=batch):
            return {**_on_gpu(_requests(batch, False, batch)), "table": _table()}

        ref = _torch_last_loc
        impls = {
            "cuda": lambda s: memory.get_last_loc(
                s["table"], s["index"], s["prefix"], backend="cuda"
            ),
            "torch_eager": lambda s: _torch_last_loc(s["table"], s["index"], s["prefix"]),
            "torch_compile": torch_compile(
                ref, [batch], lambda f, s: f(s["table"], s["index"], s["prefix"])
            ),
        }
        _sglang_peer(
            impls,
            lambda k, s: _sglang_last_loc(k, s["table"], s["index"], s["prefix"]),
            lambda s: _torch_last_loc(s["table"], s["index"], s["prefix"]),
        )
        yield Case(
            op="get_last_loc",
            shape=[batch],
            dtype=torch.int64,
            bytes=batch * (8 + 8 + 4 + 8),  # index, prefix, one table entry, out
            make_inputs=make,
            impls=impls,
        )


def _write_requests(batch: int, kind: str) -> dict:
    if kind != "long":
        return _requests(batch, kind == "extend", batch + 7)
    # 64 requests x 65536 new tokens into a [128, 65536] table: 16 MB of int32 written
    g = torch.Generator().manual_seed(batch)
    return {
        "index": torch.randperm(2 * batch, generator=g)[:batch],
        "prefix": torch.zeros(batch, dtype=torch.int64),
        "seq": torch.full((batch,), LONG, dtype=torch.int64),
        "total": batch * LONG,
    }


def write_cases(quick: bool) -> Iterator[Case]:
    grid = [(b, "decode") for b in (QUICK_BATCHES if quick else BATCHES)]
    grid += [(b, "extend") for b in (QUICK_BATCHES if quick else BATCHES)]
    grid += [(64, "long")]
    for batch, kind in grid:
        requests = _write_requests(batch, kind)
        n = requests["total"]

        def make(batch=batch, kind=kind, requests=requests, n=n):
            r = _on_gpu(requests)
            r["locs"] = torch.randint(0, 1 << 30, (n,), device="cuda")
            if kind == "long":
                r["table"] = torch.zeros(2 * batch, LONG, device="cuda", dtype=torch.int32)
            else:
                r["table"] = _table()
            return r

        ref = _torch_write

        def call(f, s):
            return f(s["table"], s["index"], s["prefix"], s["seq"], s["locs"])

        yield Case(
            op="write_req_to_token_pool",
            shape=[batch, n],
            dtype=torch.int32,
            bytes=batch * 24 + n * (8 + 4),  # rows, starts, ends; slots read, table written
            make_inputs=make,
            impls={
                "cuda": lambda s: memory.write_req_to_token_pool(
                    s["table"], s["index"], s["prefix"], s["seq"], s["locs"], backend="cuda"
                ),
                "torch_eager": lambda s, ref=ref, call=call: call(ref, s),
                "torch_compile": torch_compile(ref, [batch, n], call),
            },
            note=f"{kind}: {n} slots",
        )


def alloc_cases(quick: bool) -> Iterator[Case]:
    for kind in ("decode", "extend"):
        for batch in QUICK_BATCHES if quick else BATCHES:
            requests = _requests(batch, kind == "extend", batch + 11)
            total = requests["total"]

            def make(requests=requests):
                return _on_gpu(requests)

            if kind == "decode":
                op, shape = "alloc_decode", [batch]
                byte_count = batch * (8 + 8 + 8) + batch * 8  # seq, last, out; pages (bound)

                def ours(s):
                    return memory.alloc_decode(s["seq"], s["last"], s["free"], PAGE, backend="cuda")

                def ref(seq, last, free):
                    return _torch_decode(seq, last, free, PAGE)

                def call(f, s):
                    return f(s["seq"], s["last"], s["free"])

                def peer(k, s):
                    return _sglang_decode(k, s["seq"], s["last"], s["free"])

            else:
                op, shape = "alloc_extend", [batch, total]
                byte_count = batch * 24 + total * 8 + (total // PAGE + batch) * 8

                def ours(s, total=total):
                    return memory.alloc_extend(
                        s["prefix"],
                        s["seq"],
                        s["last"],
                        s["free"],
                        PAGE,
                        extend_num_tokens=total,
                        backend="cuda",
                    )

                def ref(prefix, seq, last, free, total=total):
                    return _torch_extend(prefix, seq, last, free, PAGE, total)

                def call(f, s):
                    return f(s["prefix"], s["seq"], s["last"], s["free"])

                def peer(k, s, total=total):
                    return _sglang_extend(k, s["prefix"], s["seq"], s["last"], s["free"], total)

            impls = {
                "cuda": ours,
                "torch_eager": lambda s, ref=ref, call=call: call(ref, s),
                "torch_compile": torch_compile(ref, shape, call),
            }
            _sglang_peer(impls, peer, lambda s, ref=ref, call=call: call(ref, s))
            yield Case(
                op=op,
                shape=shape,
                dtype=torch.int64,
                bytes=byte_count,
                make_inputs=make,
                impls=impls,
                note=f"page_size {PAGE}",
            )


def copy_blocks_cases(quick: bool) -> Iterator[Case]:
    layers, blocks, block_shape = 4, 4096, (16, 8, 64)  # 16 KB bf16 blocks
    for pairs in (1024,) if quick else (16, 1024):

        def make(pairs=pairs):
            caches = [
                torch.zeros(blocks, *block_shape, device="cuda", dtype=torch.bfloat16)
                for _ in range(2 * layers)
            ]
            order = torch.randperm(blocks, device="cuda")
            mapping = torch.stack([order[:pairs], order[pairs : 2 * pairs]], dim=1)
            return {"keys": caches[:layers], "values": caches[layers:], "mapping": mapping}

        def call(f, s):
            return f([*s["keys"], *s["values"]], s["mapping"])

        block_bytes = 16 * 8 * 64 * 2
        yield Case(
            op="copy_blocks",
            shape=[pairs, layers, block_bytes],
            dtype=torch.bfloat16,
            bytes=2 * pairs * 2 * layers * block_bytes + pairs * 16,  # read + write per cache
            make_inputs=make,
            impls={
                "cuda": lambda s: memory.copy_blocks(
                    s["keys"], s["values"], s["mapping"], backend="cuda"
                ),
                "torch_eager": lambda s: call(_torch_copy_blocks, s),
                "torch_compile": torch_compile(_torch_copy_blocks, [pairs, layers], call),
            },
            note=f"{2 * layers} caches of {blocks} blocks",
        )


def cases(quick: bool) -> Iterator[Case]:
    yield from last_loc_cases(quick)
    yield from write_cases(quick)
    yield from alloc_cases(quick)
    yield from copy_blocks_cases(quick)
