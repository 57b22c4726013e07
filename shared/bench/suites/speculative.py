"""Benchmarks of the speculative group: our CUDA kernels against torch eager (the reference),
torch.compile of the reference (a static graph per target shape, see peers.py) and
sglang-kernel 0.4.5's CUDA ``verify_tree_greedy`` / ``segment_packbits`` (checked against the
reference at their first call, ``peers.Checked``: a wrong binding is reported skipped, not timed).

The references check index ranges on the host (a sync), which CUDA-graph capture rejects: where
that happens the harness times the eager / compiled reference by eager launches, marked
"(eager)". The references' inverse-CDF draw counts ``cdf <= u * total`` instead of calling
``torch.searchsorted`` (the same index on a non-decreasing cdf), which torch.compile's inductor
failed to lower ("list indices must be integers or slices, not NoneType"). No sglang peer for
chain_speculative_sampling: sgl-kernel's tree_speculative_sampling_target_only takes its own
uniform samples (not the project RNG), so its tokens cannot be checked against the reference.

Shapes (``bytes`` = each input read once, each output written once, unless said):
- verify_tree_greedy: B in (1, 16, 64, 256) requests of N in (8, 64) draft nodes, S = 8 steps
  (S = N when N < 8), random trees over a 2-token vocabulary (paths accept often). int64 tree
  tensors. bytes = 5 B N 8 (candidates, 3 tree tensors, target_predict) + B N 4 + B S 4 + B 4.
- segment_packbits: B in (1, 16, 64, 256) segments of 4096 bits (the target: 64 x 4096), and
  64 segments of 2^20 bits (64 MB read). bytes = nnz + nnz / 8 + 2 (B + 1) 4.
- chain_speculative_sampling: B in (1, 16, 32, 64) requests, n in (1, 8) drafts, V = 128256
  fp32. bytes = the residual pass, 2 B V 4 (target row r and draft row r, read once): the
  issue's target is stated on it; the full tensors are never read.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

import kernels_speculative as speculative
from kernels_speculative import reference
from shared.bench.harness import Case
from shared.bench.peers import Checked, sglang, torch_compile

VOCAB = 128_256


def _has(ops: object, name: str) -> bool:
    try:
        return ops is not None and hasattr(ops, name)
    except Exception:  # a missing op raises from torch.ops' __getattr__ in some versions
        return False


def _sgl_call(op: object, args: list, extra: dict[str, int]) -> None:
    """Call a sgl_kernel op with the trailing ints its schema has (``batch_size``,
    ``cuda_stream`` differ across sgl-kernel versions), read from the schema itself."""
    schema = op.default._schema  # type: ignore[attr-defined]
    for arg in schema.arguments[len(args) :]:
        if arg.name == "cuda_stream":
            args.append(torch.cuda.current_stream().cuda_stream)
        else:
            args.append(extra[arg.name])
    op.default(*args)  # type: ignore[attr-defined]


class _FirstCall:
    """Runs ``prepare(inputs)`` before the first call only (the Checked comparison, outside
    capture): the outputs other impls already wrote on the same inputs are reset, so the check
    sees what the peer itself writes, and nothing but the peer is timed."""

    def __init__(self, prepare, impl) -> None:
        self.prepare, self.impl, self.first = prepare, impl, True

    def __call__(self, s):
        if self.first:
            self.first = False
            self.prepare(s)
        return self.impl(s)


def _tree(batch: int, nodes: int, seed: int) -> dict[str, torch.Tensor]:
    """Random trees (random parent per node), flat positions b N + i, a 2-token vocabulary."""
    g = torch.Generator().manual_seed(seed)
    child = torch.full((batch, nodes), -1, dtype=torch.int64)
    sibling = torch.full((batch, nodes), -1, dtype=torch.int64)
    for b in range(batch):
        last_child = [-1] * nodes
        for i in range(1, nodes):
            parent = int(torch.randint(0, i, (1,), generator=g))
            if last_child[parent] < 0:
                child[b, parent] = i
            else:
                sibling[b, last_child[parent]] = i
            last_child[parent] = i
    index = torch.arange(batch * nodes, dtype=torch.int64).reshape(batch, nodes)
    cand = torch.randint(0, 2, (batch, nodes), generator=g)
    target = torch.randint(0, 2, (batch * nodes,), generator=g)
    return {
        "candidates": cand.cuda(),
        "retrive_index": index.cuda(),
        "retrive_next_token": child.cuda(),
        "retrive_next_sibling": sibling.cuda(),
        "target_predict": target.cuda(),
    }


_TREE_ARGS = (
    "candidates",
    "retrive_index",
    "retrive_next_token",
    "retrive_next_sibling",
    "target_predict",
)


def verify_cases(quick: bool) -> Iterator[Case]:
    sgl = sglang()
    peer = _has(sgl, "verify_tree_greedy")
    grid = [(b, n) for b in (1, 16, 64, 256) for n in (8, 64)]
    if quick:
        grid = [(1, 8), (64, 64), (256, 64)]
    for batch, nodes in grid:
        steps = min(8, nodes)

        def make(batch=batch, nodes=nodes, steps=steps):
            s = _tree(batch, nodes, seed=batch + nodes)
            s["predicts"] = torch.full((batch * nodes,), -1, dtype=torch.int32, device="cuda")
            s["accept_index"] = torch.full((batch, steps), -1, dtype=torch.int32, device="cuda")
            s["accept_token_num"] = torch.zeros(batch, dtype=torch.int32, device="cuda")
            return s

        def outs(s):
            return [s["predicts"], s["accept_index"], s["accept_token_num"]]

        def tree(s):
            return [s[k] for k in _TREE_ARGS]

        def expected(s):
            got = [t.clone().fill_(-1) for t in outs(s)]
            reference.verify_tree_greedy(*got, *tree(s))
            return got

        def fresh(s):  # the peer writes in place: compare from the prefilled state
            for t in outs(s):
                t.fill_(-1)
            s["accept_token_num"].zero_()

        impls = {
            "cuda": lambda s: speculative.verify_tree_greedy(*outs(s), *tree(s), backend="cuda"),
            "torch_eager": lambda s: reference.verify_tree_greedy(*outs(s), *tree(s)),
            "torch_compile": torch_compile(
                reference.verify_tree_greedy,
                [batch, nodes, steps],
                lambda f, s: f(*outs(s), *tree(s)),
            ),
        }
        if peer:
            op = sgl.verify_tree_greedy

            def sgl_args(s, batch=batch, nodes=nodes):
                # sglang-kernel checks target_predict as [B, N] (it indexes it flat, as ours)
                return [*outs(s), *tree(s)[:-1], s["target_predict"].view(batch, nodes)]

            impls["sglang"] = Checked(
                _FirstCall(fresh, lambda s, op=op: _sgl_call(op, sgl_args(s), {})),
                expected=expected,
                outputs=lambda s, _: outs(s),
                atol=0,
                rtol=0,
            )
        yield Case(
            op="verify_tree_greedy",
            shape=[batch, nodes, steps],
            dtype=torch.int64,
            bytes=5 * batch * nodes * 8 + batch * nodes * 4 + batch * steps * 4 + batch * 4,
            make_inputs=make,
            impls=impls,
        )


def packbits_cases(quick: bool) -> Iterator[Case]:
    sgl = sglang()
    peer = _has(sgl, "segment_packbits")
    grid = [(b, 4096) for b in (1, 16, 64, 256)] + [(64, 1 << 20)]
    if quick:
        grid = [(64, 4096), (64, 1 << 20)]
    for segments, bits in grid:
        nnz = segments * bits
        nbytes = segments * ((bits + 7) // 8)

        def make(segments=segments, bits=bits, nnz=nnz, nbytes=nbytes):
            x = torch.rand(nnz, device="cuda") < 0.5
            indptr = torch.arange(segments + 1, dtype=torch.int32, device="cuda") * bits
            out_ptr = torch.arange(segments + 1, dtype=torch.int32, device="cuda") * (
                (bits + 7) // 8
            )
            y = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
            return {"x": x, "indptr": indptr, "out_ptr": out_ptr, "y": y}

        def ref_into(s):
            y = torch.zeros_like(s["y"])
            reference.segment_packbits_into(y, s["x"], s["indptr"], s["out_ptr"])
            return y

        impls = {
            "cuda": lambda s: speculative.segment_packbits(
                s["x"], s["indptr"], output_indptr=s["out_ptr"], out=s["y"], backend="cuda"
            ),
            "torch_eager": lambda s: reference.segment_packbits_into(
                s["y"], s["x"], s["indptr"], s["out_ptr"]
            ),
            "torch_compile": torch_compile(
                reference.segment_packbits_into,
                [segments, bits],
                lambda f, s: f(s["y"], s["x"], s["indptr"], s["out_ptr"]),
            ),
        }
        if peer:
            op = sgl.segment_packbits
            impls["sglang"] = Checked(
                _FirstCall(
                    lambda s: s["y"].zero_(),
                    lambda s, op=op, segments=segments: _sgl_call(
                        op, [s["x"], s["indptr"], s["out_ptr"], s["y"]], {"batch_size": segments}
                    ),
                ),
                expected=ref_into,
                outputs=lambda s, _: s["y"],
                atol=0,
                rtol=0,
            )
        yield Case(
            op="segment_packbits",
            shape=[segments, bits],
            dtype=torch.bool,
            bytes=nnz + nbytes + 2 * (segments + 1) * 4,
            make_inputs=make,
            impls=impls,
        )


def chain_cases(quick: bool) -> Iterator[Case]:
    grid = [(b, n) for b in (1, 16, 32, 64) for n in (1, 8)]
    if quick:
        grid = [(1, 8), (32, 8), (64, 1)]
    for batch, n in grid:

        def make(batch=batch, n=n):
            g = torch.Generator(device="cuda").manual_seed(batch + n)
            draft = torch.randn(batch, n, VOCAB, device="cuda", generator=g).mul_(2).softmax(-1)
            target = torch.randn(batch, n + 1, VOCAB, device="cuda", generator=g)
            target = target.mul_(2).softmax(-1)
            ids = torch.randint(0, VOCAB, (batch, n), device="cuda", generator=g)
            return {
                "draft": draft,
                "ids": ids.to(torch.int32),
                "target": target,
                "seed": torch.tensor([7], device="cuda"),
                "offset": torch.tensor([3], device="cuda"),
            }

        def call(f, s, **kw):
            return f(s["draft"], s["ids"], s["target"], seed=s["seed"], offset=s["offset"], **kw)

        impls = {
            "cuda": lambda s: call(speculative.chain_speculative_sampling, s, backend="cuda"),
            "torch_eager": lambda s: call(reference.chain_speculative_sampling, s),
            "torch_compile": torch_compile(
                reference.chain_speculative_sampling, [batch, n, VOCAB], call
            ),
        }
        yield Case(
            op="chain_speculative_sampling",
            shape=[batch, n, VOCAB],
            dtype=torch.float32,
            bytes=2 * batch * VOCAB * 4,  # the residual pass: target and draft row r, read once
            make_inputs=make,
            impls=impls,
            note="bytes: the residual pass (2 rows of V fp32 per request)",
        )


def cases(quick: bool) -> Iterator[Case]:
    yield from verify_cases(quick)
    yield from packbits_cases(quick)
    yield from chain_cases(quick)
