"""gemm.dsv3_router_gemm against a float64 matmul: every M of the CUDA kernel (1..16, both row
halves of its tensor-core tile), past it (the torch fallback), DeepSeek-V3's 256/384 x 7168 and odd
E and K, strided x and w rows, strided out views, bf16 out, empty input, PDL on and off (PDL
chains whose x the kernel just before wrote, the weight being read before the wait), bad
arguments, opcheck, torch.compile and CUDA graphs."""

from __future__ import annotations

import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kernels_gemm import dsv3_router_gemm, reference
from kernels_jit.errors import KernelsFallbackWarning
from shared.testing.compare import assert_close
from shared.testing.devices import GPU
from shared.testing.graphs import assert_pdl_chain_matches_eager
from shared.testing.inputs import misaligned, poison, randn, row_strided

DEVICES = [pytest.param("cpu", id="cpu"), GPU]
BACKENDS = {"cpu": ("torch",), "cuda": ("cuda", "torch")}


def _expected(x: torch.Tensor, w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The product in float64 and the error bound of an fp32-accumulated one.

    Bound: an fp32 GEMM adds K products in at most K/16 rounded steps (one per k16 tensor-core
    MMA; the reference's blocked CPU GEMM takes fewer) plus the cross-warp and cross-CTA sums
    (<= 16), each rounding by at most 2^-24 of a partial sum bounded by sum_k |x w|. Four times
    that first-order bound covers the MMA's internal alignment: (K/16 + 16) * 2^-22 * |x| @ |w|.T
    (K = 7168: 1.1e-4 of the absolute sum, about 0.6% of a typical logit; an indexing error is
    O(1)).
    """
    xd, wd = x.double().cpu(), w.double().cpu()
    exact = xd @ wd.t()
    scale = xd.abs() @ wd.abs().t()
    k = x.shape[1]
    return exact, (k / 16 + 16) * 2.0**-22 * scale


def _check(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, name: str = "out") -> None:
    exact, bound = _expected(x, w)
    if out.dtype == torch.bfloat16:  # one more rounding: at most one bf16 ulp (2^-8 relative)
        bound = bound + 2.0**-8 * exact.abs()
    got = out.double().cpu()
    assert not got.isnan().any(), f"{name}: NaN (an element was not written)"
    err = (got - exact).abs()
    bad = err > bound + 1e-30
    assert not bad.any(), (
        f"{name}: {int(bad.sum())} of {err.numel()} elements outside the fp32-accumulation bound; "
        f"worst error {err.max().item():.3g} at bound {bound.flatten()[err.argmax()].item():.3g}"
    )


def _inputs(m: int, e: int, k: int, device: str, seed: int = 0):
    x = randn(m, k, dtype=torch.bfloat16, device=device, seed=seed)
    w = randn(e, k, dtype=torch.bfloat16, device=device, seed=seed + 1, scale=0.05)
    return x, w


# DeepSeek-V3 (E = 256 and 384, K = 7168), a small K, odd E and K (K % 8 != 0: the torch path).
SHAPES = ((256, 7168), (384, 7168), (256, 1024), (33, 512), (7, 100), (13, 129))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("m", (1, 2, 5, 8, 9, 13, 16, 17, 64))
def test_matches_float64(device, shape, m):
    e, k = shape
    x, w = _inputs(m, e, k, device, seed=m + k)
    for backend in BACKENDS[device]:
        if backend == "cuda" and (m > 16 or k % 8):
            continue  # the torch fallback (test_fallbacks)
        out = poison(torch.empty(m, e, device=device))
        assert dsv3_router_gemm(x, w, out=out, backend=backend) is out
        _check(out, x, w, name=f"{backend} m={m} e={e} k={k}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("m", (1, 7, 16))
def test_bf16_out(device, m):
    x, w = _inputs(m, 256, 7168, device, seed=2)
    for backend in BACKENDS[device]:
        out = poison(torch.empty(m, 256, device=device, dtype=torch.bfloat16))
        dsv3_router_gemm(x, w, out_dtype=torch.bfloat16, out=out, backend=backend)
        _check(out, x, w, name=backend)
    default = dsv3_router_gemm(x, w, out_dtype=torch.bfloat16)
    assert default.dtype == torch.bfloat16 and default.shape == (m, 256)


# Long K sends the router's plan (one tile a CTA, clusters of 4 over K) to small_m_gemm's ring
# kernel (runs of >= 16 chunks of 32 a warp): 256 x 32768 (runs of 32), 384 x 16384 (two tiles a
# CTA, runs of 16), 13 x 20488 (a partial second tile; 641 chunks: runs of 21 and 20, the last
# chunk one 8-wide quad).
# fp32 and bf16 out.
RING_SHAPES = ((256, 32768), (384, 16384), (13, 20488))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", RING_SHAPES, ids=str)
@pytest.mark.parametrize("m", (1, 8, 9, 16))
@pytest.mark.parametrize("out_dtype", (torch.float32, torch.bfloat16), ids=str)
def test_ring_kernel_long_k(shape, m, out_dtype):
    e, k = shape
    x, w = _inputs(m, e, k, "cuda", seed=m + e)
    out = poison(torch.empty(m, e, device="cuda", dtype=out_dtype))
    dsv3_router_gemm(x, w, out_dtype=out_dtype, out=out, backend="cuda")
    _check(out, x, w, name=f"m={m} e={e} k={k}")


@settings(max_examples=15, deadline=None)
@given(m=st.integers(0, 20), e=st.integers(1, 40), k=st.integers(1, 300), seed=st.integers(0, 999))
def test_random_shapes(m, e, k, seed):
    x, w = _inputs(m, e, k, "cpu", seed=seed)
    _check(dsv3_router_gemm(x, w), x, w)


@pytest.mark.parametrize("device", DEVICES)
def test_strided_rows_and_out_view(device):
    """Row-strided x and w (views into wider buffers, 16-byte aligned rows: the CUDA path) and
    an out view inside a wider buffer, whose other columns stay untouched."""
    for m in (3, 12):
        x = row_strided(randn(m, 1024, dtype=torch.bfloat16, device=device, seed=3), extra=16)
        w = row_strided(
            randn(40, 1024, dtype=torch.bfloat16, device=device, seed=4, scale=0.05), extra=8
        )
        wide = torch.full((m, 60), -1.0, device=device)
        out = wide[:, 4:44]
        assert dsv3_router_gemm(x, w, out=out) is out
        _check(out, x, w)
        assert (wide[:, :4] == -1).all() and (wide[:, 44:] == -1).all()
        # a transposed out view: strides (1, m)
        out_t = poison(torch.empty(40, m, device=device)).t()
        dsv3_router_gemm(x, w, out=out_t)
        _check(out_t, x, w)


@pytest.mark.gpu
def test_fallbacks_warn_and_stay_correct():
    """M > 16, K % 8 != 0 and misaligned rows run on the torch reference, with a warning."""
    cases = [_inputs(17, 256, 1024, "cuda"), _inputs(4, 64, 100, "cuda")]
    x, w = _inputs(4, 64, 512, "cuda")
    cases.append((misaligned(x), w))
    for x, w in cases:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", KernelsFallbackWarning)
            out = dsv3_router_gemm(x, w)
        _check(out, x, w)
    from kernels_gemm.ops.dsv3_router_gemm import DSV3_ROUTER_GEMM

    explained = DSV3_ROUTER_GEMM.explain_call((torch.empty(17, 256, device="cuda"), *cases[0]))
    assert "M = 17 > 16" in explained


@pytest.mark.gpu
@pytest.mark.parametrize("pdl", (False, True))
def test_pdl_knob(pdl):
    x, w = _inputs(6, 256, 7168, "cuda", seed=9)
    _check(dsv3_router_gemm(x, w, enable_pdl=pdl), x, w)


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    w = randn(8, 64, dtype=torch.bfloat16, device=device)
    assert dsv3_router_gemm(torch.empty(0, 64, dtype=torch.bfloat16, device=device), w).shape == (
        0,
        8,
    )
    x0 = torch.empty(3, 0, dtype=torch.bfloat16, device=device)
    out = dsv3_router_gemm(x0, torch.empty(2, 0, dtype=torch.bfloat16, device=device))
    assert out.shape == (3, 2) and (out == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_bad_arguments(device):
    x = torch.randn(2, 64, device=device).bfloat16()
    w = torch.randn(8, 64, device=device).bfloat16()
    with pytest.raises(TypeError, match=r"dsv3_router_gemm: x must (have dtype in|be bfloat16)"):
        dsv3_router_gemm(x.half(), w)
    with pytest.raises(TypeError, match=r"dsv3_router_gemm: w must (have dtype in|be bfloat16)"):
        dsv3_router_gemm(x, w.float())
    with pytest.raises(ValueError, match=r"dsv3_router_gemm: x .* and w .* must share K"):
        dsv3_router_gemm(x, w[:, :32])
    with pytest.raises(TypeError, match="out_dtype must be torch.float32 or torch.bfloat16"):
        dsv3_router_gemm(x, w, out_dtype=torch.float16)
    with pytest.raises(ValueError, match=r"dsv3_router_gemm: out must have shape"):
        dsv3_router_gemm(x, w, out=torch.empty(8, 2, device=device))
    with pytest.raises(TypeError, match=r"dsv3_router_gemm: out must (have dtype|be float32)"):
        dsv3_router_gemm(x, w, out=torch.empty(2, 8, device=device, dtype=torch.float16))
    with pytest.raises(ValueError, match="w must have a contiguous last dim"):
        dsv3_router_gemm(x, torch.randn(64, 8, device=device).bfloat16().t())
    with pytest.raises(ValueError, match="dims"):
        dsv3_router_gemm(x[0], w)
    with pytest.raises(TypeError, match="enable_pdl must be a bool or None"):
        dsv3_router_gemm(x, w, enable_pdl=1)


def test_compiled_kernel_rejects_bad_input_itself():
    """The raw function's C++ checks (no GPU needed: they run before any launch)."""
    pytest.importorskip("tvm_ffi")
    from kernels_gemm.ops.dsv3_router_gemm import DSV3_ROUTER_GEMM_CUDA
    from kernels_jit import load_module
    from shared.testing.builds import cuda_arch

    try:
        with cuda_arch():
            raw = load_module(DSV3_ROUTER_GEMM_CUDA).dsv3_router_gemm
    except Exception as exc:  # no nvcc here
        pytest.skip(f"cannot build the CUDA module: {exc}")
    x = torch.randn(2, 64).bfloat16()
    w = torch.randn(8, 64).bfloat16()
    with pytest.raises(ValueError, match="wrong device type"):
        raw(torch.empty(2, 8), x, w, -1, 16, 1, 1)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    from kernels_gemm.ops.dsv3_router_gemm import DSV3_ROUTER_GEMM

    x = randn(3, 128, dtype=torch.bfloat16, device=device)
    w = randn(16, 128, dtype=torch.bfloat16, device=device)
    torch.library.opcheck(
        DSV3_ROUTER_GEMM.torch_op, (torch.empty(3, 16, device=device), x, w, None)
    )


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    """Inductor, so the custom op is traced, functionalised and lowered (about 5 s on CPU)."""
    x = randn(4, 256, dtype=torch.bfloat16, device=device)
    w = randn(32, 256, dtype=torch.bfloat16, device=device, scale=0.05)
    compiled = torch.compile(lambda a, b: dsv3_router_gemm(a, b).sigmoid(), fullgraph=True)
    assert_close(compiled(x, w), reference.dsv3_router_gemm(x, w).sigmoid())


@pytest.mark.gpu
def test_cuda_graph_capture():
    x, w = _inputs(8, 256, 7168, "cuda", seed=11)
    out = torch.empty(8, 256, device="cuda")
    dsv3_router_gemm(x, w, out=out)  # builds and loads before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        dsv3_router_gemm(x, w, out=out)
    poison(out)
    x.copy_(randn(8, 7168, dtype=torch.bfloat16, device="cuda", seed=12))
    graph.replay()
    torch.cuda.synchronize()
    _check(out, x, w)


@pytest.mark.gpu
@pytest.mark.parametrize("m", (1, 9, 16))
def test_pdl_chain_reads_each_previous_output(m):
    """Back-to-back PDL calls in a CUDA graph, each reading the logits the previous call wrote
    (E = K = 1024, bf16 out: 2-CTA clusters). The kernel lets the next one launch right after its
    first loads, so a missing wait would read stale or half-written rows: the chain must equal,
    bit for bit, the same calls made one by one without PDL (the reduction order is fixed)."""
    steps, k = 6, 1024
    ws = [
        randn(k, k, dtype=torch.bfloat16, device="cuda", seed=40 + i, scale=0.03)
        for i in range(steps)
    ]
    x0 = randn(m, k, dtype=torch.bfloat16, device="cuda", seed=39)
    eager = [x0]
    for w in ws:
        eager.append(dsv3_router_gemm(eager[-1], w, out_dtype=torch.bfloat16, enable_pdl=False))
    chain = [x0] + [poison(torch.empty(m, k, device="cuda", dtype=torch.bfloat16)) for _ in ws]
    dsv3_router_gemm(x0, ws[0], out_dtype=torch.bfloat16, out=chain[1])  # built before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i, w in enumerate(ws):
            dsv3_router_gemm(
                chain[i], w, out_dtype=torch.bfloat16, out=chain[i + 1], enable_pdl=True
            )
    for _ in range(3):
        for t in chain[1:]:
            poison(t)
        graph.replay()
        torch.cuda.synchronize()
        for i in range(1, steps + 1):
            assert torch.equal(chain[i], eager[i]), f"step {i} differs from the eager chain"


@pytest.mark.gpu
@pytest.mark.parametrize("m", (1, 8, 9, 16))
def test_pdl_weight_read_early_x_after_the_previous_kernel(m):
    """DeepSeek-V3's router (256 x 7168: 4-CTA clusters) under PDL loads its weight before
    griddepcontrol.wait and only x after it, so x must be the one the kernel right before wrote.
    A CUDA graph of PDL calls over six weights, where x was just written by: even steps, a torch
    kernel (a dtype-converting copy, whose dependents launch as its blocks exit) rewriting x whole;
    odd steps, the previous router call (which releases its dependents right after its first
    loads) writing its bf16 logits into x's first 256 columns. Each replay, with new sources, must
    equal bit for bit the same calls made one by one without PDL."""
    e, k, steps = 256, 7168, 6
    ws = [
        randn(e, k, dtype=torch.bfloat16, device="cuda", seed=70 + i, scale=0.05)
        for i in range(steps)
    ]
    xs = [randn(m, k, dtype=torch.bfloat16, device="cuda", seed=80 + i) for i in range(steps)]
    assert_pdl_chain_matches_eager(
        lambda i, x, out, pdl: dsv3_router_gemm(
            x, ws[i], out_dtype=torch.bfloat16, out=out, enable_pdl=pdl
        ),
        xs,
        e,
        torch.bfloat16,
    )
