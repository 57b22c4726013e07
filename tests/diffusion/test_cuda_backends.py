"""The CUDA backends of the diffusion group against the torch reference on the GPU: outputs
poisoned first, every dtype, odd sizes (scalar paths), strided and misaligned views, each
modulation layout and dtype, in place, empty input, CUDA-graph capture, torch.compile(fullgraph)
and opcheck on CUDA tensors, and the C++ argument errors."""

from __future__ import annotations

import math

import pytest
import torch

from kernels_diffusion import (
    group_norm_silu,
    layernorm_scale_shift,
    reference,
    residual_gate_add,
    timestep_embedding,
)
from shared.testing.compare import assert_close
from shared.testing.inputs import misaligned, poison, randn

pytestmark = pytest.mark.gpu
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
DEV = "cuda"


def _mod(layout: int, b: int, l: int, h: int, dtype, seed: int, scale=1.0):
    shape = [(b, h), (b, 1, h), (b, l, h)][layout]
    return randn(*shape, dtype=dtype, device=DEV, seed=seed, scale=scale)


def _strided(t: torch.Tensor, extra: int = 8) -> torch.Tensor:
    """The same values inside a buffer whose last dim is ``extra`` wider (B and L strides)."""
    wide = torch.full(
        (*t.shape[:-1], t.shape[-1] + extra), float("nan"), dtype=t.dtype, device=t.device
    )
    wide[..., : t.shape[-1]] = t
    return wide[..., : t.shape[-1]]


# residual_gate_add ------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("b", "l", "h"), [(1, 1, 8), (1, 1, 3072), (2, 7, 33), (3, 129, 256)])
@pytest.mark.parametrize("layout", [0, 1, 2])
@pytest.mark.parametrize("gate_fp32", [False, True])
def test_residual_gate_add(dtype, b, l, h, layout, gate_fp32):
    r = randn(b, l, h, dtype=dtype, device=DEV, seed=1)
    x = randn(b, l, h, dtype=dtype, device=DEV, seed=2)
    gate = _mod(layout, b, l, h, torch.float32 if gate_fp32 else dtype, seed=3)
    expected = reference.residual_gate_add(r, x, gate)
    out = poison(torch.empty_like(r))
    assert residual_gate_add(r, x, gate, out=out, backend="cuda") is out
    assert_close(out, expected)
    for rr, xx in ((_strided(r), x), (r, misaligned(x)), (misaligned(r), _strided(x, 3))):
        assert_close(residual_gate_add(rr, xx, gate, backend="cuda"), expected)
    rin = r.clone()
    assert residual_gate_add(rin, x, gate, out=rin, backend="cuda") is rin
    assert_close(rin, expected)


def test_residual_gate_add_large_and_empty():
    r = randn(1, 4096, 3072, dtype=torch.bfloat16, device=DEV, seed=4)
    x = randn(1, 4096, 3072, dtype=torch.bfloat16, device=DEV, seed=5)
    gate = randn(1, 3072, device=DEV, seed=6)
    assert_close(
        residual_gate_add(r, x, gate, backend="cuda"), reference.residual_gate_add(r, x, gate)
    )
    e = torch.empty(2, 0, 8, device=DEV)
    assert residual_gate_add(e, e, torch.ones(2, 8, device=DEV)).shape == (2, 0, 8)


def test_residual_gate_add_mixed_dtypes_fall_back():
    r = randn(2, 3, 16, dtype=torch.bfloat16, device=DEV, seed=7)
    x = randn(2, 3, 16, dtype=torch.float16, device=DEV, seed=8)
    gate = randn(2, 16, dtype=torch.float16, device=DEV, seed=9)
    with pytest.warns(Warning):
        got = residual_gate_add(r, x, gate)
    assert_close(got, reference.residual_gate_add(r, x, gate))


def test_residual_gate_add_errors():
    r = randn(2, 3, 8, device=DEV)
    with pytest.raises(ValueError, match=r"residual_gate_add: gate must have shape \[B, H\]"):
        residual_gate_add(r, r, torch.ones(2, 3, 7, device=DEV))
    with pytest.raises(ValueError, match=r"residual_gate_add"):
        residual_gate_add(r, r[:, :2], torch.ones(2, 8, device=DEV))
    with pytest.raises(TypeError, match=r"residual_gate_add"):
        residual_gate_add(r, r, torch.ones(2, 8, device=DEV), out=r.bfloat16())


# layernorm_scale_shift --------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    ("b", "l", "h"),
    # (2, 3, 12288), (1, 7, 8192): rows split in 4 CTAs (rowwise.cuh); (2, 32, 4104): in 2.
    [
        (1, 1, 3072),
        (2, 7, 65),
        (2, 16, 1024),
        (1, 300, 3072),
        (1, 1500, 3072),  # past one wave of the held 8-vector kernel: late per-sample loads
        (1, 2900, 3072),  # past two waves (late on the H200's DRAM only)
        (2, 3, 12288),
        (1, 7, 8192),
        (2, 32, 4104),
        (1, 2, 40000),
    ],
)
@pytest.mark.parametrize("mod_fp32", [False, True])
@pytest.mark.parametrize("affine", [None, "both", "weight"])
def test_layernorm_scale_shift(dtype, b, l, h, mod_fp32, affine):
    mdt = torch.float32 if mod_fp32 else dtype
    x = randn(b, l, h, dtype=dtype, device=DEV, seed=10, scale=3.0) + 1
    kwargs = {}
    if affine:
        kwargs["weight"] = randn(h, dtype=mdt, device=DEV, seed=11)
        if affine == "both":
            kwargs["bias"] = randn(h, dtype=mdt, device=DEV, seed=12)
    for i, (sl, tl) in enumerate([(0, 1), (1, 2), (2, 0)]):
        scale = _mod(sl, b, l, h, mdt, seed=13 + i, scale=0.2)
        shift = _mod(tl, b, l, h, mdt, seed=14 + i)
        expected = reference.layernorm_scale_shift(
            x, scale, shift, kwargs.get("weight"), kwargs.get("bias")
        )
        got = layernorm_scale_shift(x, scale, shift, backend="cuda", **kwargs)
        assert_close(got, expected, name=f"scale {sl} shift {tl}")
    if h % 8 == 1 or l > 16:
        return
    scale, shift = _mod(2, b, l, h, mdt, seed=20), _mod(0, b, l, h, mdt, seed=21)
    expected = reference.layernorm_scale_shift(
        x, scale, shift, kwargs.get("weight"), kwargs.get("bias")
    )
    for xx, ss in ((_strided(x), _strided(scale)), (misaligned(x), scale), (x, _strided(scale, 1))):
        assert_close(layernorm_scale_shift(xx, ss, shift, backend="cuda", **kwargs), expected)


def test_layernorm_scale_shift_out_poisoned_and_eps():
    from kernels_diffusion.ops.layernorm_scale_shift import LAYERNORM_SCALE_SHIFT

    x = randn(2, 5, 96, dtype=torch.bfloat16, device=DEV, seed=22)
    scale, shift = randn(2, 96, device=DEV, seed=23), randn(2, 1, 96, device=DEV, seed=24)
    out = poison(torch.empty_like(x))
    LAYERNORM_SCALE_SHIFT.run(out, x, scale, shift, None, None, 1e-3, backend="cuda")
    assert_close(out, reference.layernorm_scale_shift(x, scale, shift, eps=1e-3))
    const = torch.full((1, 2, 16), 3.0, device=DEV)
    got = layernorm_scale_shift(
        const,
        torch.zeros(1, 16, device=DEV),
        torch.full((1, 16), 0.5, device=DEV),
        eps=1e-5,
        backend="cuda",
    )
    assert_close(got, torch.full((1, 2, 16), 0.5, device=DEV))


def test_layernorm_scale_shift_errors():
    x = randn(2, 3, 8, device=DEV)
    with pytest.raises(ValueError, match=r"layernorm_scale_shift: shift must have shape"):
        layernorm_scale_shift(x, torch.ones(2, 8, device=DEV), torch.ones(1, 8, device=DEV))
    with pytest.raises(ValueError, match=r"layernorm_scale_shift: weight must"):
        layernorm_scale_shift(
            x,
            torch.ones(2, 8, device=DEV),
            torch.ones(2, 8, device=DEV),
            weight=torch.ones(4, device=DEV),
        )


# timestep_embedding -----------------------------------------------------------------------------


@pytest.mark.parametrize("out_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", [1, 7, 64, 1000])
@pytest.mark.parametrize("dim", [1, 2, 5, 8, 127, 256, 320, 512])
@pytest.mark.parametrize(("flip", "shift"), [(False, 1.0), (True, 0.0)])
def test_timestep_embedding(out_dtype, n, dim, flip, shift):
    if dim // 2 == shift:
        return
    t = torch.rand(n, device=DEV) * 1000
    got = timestep_embedding(
        t,
        dim,
        flip_sin_to_cos=flip,
        downscale_freq_shift=shift,
        out_dtype=out_dtype,
        backend="cuda",
    )
    expected = reference.timestep_embedding(t, dim, flip, shift, out_dtype=out_dtype)
    atol = 2e-4 if out_dtype == torch.float32 else None
    assert_close(got, expected, atol=atol, rtol=0 if atol else None)
    if dim % 2:
        assert not got[:, -1].any()


@pytest.mark.parametrize(
    "t_dtype", [torch.int64, torch.int32, torch.float64, torch.bfloat16, torch.float16]
)
def test_timestep_embedding_t_dtypes_and_large_arguments(t_dtype):
    t = (torch.rand(33) * 1000).to(t_dtype).to(DEV)
    got = timestep_embedding(t, 256, scale=1000.0, backend="cuda")
    expected = reference.timestep_embedding(t, 256, scale=1000.0)
    # angles up to 1e6: fp32 carries ~0.06 absolute error in the angle itself.
    assert_close(got, expected, atol=0.15, rtol=0)
    t = torch.arange(0, 1000, 37, device=DEV, dtype=t_dtype)[::2]  # strided t
    assert_close(
        timestep_embedding(t, 64, backend="cuda"),
        reference.timestep_embedding(t, 64),
        atol=2e-4,
        rtol=0,
    )


@pytest.mark.parametrize("dim", [8, 127, 256, 320])
@pytest.mark.parametrize(("flip", "shift"), [(False, 1.0), (True, 0.0)])
def test_timestep_embedding_fast_sincos_matches_sincosf(dim, flip, shift):
    """The kernel's inlined fast path of sincosf (magic-number quadrant, flip as a quadrant
    offset) against torch's sin/cos of the same fp32 angles: a few ulp, far inside 2e-4."""
    t = torch.cat([torch.rand(200, device=DEV) * 1000, -torch.rand(56, device=DEV) * 1000])
    got = timestep_embedding(t, dim, flip_sin_to_cos=flip, downscale_freq_shift=shift)
    expected = reference.timestep_embedding(t, dim, flip, shift)
    assert_close(got, expected, atol=2e-6, rtol=0)


@pytest.mark.parametrize("out_dtype", DTYPES, ids=str)
def test_timestep_embedding_fast_path_limit(out_dtype):
    """Angles on both sides of the fast path's limit (|a| < 105615), far past it (Payne-Hanek in
    sincosf), negative, inf and nan: each thread picks one path for its whole pack."""
    inf, nan = float("inf"), float("nan")
    t = torch.tensor(
        [0.0, 105613.0, 105614.5, 105615.0, -105614.99, 3e5, -7.5e6, 1e30, 2.5e4, inf, -inf, nan],
        device=DEV,
    )
    for dim, scale in ((8, 1.0), (64, 1.0), (33, 4.0), (256, 1000.0)):
        got = timestep_embedding(t, dim, scale=scale, out_dtype=out_dtype, backend="cuda")
        expected = reference.timestep_embedding(t, dim, scale=scale, out_dtype=out_dtype)
        atol = 2e-6 if out_dtype == torch.float32 else None
        assert_close(got, expected, atol=atol, rtol=0 if atol else None)


@pytest.mark.parametrize("out_dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("n", "dim"), [(20000, 512), (9001, 320), (5000, 127), (300000, 2)])
def test_timestep_embedding_lanes_loop_over_rows(out_dtype, n, dim):
    """Past about 1024 lanes per SM each lane loops over rows (n0, n0 + sweep, ...), its
    frequencies computed once: several passes, a row count that is no multiple of the pass,
    packed, scalar (odd dim, zero column) and one-frequency rows."""
    t = torch.rand(n, device=DEV) * 1000
    shift = 0.0 if dim == 2 else 1.0
    got = timestep_embedding(
        t, dim, flip_sin_to_cos=True, downscale_freq_shift=shift, out_dtype=out_dtype
    )
    expected = reference.timestep_embedding(t, dim, True, shift, out_dtype=out_dtype)
    atol = 2e-6 if out_dtype == torch.float32 else None
    assert_close(got, expected, atol=atol, rtol=0 if atol else None)
    if dim % 2:
        assert not got[:, -1].any()


def test_timestep_embedding_lanes_loop_strided():
    """The row loop's pointer steps: strided t (every other element) and rows of out inside a
    wider poisoned buffer, over several passes; the padding stays untouched."""
    from kernels_diffusion.ops.timestep_embedding import TIMESTEP_EMBEDDING

    n = 12345
    t = (torch.rand(2 * n, device=DEV) * 1000)[::2]
    wide = poison(torch.empty(n, 264, device=DEV))
    TIMESTEP_EMBEDDING.run(wide[:, :256], t, 256, False, 1.0, 1.0, 10000.0, backend="cuda")
    assert_close(wide[:, :256], reference.timestep_embedding(t, 256), atol=2e-6, rtol=0)
    assert wide[:, 256:].isnan().all()


def test_timestep_embedding_poisoned_out_and_empty():
    from kernels_diffusion.ops.timestep_embedding import TIMESTEP_EMBEDDING

    t = torch.rand(9, device=DEV) * 1000
    out = poison(torch.empty(9, 101, device=DEV))
    TIMESTEP_EMBEDDING.run(out, t, 101, True, 0.0, 1.0, 10000.0, backend="cuda")
    assert_close(out, reference.timestep_embedding(t, 101, True, 0.0), atol=2e-4, rtol=0)
    wide = poison(torch.empty(9, 264, device=DEV))
    TIMESTEP_EMBEDDING.run(wide[:, :256], t, 256, False, 1.0, 1.0, 10000.0, backend="cuda")
    assert_close(wide[:, :256], reference.timestep_embedding(t, 256), atol=2e-4, rtol=0)
    assert timestep_embedding(torch.empty(0, device=DEV), 32).shape == (0, 32)


# group_norm_silu --------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    ("shape", "groups"),
    [
        ((1, 4, 1), 2),
        ((2, 32, 5, 7), 32),
        ((2, 64, 8, 8), 8),
        ((1, 12, 2, 3, 4), 3),
        ((3, 6), 6),
        ((1, 128, 64, 64), 32),
        ((1, 32, 2, 96, 96), 32),
        ((4, 256, 16, 16), 32),
    ],
)
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("w_fp32", [False, True])
def test_group_norm_silu(dtype, shape, groups, channels_last, w_fp32):
    x = randn(*shape, dtype=dtype, device=DEV, seed=sum(shape), scale=2.0) + 0.5
    c = shape[-1] if channels_last else shape[1]
    groups = math.gcd(c, groups)  # the channels-last reading of a shape has other channels
    wdt = torch.float32 if w_fp32 else dtype
    weight = randn(c, dtype=wdt, device=DEV, seed=1)
    bias = randn(c, dtype=wdt, device=DEV, seed=2)
    from kernels_diffusion.ops.group_norm_silu import GROUP_NORM_SILU

    out = poison(torch.empty_like(x))
    GROUP_NORM_SILU.run(out, x, groups, weight, bias, 1e-5, channels_last, backend="cuda")
    assert_close(out, reference.group_norm_silu(x, groups, weight, bias, 1e-5, channels_last))
    xm = misaligned(x)
    got = group_norm_silu(xm, groups, weight, bias, channels_last=channels_last, backend="cuda")
    assert_close(got, reference.group_norm_silu(x, groups, weight, bias, 1e-5, channels_last))


@pytest.mark.parametrize(
    ("shape", "dtype", "aligned"),
    [
        ((1, 16, 600000), torch.bfloat16, True),
        ((1, 4, 1200000), torch.float32, False),
        ((1, 8, 300000), torch.bfloat16, True),
    ],
)
def test_group_norm_silu_large_groups(shape, dtype, aligned):
    """Groups of more tiles than fit on the GPU at once take the two-kernel path (the first
    two shapes, G = 1); the last one the one-read kernel with hundreds of tiles per group."""
    x = randn(*shape, dtype=dtype, device=DEV, seed=5) * 2 + 0.5
    if not aligned:
        x = misaligned(x)
    w = randn(shape[1], dtype=dtype, device=DEV, seed=6)
    b = randn(shape[1], dtype=dtype, device=DEV, seed=7)
    assert_close(group_norm_silu(x, 1, w, b, backend="cuda"), reference.group_norm_silu(x, 1, w, b))


def test_group_norm_silu_large_offset_mean():
    """A large common offset: the shifted sums keep the variance accurate. x itself carries
    fp32 rounding of 6e-5 (its ulp at 1000) into x - mean, so two correct two-pass
    implementations agree to ~1e-4 here; a one-pass E[x^2] - E[x]^2 would be off by ~5%."""
    x = randn(1, 64, 128, 128, device=DEV, seed=3) + 1000.0
    w, b = torch.ones(64, device=DEV), torch.zeros(64, device=DEV)
    torch.testing.assert_close(
        group_norm_silu(x, 32, w, b, backend="cuda"),
        reference.group_norm_silu(x, 32, w, b),
        atol=3e-4,
        rtol=1e-4,
    )


def test_group_norm_silu_non_contiguous_falls_back():
    x = randn(2, 8, 6, 6, device=DEV, seed=4).transpose(2, 3)
    w, b = torch.ones(8, device=DEV), torch.zeros(8, device=DEV)
    with pytest.warns(Warning):
        got = group_norm_silu(x, 4, w, b)
    assert_close(got, reference.group_norm_silu(x, 4, w, b))


# graphs, compile, opcheck -----------------------------------------------------------------------


def test_cuda_graph_capture():
    r = randn(2, 64, 256, dtype=torch.bfloat16, device=DEV, seed=1)
    x = randn(2, 64, 256, dtype=torch.bfloat16, device=DEV, seed=2)
    gate = randn(2, 256, device=DEV, seed=3)
    t = torch.rand(16, device=DEV) * 1000
    g = randn(1, 64, 16, 16, dtype=torch.bfloat16, device=DEV, seed=4)
    w, b = randn(64, device=DEV, seed=5), randn(64, device=DEV, seed=6)

    def run():
        return (
            residual_gate_add(r, x, gate),
            layernorm_scale_shift(x, gate, gate),
            timestep_embedding(t, 320, flip_sin_to_cos=True, downscale_freq_shift=0.0),
            group_norm_silu(g, 32, w, b),
        )

    run()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = run()
    for o in outs:
        poison(o)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(outs[0], reference.residual_gate_add(r, x, gate))
    assert_close(outs[1], reference.layernorm_scale_shift(x, gate, gate))
    assert_close(outs[2], reference.timestep_embedding(t, 320, True, 0.0), atol=2e-4, rtol=0)
    assert_close(outs[3], reference.group_norm_silu(g, 32, w, b))


def test_cuda_torch_compile_fullgraph():
    r = randn(2, 8, 128, dtype=torch.bfloat16, device=DEV, seed=1)
    gate = randn(2, 1, 128, dtype=torch.bfloat16, device=DEV, seed=2)
    t = torch.rand(5, device=DEV) * 1000
    g = randn(2, 32, 4, 4, device=DEV, seed=3)
    w, b = torch.ones(32, device=DEV), torch.zeros(32, device=DEV)

    def fn(r, gate, t, g):
        return (
            residual_gate_add(r, r, gate) * 2,
            layernorm_scale_shift(r, gate, gate) * 2,
            timestep_embedding(t, 33) * 2,
            group_norm_silu(g, 8, w, b) * 2,
        )

    got = torch.compile(fn, fullgraph=True)(r, gate, t, g)
    assert_close(got[0], reference.residual_gate_add(r, r, gate) * 2)
    assert_close(got[1], reference.layernorm_scale_shift(r, gate, gate) * 2)
    assert_close(got[2], reference.timestep_embedding(t, 33) * 2, atol=5e-4, rtol=0)
    assert_close(got[3], reference.group_norm_silu(g, 8, w, b) * 2)


def test_cuda_opcheck():
    from kernels_diffusion.ops.group_norm_silu import GROUP_NORM_SILU
    from kernels_diffusion.ops.layernorm_scale_shift import LAYERNORM_SCALE_SHIFT
    from kernels_diffusion.ops.residual_gate_add import RESIDUAL_GATE_ADD
    from kernels_diffusion.ops.timestep_embedding import TIMESTEP_EMBEDDING

    x = randn(2, 3, 64, device=DEV, seed=1)
    scale = randn(2, 64, device=DEV, seed=2)
    torch.library.opcheck(RESIDUAL_GATE_ADD.torch_op, (torch.empty_like(x), x, x, scale, None))
    torch.library.opcheck(
        LAYERNORM_SCALE_SHIFT.torch_op,
        (torch.empty_like(x), x, scale, scale, None, None, 1e-6, None),
    )
    t = torch.rand(5, device=DEV) * 1000
    torch.library.opcheck(
        TIMESTEP_EMBEDDING.torch_op,
        (torch.empty(5, 33, device=DEV), t, 33, True, 0.0, 1.0, 10000.0, None),
    )
    g = randn(2, 8, 3, 3, device=DEV, seed=3)
    w = torch.ones(8, device=DEV)
    torch.library.opcheck(
        GROUP_NORM_SILU.torch_op, (torch.empty_like(g), g, 4, w, w, 1e-5, False, None)
    )
