"""Benchmarks of the mamba group: our CUDA kernels against torch eager (the reference),
torch.compile of the reference and sglang-kernel 0.4.5's CUDA causal_conv1d_fwd/update (checked
against the reference first; a binding that disagrees is reported skipped, not timed).

Expected ceilings (H200, copy ~4.24 TB/s): causal_conv1d_fwd moves x twice (read + write in
place): 1 x 4096 x 4096 bf16 = 67 MB -> ~16 us; causal_conv1d_update moves x and the state row
twice (B x D x (1 + (W-1)) x 2 x 2 bytes); selective_state_update moves the state twice (Mamba2-2.7B
fp32: 80 x 64 x 128 x 4 = 2.6 MB per sequence and direction -> B = 64: 336 MB, ~79 us). The ops
work in place, so repeated timing calls keep updating the same buffers (values stay bounded).

The references are capturable (no host sync while a graph is captured), so torch_eager and
torch_compile are timed under CUDA graphs like the kernels.

Shapes (the issue's target shapes: batch 1, dim 4096, L 512..4096):
- causal_conv1d_fwd, one varlen sequence (query_start_loc [0, L]) of D = 4096 channels with an
  initial state: ``[1, D, L]`` = (sequences, channels, tokens) for the channel-first x [D, L]
  (contiguous, stride 1 along time); ``[L, D]`` = (tokens, channels) for the channel-last x, the
  ``proj_out[:, :D].T`` view of a token-major projection [L, D + 256] (stride 1 along channels).
  sglang-kernel's causal_conv1d_fwd reads x as contiguous along time (it ignores the time stride),
  so it runs on the channel-first cases only.
- causal_conv1d_update ``[B, D, W]``: B sequences, D channels, width W (state [B, D, W-1]).
- selective_state_update ``[B, nh, hd, ds]``; the case's dtype is the state's (fp32 or bf16), the
  bytes that matter; x, dt, B, C, z and out are bf16.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

import kernels_mamba as mamba  # the public ops, resolved lazily by the group
from kernels_mamba import reference
from shared.bench.harness import Case
from shared.bench.peers import Checked, sglang, torch_compile

DTYPE = torch.bfloat16
VIEWS = {"channel_last": "the [L, D] proj_out view", "contiguous": "[D, L] contiguous"}


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
            # sgl_kernel::causal_conv1d_fwd(x, weight, bias_, conv_states, query_start_loc,
            # cache_indices, has_initial_state, bool silu_activation, int pad_slot_id): the
            # argument order matches; its kernel loads x rows as contiguous along time, so a
            # channel-last view gave wrong values there (the failed check), not a wrong binding.
            if sgl is not None and layout == "contiguous":
                impls["sglang"] = Checked(
                    lambda s, op=sgl.causal_conv1d_fwd: op(*args(s), True, -1),
                    expected=lambda s: _conv_fwd_expected(s, args),
                    outputs=lambda s, _: (s["x"], s["s"]),
                )
            yield Case(
                op="causal_conv1d_fwd",
                shape=[length, dim] if layout == "channel_last" else [1, dim, length],
                dtype=DTYPE,
                bytes=2 * dim * length * DTYPE.itemsize + 2 * dim * (width - 1) * DTYPE.itemsize,
                make_inputs=make,
                impls=impls,
                note=f"{layout} varlen x ({VIEWS[layout]}), one sequence with an initial state, "
                f"W={width}, silu",
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
            # sgl_kernel::causal_conv1d_update(x, conv_state, weight, bias_, bool silu_activation,
            # cache_seqlens_, conv_state_indices_, int pad_slot_id) takes x as [B, D, L] only
            # (it reads sizes[2]): the decode x [B, D] goes in as the view [B, D, 1].
            impls["sglang"] = Checked(
                lambda s, op=sgl.causal_conv1d_update: op(
                    s["x"].unsqueeze(-1), s["s"], s["w"], s["b"], True, None, s["idx"], -1
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
            note=f"one decode step: x [B, D], state [B, D, {width - 1}], conv_state_indices, silu",
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

                # Tied A: a stride-0 view of per-head scalars (negated before the expand: a
                # negated view is a dense copy, which took the per-element path until 2026-12-04).
                a = (-torch.rand(heads, device="cuda"))[:, None, None].expand(heads, hd, ds)
                assert a.stride()[1:] == (0, 0)
                return {
                    "state": torch.randn(batch, heads, hd, ds, device="cuda").to(state_dtype),
                    "x": r(batch, heads, hd),
                    "dt": r(batch, heads)[..., None].expand(batch, heads, hd),
                    "A": a,
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
                dtype=state_dtype,  # the bytes' dtype; x, dt, B, C, z and out are bf16
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
