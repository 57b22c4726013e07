"""quantization.per_token_group_quant_8bit against a float64 oracle: fp8 and int8, every group size,
every scale layout (row-major, column-major, TMA-aligned with M not a multiple of 4, packed UE8M0),
3-D inputs, strided input, out_q/out_s, empty input, bad arguments, opcheck, torch.compile; the
optional modes fuse_silu_and_mul and masked_m (rows past masked_m untouched) on every backend."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernels_quantization import per_token_group_quant_8bit, reference
from shared.testing.inputs import randn, row_strided

FP8 = torch.float8_e4m3fn
DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _pow2_ceil(s: torch.Tensor) -> torch.Tensor:
    """2^ceil(log2 s) from frexp (s = m * 2^e, 0.5 <= m < 1), independent of the bit trick."""
    out = []
    for v in s.double().reshape(-1).tolist():
        m, e = math.frexp(v)
        out.append(v if m == 0.5 else math.ldexp(1.0, e))
    return torch.tensor(out, dtype=torch.float64).reshape(s.shape)


def _expected(x, group_size, dst_dtype, oracle, eps=1e-10, ue8m0=False):
    """(q as float64, s [..., M, G] as float64) computed group by group in float64."""
    qmax = 448.0 if dst_dtype == FP8 else 127.0
    groups = x.shape[-1] // group_size
    xg = x.double().reshape(*x.shape[:-1], groups, group_size)
    s = oracle.round_fp32(xg.abs().amax(dim=-1).clamp(min=eps) / qmax)
    if ue8m0:
        s = _pow2_ceil(s)
    v = oracle.round_fp32(xg / s.unsqueeze(-1))
    q = oracle.e4m3(v) if dst_dtype == FP8 else oracle.int8(v)
    return q.reshape(x.shape), s


def _assert_exact(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(actual.double(), expected, rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dst_dtype", (FP8, torch.int8), ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group_size", (16, 32, 64, 128, 256))
def test_row_major_matches_oracle(dst_dtype, dtype, group_size, oracle):
    x = randn(5, 2 * group_size, dtype=dtype, seed=group_size, scale=3.0)
    q, s = per_token_group_quant_8bit(x, group_size, dst_dtype=dst_dtype)
    q_ref, s_ref = _expected(x, group_size, dst_dtype, oracle)
    assert q.dtype == dst_dtype and s.is_contiguous() and s.shape == (5, 2)
    _assert_exact(s, s_ref)
    _assert_exact(q, q_ref)


# The oracle fixture is stateless, so sharing it across examples is safe.
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    lead=st.lists(st.integers(0, 6), min_size=1, max_size=3),
    groups=st.integers(1, 5),
    group_size=st.sampled_from((16, 32, 64, 128)),
    dst_dtype=st.sampled_from((FP8, torch.int8)),
    ue8m0=st.booleans(),
    eps=st.sampled_from((1e-10, 1e-4, 0.5)),
    seed=st.integers(0, 2**16),
)
def test_random_shapes_row_major(lead, groups, group_size, dst_dtype, ue8m0, eps, seed, oracle):
    x = randn(*lead, groups * group_size, dtype=torch.bfloat16, seed=seed, scale=2.0)
    q, s = per_token_group_quant_8bit(
        x, group_size, dst_dtype=dst_dtype, eps=eps, scale_ue8m0=ue8m0
    )
    q_ref, s_ref = _expected(x, group_size, dst_dtype, oracle, eps=eps, ue8m0=ue8m0)
    assert s.shape == (*lead, groups)
    _assert_exact(s, s_ref)
    _assert_exact(q, q_ref)


@pytest.mark.parametrize("m", (1, 3, 4, 5, 13))
@pytest.mark.parametrize("tma", (False, True))
def test_column_major_layouts(m, tma, oracle):
    x = randn(m, 384, dtype=torch.bfloat16, seed=m)
    q, s = per_token_group_quant_8bit(x, 128, column_major_scales=True, scale_tma_aligned=tma)
    q_ref, s_ref = _expected(x, 128, FP8, oracle)
    _assert_exact(s, s_ref)
    _assert_exact(q, q_ref)
    assert s.stride(0) == 1  # M is the fast dim
    rows = (m + 3) // 4 * 4 if tma else m
    assert s.stride(1) == rows  # storage [G, ceil4(M)] (TMA) or [G, M]
    assert s.untyped_storage().nbytes() == 3 * rows * 4


def test_column_major_3d_batches_leading_dims(oracle):
    x = randn(2, 5, 256, dtype=torch.float16, seed=9)
    q, s = per_token_group_quant_8bit(x, 64, column_major_scales=True, scale_tma_aligned=True)
    assert s.shape == (2, 5, 4) and s.stride() == (4 * 8, 1, 8)
    q_ref, s_ref = _expected(x, 64, FP8, oracle)
    _assert_exact(s, s_ref)
    _assert_exact(q, q_ref)


def _unpack(words: torch.Tensor, groups: int) -> torch.Tensor:
    """Biased exponents [..., M, G] read back byte by byte from the packed int32 words."""
    out = torch.zeros(*words.shape[:-1], groups, dtype=torch.int64)
    w = words.to(torch.int64) & 0xFFFFFFFF
    for g in range(groups):
        out[..., g] = (w[..., g // 4] >> (8 * (g % 4))) & 0xFF
    return out


@pytest.mark.parametrize("groups", (1, 4, 5, 9))
@pytest.mark.parametrize("m", (1, 6))
def test_packed_ue8m0(groups, m, oracle):
    x = randn(m, groups * 32, dtype=torch.bfloat16, seed=groups, scale=50.0)
    x[0, :32] = 0  # a group at the eps floor: a tiny exponent
    flags = {"column_major_scales": True, "scale_tma_aligned": True, "scale_ue8m0": True}
    q, s = per_token_group_quant_8bit(x, 32, **flags, pack_ue8m0=True)
    words = (groups + 3) // 4
    assert s.dtype == torch.int32 and s.shape == (m, words) and s.stride(0) == 1
    assert s.stride(1) == (m + 3) // 4 * 4
    q_ref, s_ref = _expected(x, 32, FP8, oracle, ue8m0=True)
    _assert_exact(q, q_ref)
    exponents = torch.tensor(
        [[math.frexp(v)[1] - 1 + 127 for v in row] for row in s_ref.tolist()], dtype=torch.int64
    )
    assert torch.equal(_unpack(s, groups), exponents)
    if groups % 4:  # bytes of groups >= G are zero
        assert torch.equal(
            _unpack(s, words * 4)[:, groups:], torch.zeros(m, words * 4 - groups, dtype=torch.int64)
        )
    # The packed exponents describe exactly the fp32 scales of the unpacked mode.
    _, s_f32 = per_token_group_quant_8bit(x, 32, **flags)
    assert torch.equal(2.0 ** (_unpack(s, groups) - 127).double(), s_f32.double())


def test_strided_input_and_caller_buffers(oracle):
    x = row_strided(randn(6, 256, dtype=torch.bfloat16, seed=4), extra=64)
    out_q = torch.empty(6, 256, dtype=torch.int8)
    storage = torch.full((2, 8), -1.0)
    out_s = storage.t()[:6]
    q, s = per_token_group_quant_8bit(
        x, 128, dst_dtype=torch.int8, column_major_scales=True, out_q=out_q, out_s=out_s
    )
    assert q is out_q and s is out_s
    q_ref, s_ref = _expected(x, 128, torch.int8, oracle)
    _assert_exact(out_q, q_ref)
    _assert_exact(out_s, s_ref)
    assert (storage[:, 6:] == -1).all()  # padding rows untouched


def test_int8_rounds_half_to_even_and_saturates():
    # Group absmax 127 gives s = 1 exactly, so q = rne(x): 0.5 -> 0, 1.5 -> 2, 2.5 -> 2.
    x = torch.zeros(1, 16)
    x[0, :6] = torch.tensor([0.5, 1.5, 2.5, -0.5, -2.5, 127.0])
    q, s = per_token_group_quant_8bit(x, 16, dst_dtype=torch.int8)
    assert s.item() == 1.0
    assert q[0, :6].tolist() == [0, 2, 2, 0, -2, 127]


def test_empty_inputs():
    x = torch.empty(0, 256, dtype=torch.bfloat16)
    q, s = per_token_group_quant_8bit(x, 128, column_major_scales=True, scale_tma_aligned=True)
    assert q.shape == (0, 256) and s.shape == (0, 2)
    q, s = per_token_group_quant_8bit(torch.empty(3, 0, 128), 64)
    assert q.shape == (3, 0, 128) and s.shape == (3, 0, 2)


def test_bad_arguments():
    op = "per_token_group_quant_8bit"
    x = torch.randn(4, 256)
    with pytest.raises(ValueError, match=rf"{op}: group_size must be one of .*got 100"):
        per_token_group_quant_8bit(x, 100)
    with pytest.raises(ValueError, match=r"last dim of x \(200\) must be a multiple of group_size"):
        per_token_group_quant_8bit(torch.randn(4, 200), 128)
    with pytest.raises(TypeError, match="dst_dtype must be torch.float8_e4m3fn or torch.int8"):
        per_token_group_quant_8bit(x, 128, dst_dtype=torch.float16)
    with pytest.raises(ValueError, match=r"eps must be > 0 .*got 0.0"):
        per_token_group_quant_8bit(x, 128, eps=0.0)
    with pytest.raises(ValueError, match="pack_ue8m0=True needs scale_ue8m0"):
        per_token_group_quant_8bit(x, 128, pack_ue8m0=True)
    with pytest.raises(ValueError, match="scale_tma_aligned=True needs column_major_scales"):
        per_token_group_quant_8bit(x, 128, scale_tma_aligned=True)
    with pytest.raises(ValueError, match=r"out_s must have shape \(4, 2\), got \(4, 3\)"):
        per_token_group_quant_8bit(x, 128, out_s=torch.empty(4, 3))
    with pytest.raises(ValueError, match=r"out_s columns must start 16 bytes apart .*\(1, 5\)"):
        per_token_group_quant_8bit(
            torch.randn(5, 256),
            128,
            column_major_scales=True,
            scale_tma_aligned=True,
            out_s=torch.empty(2, 5).t(),
        )
    with pytest.raises(ValueError, match="out_s must be column-major"):
        per_token_group_quant_8bit(x, 128, column_major_scales=True, out_s=torch.empty(4, 2))
    with pytest.raises(TypeError, match="out_q must have dtype int8, got float8_e4m3fn"):
        per_token_group_quant_8bit(
            x, 128, dst_dtype=torch.int8, out_q=torch.empty(4, 256, dtype=FP8)
        )


def test_opcheck_int8():
    """The int8 output lets opcheck run all its tests (test_schema cannot compare fp8 tensors)."""
    from kernels_quantization.ops.per_token_group_quant_8bit import PER_TOKEN_GROUP_QUANT_8BIT

    x = randn(7, 128, dtype=torch.bfloat16)
    q = torch.empty(7, 128, dtype=torch.int8)
    s = torch.empty(4, 8).t()[:7]
    torch.library.opcheck(
        PER_TOKEN_GROUP_QUANT_8BIT.torch_op, (q, s, x, 32, 1e-10, False, False, False, None, None)
    )


def test_torch_compile_fullgraph_aot():
    """aot_eager traces and functionalises the custom op with its strided scale view; the inductor
    lowering is covered once per group by test_per_token_quant_fp8."""
    x = randn(6, 256, dtype=torch.bfloat16)

    def fn(t):
        return per_token_group_quant_8bit(
            t, 64, column_major_scales=True, scale_tma_aligned=True, scale_ue8m0=True
        )

    q, s = torch.compile(fn, fullgraph=True, backend="aot_eager")(x)
    q_ref, s_ref = reference.per_token_group_quant_8bit(x, 64, FP8, 1e-10, True)
    assert torch.equal(s, s_ref) and torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))


# ---------------------------------------------------------------------------------------------
# The CUDA backend against the reference (GPU): bit-exact q and s in every layout, outputs
# poisoned first.

GPU = pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)
LAYOUTS = {
    "row": {},
    "col": {"column_major_scales": True},
    "tma": {"column_major_scales": True, "scale_tma_aligned": True},
    "tma_ue8m0": {"column_major_scales": True, "scale_tma_aligned": True, "scale_ue8m0": True},
    "packed": {
        "column_major_scales": True,
        "scale_tma_aligned": True,
        "scale_ue8m0": True,
        "pack_ue8m0": True,
    },
    "row_ue8m0": {"scale_ue8m0": True},
}


def _q_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    if actual.dtype == torch.int8:
        assert torch.equal(actual.cpu(), expected.cpu())
    else:
        torch.testing.assert_close(
            actual.float().cpu(), expected.float().cpu(), rtol=0, atol=0, equal_nan=True
        )


def _run_both(x, group_size, *, dst_dtype=FP8, out_q=None, eps=1e-10, **layout):
    """The CUDA backend (poisoned outputs) against the torch backend in the same layout."""
    kw = {"dst_dtype": dst_dtype, "eps": eps, **layout}
    q_ref, s_ref = per_token_group_quant_8bit(x, group_size, backend="torch", **kw)
    if out_q is None:
        out_q = torch.empty(q_ref.shape, dtype=dst_dtype, device=x.device)
    out_q.view(torch.uint8).fill_(0x7F)
    s_poison = per_token_group_quant_8bit(x, group_size, backend="torch", **kw)[1]  # same layout
    s_poison.fill_(-12345 if s_poison.dtype == torch.int32 else float("nan"))
    q, s = per_token_group_quant_8bit(
        x, group_size, backend="cuda", out_q=out_q, out_s=s_poison, **kw
    )
    assert s.stride() == s_ref.stride()
    _q_equal(q, q_ref)
    if s.dtype == torch.int32:
        assert torch.equal(s.cpu(), s_ref.cpu())
    else:
        torch.testing.assert_close(s.cpu(), s_ref.cpu(), rtol=0, atol=0, equal_nan=True)
    # The reference itself (row-major, float) agrees with the torch backend.
    if not layout:
        q0, _ = reference.per_token_group_quant_8bit(x, group_size, dst_dtype, eps, False)
        _q_equal(q, q0)
    return q, s


@pytest.mark.parametrize("device", (GPU,))
@pytest.mark.parametrize("dst_dtype", (FP8, torch.int8), ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("group_size", (16, 32, 64, 128, 256))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_cuda_matches_torch_every_layout(device, dst_dtype, dtype, group_size, layout):
    for m, groups in ((1, 1), (5, 3), (7, 9), (33, 56 * 128 // group_size)):
        x = randn(m, groups * group_size, dtype=dtype, device=device, seed=m + groups, scale=4.0)
        _run_both(x, group_size, dst_dtype=dst_dtype, **LAYOUTS[layout])


@pytest.mark.parametrize("device", (GPU,))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_cuda_decode_and_prefill_shapes(device, layout):
    for m in (1, 16, 127, 1024):
        x = randn(m, 7168, dtype=torch.bfloat16, device=device, seed=m)
        _run_both(x, 128, **LAYOUTS[layout])


@pytest.mark.parametrize("device", (GPU,))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ("row", "tma", "packed"))
def test_cuda_strided_misaligned_3d(device, dtype, layout):
    flags = LAYOUTS[layout]
    base = randn(11, 1024 + 32, dtype=dtype, device=device, seed=3, scale=6.0)
    _run_both(base[:, :1024], 128, **flags)  # row-strided input
    _run_both(base[:, 1:1025], 128, **flags)  # misaligned rows: the scalar kernel
    wide = torch.empty(11, 1024 + 64, dtype=FP8, device=device)
    _run_both(base[:, 8:1032], 64, out_q=wide[:, 16:1040], **flags)
    _run_both(base[:, 8:1032], 64, out_q=wide[:, 1:1025], **flags)  # misaligned out_q
    x3 = randn(3, 5, 512, dtype=dtype, device=device, seed=4)  # [E, M, K]: two row levels
    _run_both(x3, 128, **flags)
    _run_both(randn(4, 7, 384, dtype=dtype, device=device, seed=5)[:, 1:6], 32, **flags)


@pytest.mark.parametrize("device", (GPU,))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ("col", "tma", "packed"))
def test_cuda_column_major_row_tiles(device, dtype, layout):
    """Column-major scales: the kernel walks tiles of R consecutive rows (R = the groups one warp
    takes: 32 for g16 down to 4 for g256), M not a multiple of R, in the throughput plan (large
    M), the decode plan (small M) and the scalar kernel (misaligned rows), tiles that straddle
    the [E, M] batches of a 3-D x; TMA padding rows are never written."""
    flags = LAYOUTS[layout]
    for m, k, group_size in (
        (1027, 7168, 128),
        (2117, 1024, 16),
        (1061, 2048, 256),
        (13, 7168, 128),
    ):
        x = randn(m, k, dtype=dtype, device=device, seed=m, scale=4.0)
        _, s = _run_both(x, group_size, **flags)
        if layout != "col":  # storage [G', ceil4(M)]: the padding rows keep their contents
            storage = torch.full((s.shape[1], s.stride(1)), -7, dtype=s.dtype, device=device)
            per_token_group_quant_8bit(
                x, group_size, backend="cuda", out_s=storage.t()[:m], **flags
            )
            assert (storage[:, m:] == -7).all()
    _run_both(randn(3, 301, 7168, dtype=dtype, device=device, seed=6), 128, **flags)
    base = randn(203, 2048 + 32, dtype=dtype, device=device, seed=8, scale=2.0)
    _run_both(base[:, 1:2049], 32, **flags)  # misaligned rows: the scalar kernel, 4-row tiles
    x = randn(4, 300, 7168, dtype=torch.bfloat16, device=device, seed=9)
    masked_m = torch.tensor([300, 0, 123, 7], dtype=torch.int32, device=device)
    q_t, s_t = _masked_run(x, 128, masked_m, "torch", **flags)
    q_c, s_c = _masked_run(x, 128, masked_m, "cuda", **flags)
    assert torch.equal(q_c.view(torch.uint8).cpu(), q_t.view(torch.uint8).cpu())
    assert torch.equal(s_c.cpu(), s_t.cpu())


@pytest.mark.parametrize("device", (GPU,))
@pytest.mark.parametrize("dst_dtype", (FP8, torch.int8), ids=str)
def test_cuda_edge_values(device, dst_dtype):
    x = randn(3, 512, device=device, seed=2)
    x[0, :128] = 0.0  # eps floor
    if dst_dtype == FP8:  # int8 of NaN is unspecified (torch's cast)
        x[1, 130] = float("nan")
    x[2, 300] = 3e38
    for layout in ("row", "packed"):
        for eps in (1e-10, 0.5, 1e-40):
            _run_both(x, 128, dst_dtype=dst_dtype, eps=eps, **LAYOUTS[layout])


@pytest.mark.parametrize("device", (GPU,))
def test_cuda_graph_capture(device):
    x = randn(64, 7168, dtype=torch.bfloat16, device=device, seed=5)
    flags = LAYOUTS["packed"]
    per_token_group_quant_8bit(x, 128, **flags)  # build and warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, s = per_token_group_quant_8bit(x, 128, **flags)
    x.copy_(randn(64, 7168, dtype=torch.bfloat16, device=device, seed=6))
    graph.replay()
    torch.cuda.synchronize()
    q_ref, s_ref = per_token_group_quant_8bit(x, 128, backend="torch", **flags)
    _q_equal(q, q_ref)
    assert torch.equal(s, s_ref)


@pytest.mark.parametrize("device", (GPU,))
def test_cuda_torch_compile_fullgraph(device):
    x = randn(16, 7168, dtype=torch.bfloat16, device=device)

    def fn(t):
        return per_token_group_quant_8bit(
            t * 2, 128, column_major_scales=True, scale_tma_aligned=True, scale_ue8m0=True
        )

    q, s = torch.compile(fn, fullgraph=True)(x)
    q_ref, s_ref = reference.per_token_group_quant_8bit(x * 2, 128, FP8, 1e-10, True)
    _q_equal(q, q_ref)
    assert torch.equal(s, s_ref)


# ---------------------------------------------------------------------------------------------
# Optional modes: fuse_silu_and_mul (x [..., 2K]) and the masked EP layout (x [E, T_pad, K] with
# masked_m [E]), on every backend.

DEVICES = ("cpu", GPU)


def _masked_run(x, group_size, masked_m, backend, **flags):
    """Run ``backend`` with poisoned q and s; return (q, s) and the poison (as uint8/int32)."""
    q_shape = (*x.shape[:-1], x.shape[-1] // (2 if flags.get("fuse_silu_and_mul") else 1))
    dst = flags.pop("dst_dtype", FP8)
    out_q = torch.empty(q_shape, dtype=dst, device=x.device)
    out_q.view(torch.uint8).fill_(0x7F)
    layout = {k: v for k, v in flags.items() if k != "fuse_silu_and_mul"}
    s_like = per_token_group_quant_8bit(
        torch.zeros(q_shape, dtype=x.dtype, device=x.device), group_size, backend="torch", **layout
    )[1]
    s_like.fill_(-12345 if s_like.dtype == torch.int32 else -7.0)
    return per_token_group_quant_8bit(
        x,
        group_size,
        dst_dtype=dst,
        masked_m=masked_m,
        out_q=out_q,
        out_s=s_like,
        backend=backend,
        **flags,
    )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", ("row", "tma", "packed"))
def test_fuse_silu_and_mul_equals_unfused(device, dtype, layout):
    flags = LAYOUTS[layout]
    for m, k in ((1, 256), (5, 512), (33, 2048)):
        x = randn(m, 2 * k, dtype=dtype, device=device, seed=m, scale=3.0)
        q, s = per_token_group_quant_8bit(x, 128, fuse_silu_and_mul=True, **flags)
        assert q.shape == (m, k)
        q_ref, s_ref = per_token_group_quant_8bit(
            reference.silu_and_mul(x), 128, backend="torch", **flags
        )
        _q_equal(q, q_ref)
        assert torch.equal(s.cpu(), s_ref.cpu())
        if device != "cpu":
            _run_both(x, 128, fuse_silu_and_mul=True, **flags)
            _run_both(x, 64, dst_dtype=torch.int8, fuse_silu_and_mul=True)


def test_silu_and_mul_reference_rounds_once():
    x = randn(4, 64, dtype=torch.bfloat16, seed=1, scale=4.0)
    x1, x2 = x[:, :32].double(), x[:, 32:].double()
    exact = x1 / (1 + torch.exp(-x1)) * x2
    got = reference.silu_and_mul(x)
    assert got.dtype == torch.bfloat16 and got.shape == (4, 32)
    # fp32 arithmetic then one bf16 rounding: within one bf16 step of the exact product.
    torch.testing.assert_close(got.double(), exact, rtol=2**-7, atol=1e-30)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("layout", ("row", "tma", "packed"))
@pytest.mark.parametrize("fused", (False, True))
def test_masked_rows_untouched(device, layout, fused):
    flags = {**LAYOUTS[layout], "fuse_silu_and_mul": fused}
    e, t_pad, k = 5, 13, 384
    x = randn(e, t_pad, k * (2 if fused else 1), dtype=torch.bfloat16, device=device, seed=7)
    masked_m = torch.tensor([3, 0, 13, 40, -2], dtype=torch.int32, device=device)
    q, s = _masked_run(x, 128, masked_m, None, **flags)
    q_all, s_all = per_token_group_quant_8bit(x, 128, backend="torch", **flags)
    live = (torch.arange(t_pad).unsqueeze(0) < masked_m.cpu().clamp(min=0).unsqueeze(1)).tolist()
    for ei in range(e):
        for t in range(t_pad):
            if live[ei][t]:
                _q_equal(q[ei, t], q_all[ei, t])
                assert torch.equal(s[ei, t].cpu(), s_all[ei, t].cpu())
            else:
                assert (q[ei, t].view(torch.uint8) == 0x7F).all()
                poison = -12345 if s.dtype == torch.int32 else -7.0
                assert (s[ei, t] == poison).all()
    if device != "cpu":  # the CUDA backend against the torch backend, both poisoned alike
        q_t, s_t = _masked_run(x, 128, masked_m, "torch", **flags)
        q_c, s_c = _masked_run(x, 128, masked_m, "cuda", **flags)
        assert torch.equal(q_c.view(torch.uint8).cpu(), q_t.view(torch.uint8).cpu())
        assert torch.equal(s_c.cpu(), s_t.cpu())


@pytest.mark.parametrize("device", (GPU,))
def test_masked_graph_capture_reads_counts_on_device(device):
    e, t_pad, k = 8, 64, 7168
    x = randn(e, t_pad, k, dtype=torch.bfloat16, device=device, seed=3)
    masked_m = torch.tensor([1, 5, 0, 64, 9, 2, 33, 7], dtype=torch.int32, device=device)
    q = torch.zeros(e, t_pad, k, dtype=FP8, device=device)
    s = torch.zeros(e, t_pad, k // 128, device=device)
    per_token_group_quant_8bit(x, 128, masked_m=masked_m, out_q=q, out_s=s)  # warm up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        per_token_group_quant_8bit(x, 128, masked_m=masked_m, out_q=q, out_s=s)
    q.zero_()
    s.zero_()
    masked_m.copy_(torch.tensor([2, 0, 64, 3, 0, 1, 10, 64], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    q_ref, s_ref = _masked_run(x, 128, masked_m, "torch")
    live = reference.masked_rows(masked_m, t_pad).unsqueeze(-1)
    assert torch.equal(s, torch.where(live, s_ref, torch.zeros_like(s)))
    q_ref = torch.where(live, q_ref.view(torch.uint8), torch.zeros_like(q_ref.view(torch.uint8)))
    assert torch.equal(q.view(torch.uint8), q_ref)


def test_optional_modes_bad_arguments():
    op = "per_token_group_quant_8bit"
    x3 = torch.randn(2, 4, 256)
    with pytest.raises(ValueError, match=rf"{op}: fuse_silu_and_mul=True needs .*even last dim"):
        per_token_group_quant_8bit(torch.randn(4, 257), 128, fuse_silu_and_mul=True)
    with pytest.raises(ValueError, match=r"half the last dim of x \(192\) must be a multiple"):
        per_token_group_quant_8bit(torch.randn(4, 384), 128, fuse_silu_and_mul=True)
    with pytest.raises(ValueError, match=r"out_q must have shape \(4, 128\)"):
        per_token_group_quant_8bit(
            torch.randn(4, 256), 128, fuse_silu_and_mul=True, out_q=torch.empty(4, 256, dtype=FP8)
        )
    with pytest.raises(TypeError, match="masked_m must have dtype torch.int32"):
        per_token_group_quant_8bit(x3, 128, masked_m=torch.zeros(2, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"masked_m must have shape \[E\] = \(2,\)"):
        per_token_group_quant_8bit(x3, 128, masked_m=torch.zeros(3, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"masked_m needs x of shape \[E, T_pad, K\]"):
        per_token_group_quant_8bit(x3[0], 128, masked_m=torch.zeros(2, dtype=torch.int32))
    with pytest.raises(TypeError, match="masked_m must be a torch.Tensor or None"):
        per_token_group_quant_8bit(x3, 128, masked_m=[1, 2])


def test_opcheck_int8_optional_modes():
    from kernels_quantization.ops.per_token_group_quant_8bit import PER_TOKEN_GROUP_QUANT_8BIT

    x = randn(3, 4, 256, dtype=torch.bfloat16)
    q = torch.zeros(3, 4, 128, dtype=torch.int8)
    s = torch.zeros(3, 4, 4)
    masked_m = torch.tensor([1, 4, 0], dtype=torch.int32)
    torch.library.opcheck(
        PER_TOKEN_GROUP_QUANT_8BIT.torch_op,
        (q, s, x, 32, 1e-10, False, False, True, masked_m, None),
    )


@pytest.mark.parametrize("device", DEVICES)
def test_optional_modes_empty(device):
    x = torch.empty(2, 0, 512, dtype=torch.bfloat16, device=device)
    m = torch.zeros(2, dtype=torch.int32, device=device)
    q, s = per_token_group_quant_8bit(x, 128, fuse_silu_and_mul=True, masked_m=m)
    assert q.shape == (2, 0, 256) and s.shape == (2, 0, 2)
