"""Benchmarks of the grammar group: apply_token_bitmask_inplace (ours) against torch eager (the
reference), torch.compile of it, and sglang-kernel 0.4.5's ``apply_token_bitmask_inplace_cuda``
(the xgrammar CUDA kernel; schema ``(Tensor logits, Tensor bitmask, Tensor? indices=None) -> ()``
in sgl-kernel's csrc/common_extension.cc), on the same inputs.

Shapes: B in (1, 16, 64, 256) x V = 128256 (W = 4008 words) fp32 logits, two masks: "random50"
(every bit random: every word forbids something) and "allowed95" (95% of the words fully
allowed, the rest random bits: a typical grammar state, where time should track the density).
``bytes`` is the minimum traffic of the masked update: the mask words, the logits of every
word that forbids something read once, and the masked logits written once (fully allowed
words need no logits traffic).
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

import kernels_grammar as grammar
from kernels_grammar import reference
from shared.bench.harness import Case
from shared.bench.peers import Checked, sglang, torch_compile

DTYPE = torch.float32
VOCAB = 128256
BATCHES = (1, 16, 64, 256)
QUICK_BATCHES = (1, 64)
MASKS = ("random50", "allowed95")


def _mask(batch: int, kind: str, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    words = (VOCAB + 31) // 32
    bits = torch.randint(-(2**31), 2**31 - 1, (batch, words), generator=g, dtype=torch.int32)
    if kind == "allowed95":
        full = torch.rand(batch, words, generator=g) < 0.95
        bits = torch.where(full, torch.full_like(bits, -1), bits)
    return bits


def _min_bytes(mask: torch.Tensor) -> int:
    allowed = reference.unpack_bitmask(mask, VOCAB)
    touched_words = int((mask != -1).sum())
    masked = int((~allowed).sum())
    item = DTYPE.itemsize
    return mask.numel() * 4 + touched_words * 32 * item + masked * item


def cases(quick: bool) -> Iterator[Case]:
    sgl = sglang()
    for kind in MASKS:
        for batch in QUICK_BATCHES if quick else BATCHES:
            mask_cpu = _mask(batch, kind, seed=batch)

            def make(batch=batch, mask_cpu=mask_cpu):
                return {
                    "logits": torch.randn(batch, VOCAB, device="cuda", dtype=DTYPE),
                    "bitmask": mask_cpu.to("cuda"),
                }

            def ref(logits, bitmask):
                reference.apply_token_bitmask_inplace(logits, bitmask)
                return logits

            impls = {
                "cuda": lambda s: grammar.apply_token_bitmask_inplace(
                    s["logits"], s["bitmask"], backend="cuda"
                ),
                "torch_eager": lambda s: ref(s["logits"], s["bitmask"]),
                "torch_compile": torch_compile(
                    ref, [batch, VOCAB], lambda f, s: f(s["logits"], s["bitmask"])
                ),
            }
            if sgl is not None and hasattr(sgl, "apply_token_bitmask_inplace_cuda"):
                impls["sglang"] = Checked(
                    lambda s, op=sgl.apply_token_bitmask_inplace_cuda: op(
                        s["logits"], s["bitmask"], None
                    ),
                    expected=lambda s: ref(s["logits"].clone(), s["bitmask"]),
                    outputs=lambda s, _: s["logits"],
                )
            yield Case(
                op="apply_token_bitmask_inplace",
                shape=[batch, VOCAB],
                dtype=DTYPE,
                bytes=_min_bytes(mask_cpu),
                make_inputs=make,
                impls=impls,
                note=f"mask {kind}",
            )
