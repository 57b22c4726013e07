"""gemm.dsv3_fused_a_gemm against a float64 matmul rounded to bf16: every M of the CUDA kernel
(1..16), past it (the torch fallback), DeepSeek-V3's 2112 x 7168 and odd N and K, strided a rows
and b columns, strided out views, empty input, PDL on and off (PDL chains whose a the kernel just
before wrote, the weight being read before the wait), bad arguments (a row-major b included),
opcheck, torch.compile and CUDA graphs."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels_gemm import dsv3_fused_a_gemm, reference
from kernels_jit.errors import KernelsFallbackWarning
from shared.testing.compare import assert_close
from shared.testing.devices import GPU
from shared.testing.graphs import assert_pdl_chain_matches_eager
from shared.testing.inputs import misaligned, poison, randn, row_strided

DEVICES = [pytest.param("cpu", id="cpu"), GPU]
BACKENDS = {"cpu": ("torch",), "cuda": ("cuda", "torch")}


def _check(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, name: str = "out") -> None:
    """Against the float64 product, within the fp32-accumulation bound of
    test_dsv3_router_gemm._expected ((K/16 + 16) * 2^-22 * |a| @ |b|) plus one bf16 rounding
    (one ulp: 2^-8 of the value, since the fp32 sum may sit on the other side of a tie)."""
    ad, bd = a.double().cpu(), b.double().cpu()
    exact = ad @ bd
    k = a.shape[1]
    bound = (k / 16 + 16) * 2.0**-22 * (ad.abs() @ bd.abs()) + 2.0**-8 * exact.abs()
    assert out.dtype == torch.bfloat16
    got = out.double().cpu()
    assert not got.isnan().any(), f"{name}: NaN (an element was not written)"
    err = (got - exact).abs()
    bad = err > bound + 1e-30
    assert not bad.any(), (
        f"{name}: {int(bad.sum())} of {err.numel()} elements outside the bound; worst error "
        f"{err.max().item():.3g} at bound {bound.flatten()[err.argmax()].item():.3g}"
    )


def _inputs(m: int, n: int, k: int, device: str, seed: int = 0):
    """a [M, K] and b = w.t() of a row-major [N, K] weight (column-major [K, N])."""
    a = randn(m, k, dtype=torch.bfloat16, device=device, seed=seed)
    w = randn(n, k, dtype=torch.bfloat16, device=device, seed=seed + 1, scale=0.05)
    return a, w.t()


# DeepSeek-V3 (2112 x 7168), N not a multiple of 8 or 16, a small K, K % 8 != 0 (torch path).
SHAPES = ((2112, 7168), (2112, 1024), (100, 512), (13, 256), (24, 100), (40, 7))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("m", (1, 3, 8, 9, 15, 16, 17, 40))
def test_matches_float64(device, shape, m):
    n, k = shape
    a, b = _inputs(m, n, k, device, seed=m + n)
    for backend in BACKENDS[device]:
        if backend == "cuda" and (m > 16 or k % 8):
            continue  # the torch fallback (test_fallbacks)
        out = poison(torch.empty(m, n, device=device, dtype=torch.bfloat16))
        assert dsv3_fused_a_gemm(a, b, out=out, backend=backend) is out
        _check(out, a, b, name=f"{backend} m={m} n={n} k={k}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", range(1, 17))
def test_every_decode_m_at_deepseek_shape(m):
    a, b = _inputs(m, 2112, 7168, "cuda", seed=100 + m)
    out = poison(torch.empty(m, 2112, device="cuda", dtype=torch.bfloat16))
    dsv3_fused_a_gemm(a, b, out=out)
    _check(out, a, b, name=f"m={m}")


# small_m_gemm's ring kernel (cp.async through shared memory) takes runs of >= 16 chunks of 32 a
# warp: K >= 4096 without a split. Its edges: K = 4096 (runs of exactly 16), 4064 (127 chunks: a
# last warp one chunk short), 2104 x 7176 (225 chunks: runs of 29, odd for the stage's 2 chunks,
# a last chunk of one 8-wide quad as K % 32 == 8, and a last column group whose second tile is
# past N), and narrow weights over a long K, where the plan splits K over a cluster of 4 (one tile
# a CTA, the cluster reduction after the ring): 136 / 24 x 16384 (runs of 16), 40 x 16392 (513
# chunks: runs of 17 and, in the last rank, 16 and 14, the last partial).
RING_SHAPES = ((2112, 4096), (2112, 4064), (2104, 7176), (136, 16384), (24, 16384), (40, 16392))


@pytest.fixture
def ring_on(monkeypatch):
    """The ring kernel at every M (fused_a's default too), the other switches at the router's
    choices (the st.async push instantiation, weight before the PDL wait)."""
    import kernels_gemm.ops.dsv3_fused_a_gemm as op_module

    monkeypatch.setattr(op_module, "_RING_MAX_M", 16)
    monkeypatch.setattr(op_module, "_CLUSTER_PUSH", True)
    monkeypatch.setattr(op_module, "_WEIGHT_FIRST", True)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", RING_SHAPES, ids=str)
@pytest.mark.parametrize("m", (1, 5, 8, 9, 16))
def test_ring_kernel_edges(shape, m, ring_on):
    n, k = shape
    a, b = _inputs(m, n, k, "cuda", seed=7 * m + n)
    out = poison(torch.empty(m, n, device="cuda", dtype=torch.bfloat16))
    dsv3_fused_a_gemm(a, b, out=out, backend="cuda")
    _check(out, a, b, name=f"m={m} n={n} k={k}")


@pytest.mark.gpu
def test_ring_kernel_strided_rows_and_out_view(ring_on):
    """The ring kernel's copies from row-strided a and weight rows apart in a wider buffer, into
    an out view inside a wider buffer (other columns untouched)."""
    for m in (3, 12):
        a = row_strided(randn(m, 7168, dtype=torch.bfloat16, device="cuda", seed=15), extra=40)
        w = row_strided(
            randn(264, 7168, dtype=torch.bfloat16, device="cuda", seed=16, scale=0.05), extra=8
        )
        b = w.t()
        wide = torch.full((m, 280), -1.0, device="cuda", dtype=torch.bfloat16)
        out = wide[:, 8:272]
        dsv3_fused_a_gemm(a, b, out=out, backend="cuda")
        _check(out, a, b, name=f"m={m}")
        assert (wide[:, :8] == -1).all() and (wide[:, 272:] == -1).all()


@pytest.mark.gpu
@pytest.mark.parametrize("m", (1, 9, 16))
def test_ring_kernel_is_deterministic(m, ring_on):
    """Each lane's k order, the warps' sum and the cluster's sum are fixed: repeated calls give
    the same bytes (with and without PDL)."""
    a, b = _inputs(m, 2112, 7168, "cuda", seed=31 + m)
    first = dsv3_fused_a_gemm(a, b, enable_pdl=False)
    for pdl in (False, True, True):
        assert torch.equal(dsv3_fused_a_gemm(a, b, enable_pdl=pdl), first)


@settings(max_examples=15, deadline=None)
@given(m=st.integers(0, 20), n=st.integers(1, 40), k=st.integers(1, 300), seed=st.integers(0, 999))
def test_random_shapes(m, n, k, seed):
    a, b = _inputs(m, n, k, "cpu", seed=seed)
    _check(dsv3_fused_a_gemm(a, b), a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_rows_and_out_view(device):
    """Row-strided a, a weight whose rows sit apart in a wider buffer (b's column stride > K),
    an out view inside a wider buffer (other columns untouched) and a transposed out."""
    for m in (2, 16):
        a = row_strided(randn(m, 1024, dtype=torch.bfloat16, device=device, seed=5), extra=24)
        w = row_strided(
            randn(72, 1024, dtype=torch.bfloat16, device=device, seed=6, scale=0.05), extra=8
        )
        b = w.t()
        wide = torch.full((m, 90), -1.0, device=device, dtype=torch.bfloat16)
        out = wide[:, 8:80]
        assert dsv3_fused_a_gemm(a, b, out=out) is out
        _check(out, a, b)
        assert (wide[:, :8] == -1).all() and (wide[:, 80:] == -1).all()
        out_t = poison(torch.empty(72, m, device=device, dtype=torch.bfloat16)).t()
        dsv3_fused_a_gemm(a, b, out=out_t)
        _check(out_t, a, b)


@pytest.mark.gpu
def test_fallbacks_warn_and_stay_correct():
    """M > 16, K % 8 != 0 and misaligned rows run on the torch reference, with a warning."""
    a, b = _inputs(4, 64, 512, "cuda")
    cases = [_inputs(17, 2112, 1024, "cuda"), _inputs(4, 64, 100, "cuda"), (misaligned(a), b)]
    for a, b in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", KernelsFallbackWarning)
            out = dsv3_fused_a_gemm(a, b)
        _check(out, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", (False, True))
def test_pdl_knob(pdl):
    a, b = _inputs(12, 2112, 7168, "cuda", seed=9)
    _check(dsv3_fused_a_gemm(a, b, enable_pdl=pdl), a, b)


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    a, b = _inputs(0, 16, 64, device)
    assert dsv3_fused_a_gemm(a, b).shape == (0, 16)
    a, b = _inputs(3, 5, 0, device)
    out = dsv3_fused_a_gemm(a, b)
    assert out.shape == (3, 5) and (out == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_bad_arguments(device):
    a, b = _inputs(2, 32, 64, device)
    with pytest.raises(TypeError, match=r"dsv3_fused_a_gemm: a must (have dtype in|be bfloat16)"):
        dsv3_fused_a_gemm(a.half(), b)
    with pytest.raises(TypeError, match=r"dsv3_fused_a_gemm: b must (have dtype in|be bfloat16)"):
        dsv3_fused_a_gemm(a, b.float())
    with pytest.raises(ValueError, match=r"dsv3_fused_a_gemm: b \[K, N\] must be column-major"):
        dsv3_fused_a_gemm(a, b.contiguous())
    with pytest.raises(ValueError, match=r"dsv3_fused_a_gemm: a .* and b .* must share K"):
        dsv3_fused_a_gemm(a, b[:32])
    with pytest.raises(ValueError, match=r"dsv3_fused_a_gemm: out must have shape"):
        dsv3_fused_a_gemm(a, b, out=torch.empty(32, 2, device=device, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=r"dsv3_fused_a_gemm: out must (have dtype|be bfloat16)"):
        dsv3_fused_a_gemm(a, b, out=torch.empty(2, 32, device=device))
    with pytest.raises(ValueError, match="a must have a contiguous last dim"):
        dsv3_fused_a_gemm(a.t().contiguous().t(), b)
    with pytest.raises(ValueError, match="dims"):
        dsv3_fused_a_gemm(a[0], b)
    with pytest.raises(TypeError, match="enable_pdl must be a bool or None"):
        dsv3_fused_a_gemm(a, b, enable_pdl="yes")


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    from kernels_gemm.ops.dsv3_fused_a_gemm import DSV3_FUSED_A_GEMM

    a, b = _inputs(3, 48, 128, device)
    out = torch.empty(3, 48, device=device, dtype=torch.bfloat16)
    torch.library.opcheck(DSV3_FUSED_A_GEMM.torch_op, (out, a, b, None))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    a, b = _inputs(4, 64, 256, device)
    compiled = torch.compile(lambda x, y: dsv3_fused_a_gemm(x, y).float() * 2, fullgraph=True)
    assert_close(compiled(a, b), reference.dsv3_fused_a_gemm(a, b).float() * 2)


@pytest.mark.gpu
def test_cuda_graph_capture():
    a, b = _inputs(16, 2112, 7168, "cuda", seed=21)
    out = torch.empty(16, 2112, device="cuda", dtype=torch.bfloat16)
    dsv3_fused_a_gemm(a, b, out=out)  # builds and loads before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dsv3_fused_a_gemm(a, b, out=out)
    poison(out)
    a.copy_(randn(16, 7168, dtype=torch.bfloat16, device="cuda", seed=22))
    graph.replay()
    torch.cuda.synchronize()
    _check(out, a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("m", (1, 8, 16))
def test_pdl_chain_reads_each_previous_output(m):
    """A CUDA graph of back-to-back PDL calls (N = K = 2112: 132 CTAs, no cluster), each taking
    the previous call's output as its a. The next kernel launches once this one's first loads are
    out, so only its griddepcontrol.wait orders the reads: the graph must reproduce, bit for bit,
    the eager chain without PDL."""
    n = 2112
    bs = [
        randn(n, n, dtype=torch.bfloat16, device="cuda", seed=60 + i, scale=0.03).t()
        for i in range(5)
    ]
    a0 = randn(m, n, dtype=torch.bfloat16, device="cuda", seed=59)
    expected = [a0]
    for b in bs:
        expected.append(dsv3_fused_a_gemm(expected[-1], b, enable_pdl=False))
    outs = [poison(torch.empty(m, n, device="cuda", dtype=torch.bfloat16)) for _ in bs]
    dsv3_fused_a_gemm(a0, bs[0], out=outs[0])  # built before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        prev = a0
        for b, out in zip(bs, outs, strict=True):
            prev = dsv3_fused_a_gemm(prev, b, out=out, enable_pdl=True)
    for _ in range(3):
        for out in outs:
            poison(out)
        graph.replay()
        torch.cuda.synchronize()
        for i, out in enumerate(outs):
            assert torch.equal(out, expected[i + 1]), f"call {i + 1} differs from the eager chain"


@pytest.mark.gpu
@pytest.mark.parametrize("m", (1, 8, 9, 16))
def test_pdl_weight_read_early_a_after_the_previous_kernel(m, ring_on):
    """DeepSeek-V3's fused_a (2112 x 7168: the ring kernel) under PDL copies its whole ring of
    weight before griddepcontrol.wait and only a after it, so a must be the one the kernel right
    before wrote. A CUDA graph of PDL calls over six weights, where a was just written by: even
    steps, a torch kernel (a dtype-converting copy, whose dependents launch as its blocks exit)
    rewriting a whole; odd steps, the previous call (which releases its dependents right after its
    first copies) writing its output into a's first 2112 columns. Each replay, with new sources,
    must equal bit for bit the same calls made one by one without PDL."""
    n, k, steps = 2112, 7168, 6
    bs = [
        randn(n, k, dtype=torch.bfloat16, device="cuda", seed=70 + i, scale=0.05).t()
        for i in range(steps)
    ]
    as_ = [randn(m, k, dtype=torch.bfloat16, device="cuda", seed=80 + i) for i in range(steps)]
    assert_pdl_chain_matches_eager(
        lambda i, a, out, pdl: dsv3_fused_a_gemm(a, bs[i], out=out, enable_pdl=pdl),
        as_,
        n,
        torch.bfloat16,
    )
