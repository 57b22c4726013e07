"""Benchmarks of the activation group: our CUDA kernels against torch eager (the reference),
torch.compile of the reference (a static graph per target shape, see peers.py), Liger-Kernel and
FlashInfer's CUDA act_and_mul kernels (silu, gelu, gelu_tanh; built by
shared/bench/build_flashinfer_peer.py) where they have the op, on the same inputs.

Expected ceiling: the gated ops move 3 bytes-per-element x T x d (read 2d, write d; bf16 x2),
relu2 2 x T x d x 2; at the H200's ~4.27 TB/s copy rate 32768 x 8192 bf16 silu_and_mul (1.61 GB)
takes ~377 us. Decode shapes (1-16 tokens) are launch-bound: ~1-2 us under CUDA graphs.

Shapes are recorded as [tokens, d] with d the output width of the *_and_mul ops.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import torch

import kernels_activation as activation  # the public ops, resolved lazily by the group
from kernels_activation import reference
from shared.bench.harness import Case
from shared.bench.peers import Checked, flashinfer, flashinfer_pdl, has, torch_compile
from shared.bench.shapes import token_grid

DTYPE = torch.bfloat16


def _liger_gated(name: str) -> tuple[Callable[[dict], object], bool] | None:
    """Liger's implementation of a gated op and whether it needs the two halves as separate
    contiguous tensors (its GeGLU kernel takes a and b with one shared row stride: it indexes both
    with the output's stride, so the halves of a [T, 2d] buffer cannot be passed as views)."""
    if not has("liger_kernel"):
        return None
    if name == "silu_and_mul":
        from liger_kernel.ops.swiglu import swiglu_fused_gate_up_forward

        return (lambda s: swiglu_fused_gate_up_forward(s["x"])), False
    if name == "gelu_tanh_and_mul":
        from liger_kernel.ops.geglu import geglu_forward

        return (lambda s: geglu_forward(s["a"], s["b"])), True
    return None


def gated_cases(name: str, quick: bool) -> Iterator[Case]:
    op = getattr(activation, name)
    ref = getattr(reference, name)
    liger = _liger_gated(name)
    fi = flashinfer()
    for tokens, d in token_grid(quick):

        def make(tokens=tokens, d=d, halves=bool(liger and liger[1])):
            x = torch.randn(tokens, 2 * d, device="cuda").to(DTYPE)
            inputs = {"x": x, "out": torch.empty(tokens, d, device="cuda", dtype=DTYPE)}
            if halves:  # Liger's GeGLU reads two contiguous halves (made outside the timing)
                inputs["a"], inputs["b"] = x[:, :d].contiguous(), x[:, d:].contiguous()
            return inputs

        impls = {
            "cuda": lambda s, op=op: op(s["x"], out=s["out"], backend="cuda"),
            "torch_eager": lambda s, ref=ref: ref(s["x"]),
            "torch_compile": torch_compile(ref, [tokens, d], lambda f, s: f(s["x"])),
        }
        if liger:
            impls["liger"] = liger[0]
        if fi is not None:  # into the preallocated output, like ours
            fi_op, pdl = getattr(fi, name), flashinfer_pdl()
            impls["flashinfer"] = Checked(
                lambda s, fi_op=fi_op, pdl=pdl: fi_op(s["out"], s["x"], pdl),
                expected=lambda s, ref=ref: ref(s["x"]),
                outputs=lambda s, _: s["out"],
            )
        yield Case(
            op=name,
            shape=[tokens, d],
            dtype=DTYPE,
            bytes=3 * tokens * d * DTYPE.itemsize,  # read x [T, 2d] + write out [T, d]
            make_inputs=make,
            impls=impls,
            note="liger on two contiguous halves" if liger and liger[1] else "",
        )


def relu2_cases(quick: bool) -> Iterator[Case]:
    liger = None
    if has("liger_kernel"):
        from liger_kernel.ops.relu_squared import relu_squared_forward

        liger = relu_squared_forward
    for tokens, d in token_grid(quick):

        def make(tokens=tokens, d=d):
            x = torch.randn(tokens, d, device="cuda").to(DTYPE)
            return {"x": x, "out": torch.empty_like(x)}

        impls = {
            "cuda": lambda s: activation.relu2(s["x"], out=s["out"], backend="cuda"),
            "torch_eager": lambda s: reference.relu2(s["x"]),
            "torch_compile": torch_compile(reference.relu2, [tokens, d], lambda f, s: f(s["x"])),
        }
        if liger:
            impls["liger"] = lambda s, f=liger: f(s["x"])
        yield Case(
            op="relu2",
            shape=[tokens, d],
            dtype=DTYPE,
            bytes=2 * tokens * d * DTYPE.itemsize,  # read x + write out, both [T, d]
            make_inputs=make,
            impls=impls,
        )


def cases(quick: bool) -> Iterator[Case]:
    for name in ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"):
        yield from gated_cases(name, quick)
    yield from relu2_cases(quick)
