"""elementwise.fused_dual_residual_rmsnorm against a float64 oracle and its reference: the
rounding contract (mid rounded once, the second norm reads the rounded mid), every register
config of the CUDA kernel and its loop path, in place into residual, row strides, odd and
misaligned widths (scalar path), empty T, CUDA graphs, torch.compile and opcheck."""

from __future__ import annotations

import math

import pytest
import torch

from kernels_elementwise import fused_dual_residual_rmsnorm, reference
from kernels_elementwise.ops.fused_dual_residual_rmsnorm import FUSED_DUAL_RESIDUAL_RMSNORM
from shared.testing.compare import assert_close
from shared.testing.inputs import FLOAT_DTYPES, misaligned, poison, randn

EPS = 1e-6


def _rms64(v, eps):
    v = v.double()
    return v / torch.sqrt((v * v).sum(-1, keepdim=True) / v.shape[-1] + eps)


def oracle(x, residual, w1, w2, eps):
    """Float64 throughout, except that mid is rounded to the dtype before the second norm."""
    mid = (residual.double() + _rms64(x, eps) * w1.double()).to(x.dtype)
    out = (_rms64(mid, eps) * w2.double()).to(x.dtype)
    return out, mid


def make(tokens, hidden, dtype, device="cpu", seed=0):
    x = randn(tokens, hidden, dtype=dtype, device=device, seed=seed)
    residual = randn(tokens, hidden, dtype=dtype, device=device, seed=seed + 1, scale=4.0)
    w1 = randn(hidden, dtype=dtype, device=device, seed=seed + 2)
    w2 = randn(hidden, dtype=dtype, device=device, seed=seed + 3)
    return x, residual, w1, w2


def check(got, args, eps=EPS, label=""):
    """mid against the oracle's mid; out against the float64 second norm of the mid *as
    returned*. Two fp32 computations of mid round to different neighbours for a few elements
    in 10^4 (one ulp, within tolerance); checking out against the oracle's own mid would then
    stack that ulp on out's rounding (up to 3 fp16 ulps at |out| > 1, past the tolerance)."""
    out, mid = got
    x, residual, w1, w2 = args
    assert_close(mid, oracle(x, residual, w1, w2, eps)[1], name=f"mid {label}")
    assert_close(out, (_rms64(mid, eps) * w2.double()).to(out.dtype), name=f"out {label}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("hidden", (1, 100, 4096))
def test_reference_matches_float64_oracle(dtype, hidden):
    args = make(13, hidden, dtype, seed=hidden)
    check(reference.fused_dual_residual_rmsnorm(*args, EPS), args)


def test_reference_reads_the_rounded_mid():
    """The second norm must see mid as stored: rmsnorm(mid_bf16) * w2, not the fp32 mid."""
    x, residual, w1, w2 = make(4, 64, torch.bfloat16, seed=9)
    out, mid = reference.fused_dual_residual_rmsnorm(x, residual, w1, w2, EPS)
    m = mid.double()
    separate = (m / torch.sqrt(m.pow(2).mean(-1, keepdim=True) + EPS) * w2.double()).bfloat16()
    assert_close(out, separate)


def test_public_op_on_cpu_outputs_and_in_place():
    args = make(6, 48, torch.float32)
    x, residual, w1, w2 = args
    check(fused_dual_residual_rmsnorm(*args, EPS), args)
    out, mid = poison(torch.empty_like(x)), poison(torch.empty_like(x))
    got = fused_dual_residual_rmsnorm(*args, EPS, out=out, mid=mid)
    assert got[0] is out and got[1] is mid
    check(got, args)
    saved = (x, residual.clone(), w1, w2)
    got = fused_dual_residual_rmsnorm(*args, EPS, mid=residual)
    assert got[1] is residual
    check(got, saved)
    out, mid = fused_dual_residual_rmsnorm(torch.empty(0, 8), torch.empty(0, 8), w1[:8], w2[:8])
    assert out.shape == mid.shape == (0, 8)


def test_bad_input_errors_name_op_argument_and_value():
    x, residual, w1, w2 = make(4, 8, torch.float32)
    name = "fused_dual_residual_rmsnorm"
    with pytest.raises(ValueError, match=rf"{name}: weight2 must be \[8\] \(x's H\), got \(7,\)"):
        fused_dual_residual_rmsnorm(x, residual, w1, w2[:7])
    with pytest.raises(
        ValueError,
        match=rf"{name}: residual must have x's shape \(4, 8\), "
        r"got \(3, 8\)",
    ):
        fused_dual_residual_rmsnorm(x, residual[:3], w1, w2)
    with pytest.raises(ValueError, match=rf"{name}: eps must be a finite number >= 0, got -1.0"):
        fused_dual_residual_rmsnorm(x, residual, w1, w2, -1.0)
    with pytest.raises(ValueError, match=rf"{name}: eps must be a finite number >= 0, got nan"):
        fused_dual_residual_rmsnorm(x, residual, w1, w2, math.nan)
    with pytest.raises(ValueError, match=rf"{name}: out and mid must be different buffers"):
        fused_dual_residual_rmsnorm(x, residual, w1, w2, out=residual, mid=residual)
    with pytest.raises(
        TypeError,
        match=rf"{name}: weight1 must have dtype in \(float32\), "
        r"got bfloat16",
    ):
        fused_dual_residual_rmsnorm(x, residual, w1.bfloat16(), w2)
    with pytest.raises(ValueError, match=rf"{name}: mid must have shape \(4, 8\), got \(4, 9\)"):
        fused_dual_residual_rmsnorm(x, residual, w1, w2, mid=torch.empty(4, 9))
    with pytest.raises(ValueError, match=rf"{name}: x must have 2 dims, got shape \(8,\)"):
        fused_dual_residual_rmsnorm(w1, w1, w1, w2)


def test_torch_compile_fullgraph_cpu():
    args = make(6, 64, torch.float32)
    compiled = torch.compile(
        lambda *a: tuple(t * 2 for t in fused_dual_residual_rmsnorm(*a, EPS)), fullgraph=True
    )
    out2, mid2 = compiled(*args)
    check((out2 / 2, mid2 / 2), args)


def test_opcheck():
    x, residual, w1, w2 = make(6, 64, torch.float32)
    out, mid = torch.empty_like(x), torch.empty_like(x)
    torch.library.opcheck(
        FUSED_DUAL_RESIDUAL_RMSNORM.torch_op, (out, mid, x, residual, w1, w2, EPS, None)
    )


# --- GPU -----------------------------------------------------------------------------------------

# The width (16-byte vectors per row, bf16) and the row count pick the kernel and layout (see
# kernels/rowwise.cuh): 8, 256 and 1024 (1, 32, 128 vectors: several rows per block), 4096-24576
# (one row per block: 2 vectors per thread for at most 2 rows per SM, else 8), 40000 (5000
# vectors: the loop kernel); 1, 127, 5128 + 1 leave the 16-byte path (the scalar loop kernel).
WIDTHS = (1, 8, 127, 256, 1024, 4096, 5128, 5129, 7168, 8192, 16384, 24576, 40000)
TOKENS = (1, 7, 64, 128, 1000)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("hidden", WIDTHS)
@pytest.mark.parametrize("tokens", TOKENS)
def test_cuda_matches_reference(tokens, hidden, dtype):
    args = make(tokens, hidden, dtype, "cuda", seed=tokens + hidden)
    out, mid = poison(torch.empty_like(args[0])), poison(torch.empty_like(args[0]))
    fused_dual_residual_rmsnorm(*args, EPS, out=out, mid=mid, backend="cuda")
    check((out, mid), args, label=f"T={tokens} H={hidden}")


# Split rows (the row engine's clusters at decode, rowwise.cuh): 1-33 rows split in 4 from 8192
# 16-bit values and in 2 from 4096; 34-66 rows in 2 up to 16384 values; 100 rows are not split.
# Both statistics (rms of x, then of the rounded mid) go through the cluster exchange.
SPLIT_WIDTHS = (4096, 4104, 7168, 8192, 8200, 16392, 32768)
SPLIT_TOKENS = (1, 7, 33, 34, 64, 100)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("hidden", SPLIT_WIDTHS)
@pytest.mark.parametrize("tokens", SPLIT_TOKENS)
def test_cuda_split_rows_match_and_repeat(tokens, hidden, dtype):
    args = make(tokens, hidden, dtype, "cuda", seed=tokens + hidden)
    runs = []
    for _ in range(2):
        out, mid = poison(torch.empty_like(args[0])), poison(torch.empty_like(args[0]))
        fused_dual_residual_rmsnorm(*args, EPS, out=out, mid=mid, backend="cuda")
        check((out, mid), args, label=f"T={tokens} H={hidden}")
        runs.append((out, mid))
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
def test_cuda_in_place_strided_and_misaligned(dtype):
    x, residual, w1, w2 = make(33, 4096, dtype, "cuda", seed=5)
    saved = (x, residual.clone(), w1, w2)
    got = fused_dual_residual_rmsnorm(x, residual, w1, w2, EPS, mid=residual, backend="cuda")
    assert got[1] is residual
    check(got, saved, label="mid=residual")
    x, residual, w1, w2 = make(33, 4096, dtype, "cuda", seed=6)
    saved = (x.clone(), residual, w1, w2)
    got = fused_dual_residual_rmsnorm(x, residual, w1, w2, EPS, out=x, backend="cuda")
    assert got[0] is x
    check(got, saved, label="out=x")
    for extra in (64, 3):
        wide = randn(33, 2 * 4096 + extra, dtype=dtype, device="cuda", seed=extra)
        xs, rs = wide[:, :4096], wide[:, 4096 + extra :]
        got = fused_dual_residual_rmsnorm(xs, rs, w1, w2, EPS, backend="cuda")
        check(got, (xs, rs, w1, w2), label=f"row stride +{extra}")
    w1m = misaligned(w1)
    got = fused_dual_residual_rmsnorm(x, residual, w1m, w2, EPS, backend="cuda")
    check(got, (x, residual, w1m, w2), label="misaligned w1")
    empty = torch.empty(0, 4096, dtype=dtype, device="cuda")
    assert fused_dual_residual_rmsnorm(empty, empty, w1, w2, backend="cuda")[0].shape == (0, 4096)


@pytest.mark.gpu
def test_cuda_graph_capture():
    x, residual, w1, w2 = make(16, 7168, torch.bfloat16, "cuda")
    out, mid = torch.empty_like(x), torch.empty_like(x)
    fused_dual_residual_rmsnorm(x, residual, w1, w2, EPS, out=out, mid=mid)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused_dual_residual_rmsnorm(x, residual, w1, w2, EPS, out=out, mid=mid)
    poison(out)
    poison(mid)
    graph.replay()
    torch.cuda.synchronize()
    check((out, mid), (x, residual, w1, w2))


@pytest.mark.gpu
def test_cuda_torch_compile_fullgraph():
    args = make(100, 4096, torch.bfloat16, "cuda")
    compiled = torch.compile(
        lambda *a: tuple(t * 2 for t in fused_dual_residual_rmsnorm(*a, EPS)), fullgraph=True
    )
    out2, mid2 = compiled(*args)
    check((out2 / 2, mid2 / 2), args)


@pytest.mark.gpu
def test_cuda_opcheck():
    x, residual, w1, w2 = make(16, 1024, torch.bfloat16, "cuda")
    out, mid = torch.empty_like(x), torch.empty_like(x)
    torch.library.opcheck(
        FUSED_DUAL_RESIDUAL_RMSNORM.torch_op, (out, mid, x, residual, w1, w2, EPS, None)
    )
