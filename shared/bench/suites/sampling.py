"""Benchmarks of the sampling group's filtering ops: our CUDA kernels (csrc/filters.cuh) against
torch eager (the sort-based reference), torch.compile of the reference, sglang-kernel 0.4.5's
FlashInfer-derived kernels (top_k_renorm_probs, top_p_renorm_probs, top_k_mask_logits) and
FlashInfer 0.7.2.post1's own (the same three: its multi-CTA radix top-k and AIR top-p, built by
shared/bench/build_flashinfer_peer.py; FlashInfer has no min_p_renorm_probs), each checked
against the reference at its first call.

Shapes: [B, V] with V = 128256 (Llama-3 vocabulary) fp32, B in 1..512; k = 50, p = 0.9,
min_p = 0.05; probabilities are the softmax of randn * 3 logits. ``bytes`` is the minimum traffic
(read the row once, write it once: 2 * B * V * 4), so the "% of copy" column reads directly;
our kernels read the row 3-4 times (L2 absorbs part of it) and write it once.

The sampling ops (sampling_from_probs, top_k_top_p_sampling_from_probs, see draw_cases) are timed
against torch eager and torch.compile only (the peers draw with their own RNG, so their samples
cannot be checked against the reference); B in 1..256.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

import kernels_sampling as sampling  # the public ops, resolved lazily by the group
from kernels_sampling import reference
from shared.bench.harness import Case
from shared.bench.peers import Checked, flashinfer, sglang, torch_compile

DTYPE = torch.float32
VOCAB = 128256
BATCHES = (1, 16, 64, 128, 512)
QUICK_BATCHES = (1, 128)
TOP_K, TOP_P, MIN_P = 50, 0.9, 0.05
# FlashInfer's multi-CTA radix top-k keeps per-row state across its CTAs in a buffer that must
# start zeroed (it resets it at the end of each launch): 1 MiB, as flashinfer/sampling.py
# allocates it.
FI_ROW_STATES_BYTES = 1 << 20


def fi_top_p_workspace_bytes(batch: int, vocab: int = VOCAB) -> int:
    """The AIR top-p workspace of ``top_p_renorm_probs`` (not deterministic: float histograms),
    sized as flashinfer/sampling.py sizes it (GetAirTopPRenormWorkspaceSize in air_top_p.cuh)."""

    def align(n: int) -> int:
        return (n + 255) // 256 * 256

    buf_len = max(align(vocab // 32), 256)  # fp32: 1/32 of the row per candidate buffer
    return (
        align(384 * batch)  # counters
        + align(4 * 2048 * batch)  # histogram (float)
        + align(4 * 2048 * batch)  # count histogram
        + 2 * align(4 * buf_len * batch)  # two candidate buffers
    )


def _make(batch: int, *, logits: bool = False, fi_buffers: bool = False):
    """Inputs of one filter case; FlashInfer's row states and top-p workspace only where that
    peer runs."""

    def make():
        x = torch.randn(batch, VOCAB, device="cuda") * 3
        if not logits:
            x = x.softmax(dim=1)
        s = {"x": x, "out": torch.empty_like(x)}
        if fi_buffers:
            s["fi_row_states"] = torch.zeros(FI_ROW_STATES_BYTES, dtype=torch.uint8, device="cuda")
            s["fi_workspace"] = torch.empty(
                fi_top_p_workspace_bytes(batch), dtype=torch.uint8, device="cuda"
            )
        return s

    return make


def _case(name: str, batch: int, impls: dict, note: str = "", logits: bool = False) -> Case:
    return Case(
        op=name,
        shape=[batch, VOCAB],
        dtype=DTYPE,
        bytes=2 * batch * VOCAB * DTYPE.itemsize,  # read the row once, write it once
        make_inputs=_make(batch, logits=logits, fi_buffers="flashinfer" in impls),
        impls=impls,
        note=note,
    )


def _sgl_peer(sgl, name: str, value, ref):
    """sgl_kernel.<name>(probs, out, maybe_arr=None, val) -> () (sgl-kernel common_extension.cc)."""
    fn = getattr(sgl, name)
    return Checked(
        lambda s: fn(s["x"], s["out"], None, value),
        expected=lambda s: ref(s["x"], value),
        outputs=lambda s, _: s["out"],
    )


# FlashInfer's calls (flashinfer_sampling_binding.cu, as flashinfer/sampling.py makes them with a
# scalar k/p: maybe_arr None, is_deterministic False, its default).
_FI_CALLS = {
    "top_k_renorm_probs": lambda fn, s, k: fn(s["x"], s["out"], None, k, False, s["fi_row_states"]),
    "top_p_renorm_probs": lambda fn, s, p: fn(s["x"], s["out"], None, p, False, s["fi_workspace"]),
    "top_k_mask_logits": lambda fn, s, k: fn(s["x"], s["out"], None, k, s["fi_row_states"]),
}


def _fi_peer(fi, name: str, value, ref):
    fn, call = getattr(fi, name), _FI_CALLS[name]
    return Checked(
        lambda s: call(fn, s, value),
        expected=lambda s: ref(s["x"], value),
        outputs=lambda s, _: s["out"],
    )


def cases(quick: bool) -> Iterator[Case]:
    sgl = sglang()
    fi = flashinfer("sampling")
    batches = QUICK_BATCHES if quick else BATCHES
    specs = (
        ("top_k_renorm_probs", TOP_K, reference.top_k_renorm_probs, False),
        ("top_p_renorm_probs", TOP_P, reference.top_p_renorm_probs, False),
        ("min_p_renorm_probs", MIN_P, reference.min_p_renorm_probs, False),
        ("top_k_mask_logits", TOP_K, reference.top_k_mask_logits, True),
    )
    for name, value, ref, logits in specs:
        op = getattr(sampling, name)
        for batch in batches:
            impls = {
                "cuda": lambda s, op=op, value=value: op(s["x"], value, backend="cuda"),
                "torch_eager": lambda s, ref=ref, value=value: ref(s["x"], value),
                "torch_compile": torch_compile(
                    ref, [batch, VOCAB], lambda f, s, value=value: f(s["x"], value)
                ),
            }
            if sgl is not None and hasattr(sgl, name):
                impls["sglang"] = _sgl_peer(sgl, name, value, ref)
            if fi is not None and name in _FI_CALLS:
                impls["flashinfer"] = _fi_peer(fi, name, value, ref)
            yield _case(name, batch, impls, logits=logits)
    yield from draw_cases(quick)


def _make_draw(batch: int):
    def make():
        x = (torch.randn(batch, VOCAB, device="cuda") * 3).softmax(dim=1)
        seed = torch.full((1,), 1234, dtype=torch.int64, device="cuda")
        return {"x": x, "seed": seed, "offset": torch.zeros_like(seed)}

    return make


def draw_cases(quick: bool) -> Iterator[Case]:
    """sampling_from_probs and top_k_top_p_sampling_from_probs (k = 50, p = 0.9, both orders).

    ``bytes`` reads the row once and writes an int32 sample and a bool per row. No binary peer:
    sglang-kernel's sampling ops take other RNG arguments (not the project RNG).
    """
    batches = (1, 16, 64, 256) if not quick else (1, 256)
    specs = (
        ("sampling_from_probs", sampling.sampling_from_probs, reference.sampling_from_probs, ()),
        (
            "top_k_top_p_sampling_from_probs",
            sampling.top_k_top_p_sampling_from_probs,
            reference.top_k_top_p_sampling_from_probs,
            (TOP_K, TOP_P),
        ),
    )
    for name, op, ref, args in specs:
        orders = ("top_k_first", "joint") if args else (None,)
        for order in orders:
            kw = {} if order is None else {"filter_apply_order": order}
            for batch in batches:
                impls = {
                    "cuda": lambda s, op=op, args=args, kw=kw: op(
                        s["x"], *args, seed=s["seed"], offset=s["offset"], backend="cuda", **kw
                    ),
                    "torch_eager": lambda s, ref=ref, args=args, kw=kw: ref(
                        s["x"], *args, seed=s["seed"], offset=s["offset"], **kw
                    ),
                    "torch_compile": torch_compile(
                        ref,
                        [batch, VOCAB],
                        lambda f, s, args=args, kw=kw: f(
                            s["x"], *args, seed=s["seed"], offset=s["offset"], **kw
                        ),
                    ),
                }
                yield Case(
                    op=name,
                    shape=[batch, VOCAB],
                    dtype=DTYPE,
                    bytes=batch * (VOCAB * DTYPE.itemsize + 4 + 1),
                    make_inputs=_make_draw(batch),
                    impls=impls,
                    note=order or "",
                )
