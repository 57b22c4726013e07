"""Benchmarks of the embeddings group: our CUDA kernels against torch eager (the reference, or the
sync-free torch expression an engine runs), torch.compile of it, and vLLM 0.33.0's
``_C.vocab_parallel_embedding``.

vocab_parallel_embedding: T tokens (1, 16, 64 decode; 8192, 32768 prefill), H = 7168 bf16
(DeepSeek-V3), a TP-8 shard of Llama-3's 128256-token vocabulary (16032 rows, rank 1), ids uniform
over the whole vocabulary, so about 1/8 of the tokens are in the shard. ``bytes`` = the output
written (T x H) + the expected in-shard rows read (T / 8 x H) + the int64 ids.

scatter_embeddings: T tokens of H = 4096 bf16 text embeddings, M = T / 2 image rows (one span of
placeholder tokens), by positions and by mask. ``bytes`` = the M rows read and written + the index
(positions or mask). The torch peer for the mask form is ``masked_scatter_`` (``embeds[mask] = mm``
needs the count on the host: a sync, not capturable).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

import kernels_embeddings as embeddings
from kernels_embeddings import reference
from shared.bench.harness import Case
from shared.bench.peers import Checked, torch_compile, vllm

DTYPE = torch.bfloat16
VOCAB, SHARD, HIDDEN = 128256, 16032, 7168
ORG_START, ORG_END = SHARD, 2 * SHARD  # rank 1 of TP 8
TOKENS = (1, 16, 64, 8192, 32768)
QUICK_TOKENS = (16, 8192)
SCATTER_HIDDEN = 4096

_WEIGHT: list[torch.Tensor] = []


def _weight() -> torch.Tensor:
    """The shard's weight, shared by every input set and shape (230 MB)."""
    if not _WEIGHT:
        _WEIGHT.append(torch.randn(SHARD, HIDDEN, device="cuda").to(DTYPE))
    return _WEIGHT[0]


def vocab_parallel_embedding_cases(quick: bool) -> Iterator[Case]:
    peer = vllm()
    has_peer = peer is not None and hasattr(peer._C, "vocab_parallel_embedding")
    for tokens in QUICK_TOKENS if quick else TOKENS:

        def make(tokens=tokens):
            return {
                "ids": torch.randint(0, VOCAB, (tokens,), device="cuda"),
                "weight": _weight(),
                "out": torch.empty(tokens, HIDDEN, dtype=DTYPE, device="cuda"),
            }

        def ref(ids, weight):
            return reference.vocab_parallel_embedding(ids, weight, ORG_START, ORG_END)

        impls = {
            "cuda": lambda s: embeddings.vocab_parallel_embedding(
                s["ids"], s["weight"], ORG_START, ORG_END, backend="cuda"
            ),
            "torch_eager": lambda s, ref=ref: ref(s["ids"], s["weight"]),
            "torch_compile": torch_compile(
                ref, [tokens, HIDDEN], lambda f, s: f(s["ids"], s["weight"])
            ),
        }
        if has_peer:
            impls["vllm"] = Checked(
                lambda s: peer._C.vocab_parallel_embedding(
                    s["out"], s["ids"], s["weight"], ORG_START, ORG_END, 0, 0, 0
                ),
                expected=lambda s, ref=ref: ref(s["ids"], s["weight"]),
                outputs=lambda s, _: s["out"],
            )
        in_shard = tokens * SHARD // VOCAB
        yield Case(
            op="vocab_parallel_embedding",
            shape=[tokens, HIDDEN],
            dtype=DTYPE,
            # write out [T, H] + read the ~T/8 in-shard rows + the int64 ids
            bytes=(tokens + in_shard) * HIDDEN * DTYPE.itemsize + 8 * tokens,
            make_inputs=make,
            impls=impls,
            note="TP-8 shard of 128256 ids (rank 1); vllm's out preallocated",
        )


def scatter_embeddings_cases(quick: bool) -> Iterator[Case]:
    for form in ("positions", "mask"):
        for tokens in QUICK_TOKENS if quick else TOKENS:
            rows = max(tokens // 2, 1)

            def make(tokens=tokens, rows=rows):
                start = (tokens - rows) // 3
                positions = torch.arange(start, start + rows, device="cuda")
                mask = torch.zeros(tokens, dtype=torch.bool, device="cuda")
                mask[positions] = True
                return {
                    "embeds": torch.randn(tokens, SCATTER_HIDDEN, device="cuda").to(DTYPE),
                    "mm": torch.randn(rows, SCATTER_HIDDEN, device="cuda").to(DTYPE),
                    "positions": positions,
                    "mask": mask,
                }

            if form == "positions":

                def torch_place(embeds, mm, index):
                    embeds[index] = mm

                index_bytes = 8 * rows
            else:

                def torch_place(embeds, mm, index):
                    embeds.masked_scatter_(index[:, None], mm)

                index_bytes = tokens

            impls = {
                "cuda": lambda s, form=form: embeddings.scatter_embeddings(
                    s["embeds"], s["mm"], backend="cuda", **{form: s[form]}
                ),
                "torch_eager": lambda s, f=torch_place, form=form: f(s["embeds"], s["mm"], s[form]),
                "torch_compile": torch_compile(
                    torch_place,
                    [tokens, SCATTER_HIDDEN],
                    lambda f, s, form=form: f(s["embeds"], s["mm"], s[form]),
                ),
            }
            yield Case(
                op="scatter_embeddings",
                shape=[tokens, SCATTER_HIDDEN],
                dtype=DTYPE,
                # read the M mm rows + write M rows of embeds + the index
                bytes=2 * rows * SCATTER_HIDDEN * DTYPE.itemsize + index_bytes,
                make_inputs=make,
                impls=impls,
                note=f"{form} form, M = T/2 rows in one span",
            )


def cases(quick: bool) -> Iterator[Case]:
    yield from vocab_parallel_embedding_cases(quick)
    yield from scatter_embeddings_cases(quick)
