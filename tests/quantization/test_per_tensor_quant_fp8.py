"""quantization.per_tensor_quant_fp8 against a float64 oracle: dynamic and static scales, any
shape, saturation, the all-zero edge, empty input, bad arguments, opcheck."""

from __future__ import annotations

import contextlib
import re

import pytest
import torch

from kernels_quantization import per_tensor_quant_fp8, reference
from shared.testing.inputs import randn, row_strided

# opcheck's test_schema compares tensors with torch.allclose, which has no fp8 kernel in torch
# 2.13 ("mul_cpu_reduced_float" not implemented for 'Float8_e4m3fn'); the int8 path of
# per_token_group_quant_8bit runs the full opcheck.
NO_SCHEMA = ("test_faketensor", "test_aot_dispatch_static", "test_aot_dispatch_dynamic")
DTYPES = (torch.float32, torch.float16, torch.bfloat16)
SHAPES = ((1,), (7, 9), (3, 5, 129), (16, 4096))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_dynamic_matches_float64_oracle(dtype, shape, oracle):
    x = randn(*shape, dtype=dtype, seed=len(shape), scale=30.0)
    q, s = per_tensor_quant_fp8(x)
    s_ref = oracle.round_fp32(x.double().abs().max().clamp(min=1e-10).reshape(1) / 448.0)
    torch.testing.assert_close(s.double(), s_ref, rtol=0, atol=0)
    q_ref = oracle.e4m3(oracle.round_fp32(x.double() / s_ref))
    torch.testing.assert_close(q.double(), q_ref, rtol=0, atol=0)
    assert q.shape == x.shape and s.shape == (1,)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_static_scale_saturates_and_is_not_modified(dtype, oracle):
    x = row_strided(randn(9, 100, dtype=dtype, seed=5, scale=10.0))
    scale = torch.tensor([0.01])
    q, s = per_tensor_quant_fp8(x, scale=scale)
    assert s is scale and scale.item() == pytest.approx(0.01)
    q_ref = oracle.e4m3(oracle.round_fp32(x.double() / scale.double()))
    torch.testing.assert_close(q.double(), q_ref, rtol=0, atol=0)
    assert (q.float().abs() == 448).any()  # |x| up to ~40 over 0.01: saturated, never NaN
    assert not q.float().isnan().any()


def test_static_scale_inf_input_saturates():
    x = torch.tensor([float("inf"), float("-inf"), 1.0])
    q, _ = per_tensor_quant_fp8(x, scale=torch.tensor([1.0]))
    assert q.float().tolist() == [448.0, -448.0, 1.0]


def test_all_zero_and_empty():
    q, s = per_tensor_quant_fp8(torch.zeros(4, 8, dtype=torch.bfloat16))
    assert s.item() == pytest.approx(1e-10 / 448, rel=1e-6)
    assert q.float().abs().sum() == 0 and not q.float().isnan().any()
    q, s = per_tensor_quant_fp8(torch.empty(0, 8))
    assert q.shape == (0, 8) and s.shape == (1,) and s.item() == pytest.approx(1e-10 / 448)


def test_out_is_written_in_place(oracle):
    x = randn(5, 64, seed=2)
    out = torch.empty(5, 64, dtype=torch.float8_e4m3fn)
    q, s = per_tensor_quant_fp8(x, out=out)
    assert q is out
    torch.testing.assert_close(
        out.double(), oracle.e4m3(oracle.round_fp32(x.double() / s.double())), rtol=0, atol=0
    )


def test_bad_arguments():
    x = torch.randn(4, 64)
    with pytest.raises(
        TypeError, match=r"per_tensor_quant_fp8: scale must have dtype in \(float32"
    ):
        per_tensor_quant_fp8(x, scale=torch.tensor([1.0], dtype=torch.float16))
    with pytest.raises(
        ValueError, match=r"scale must hold exactly one fp32 value .*got shape \(2,\)"
    ):
        per_tensor_quant_fp8(x, scale=torch.ones(2))
    with pytest.raises(TypeError, match="scale must be a torch.Tensor, got float"):
        per_tensor_quant_fp8(x, scale=0.5)
    with pytest.raises(TypeError, match="x must have dtype in .*got int32"):
        per_tensor_quant_fp8(torch.ones(3, dtype=torch.int32))


def test_opcheck_static_and_dynamic():
    from kernels_quantization.ops.per_tensor_quant_fp8 import PER_TENSOR_QUANT_FP8

    x = randn(6, 32, dtype=torch.float16)
    q = torch.empty(6, 32, dtype=torch.float8_e4m3fn)
    torch.library.opcheck(
        PER_TENSOR_QUANT_FP8.torch_op, (q, torch.empty(1), x, False, None), test_utils=NO_SCHEMA
    )
    torch.library.opcheck(
        PER_TENSOR_QUANT_FP8.torch_op, (q, torch.tensor([0.1]), x, True, None), test_utils=NO_SCHEMA
    )


# ---------------------------------------------------------------------------------------------
# The CUDA backend against the reference (GPU): bit-exact q and s, outputs poisoned first.

GPU = pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)
# One fused block (<= 4096 vectors), one thread-block cluster (up to 16 x 1024 x 8 vectors; rows
# views and scalars up to 4 per thread), the memset + atomic-max sweep + reversed quantize pass
# (larger; flat x past the SMs' shared memory: the resident kernel), flat tails (sizes not in
# whole vectors), 3-D inputs.
GPU_SHAPES = (
    (1,),
    (7,),
    (1, 7168),
    (7, 9),
    (3, 5, 129),
    (4096, 8),
    (16, 7168),
    (1, 32776),
    (129, 4097),
    (512, 7168),
)


def _fp8_equal(actual: torch.Tensor, expected: torch.Tensor) -> None:
    torch.testing.assert_close(
        actual.float().cpu(), expected.float().cpu(), rtol=0, atol=0, equal_nan=True
    )


def _run_both(x: torch.Tensor, scale: torch.Tensor | None = None, out: torch.Tensor | None = None):
    q_ref, s_ref = reference.per_tensor_quant_fp8(x, scale)
    q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device) if out is None else out
    q.view(torch.uint8).fill_(0x7F)  # poison: NaN codes
    q, s = per_tensor_quant_fp8(x, scale=scale, out=q, backend="cuda")
    _fp8_equal(q, q_ref)
    torch.testing.assert_close(s.cpu(), s_ref.cpu(), rtol=0, atol=0, equal_nan=True)
    return q, s


@pytest.mark.parametrize("device", (GPU,))
@pytest.mark.parametrize("static", (False, True))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=str)
def test_cuda_matches_reference(device, static, dtype, shape):
    x = randn(*shape, dtype=dtype, device=device, seed=sum(shape), scale=20.0)
    scale = torch.tensor([0.03], device=device) if static else None
    _run_both(x, scale)


@pytest.mark.parametrize("device", (GPU,))
@pytest.mark.parametrize("static", (False, True))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_strided_and_misaligned(device, static, dtype):
    scale = torch.tensor([0.05], device=device) if static else None
    base = randn(33, 4096 + 24, dtype=dtype, device=device, seed=7, scale=9.0)
    _run_both(base[:, :4096], scale)  # row-strided: row mode, vectors
    _run_both(base[:, 1:4097], scale)  # misaligned rows: row mode, scalars
    _run_both(base.view(-1)[1:5001], scale)  # contiguous but misaligned: flat scalars
    x3 = randn(3, 12, 256, dtype=dtype, device=device, seed=8)[:, :11]  # two row levels
    _run_both(x3, scale)
    wide = torch.empty(33, 4096 + 64, dtype=torch.float8_e4m3fn, device=device)
    _run_both(base[:, 8:4104], scale, out=wide[:, 16:4112])


@pytest.mark.parametrize("device", (GPU,))
@pytest.mark.parametrize("n", (300, 70000))  # the fused block and the two-pass path
def test_cuda_edge_values(device, n):
    _run_both(torch.zeros(n, device=device))  # floor scale, q = 0
    x = randn(n, device=device, seed=3)
    x[n // 2] = float("nan")
    _run_both(x)  # a NaN anywhere: s and q NaN, as the reference
    x = randn(n, device=device, seed=3)
    x[n // 3] = float("inf")
    x[n // 2] = 3e38
    _run_both(x, torch.tensor([1.0], device=device))  # static: saturates to +-448
    _run_both(x)


# The cluster kernel covers 16 and 128 tokens of 7168 (flat bf16 and fp32); past it, and where
# the cluster kernel is skipped (the test hook), the cooperative launch (one 256-vector chunk per
# CTA, at most min(chunk 0's q bytes / 4 - 1, resident CTAs) of them: bf16 511, ~1M elements,
# fp32 255 on the H200) and the memset + two kernels; flat x past the SMs' shared memory (132 x
# 224 KiB on the H200: bf16 15.1M elements, fp32 7.6M) the resident kernel, the two kernels
# where it is skipped; below the L2 and above it (~117 MB of bf16), with flat tails and chunk
# counts that are no multiple of the grid; fp32 has 4-byte codes (a smaller scratch).
COOPERATIVE_SHAPES = (
    (16, 7168),
    (128, 7168),
    (1000, 7168),
    (2049, 7177),
    (8191, 7177),
    (32768, 4096),
)


def _hook(name: str):
    from kernels_jit.loader import CompiledFunction
    from kernels_quantization.ops.per_tensor_quant_fp8 import PER_TENSOR_QUANT_FP8_CUDA

    return CompiledFunction(PER_TENSOR_QUANT_FP8_CUDA, name)


@contextlib.contextmanager
def _skip_paths(mask: int):
    """Dynamic calls skip the CUDA paths in mask (1: the cluster kernel, 2: the resident kernel)
    inside the block."""
    hook = _hook("per_tensor_quant_fp8_skip_paths")
    hook(mask)
    try:
        yield
    finally:
        hook(0)


def _cluster_size(x: torch.Tensor) -> int:
    """CTAs of the cluster kernel for x's dtype on its device (16 on the H200; 0: none)."""
    return int(_hook("per_tensor_quant_fp8_limits")(x, 0))


def _resident_vectors(x: torch.Tensor) -> int:
    """The vectors the resident kernel keeps in shared memory for x's dtype (it takes flat x of
    more vectors; 132 x 14336 on the H200; 0: it does not launch)."""
    return int(_hook("per_tensor_quant_fp8_limits")(x, 1))


def _cuda_kernels(fn) -> str:
    """The names of the kernels run while fn runs (torch.profiler), space-separated."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return " ".join(event.key for event in prof.key_averages())


def _only(names: str, kernel: str) -> None:
    kernels = (
        "fused_kernel",
        "cluster_kernel",
        "cooperative_kernel",
        "resident_kernel",
        "absmax_kernel",
    )
    assert kernel in names, names
    assert all(k not in names for k in kernels if k != kernel), names


@pytest.mark.parametrize("device", (GPU,))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
@pytest.mark.parametrize("above", (False, True), ids=("largest_cooperative", "two_kernels"))
def test_cuda_cooperative_limit(device, dtype, above):
    """With the cluster kernel skipped: the largest x that one cooperative launch covers (G chunks
    of 256 vectors, a flat tail holding the maximum) runs that kernel alone; one vector more runs
    the absmax sweep and the quantize pass instead. G as the launch computes it: 6 CTAs per SM
    (__launch_bounds__)."""
    vec = 16 // dtype.itemsize
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    ctas = min(256 * vec // 4 - 1, 6 * sms)
    n = ctas * 256 * vec + (vec if above else vec - 1)
    x = randn(n, dtype=dtype, device=device, seed=n, scale=3.0)
    x[-1] = -5000.0
    with _skip_paths(1):
        names = _cuda_kernels(lambda: _run_both(x))
    _only(names, "absmax_kernel" if above else "cooperative_kernel")


@pytest.mark.parametrize("device", (GPU,))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_cluster_limits(device, dtype):
    """The fused block's last size (4096 vectors + a tail) and the cluster kernel's first; the
    cluster's last flat size (cluster x 1024 x 2 vectors + a tail holding the maximum) and one
    vector more (the cooperative launch where it still fits, else the two kernels); rows views
    up to cluster x 1024 x 2 vectors. The H200 runs clusters of 16."""
    vec = 16 // dtype.itemsize
    cluster = _cluster_size(torch.empty(1, dtype=dtype, device=device))
    if torch.cuda.get_device_capability(device) == (9, 0):
        assert cluster == 16
    assert cluster in (0, 8, 16)
    sizes = [(4096 * vec + vec - 1, "fused_kernel")]
    if cluster:
        last = cluster * 2048 * vec + vec - 1  # 2 vectors per thread
        sizes += [(4097 * vec, "cluster_kernel"), (last, "cluster_kernel"), (last + 1, None)]
    for n, kernel in sizes:
        x = randn(n, dtype=dtype, device=device, seed=n, scale=3.0)
        x[-1] = -5000.0
        names = _cuda_kernels(lambda x=x: _run_both(x))
        if kernel is not None:
            _only(names, kernel)
        else:
            assert "cluster_kernel" not in names and "fused_kernel" not in names, names
    if cluster:
        cols = 4096 + 8  # rows of a wider buffer: row mode, vectors
        rows = cluster * 1024 * 2 * vec // 4096
        base = randn(rows + 1, cols, dtype=dtype, device=device, seed=3, scale=7.0)
        _only(_cuda_kernels(lambda: _run_both(base[:rows, :4096])), "cluster_kernel")
        names = _cuda_kernels(lambda: _run_both(base[:, :4096]))
        assert "cluster_kernel" not in names, names


@pytest.mark.parametrize("device", (GPU,))
@pytest.mark.parametrize("static", (False, True))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    "shape", ((16, 7168), (128, 7168), (5, 6553), (3, 7, 4099), (1, 65537), (127, 8191))
)
def test_cuda_cluster_matches_reference(device, static, dtype, shape):
    """The cluster kernel's sizes: flat (every vectors-per-thread count, odd sizes with tails),
    rows views (vectors; misaligned: scalars), a q of wider rows; values with NaN, inf, zeros."""
    scale = torch.tensor([0.04], device=device) if static else None
    x = randn(*shape, dtype=dtype, device=device, seed=sum(shape), scale=11.0)
    _run_both(x, scale)
    wide = randn(*shape[:-1], shape[-1] + 24, dtype=dtype, device=device, seed=1, scale=5.0)
    _run_both(wide[..., 8 : 8 + shape[-1]], scale)  # rows views (vectors where aligned)
    _run_both(wide[..., 1 : 1 + shape[-1]], scale)  # misaligned rows: scalars
    out = torch.empty(*shape[:-1], shape[-1] + 32, dtype=torch.float8_e4m3fn, device=device)
    _run_both(x, scale, out=out[..., 16 : 16 + shape[-1]])
    _run_both(torch.zeros(shape, dtype=dtype, device=device), scale)  # the floor scale
    flat = x.reshape(-1)
    for where in (0, flat.numel() // 2, -1):  # rank 0, the middle rank, the tail / last rank
        y = flat.clone()
        y[where] = float("nan")
        _run_both(y.view(shape), scale)
        y[where] = float("-inf")
        _run_both(y.view(shape), scale)
        y[where] = -60000.0
        _run_both(y.view(shape), scale)


@pytest.mark.parametrize("device", (GPU,))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
@pytest.mark.parametrize("shape", COOPERATIVE_SHAPES, ids=str)
@pytest.mark.parametrize("skip", (0, 1, 3), ids=("auto", "no_cluster", "no_cluster_resident"))
def test_cuda_cooperative_matches_reference(device, dtype, shape, skip):
    x = randn(*shape, dtype=dtype, device=device, seed=shape[0], scale=3.0)
    with _skip_paths(skip):
        _run_both(x)
        _run_both(x)  # again: the scratch count is re-zeroed by every launch


@pytest.mark.parametrize("device", (GPU,))
@pytest.mark.parametrize("n", (131073, 9_000_001))  # fp32: the cluster; the resident kernel
@pytest.mark.parametrize("where", (0, 5, -1))  # chunk 0 (q's scratch words), early, the tail
def test_cuda_cooperative_absmax_anywhere(device, n, where):
    """The maximum (a large value, then a NaN) in chunk 0, whose q holds the cooperative (and
    resident) CTAs' candidates until every CTA has read them, elsewhere, or in the flat tail."""
    x = randn(n, device=device, seed=4)
    x[where] = -5000.0
    _run_both(x)
    x[where] = float("nan")
    _run_both(x)
    _run_both(torch.zeros(n, device=device))  # the floor scale from every CTA


@pytest.mark.parametrize("device", (GPU,))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_resident_limit(device, dtype):
    """The largest flat x of the two kernels (the resident vectors and a tail) and the smallest of
    the resident kernel (one vector of N, the part outside shared memory, holding the maximum);
    the two kernels again with the resident kernel skipped."""
    vec = 16 // dtype.itemsize
    resident = _resident_vectors(torch.empty(1, dtype=dtype, device=device))
    if torch.cuda.get_device_capability(device) == (9, 0):
        assert resident == torch.cuda.get_device_properties(device).multi_processor_count * 14336
    if resident == 0:
        pytest.skip("the resident kernel does not launch on this device")
    for n, kernel in ((resident * vec + vec - 1, "absmax_kernel"), (resident * vec + vec, None)):
        x = randn(n, dtype=dtype, device=device, seed=n, scale=3.0)
        x[-1] = -5000.0
        _only(_cuda_kernels(lambda x=x: _run_both(x)), kernel or "resident_kernel")
        if kernel is None:
            with _skip_paths(2):
                _only(_cuda_kernels(lambda x=x: _run_both(x)), "absmax_kernel")


@pytest.mark.parametrize("device", (GPU,))
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float32), ids=str)
def test_cuda_resident_absmax_anywhere(device, dtype):
    """The resident kernel with the maximum (a large value, then a NaN) in chunk 0 (q's scratch
    words), in another CTA's chunk, at N's first and last vectors, in the flat tail; all zeros."""
    vec = 16 // dtype.itemsize
    resident = _resident_vectors(torch.empty(1, dtype=dtype, device=device))
    if resident == 0:
        pytest.skip("the resident kernel does not launch on this device")
    per_cta = resident // torch.cuda.get_device_properties(device).multi_processor_count
    n = resident * vec + 3 * 8192 * vec + 5 * vec + 3  # N: 3 rounds of one CTA's chunk, a tail
    x = randn(n, dtype=dtype, device=device, seed=9)
    for where in (0, 7 * per_cta * vec + 3, resident * vec, n - 3 - vec, n - 1):
        y = x.clone()
        y[where] = -5000.0
        _only(_cuda_kernels(lambda y=y: _run_both(y)), "resident_kernel")
        y[where] = float("nan")
        _run_both(y)
    _run_both(torch.zeros(n, dtype=dtype, device=device))


@pytest.mark.parametrize("device", (GPU,))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_static_unroll_limit(device, dtype):
    """Static x of at most SMs x 1024 vectors runs one vector a thread, one vector more 4 a
    thread (quantize_kernel's last template argument); both sides with a tail and a saturating
    value, flat and as rows of a wider buffer."""
    vec = 16 // dtype.itemsize
    last = torch.cuda.get_device_properties(device).multi_processor_count * 1024
    scale = torch.tensor([0.02], device=device)
    for n, unroll in ((3, "1"), (7168, "1"), (last * vec + vec - 1, "1"), ((last + 1) * vec, "4")):
        x = randn(n, dtype=dtype, device=device, seed=n, scale=5.0)
        x[-1] = 1e4
        names = _cuda_kernels(lambda x=x: _run_both(x, scale))
        assert re.findall(r"quantize_kernel<[^>]*, (\d)>\(", names) == [unroll], names
    rows = last * vec // 4096
    base = randn(rows + 1, 4096 + 8, dtype=dtype, device=device, seed=4, scale=7.0)
    _run_both(base[:rows, :4096], scale)
    _run_both(base[:, :4096], scale)


@pytest.mark.parametrize("device", (GPU,))
@pytest.mark.parametrize("shape", ((1, 7168), (16, 7168), (256, 7168), (4096, 7168)))
def test_cuda_graph_capture(device, shape):
    """Dynamic: the scale is re-zeroed inside the graph on every replay (the fused block, the
    cluster, the two kernels, the resident kernel's cooperative launch)."""
    x = randn(*shape, dtype=torch.bfloat16, device=device, seed=5, scale=100.0)
    per_tensor_quant_fp8(x)  # build and warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        q, s = per_tensor_quant_fp8(x)
    for seed, scale in ((6, 0.5), (7, 0.1)):  # a smaller absmax than the capture's
        x.copy_(randn(*shape, dtype=torch.bfloat16, device=device, seed=seed, scale=scale))
        graph.replay()
        torch.cuda.synchronize()
        q_ref, s_ref = reference.per_tensor_quant_fp8(x)
        _fp8_equal(q, q_ref)
        torch.testing.assert_close(s, s_ref, rtol=0, atol=0)


@pytest.mark.parametrize("device", (GPU,))
def test_cuda_torch_compile_fullgraph(device):
    x = randn(64, 7168, dtype=torch.bfloat16, device=device)
    compiled = torch.compile(lambda t: per_tensor_quant_fp8(t * 2), fullgraph=True)
    q, s = compiled(x)
    q_ref, s_ref = reference.per_tensor_quant_fp8(x * 2)
    _fp8_equal(q, q_ref)
    torch.testing.assert_close(s, s_ref, rtol=0, atol=0)
