"""Benchmarks of the mamba group: our CUDA kernels against torch eager (the reference),
torch.compile of the reference and sglang-kernel 0.4.5's CUDA causal_conv1d_fwd/update (checked
against the reference first; a binding that disagrees is reported skipped, not timed).

Expected ceilings (H200, copy ~4.27 TB/s): causal_conv1d_fwd moves x twice (read + write in
place): 1 x 4096 x 4096 bf16 = 67 MB -> ~16 us; causal_conv1d_update moves x and the state row
twice (B x D x (1 + (W-1)) x 2 x 2 bytes); selective_state_update moves the state twice (Mamba2-2.7B
fp32: 80 x 64 x 128 x 4 = 2.6 MB per sequence and direction -> B = 64: 336 MB, ~79 us). The ops
work in place, so repeated timing calls keep updating the same buffers (values stay bounded).

Shapes: causal_conv1d_fwd [layout, Bt, D, L]; causal_conv1d_update [B, D, W]; selective_state_update
[B, nh, hd, ds] with the state dtype in the note.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

import kernels_mamba as mamba  # the public ops, resolved lazily by the group
from kernels_mamba import reference
from shared.bench.harness import Case
from shared.bench.peers import Checked, sglang, torch_compile

DTYPE = torch.bfloat16


def conv_fwd_cases(quick: bool) -> Iterator[Case]:
    sgl = sglang()
    dim, width = 4096, 4
    lengths = (2048, 4096) if quick else (512, 2048, 4096)
    for layout in ("channel_last", "contiguous"):
        for length in lengths:

            def make(length=length, layout=layout):
                if layout == "channel_last":  # the proj_out[:, :D].T view of a varlen batch
                    x = torch.randn(length, dim + 256, device="cuda").to(DTYPE)[:, :dim].T
                else:
                    x = torch.randn(dim, length, device="cuda").to(DTYPE)
                return {
                    "x": x,
                    "w": torch.randn(dim, width, device="cuda").to(DTYPE),
                    "b": torch.randn(dim, device="cuda").to(DTYPE),
                    "s": torch.randn(1, dim, width - 1, device="cuda").to(DTYPE),
                    "qsl": torch.tensor([0, length], dtype=torch.int32, device="cuda"),
                    "idx": torch.zeros(1, dtype=torch.int32, device="cuda"),
                    "init": torch.ones(1, dtype=torch.bool, device="cuda"),
                }

            def args(s):
                return (s["x"], s["w"], s["b"], s["s"], s["qsl"], s["idx"], s["init"])

            impls = {
                "cuda": lambda s: mamba.causal_conv1d_fwd(*args(s), "silu", backend="cuda"),
                "torch_eager": lambda s: reference.causal_conv1d_fwd(*args(s), "silu"),
                "torch_compile": torch_compile(
                    reference.causal_conv1d_fwd,
                    [dim, length],
                    lambda f, s: f(*args(s), "silu"),
                ),
            }
            if sgl is not None:
                impls["sglang"] = Checked(
                    lambda s, op=sgl.causal_conv1d_fwd: op(*args(s), True, -1),
                    expected=lambda s: _conv_fwd_expected(s, args),
                    outputs=lambda s, _: (s["x"], s["s"]),
                )
            yield Case(
                op="causal_conv1d_fwd",
                shape=[dim, length],
                dtype=DTYPE,
                bytes=2 * dim * length * DTYPE.itemsize + 2 * dim * (width - 1) * DTYPE.itemsize,
                make_inputs=make,
                impls=impls,
                note=f"{layout} varlen x, one sequence with an initial state, W={width}, silu",
            )


def _conv_fwd_expected(s, args):
    x, states = s["x"].clone(), s["s"].clone()
    a = list(args(s))
    a[0], a[3] = x, states
    reference.causal_conv1d_fwd(*a, "silu")
    return x, states


def conv_update_cases(quick: bool) -> Iterator[Case]:
    sgl = sglang()
    width = 4
    shapes = (
        [(1, 4096), (256, 4096)] if quick else [(1, 4096), (16, 4096), (256, 4096), (256, 8192)]
    )
    for batch, dim in shapes:

        def make(batch=batch, dim=dim):
            return {
                "x": torch.randn(batch, dim, device="cuda").to(DTYPE),
                "s": torch.randn(batch, dim, width - 1, device="cuda").to(DTYPE),
                "w": torch.randn(dim, width, device="cuda").to(DTYPE),
                "b": torch.randn(dim, device="cuda").to(DTYPE),
                "idx": torch.arange(batch, dtype=torch.int32, device="cuda"),
            }

        impls = {
            "cuda": lambda s: mamba.causal_conv1d_update(
                s["x"], s["s"], s["w"], s["b"], "silu", conv_state_indices=s["idx"], backend="cuda"
            ),
            "torch_eager": lambda s: reference.causal_conv1d_update(
                s["x"], s["s"], s["w"], s["b"], "silu", None, s["idx"]
            ),
            "torch_compile": torch_compile(
                reference.causal_conv1d_update,
                [batch, dim],
                lambda f, s: f(s["x"], s["s"], s["w"], s["b"], "silu", None, s["idx"]),
            ),
        }
        if sgl is not None:
            impls["sglang"] = Checked(
                lambda s, op=sgl.causal_conv1d_update: op(
                    s["x"], s["s"], s["w"], s["b"], True, None, s["idx"], -1
                ),
                expected=_conv_update_expected,
                outputs=lambda s, _: (s["x"], s["s"]),
            )
        yield Case(
            op="causal_conv1d_update",
            shape=[batch, dim, width],
            dtype=DTYPE,
            bytes=2 * batch * dim * width * DTYPE.itemsize,  # x and the W-1 state, read + write
            make_inputs=make,
            impls=impls,
            note="one decode step, conv_state_indices, silu",
        )


def _conv_update_expected(s):
    x, states = s["x"].clone(), s["s"].clone()
    reference.causal_conv1d_update(x, states, s["w"], s["b"], "silu", None, s["idx"])
    return x, states


def ssu_cases(quick: bool) -> Iterator[Case]:
    heads, hd, ds, groups = 80, 64, 128, 1  # Mamba2-2.7B
    batches = (1, 64) if quick else (1, 16, 64)
    for state_dtype in (torch.float32, torch.bfloat16):
        for batch in batches:

            def make(batch=batch, state_dtype=state_dtype):
                def r(*shape):
                    return torch.randn(*shape, device="cuda").to(DTYPE)

                return {
                    "state": torch.randn(batch, heads, hd, ds, device="cuda").to(state_dtype),
                    "x": r(batch, heads, hd),
                    "dt": r(batch, heads)[..., None].expand(batch, heads, hd),
                    "A": -torch.rand(heads, device="cuda")[:, None, None].expand(heads, hd, ds),
                    "B": r(batch, groups, ds),
                    "C": r(batch, groups, ds),
                    "D": torch.randn(heads, device="cuda")[:, None].expand(heads, hd),
                    "z": r(batch, heads, hd),
                    "dt_bias": torch.randn(heads, device="cuda")[:, None].expand(heads, hd),
                    "out": torch.empty(batch, heads, hd, device="cuda", dtype=DTYPE),
                }

            def args(s):
                return (
                    s["state"], s["x"], s["dt"], s["A"], s["B"], s["C"], s["D"], s["z"],
                    s["dt_bias"], True,
                )  # fmt: skip

            impls = {
                "cuda": lambda s: mamba.selective_state_update(
                    *args(s), out=s["out"], backend="cuda"
                ),
                "torch_eager": lambda s: reference.selective_state_update(*args(s)),
                "torch_compile": torch_compile(
                    reference.selective_state_update,
                    [batch, heads, hd, ds],
                    lambda f, s: f(*args(s)),
                ),
            }
            elem = state_dtype.itemsize
            yield Case(
                op="selective_state_update",
                shape=[batch, heads, hd, ds],
                dtype=DTYPE,
                bytes=2 * batch * heads * hd * ds * elem  # the state, read + write
                + 3 * batch * heads * hd * DTYPE.itemsize  # x, z, out
                + 2 * batch * groups * ds * DTYPE.itemsize,  # B, C
                make_inputs=make,
                impls=impls,
                note=f"Mamba2-2.7B, {str(state_dtype).removeprefix('torch.')} state, tied A/dt/D",
            )


def cases(quick: bool) -> Iterator[Case]:
    yield from conv_fwd_cases(quick)
    yield from conv_update_cases(quick)
    yield from ssu_cases(quick)
