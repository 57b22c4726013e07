"""gemm.fp8_blockwise_mm against float64 sums: 1x128 activation and 128x128 weight block scales,
random shapes (M 1..4096, N not a multiple of 128), DeepSeek-V3's shapes (N = 2112, 24576, 7168 at
K = 7168), the scale layouts the CUDA path takes and those that fall back (row-major or unaligned
scale_a, row-major scale_b), fp16 out (fallback), empty input, bad arguments (Python and the C++
entry: K % 128, scale shapes and layouts, alignment), opcheck, torch.compile and CUDA graphs."""

from __future__ import annotations

import warnings

import pytest
import torch

from kernels_gemm import fp8_blockwise_mm, reference
from kernels_jit.errors import KernelsFallbackWarning
from shared.testing.compare import assert_close
from shared.testing.devices import GPU
from shared.testing.inputs import poison

FP8 = torch.float8_e4m3fn
DEVICES = [pytest.param("cpu", id="cpu"), GPU]
BACKENDS = {"cpu": ("torch",), "cuda": ("cuda", "torch")}
# opcheck's test_schema compares the inputs before and after with torch.allclose, which has no fp8
# kernel in torch 2.13; the other opcheck tests run.
NO_SCHEMA = ("test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic")


def _operands(m: int, n: int, k: int, seed: int, device: str = "cpu", layout: str = "tma"):
    """a [M, K] fp8 row-major, b = w.t() of a row-major [N, K] fp8 weight, scale_a [M, K/128],
    scale_b [K/128, ceil(N/128)].

    ``layout``: "tma" (the CUDA path's: scale_a column-major with columns padded to 4 rows as
    per_token_group_quant_8bit(column_major_scales=True, scale_tma_aligned=True) writes it,
    scale_b = weight_scale_inv.t()), "row" (both contiguous) or "colmajor" (scale_a column-major
    without the padding, scale_b as in "tma")."""
    g = torch.Generator().manual_seed(seed)
    groups, blocks_n = k // 128, -(-n // 128)
    a = (torch.randn(m, k, generator=g) * 16).to(FP8).to(device)
    w = (torch.randn(n, k, generator=g) * 16).to(FP8).to(device)
    sa = (torch.rand(m, groups, generator=g) * 0.01 + 1e-3).to(device)
    sb = (torch.rand(groups, blocks_n, generator=g) * 0.01 + 1e-3).to(device)
    if layout == "tma":
        rows = -(-m // 4) * 4
        padded = torch.full((groups, rows), float("nan"), device=device)
        padded[:, :m] = sa.t()
        sa = padded.t()[:m]
        sb = sb.t().contiguous().t()
    elif layout == "colmajor":
        sa = sa.t().contiguous().t()
        sb = sb.t().contiguous().t()
    return a, w.t(), sa, sb


def _check(out, a, b, sa, sb, name: str = "out") -> None:
    """Against the float64 result (fp8 times an fp32 scale is exact in float64): Hopper's fp8
    MMAs sum a 128-K group with about 14 mantissa bits before the scaled promotion, so the sum
    may be off by 2^-9 of sum |a sa| |b sb| (a wrong scale, block or index is off by O(1) of
    it), plus one rounding of out."""
    n = b.shape[1]
    sa_k = sa.double().repeat_interleave(128, dim=1)
    sb_kn = sb.double().repeat_interleave(128, dim=0).repeat_interleave(128, dim=1)[:, :n]
    ad, bd = a.double() * sa_k, b.double() * sb_kn
    exact = ad @ bd
    ulp = 2.0**-8 if out.dtype == torch.bfloat16 else 2.0**-11
    bound = 2.0**-9 * (ad.abs() @ bd.abs()) + ulp * exact.abs() + 1e-30
    got = out.double()
    assert not got.isnan().any(), f"{name}: NaN (an element was not written)"
    err = (got - exact).abs()
    bad = err > bound
    assert not bad.any(), (
        f"{name}: {int(bad.sum())} of {err.numel()} elements outside the bound; worst error "
        f"{err.max().item():.3g} at bound {bound.flatten()[err.argmax()].item():.3g}"
    )


def _run(backend, a, b, sa, sb, out_dtype=torch.bfloat16):
    """One backend through the op's dispatcher, into a NaN-poisoned out."""
    from kernels_gemm.ops.fp8_blockwise_mm import FP8_BLOCKWISE_MM

    out = poison(torch.empty(a.shape[0], b.shape[1], dtype=out_dtype, device=a.device))
    FP8_BLOCKWISE_MM.run(out, a, b, sa, sb, backend=backend)
    return out


SHAPES = ((1, 128, 128), (5, 144, 256), (33, 272, 384), (130, 2112, 512), (4, 48, 1024))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_matches_float64(device, shape):
    a, b, sa, sb = _operands(*shape, seed=sum(shape), device=device)
    out = fp8_blockwise_mm(a, b, sa, sb)
    assert out.dtype == torch.bfloat16 and out.shape == shape[:2]
    _check(out, a, b, sa, sb)
    for backend in BACKENDS[device]:
        _check(_run(backend, a, b, sa, sb), a, b, sa, sb, name=backend)


def _random_shape(seed: int) -> tuple[int, int, int]:
    """M log-uniform over 1..4096 (both tile configs), N a multiple of 16, K of 128."""
    g = torch.Generator().manual_seed(1000 + seed)
    m = int(2 ** (torch.rand(1, generator=g).item() * 12))
    n = 16 * int(torch.randint(1, 257, (1,), generator=g))
    k = 128 * int(torch.randint(1, 33, (1,), generator=g))
    return m, n, k


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(16))
def test_random_shapes_cuda(seed):
    m, n, k = _random_shape(seed)
    a, b, sa, sb = _operands(m, n, k, seed=seed, device="cuda")
    _check(_run("cuda", a, b, sa, sb), a, b, sa, sb, name=f"m={m} n={n} k={k}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", (1, 2, 3, 4, 16, 64, 127, 128, 129, 1000, 4096))
@pytest.mark.parametrize("nk", ((2112, 7168), (24576, 1536), (7168, 2048), (4096, 4096)), ids=str)
def test_model_shapes_cuda(m, nk):
    """Decode and prefill M across the small/large switch (M = 128) at DeepSeek-V3's shapes:
    fused A projection (2112 x 7168), q_b (24576 x 1536), o_proj-like (7168 x 2048), square."""
    n, k = nk
    a, b, sa, sb = _operands(m, n, k, seed=m + n, device="cuda")
    _check(_run("cuda", a, b, sa, sb), a, b, sa, sb, name=f"m={m} n={n} k={k}")


@pytest.mark.gpu
def test_deepseek_wide_n_prefill_cuda():
    a, b, sa, sb = _operands(512, 24576, 7168, seed=3, device="cuda")
    _check(_run("cuda", a, b, sa, sb), a, b, sa, sb)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ("tma", "row", "colmajor"))
def test_scale_layouts(device, layout):
    """Every scale layout gives the same result; on the GPU the CUDA path takes the TMA layout
    (and column-major scale_a whose rows are already a multiple of 4) and falls back otherwise."""
    for m in (3, 8):
        a, b, sa, sb = _operands(m, 272, 512, seed=m, device=device, layout=layout)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", KernelsFallbackWarning)
            _check(fp8_blockwise_mm(a, b, sa, sb), a, b, sa, sb, name=f"{layout} m={m}")
        if device == "cuda" and (layout == "tma" or (layout == "colmajor" and m % 4 == 0)):
            _check(_run("cuda", a, b, sa, sb), a, b, sa, sb, name=f"cuda {layout} m={m}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", (1, 3, 5, 6))
def test_scale_a_storage_ends_at_m_cuda(m):
    """One K group: scale_a [M, 1] is a plain contiguous tensor whose storage ends at row M, where
    the kernel's TMA reads through row ceil(M / 4) * 4; the op reads a padded copy instead (the
    memcheck test runs this under compute-sanitizer)."""
    a, b, _, sb = _operands(m, 144, 128, seed=m, device="cuda")
    sa = torch.rand(m, 1, device="cuda").add(0.01).mul(0.05)
    assert sa.untyped_storage().nbytes() == 4 * m
    _check(_run("cuda", a, b, sa, sb), a, b, sa, sb, name=f"m={m}")


@pytest.mark.gpu
def test_fallbacks_warn_and_stay_correct():
    """fp16 out, N not a multiple of 16, misaligned a, unaligned scale_a columns, row-major
    scale_b run on the torch reference; forcing the CUDA backend says why."""
    a, b, sa, sb = _operands(8, 256, 256, seed=7, device="cuda")
    flat = torch.empty(8 * 256 + 1, dtype=FP8, device="cuda")
    misaligned = flat[1:].view(8, 256)
    misaligned.copy_(a)
    sa_unaligned = _operands(6, 256, 256, seed=8, device="cuda", layout="colmajor")
    sb_row = sb.contiguous()
    cases = {
        "needs bfloat16 out": ((a, b, sa, sb), torch.float16),
        "needs K and N multiples of 16": (_operands(8, 200, 256, seed=9, device="cuda"), None),
        "16-byte aligned a, b and out": ((misaligned, b, sa, sb), None),
        "scale_tma_aligned": (sa_unaligned, None),
        r"weight_scale_inv.t\(\)": ((a, b, sa, sb_row), None),
    }
    for reason, (args, out_dtype) in cases.items():
        dtype = out_dtype or torch.bfloat16
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", KernelsFallbackWarning)
            _check(fp8_blockwise_mm(*args, dtype), *args, name=reason)
        with pytest.raises(ValueError, match=reason):
            fp8_blockwise_mm(*args, dtype, backend="cuda")


@pytest.mark.parametrize("device", DEVICES)
def test_fp16_out(device):
    a, b, sa, sb = _operands(4, 144, 256, seed=12, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KernelsFallbackWarning)
        out = fp8_blockwise_mm(a, b, sa, sb, torch.float16)
    assert out.dtype == torch.float16
    _check(out, a, b, sa, sb)


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    a, b, sa, sb = _operands(0, 144, 256, seed=2, device=device)
    assert fp8_blockwise_mm(a, b, sa, sb).shape == (0, 144)
    a, b, sa, sb = _operands(3, 16, 0, seed=3, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KernelsFallbackWarning)  # K = 0: the reference
        out = fp8_blockwise_mm(a, b, sa, sb)
    assert out.shape == (3, 16) and (out == 0).all()
    a, b, sa, sb = _operands(3, 0, 128, seed=3, device=device)
    assert fp8_blockwise_mm(a, b, sa, sb).shape == (3, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_arguments(device):
    a, b, sa, sb = _operands(4, 144, 256, seed=4, device=device)
    op = "gemm.fp8_blockwise_mm"
    with pytest.raises(ValueError, match=rf"{op}: K must be a multiple of 128, got K=192"):
        a2, b2, _, _ = _operands(4, 144, 256, seed=4, device=device)
        fp8_blockwise_mm(a2[:, :192], b2[:192], sa, sb)
    with pytest.raises(ValueError, match=rf"{op}: b \[K, N\] must be column-major"):
        fp8_blockwise_mm(a, b.contiguous(), sa, sb)
    with pytest.raises(ValueError, match=rf"{op}: a \[M, K\] must be row-major"):
        fp8_blockwise_mm(a.t().contiguous().t(), b, sa, sb)
    with pytest.raises(ValueError, match=r"scale_a must have shape \[M, K/128\] = \[4, 2\]"):
        fp8_blockwise_mm(a, b, sa[:, :1], sb)
    with pytest.raises(ValueError, match=r"scale_b must have shape .* = \[2, 2\], got \[2, 1\]"):
        fp8_blockwise_mm(a, b, sa, sb[:, :1])
    with pytest.raises(ValueError, match=r"scale_b must have 2 dims, got shape \(2,\)"):
        fp8_blockwise_mm(a, b, sa, sb[:, 0])
    with pytest.raises(TypeError, match="scale_a must have dtype in .*got bfloat16"):
        fp8_blockwise_mm(a, b, sa.bfloat16(), sb)
    with pytest.raises(TypeError, match="a must have dtype in .*got bfloat16"):
        fp8_blockwise_mm(a.bfloat16(), b, sa, sb)
    with pytest.raises(TypeError, match="out_dtype must be torch.bfloat16 or torch.float16"):
        fp8_blockwise_mm(a, b, sa, sb, torch.float32)
    with pytest.raises(ValueError, match=r"must share K, got a \(4, 256\) and b \(128, 144\)"):
        fp8_blockwise_mm(a, b[:128], sa, sb)


@pytest.mark.gpu
def test_cuda_entry_checks():
    """The C++ entry's own checks (reached only by calling the compiled function directly):
    K % 128, scale shapes and layouts, alignment, out dtype raise before any launch."""
    from kernels_gemm.ops.fp8_blockwise_mm import _fp8_blockwise_mm_cuda

    a, b, sa, sb = _operands(8, 256, 256, seed=10, device="cuda")
    out = torch.empty(8, 256, dtype=torch.bfloat16, device="cuda")
    op = "gemm.fp8_blockwise_mm"
    with pytest.raises(ValueError, match=f"{op}: K must be a multiple of 128, got 192"):
        _fp8_blockwise_mm_cuda(out, a[:, :192], b[:192], sa[:, :1], sb[:1])
    with pytest.raises(ValueError, match=f"{op}: scale_a must have shape"):
        _fp8_blockwise_mm_cuda(out, a, b, sa[:, :1], sb)
    with pytest.raises(ValueError, match=f"{op}: scale_b must have shape"):
        _fp8_blockwise_mm_cuda(out, a, b, sa, sb[:, :1])
    with pytest.raises(ValueError, match=f"{op}: scale_a must be column-major"):
        _fp8_blockwise_mm_cuda(out, a, b, sa.contiguous(), sb)
    with pytest.raises(ValueError, match=f"{op}: scale_b must have stride 1 along K/128"):
        _fp8_blockwise_mm_cuda(out, a, b, sa, sb.contiguous())
    shifted = torch.empty(2 * 12 + 1, device="cuda")[1:].view(2, 12).t()[:8]
    shifted.copy_(sa)
    with pytest.raises(ValueError, match=f"{op}: scale_a and scale_b must start on 16-byte"):
        _fp8_blockwise_mm_cuda(out, a, b, shifted, sb)
    with pytest.raises(TypeError, match=f"{op}: out must have dtype bfloat16"):
        _fp8_blockwise_mm_cuda(out.half(), a, b, sa, sb)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    from kernels_gemm.ops.fp8_blockwise_mm import FP8_BLOCKWISE_MM

    a, b, sa, sb = _operands(5, 144, 256, seed=5, device=device)
    out = torch.empty(5, 144, dtype=torch.bfloat16, device=device)
    torch.library.opcheck(
        FP8_BLOCKWISE_MM.torch_op, (out, a, b, sa, sb, None), test_utils=NO_SCHEMA
    )


def test_torch_compile_fullgraph_aot():
    a, b, sa, sb = _operands(8, 144, 256, seed=6)
    compiled = torch.compile(fp8_blockwise_mm, fullgraph=True, backend="aot_eager")
    assert_close(compiled(a, b, sa, sb), reference.fp8_blockwise_mm(a, b, sa, sb))


@pytest.mark.gpu
def test_torch_compile_fullgraph_cuda():
    a, b, sa, sb = _operands(96, 2112, 1024, seed=11, device="cuda")
    got = torch.compile(lambda *t: fp8_blockwise_mm(*t).float() * 2, fullgraph=True)(a, b, sa, sb)
    _check((got / 2).bfloat16(), a, b, sa, sb)


@pytest.mark.gpu
@pytest.mark.parametrize("m", (16, 256))
def test_cuda_graph_capture(m):
    from kernels_gemm.ops.fp8_blockwise_mm import FP8_BLOCKWISE_MM

    a, b, sa, sb = _operands(m, 2112, 7168, seed=21, device="cuda")
    out = torch.empty(m, 2112, dtype=torch.bfloat16, device="cuda")
    FP8_BLOCKWISE_MM.run(out, a, b, sa, sb, backend="cuda")  # builds and loads first
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        FP8_BLOCKWISE_MM.run(out, a, b, sa, sb, backend="cuda")
    poison(out)
    a2, _, sa2, _ = _operands(m, 2112, 7168, seed=22, device="cuda")
    a.copy_(a2)
    sa.copy_(sa2)
    graph.replay()
    torch.cuda.synchronize()
    _check(out, a, b, sa, sb)
