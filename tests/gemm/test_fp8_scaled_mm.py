"""gemm.fp8_scaled_mm against float64 sums: per-token x per-channel and per-tensor scales, bias,
bf16 and fp16 out, odd M, N, K, every tile config's M range on both sides of its bounds (swap AB
at M <= 16 and M <= 64, 64x128 at M <= 128, 128x128 above), random shapes (M 1..4096) and
DeepSeek-V3's N = 2112, strided operands, the fallbacks of the CUDA path, empty input, bad
arguments (Python and the C++ entry), opcheck, torch.compile and CUDA graphs."""

from __future__ import annotations

import warnings

import pytest
import torch

from kernels_gemm import fp8_scaled_mm, reference
from kernels_jit.errors import KernelsFallbackWarning
from shared.testing.compare import assert_close
from shared.testing.devices import GPU
from shared.testing.inputs import poison

FP8 = torch.float8_e4m3fn
DEVICES = [pytest.param("cpu", id="cpu"), GPU]
BACKENDS = {"cpu": ("torch",), "cuda": ("cuda", "torch")}
OUT_DTYPES = (torch.bfloat16, torch.float16)
# opcheck's test_schema compares the inputs before and after with torch.allclose, which has no fp8
# kernel in torch 2.13; the other opcheck tests run.
NO_SCHEMA = ("test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic")


def _operands(m: int, n: int, k: int, seed: int, device: str = "cpu"):
    """a [M, K] fp8 row-major, b = w.t() of a row-major [N, K] fp8 weight, scale_a [M, 1],
    scale_b [N], bias [N] (float32: the caller casts)."""
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) * 16).to(FP8)
    w = (torch.randn(n, k, generator=g) * 16).to(FP8)
    sa = torch.rand(m, 1, generator=g) * 0.01 + 1e-3
    sb = torch.rand(n, generator=g) * 0.01 + 1e-3
    bias = torch.randn(n, generator=g)
    return a.to(device), w.to(device).t(), sa.to(device), sb.to(device), bias.to(device)


def _check(out, a, b, sa, sb, bias, name: str = "out") -> None:
    """Against the float64 result: fp8 products are exact in fp32 and Hopper's fp8 MMAs sum with
    about 14 mantissa bits between promotions, so the sum may be off by 2^-9 of sum |a| |b| (a
    wrong scale, block or index is off by O(1) of it), plus one rounding of out (an ulp: the
    fp32 value may sit on the other side of a tie)."""
    m, n = a.shape[0], b.shape[1]
    sa = sa.double().reshape(-1, 1).expand(m, 1)
    sb = sb.double().reshape(1, -1).expand(1, n)
    ad, bd = a.double(), b.double()
    exact = (ad @ bd) * sa * sb
    if bias is not None:
        exact = exact + bias.double()
    ulp = 2.0**-8 if out.dtype == torch.bfloat16 else 2.0**-11
    bound = 2.0**-9 * (ad.abs() @ bd.abs()) * sa * sb + ulp * exact.abs() + 1e-30
    got = out.double()
    assert not got.isnan().any(), f"{name}: NaN (an element was not written)"
    err = (got - exact).abs()
    bad = err > bound
    assert not bad.any(), (
        f"{name}: {int(bad.sum())} of {err.numel()} elements outside the bound; worst error "
        f"{err.max().item():.3g} at bound {bound.flatten()[err.argmax()].item():.3g}"
    )


def _run(backend, a, b, sa, sb, out_dtype, bias):
    """One backend through the op's dispatcher, into a NaN-poisoned out."""
    from kernels_gemm.ops.fp8_scaled_mm import FP8_SCALED_MM

    out = poison(torch.empty(a.shape[0], b.shape[1], dtype=out_dtype, device=a.device))
    FP8_SCALED_MM.run(out, a, b, sa, sb, bias, backend=backend)
    return out


SHAPES = ((1, 64, 128), (7, 48, 96), (33, 17, 13), (16, 256, 512), (65, 272, 384))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("per_tensor", (False, True), ids=("per-token", "per-tensor"))
@pytest.mark.parametrize("with_bias", (False, True), ids=("", "bias"))
def test_matches_float64(device, out_dtype, shape, per_tensor, with_bias):
    a, b, sa, sb, bias = _operands(*shape, seed=sum(shape), device=device)
    if per_tensor:
        sa, sb = sa[:1, 0].clone(), sb[:1].clone()
    bias = bias.to(out_dtype) if with_bias else None
    out = fp8_scaled_mm(a, b, sa, sb, out_dtype, bias)
    assert out.dtype == out_dtype and out.shape == (shape[0], shape[1])
    _check(out, a, b, sa, sb, bias)
    _, n, k = shape
    for backend in BACKENDS[device]:
        if backend == "cuda" and (k % 16 or n % 16):
            continue  # the torch fallback (test_fallbacks_warn_and_stay_correct)
        _check(_run(backend, a, b, sa, sb, out_dtype, bias), a, b, sa, sb, bias, name=backend)


def _random_shape(seed: int) -> tuple[int, int, int]:
    """M log-uniform over 1..4096 (both tile configs), N and K multiples of 16 (the CUDA path)."""
    g = torch.Generator().manual_seed(seed)
    m = int(2 ** (torch.rand(1, generator=g).item() * 12))
    n = 16 * int(torch.randint(1, 257, (1,), generator=g))
    k = 16 * int(torch.randint(1, 257, (1,), generator=g))
    return m, n, k


@pytest.mark.gpu
@pytest.mark.parametrize("seed", range(16))
def test_random_shapes_cuda(seed):
    m, n, k = _random_shape(seed)
    a, b, sa, sb, bias = _operands(m, n, k, seed=seed, device="cuda")
    out_dtype = OUT_DTYPES[seed % 2]
    per_tensor, with_bias = seed % 4 >= 2, seed % 3 == 0
    if per_tensor:
        sa, sb = sa[:1, 0].clone(), sb[:1].clone()
    bias = bias.to(out_dtype) if with_bias else None
    out = _run("cuda", a, b, sa, sb, out_dtype, bias)
    _check(out, a, b, sa, sb, bias, name=f"m={m} n={n} k={k}")


# Each config's M range at and past its bounds (M16: 1..16, M64: 17..64, M128: 65..128, large).
CONFIG_MS = (1, 3, 16, 17, 64, 65, 128, 129, 4000)


def test_config_bounds_cover_every_m():
    """The op file's M buckets: contiguous, ending in a config that takes any M, and the CONFIG_MS
    above touch both sides of every bound."""
    from kernels_gemm.ops import fp8_scaled_mm as op_module

    bounds = [max_m for _, _, max_m in op_module._CONFIGS]
    assert bounds[-1] is None and bounds[:-1] == sorted(bounds[:-1])
    assert [op_module._config(m) for m in CONFIG_MS] == [
        "m16", "m16", "m16", "m64", "m64", "m128", "m128", "large", "large"
    ]  # fmt: skip
    for bound in bounds[:-1]:
        assert bound in CONFIG_MS and bound + 1 in CONFIG_MS
    assert set(op_module.FP8_SCALED_MM_CUDA) == {
        (dtype, config) for dtype in OUT_DTYPES for config, _, _ in op_module._CONFIGS
    }


@pytest.mark.gpu
@pytest.mark.parametrize("m", CONFIG_MS)
@pytest.mark.parametrize("n", (16, 48, 272, 1040), ids=lambda n: f"n{n}")
@pytest.mark.parametrize("out_dtype", OUT_DTYPES, ids=str)
@pytest.mark.parametrize("per_tensor", (False, True), ids=("per-token", "per-tensor"))
@pytest.mark.parametrize("with_bias", (False, True), ids=("", "bias"))
def test_every_config_cuda(m, n, out_dtype, per_tensor, with_bias):
    """Every tile config (M bucket) x odd multiples of 16 for N (ragged last weight tile, fewer
    rows than one 64-row swap-AB tile at N = 16 and 48) x scale kinds x bias x out dtype."""
    k = 400 if m < 1000 else 176  # K tiles of 128 plus a ragged one
    a, b, sa, sb, bias = _operands(m, n, k, seed=m * 7 + n, device="cuda")
    if per_tensor:
        sa, sb = sa[:1, 0].clone(), sb[:1].clone()
    bias = bias.to(out_dtype) if with_bias else None
    out = _run("cuda", a, b, sa, sb, out_dtype, bias)
    _check(out, a, b, sa, sb, bias, name=f"m={m} n={n}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", (1, 3, 16, 17, 64, 65, 128, 129))
@pytest.mark.parametrize("sa_kind", ("[M, 1]", "[1]"))
@pytest.mark.parametrize("sb_kind", ("[N]", "[1, N]", "[1]"))
def test_scale_kinds_cuda(m, sa_kind, sb_kind):
    """Mixed scale kinds (a per-token scale_a with a per-tensor scale_b and the other way round):
    the swap-AB configs read scale_a as a row vector and scale_b as a column vector."""
    n, k = 144, 256
    a, b, sa, sb, bias = _operands(m, n, k, seed=m + 100, device="cuda")
    sa = sa if sa_kind == "[M, 1]" else sa[:1, 0].clone()
    sb = {"[N]": sb, "[1, N]": sb.reshape(1, -1), "[1]": sb[:1].clone()}[sb_kind]
    bias = bias.half()
    _check(_run("cuda", a, b, sa, sb, torch.float16, bias), a, b, sa, sb, bias, name=f"m={m}")


@pytest.mark.gpu
@pytest.mark.parametrize("m", (1, 2, 3, 4, 16, 17, 63, 64, 65, 128, 129, 1000, 4096))
@pytest.mark.parametrize("nk", ((2112, 7168), (7168, 2048), (4096, 4096)), ids=str)
def test_model_shapes_cuda(m, nk):
    """Decode and prefill M across every config switch (M = 16, 64, 128) at DeepSeek-V3's fused A
    projection (N = 2112), a wide-N case and a square one."""
    n, k = nk
    a, b, sa, sb, bias = _operands(m, n, k, seed=m + n, device="cuda")
    bias = bias.bfloat16()
    _check(_run("cuda", a, b, sa, sb, torch.bfloat16, bias), a, b, sa, sb, bias, name=f"m={m}")


@pytest.mark.parametrize("device", DEVICES)
def test_scale_b_row_vector_and_row_strided_a(device):
    a, b, sa, sb, _ = _operands(6, 48, 64, seed=1, device=device)
    wide = torch.zeros(6, 96, dtype=FP8, device=device)
    wide[:, 16:80] = a
    a_view = wide[:, 16:80]  # rows 96 bytes apart, 16-byte aligned: the CUDA path takes it
    _check(fp8_scaled_mm(a_view, b, sa, sb.reshape(1, -1)), a, b, sa, sb, None)
    w = torch.zeros(48, 80, dtype=FP8, device=device)
    w[:, :64] = b.t()
    b_view = w[:, :64].t()  # columns 80 bytes apart
    for backend in BACKENDS[device]:
        out = _run(backend, a_view, b_view, sa, sb.reshape(1, -1), torch.float16, None)
        _check(out, a, b, sa, sb, None, name=backend)


@pytest.mark.gpu
@pytest.mark.parametrize("m", (1, 16, 40, 100, 300))
def test_strided_operands_every_config_cuda(m):
    """Row-strided a and column-strided b (the swap-AB configs take the weight as the MMA's A and
    a as its B, so each stride lands on the other operand) in every config."""
    n, k = 208, 320
    a, b, sa, sb, bias = _operands(m, n, k, seed=m + 50, device="cuda")
    wide = torch.zeros(m, k + 48, dtype=FP8, device="cuda")
    wide[:, 32 : 32 + k] = a
    w = torch.zeros(n, k + 16, dtype=FP8, device="cuda")
    w[:, :k] = b.t()
    a_view, b_view = wide[:, 32 : 32 + k], w[:, :k].t()
    bias = bias.bfloat16()
    out = _run("cuda", a_view, b_view, sa, sb, torch.bfloat16, bias)
    _check(out, a, b, sa, sb, bias, name=f"m={m}")


@pytest.mark.gpu
def test_fallbacks_warn_and_stay_correct():
    """K or N not multiples of 16, a misaligned a, a row stride not a multiple of 16 and a
    non-contiguous scale run on the torch reference; forcing the CUDA backend says why."""
    a, b, sa, sb, _ = _operands(8, 64, 128, seed=7, device="cuda")
    flat = torch.empty(8 * 128 + 1, dtype=FP8, device="cuda")
    misaligned = flat[1:].view(8, 128)
    misaligned.copy_(a)
    wide = torch.zeros(8, 136, dtype=FP8, device="cuda")
    wide[:, :128] = a
    sb_strided = torch.stack([sb, sb], dim=1)[:, 0]
    cases = {
        "k": (*_operands(8, 64, 120, seed=8, device="cuda")[:4],),
        "n": (*_operands(8, 56, 128, seed=9, device="cuda")[:4],),
        "misaligned": (misaligned, b, sa, sb),
        "row stride": (wide[:, :128], b, sa, sb),
        "scale_b": (a, b, sa, sb_strided),
    }
    reasons = {
        "k": "multiples of 16",
        "n": "multiples of 16",
        "misaligned": "16-byte aligned",
        "row stride": "row strides that are multiples of 16",
        "scale_b": "contiguous scale_a and scale_b",
    }
    for name, (a_, b_, sa_, sb_) in cases.items():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", KernelsFallbackWarning)
            out = fp8_scaled_mm(a_, b_, sa_, sb_)
        _check(out, a_, b_, sa_, sb_, None, name=name)
        with pytest.raises(ValueError, match=reasons[name]):
            fp8_scaled_mm(a_, b_, sa_, sb_, backend="cuda")


@pytest.mark.parametrize("device", DEVICES)
def test_empty(device):
    a, b, sa, sb, _ = _operands(0, 16, 32, seed=2, device=device)
    assert fp8_scaled_mm(a, b, sa, sb).shape == (0, 16)
    a, b, sa, sb, _ = _operands(3, 16, 0, seed=3, device=device)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", KernelsFallbackWarning)  # K = 0: the reference
        assert (fp8_scaled_mm(a, b, sa, sb) == 0).all()
    a, b, sa, sb, _ = _operands(3, 0, 32, seed=3, device=device)
    assert fp8_scaled_mm(a, b, sa, sb).shape == (3, 0)


@pytest.mark.parametrize("device", DEVICES)
def test_bad_arguments(device):
    a, b, sa, sb, bias = _operands(4, 8, 32, seed=4, device=device)
    with pytest.raises(ValueError, match=r"fp8_scaled_mm: b \[K, N\] must be column-major"):
        fp8_scaled_mm(a, b.contiguous(), sa, sb)
    with pytest.raises(ValueError, match=r"a \[M, K\] must be row-major"):
        fp8_scaled_mm(a.t().contiguous().t(), b, sa, sb)
    with pytest.raises(ValueError, match=r"scale_a must have shape \[4, 1\] or \[1\], got \[4\]"):
        fp8_scaled_mm(a, b, sa.reshape(-1), sb)
    with pytest.raises(ValueError, match=r"scale_b must have shape \[8\] or \[1, 8\] or \[1\]"):
        fp8_scaled_mm(a, b, sa, sb[:3])
    with pytest.raises(TypeError, match="a must have dtype in .*got bfloat16"):
        fp8_scaled_mm(a.bfloat16(), b, sa, sb)
    with pytest.raises(TypeError, match="scale_a must have dtype in .*got bfloat16"):
        fp8_scaled_mm(a, b, sa.bfloat16(), sb)
    with pytest.raises(TypeError, match="bias must have dtype in .*got float32"):
        fp8_scaled_mm(a, b, sa, sb, torch.bfloat16, bias)
    with pytest.raises(ValueError, match=r"bias must have shape \[8\] \(N\)"):
        fp8_scaled_mm(a, b, sa, sb, torch.bfloat16, bias[:5].bfloat16())
    with pytest.raises(TypeError, match="out_dtype must be torch.bfloat16 or torch.float16"):
        fp8_scaled_mm(a, b, sa, sb, torch.float32)
    with pytest.raises(ValueError, match=r"must share K, got a \(4, 32\) and b \(16, 8\)"):
        fp8_scaled_mm(a, b[:16], sa, sb)


@pytest.mark.gpu
def test_cuda_entry_checks():
    """The C++ entry's own checks (reached only by calling the compiled function directly):
    shapes, dtypes, layout and alignment raise before any launch."""
    from kernels_gemm.ops.fp8_scaled_mm import _fp8_scaled_mm_cuda

    a, b, sa, sb, bias = _operands(4, 64, 128, seed=10, device="cuda")
    out = torch.empty(4, 64, dtype=torch.bfloat16, device="cuda")
    op = "gemm.fp8_scaled_mm"
    with pytest.raises(ValueError, match=f"{op}: scale_b must have N"):
        _fp8_scaled_mm_cuda(out, a, b, sa, sb[:5], None)
    with pytest.raises(TypeError, match=f"{op}: scale_a and scale_b must have dtype float32"):
        _fp8_scaled_mm_cuda(out, a, b, sa.half(), sb, None)
    with pytest.raises(ValueError, match=f"{op}: out must have shape"):
        _fp8_scaled_mm_cuda(out[:, :32], a, b, sa, sb, None)
    with pytest.raises(ValueError, match=f"{op}: b must be column-major"):
        _fp8_scaled_mm_cuda(out, a, b.contiguous(), sa, sb, None)
    with pytest.raises(ValueError, match=f"{op}: bias must start on a 16-byte boundary"):
        _fp8_scaled_mm_cuda(out, a, b, sa, sb, bias.bfloat16().repeat(2)[1:65])
    with pytest.raises(ValueError, match=f"{op}: scale_b must start on a 16-byte boundary"):
        _fp8_scaled_mm_cuda(out, a, b, sa, sb.repeat(2)[1:65], None)
    with pytest.raises(TypeError, match=f"{op}: a must have dtype float8_e4m3fn"):
        _fp8_scaled_mm_cuda(out, a.view(torch.int8), b, sa, sb, None)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    from kernels_gemm.ops.fp8_scaled_mm import FP8_SCALED_MM

    a, b, sa, sb, bias = _operands(5, 32, 48, seed=5, device=device)
    out = torch.empty(5, 32, dtype=torch.bfloat16, device=device)
    torch.library.opcheck(
        FP8_SCALED_MM.torch_op, (out, a, b, sa, sb, bias.bfloat16(), None), test_utils=NO_SCHEMA
    )
    torch.library.opcheck(
        FP8_SCALED_MM.torch_op, (out, a, b, sa, sb, None, None), test_utils=NO_SCHEMA
    )


def test_torch_compile_fullgraph_aot():
    a, b, sa, sb, _ = _operands(8, 32, 64, seed=6)
    compiled = torch.compile(fp8_scaled_mm, fullgraph=True, backend="aot_eager")
    assert_close(compiled(a, b, sa, sb), reference.fp8_scaled_mm(a, b, sa, sb))


@pytest.mark.gpu
def test_torch_compile_fullgraph_cuda():
    a, b, sa, sb, bias = _operands(96, 256, 512, seed=11, device="cuda")
    bias = bias.half()

    def layer(a, b, sa, sb, bias):
        return fp8_scaled_mm(a, b, sa, sb, torch.float16, bias).float() * 2

    got = torch.compile(layer, fullgraph=True)(a, b, sa, sb, bias)
    _check(got / 2, a, b, sa, sb, bias)


@pytest.mark.gpu
@pytest.mark.parametrize("m", (1, 16, 48, 96, 256))
def test_cuda_graph_capture(m):
    from kernels_gemm.ops.fp8_scaled_mm import FP8_SCALED_MM

    a, b, sa, sb, bias = _operands(m, 2112, 7168, seed=21, device="cuda")
    bias = bias.bfloat16()
    out = torch.empty(m, 2112, dtype=torch.bfloat16, device="cuda")
    FP8_SCALED_MM.run(out, a, b, sa, sb, bias, backend="cuda")  # builds and loads first
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        FP8_SCALED_MM.run(out, a, b, sa, sb, bias, backend="cuda")
    poison(out)
    a2, _, sa2, _, _ = _operands(m, 2112, 7168, seed=22, device="cuda")
    a.copy_(a2)
    sa.copy_(sa2)
    graph.replay()
    torch.cuda.synchronize()
    _check(out, a, b, sa, sb, bias)
