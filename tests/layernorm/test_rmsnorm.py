"""rmsnorm, gemma_rmsnorm, fused_add_rmsnorm and gemma_fused_add_rmsnorm against their references.

GPU: every backend on random inputs (never zeros), outputs poisoned first, over hidden sizes that
reach every kernel path, tokens around the block widths, every dtype, strided and misaligned
layouts, empty input, CUDA graphs, torch.compile and opcheck. CPU: the torch backend, the same
plumbing, and every argument error.

Kernel paths by hidden size (16-bit dtypes; fp32 has half the elements per 16-byte vector):
  1, 127         scalar loop kernel (hidden not a multiple of the vector)
  8, 32          register kernel, 1 vector per thread, 1-4 threads per row
  128            2 vectors per thread, 8 threads per row (qk heads)
  1024, 2048     4 and 8 vectors per thread, a warp per row
  4096 .. 32768  8 vectors per thread, 64..512 threads per row (5128: a partial last vector
                 column; 7168: a whole idle column; 24576: 384 threads)
  32776, 65536   longer than registers hold: vector loop kernel (fp32 from 16384 + 4 on)
The fused ops take the vector loop kernel up to 64 vectors (512 16-bit values) as well.
"""

from __future__ import annotations

import pytest
import torch

from kernels_layernorm import (
    fused_add_rmsnorm,
    gemma_fused_add_rmsnorm,
    gemma_rmsnorm,
    reference,
    rmsnorm,
)
from shared.testing.compare import assert_close
from shared.testing.inputs import FLOAT_DTYPES, misaligned, poison, row_strided

NORMS = {
    "rmsnorm": (rmsnorm, reference.rmsnorm),
    "gemma_rmsnorm": (gemma_rmsnorm, reference.gemma_rmsnorm),
}
FUSED = {
    "fused_add_rmsnorm": (fused_add_rmsnorm, reference.fused_add_rmsnorm),
    "gemma_fused_add_rmsnorm": (gemma_fused_add_rmsnorm, reference.gemma_fused_add_rmsnorm),
}
BACKENDS = {"cpu": ("torch",), "cuda": ("cuda", "torch")}
GPU_HIDDEN = (1, 8, 32, 127, 128, 1024, 2048, 4096, 5128, 7168, 8192, 16384, 24576)
LONG_HIDDEN = (32768, 32776, 65536)
TOKENS = (1, 7, 64, 128, 1000)
SENTINEL = 7777.0


def _rand(*shape, dtype=torch.float32, device="cpu", seed=0, scale=1.0) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(*shape, generator=g, device=device) * scale).to(dtype)


def _weight(hidden, dtype, device, seed=100) -> torch.Tensor:
    return (1.0 + 0.25 * _rand(hidden, device=device, seed=seed)).to(dtype)


def _sentinel_rows(rows, cols, dtype, device, extra=8):
    """A [rows, cols] view of a wider buffer whose extra columns hold a sentinel value."""
    wide = torch.full((rows, cols + extra), SENTINEL, dtype=dtype, device=device)
    return wide, wide[:, :cols]


def _padding_intact(wide: torch.Tensor, cols: int) -> bool:
    return bool((wide[:, cols:] == torch.tensor(SENTINEL, dtype=wide.dtype)).all())


def _shapes(device: str):
    if device == "cpu":  # the torch backend only: the plumbing, not the kernels
        return [(7, 127), (3, 4096)]
    return [(t, h) for h in GPU_HIDDEN for t in TOKENS] + [
        (t, h) for h in LONG_HIDDEN for t in (1, 7, 128)
    ]


def _params(device: str, *extra):
    marks = (pytest.mark.gpu,) if device == "cuda" else ()
    return [
        pytest.param(device, dtype, t, h, id=f"{device}-{str(dtype)[6:]}-{t}x{h}", marks=marks)
        for dtype in FLOAT_DTYPES
        for t, h in _shapes(device)
    ]


ALL_SHAPES = _params("cpu") + _params("cuda")
DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("name", sorted(NORMS))
@pytest.mark.parametrize(("device", "dtype", "tokens", "hidden"), ALL_SHAPES)
def test_norm_matches_reference(name, device, dtype, tokens, hidden):
    op, ref = NORMS[name]
    x = _rand(tokens, hidden, dtype=dtype, device=device, seed=hidden + tokens)
    w = _weight(hidden, dtype, device)
    expected = ref(x, w, 1e-6)
    for backend in BACKENDS[device]:
        out = poison(torch.empty_like(x))
        assert op(x, w, 1e-6, out=out, backend=backend) is out
        assert_close(out, expected, name=f"{name} {backend} {tokens}x{hidden}")
    assert_close(op(x, w, 1e-6), expected, name=f"{name} default backend, out allocated")


@pytest.mark.parametrize("name", sorted(FUSED))
@pytest.mark.parametrize(("device", "dtype", "tokens", "hidden"), ALL_SHAPES)
def test_fused_matches_reference(name, device, dtype, tokens, hidden):
    op, ref = FUSED[name]
    x0 = _rand(tokens, hidden, dtype=dtype, device=device, seed=hidden + tokens)
    r0 = _rand(tokens, hidden, dtype=dtype, device=device, seed=hidden + tokens + 1, scale=3.0)
    w = _weight(hidden, dtype, device)
    y_expected, s_expected = ref(x0, r0, w, 1e-6)
    for backend in BACKENDS[device]:
        x, r = x0.clone(), r0.clone()
        assert op(x, r, w, 1e-6, backend=backend) is None
        # The stored residual is the fp32 sum rounded once: bit-exact on every backend.
        assert torch.equal(r, s_expected), f"{name} {backend}: residual differs"
        assert_close(x, y_expected, name=f"{name} {backend} {tokens}x{hidden}")


def _layouts(device):
    marks = (pytest.mark.gpu,) if device == "cuda" else ()
    return [
        pytest.param(device, dtype, hidden, id=f"{device}-{str(dtype)[6:]}-{hidden}", marks=marks)
        for dtype in FLOAT_DTYPES
        for hidden in (127, 2048, 4096, 5128)
    ]


LAYOUTS = _layouts("cpu") + _layouts("cuda")


@pytest.mark.parametrize("name", sorted(NORMS))
@pytest.mark.parametrize(("device", "dtype", "hidden"), LAYOUTS)
def test_norm_layouts(name, device, dtype, hidden):
    """Row-strided and misaligned inputs and outputs, [..., H] inputs, out= input (in place).
    Writes stay inside the output view (its buffer's extra columns keep their sentinel)."""
    op, ref = NORMS[name]
    x = _rand(33, hidden, dtype=dtype, device=device, seed=1)
    w = _weight(hidden, dtype, device)
    expected = ref(x, w, 1e-5)
    for backend in BACKENDS[device]:
        tag = f"{name} {backend}"
        wide, out = _sentinel_rows(33, hidden, dtype, device)
        poison(out)
        op(row_strided(x), w, 1e-5, out=out, backend=backend)
        assert_close(out, expected, name=f"{tag} row-strided")
        assert _padding_intact(wide, hidden), f"{tag}: wrote outside the output rows"
        assert_close(
            op(misaligned(x), w, 1e-5, backend=backend), expected, name=f"{tag} misaligned"
        )
        out = poison(misaligned(torch.empty_like(x)))
        op(x, w, 1e-5, out=out, backend=backend)
        assert_close(out, expected, name=f"{tag} misaligned out")
        assert_close(op(x, misaligned(w), 1e-5, backend=backend), expected, name=f"{tag} mis. w")
        x3 = x.view(3, 11, hidden)
        assert_close(op(x3, w, 1e-5, backend=backend), expected.view(3, 11, hidden), name=tag)
        # [3, 11, H] inside a [3, 12, H] buffer: rows do not merge into one stride (two levels).
        heads = _rand(3, 12, hidden, dtype=dtype, device=device, seed=2)[:, :11]
        heads.copy_(x3)
        assert_close(op(heads, w, 1e-5, backend=backend), expected.view(3, 11, hidden), name=tag)
        x1 = x[5]
        assert_close(op(x1, w, 1e-5, backend=backend), expected[5], name=f"{tag} 1-D")
        inplace = x.clone()
        assert op(inplace, w, 1e-5, out=inplace, backend=backend) is inplace
        assert_close(inplace, expected, name=f"{tag} in place")


@pytest.mark.parametrize("name", sorted(FUSED))
@pytest.mark.parametrize(("device", "dtype", "hidden"), LAYOUTS)
def test_fused_layouts(name, device, dtype, hidden):
    """Row-strided (each its own stride), misaligned and 3-D inputs of the in-place fused ops."""
    op, ref = FUSED[name]
    x0 = _rand(33, hidden, dtype=dtype, device=device, seed=3)
    r0 = _rand(33, hidden, dtype=dtype, device=device, seed=4, scale=2.0)
    w = _weight(hidden, dtype, device)
    y_expected, s_expected = ref(x0, r0, w, 1e-5)
    for backend in BACKENDS[device]:
        tag = f"{name} {backend}"
        x_wide, x = _sentinel_rows(33, hidden, dtype, device, extra=8)
        r_wide, r = _sentinel_rows(33, hidden, dtype, device, extra=24)
        x.copy_(x0)
        r.copy_(r0)
        op(x, r, w, 1e-5, backend=backend)
        assert torch.equal(r, s_expected), f"{tag} row-strided: residual differs"
        assert_close(x, y_expected, name=f"{tag} row-strided")
        assert _padding_intact(x_wide, hidden) and _padding_intact(r_wide, hidden), tag
        x, r = misaligned(x0), misaligned(r0)
        op(x, r, w, 1e-5, backend=backend)
        assert torch.equal(r, s_expected), f"{tag} misaligned: residual differs"
        assert_close(x, y_expected, name=f"{tag} misaligned")
        x, r = x0.clone().view(3, 11, hidden), r0.clone().view(3, 11, hidden)
        op(x, r, w, 1e-5, backend=backend)
        assert torch.equal(r, s_expected.view(3, 11, hidden)), f"{tag} 3-D: residual differs"
        assert_close(x, y_expected.view(3, 11, hidden), name=f"{tag} 3-D")


@pytest.mark.parametrize("device", DEVICES)
def test_empty_input(device):
    w = _weight(64, torch.bfloat16, device)
    for name, (op, _) in NORMS.items():
        empty = torch.empty(0, 64, dtype=torch.bfloat16, device=device)
        assert op(empty, w).shape == (0, 64), name
    for name, (op, _) in FUSED.items():
        x = torch.empty(0, 64, dtype=torch.bfloat16, device=device)
        assert op(x, torch.empty_like(x), w) is None, name


@pytest.mark.gpu
@pytest.mark.parametrize("enable_pdl", (False, True))
def test_pdl_on_and_off(enable_pdl):
    x = _rand(64, 4096, dtype=torch.bfloat16, device="cuda", seed=5)
    r = _rand(64, 4096, dtype=torch.bfloat16, device="cuda", seed=6)
    w = _weight(4096, torch.bfloat16, "cuda")
    assert_close(rmsnorm(x, w, enable_pdl=enable_pdl), reference.rmsnorm(x, w))
    y, s = reference.fused_add_rmsnorm(x, r, w)
    fused_add_rmsnorm(x, r, w, enable_pdl=enable_pdl)
    assert torch.equal(r, s)
    assert_close(x, y)


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", (1, 16, 4096))
def test_cuda_graph_capture(tokens):
    """Every op captured in one graph (back to back, as an engine's decode step runs them)."""
    dtype, hidden = torch.bfloat16, 4096
    x0 = _rand(tokens, hidden, dtype=dtype, device="cuda", seed=7)
    r0 = _rand(tokens, hidden, dtype=dtype, device="cuda", seed=8)
    w = _weight(hidden, dtype, "cuda")
    x = x0.clone()
    outs = {name: torch.empty_like(x0) for name in NORMS}
    xs = {name: x0.clone() for name in FUSED}
    rs = {name: r0.clone() for name in FUSED}

    def step():
        for name, (op, _) in NORMS.items():
            op(x, w, out=outs[name])
        for name, (op, _) in FUSED.items():
            op(xs[name], rs[name], w)

    step()  # builds and loads the module before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    for name in NORMS:
        poison(outs[name])
    for name in FUSED:
        xs[name].copy_(x0)
        rs[name].copy_(r0)
    graph.replay()
    torch.cuda.synchronize()
    for name, (_, ref) in NORMS.items():
        assert_close(outs[name], ref(x0, w), name=name)
    for name, (_, ref) in FUSED.items():
        y, s = ref(x0, r0, w)
        assert torch.equal(rs[name], s), name
        assert_close(xs[name], y, name=name)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x0 = _rand(9, 512, dtype=dtype, device=device, seed=9)
    r0 = _rand(9, 512, dtype=dtype, device=device, seed=10)
    w = _weight(512, dtype, device)

    def fn(x, r):
        y = rmsnorm(x, w) + gemma_rmsnorm(x, w)
        fused_add_rmsnorm(x, r, w)
        gemma_fused_add_rmsnorm(x, r, w)
        return y * 2

    expected_x, expected_r = x0.clone(), r0.clone()
    expected = fn(expected_x, expected_r)
    compiled = torch.compile(fn, fullgraph=True)
    x, r = x0.clone(), r0.clone()
    assert_close(compiled(x, r), expected)
    assert_close(x, expected_x)
    assert_close(r, expected_r)


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    from kernels_layernorm.ops.rmsnorm import (
        FUSED_ADD_RMSNORM,
        GEMMA_FUSED_ADD_RMSNORM,
        GEMMA_RMSNORM,
        RMSNORM,
    )

    x = _rand(8, 256, device=device, seed=11)
    w = _weight(256, torch.float32, device)
    for op in (RMSNORM, GEMMA_RMSNORM):
        torch.library.opcheck(op.torch_op, (torch.empty_like(x), x, w, 1e-6, None))
    for op in (FUSED_ADD_RMSNORM, GEMMA_FUSED_ADD_RMSNORM):
        torch.library.opcheck(op.torch_op, (x.clone(), torch.randn_like(x), w, 1e-6, None))


def test_bad_input_errors_name_op_and_argument():
    x = torch.randn(4, 64)
    w = torch.ones(64)
    op = "layernorm.rmsnorm"
    with pytest.raises(TypeError, match=rf"{op}: input must have dtype in .*got float64"):
        rmsnorm(x.double(), w.double())
    with pytest.raises(TypeError, match=rf"{op}: input must have dtype in .*got int32"):
        rmsnorm(x.int(), w)
    with pytest.raises(TypeError, match=rf"{op}: input must be a torch.Tensor, got list"):
        rmsnorm([1.0], w)
    with pytest.raises(TypeError, match=rf"{op}: weight must be a torch.Tensor"):
        rmsnorm(x, None)
    with pytest.raises(ValueError, match=r"weight must have shape \(64,\) .*got \(63,\)"):
        rmsnorm(x, torch.ones(63))
    with pytest.raises(ValueError, match=r"weight must have shape \(64,\) .*got \(1, 64\)"):
        rmsnorm(x, torch.ones(1, 64))
    with pytest.raises(TypeError, match=r"weight must have the dtype of input \(float32\)"):
        rmsnorm(x, w.half())
    with pytest.raises(ValueError, match="weight is on meta, input on cpu"):
        rmsnorm(x, w.to("meta"))
    with pytest.raises(ValueError, match="weight must be contiguous"):
        rmsnorm(x, torch.ones(128)[::2])
    with pytest.raises(TypeError, match=r"eps must be a float, got str"):
        rmsnorm(x, w, "1e-6")
    with pytest.raises(TypeError, match=r"eps must be a float, got bool"):
        rmsnorm(x, w, True)
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        rmsnorm(x, w, -1e-6)
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        rmsnorm(x, w, float("nan"))
    with pytest.raises(ValueError, match=r"out must have the shape of input \(4, 64\)"):
        rmsnorm(x, w, out=torch.empty(4, 63))
    with pytest.raises(TypeError, match=r"out must have the dtype of input \(float32\)"):
        rmsnorm(x, w, out=torch.empty(4, 64, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="input must have a contiguous last dim"):
        rmsnorm(torch.randn(64, 4).t(), torch.ones(4))
    with pytest.raises(ValueError, match="input must have a contiguous last dim"):
        rmsnorm(torch.randn(64, 4).t(), torch.ones(64))
    with pytest.raises(ValueError, match="out must have a contiguous last dim"):
        rmsnorm(x, w, out=torch.empty(64, 4).t())
    with pytest.raises(ValueError, match="input must have at least 1 dim"):
        rmsnorm(torch.tensor(1.0), torch.ones(1))
    with pytest.raises(TypeError, match="enable_pdl must be a bool or None"):
        rmsnorm(x, w, enable_pdl=1)
    with pytest.raises(ValueError, match="backend 'cuda' cannot run here"):
        rmsnorm(x, w, backend="cuda")
    assert torch.equal(rmsnorm(x, w, 0), rmsnorm(x, w, 0.0))  # an int eps is fine


def test_fused_bad_input_errors():
    x, r, w = torch.randn(4, 64), torch.randn(4, 64), torch.ones(64)
    op = "layernorm.fused_add_rmsnorm"
    with pytest.raises(ValueError, match=rf"{op}: residual must have the shape of input"):
        fused_add_rmsnorm(x, torch.randn(4, 65), w)
    with pytest.raises(TypeError, match=rf"{op}: residual must have the dtype of input"):
        fused_add_rmsnorm(x, r.half(), w)
    with pytest.raises(TypeError, match=rf"{op}: residual must be a torch.Tensor"):
        fused_add_rmsnorm(x, 1.0, w)
    with pytest.raises(ValueError, match=r"gemma_fused_add_rmsnorm: weight must have shape"):
        gemma_fused_add_rmsnorm(x, r, torch.ones(32))
    with pytest.raises(TypeError, match="eps must be a float"):
        fused_add_rmsnorm(x, r, w, eps=None)


@pytest.mark.gpu
def test_bad_input_errors_on_gpu():
    """On the CUDA fast path the compiled function validates; its errors name op and argument."""
    x = torch.randn(4, 64, device="cuda")
    w = torch.ones(64, device="cuda")
    with pytest.raises(ValueError, match=r"layernorm.rmsnorm: weight must have shape \[64\]"):
        rmsnorm(x, torch.ones(63, device="cuda"))
    with pytest.raises(TypeError, match="layernorm.rmsnorm: weight and input must have the same"):
        rmsnorm(x, w.half())
    with pytest.raises(ValueError, match="layernorm.rmsnorm: weight and input must be on the same"):
        rmsnorm(x, torch.ones(64))
    with pytest.raises(ValueError, match="out .* and input .* must have the same shape"):
        rmsnorm(x, w, out=torch.empty(4, 63, device="cuda"))
    with pytest.raises(ValueError, match="input must have a contiguous last dim"):
        rmsnorm(torch.randn(64, 4, device="cuda").t(), torch.ones(64, device="cuda"))
    with pytest.raises(ValueError, match="residual .* and input .* must have the same shape"):
        fused_add_rmsnorm(x, torch.randn(4, 65, device="cuda"), w)
    with pytest.raises(TypeError, match="input must have dtype in"):
        rmsnorm(x.double(), w.double())
    with pytest.raises(ValueError, match="eps must be a finite number"):
        rmsnorm(x, w, -1.0)
    weird = torch.randn(3, 5, 7, 64, device="cuda")[:, :3, :4]  # three levels of strides
    with pytest.raises(ValueError, match="cannot be merged .* contiguous"):
        rmsnorm(weird, w)
    assert_close(rmsnorm(weird.contiguous(), w), reference.rmsnorm(weird, w))


def test_compiled_functions_validate_their_arguments():
    """The raw compiled functions, called past the Python checks with CPU tensors, reject bad
    arguments themselves (all checks precede the device check, so they run without a GPU)."""
    from kernels_jit import load_module
    from kernels_layernorm.ops.rmsnorm import RMSNORM_CUDA
    from shared.testing.builds import cuda_arch

    with cuda_arch():
        module = load_module(RMSNORM_CUDA)
    x, w = torch.randn(4, 64), torch.ones(64)
    with pytest.raises(ValueError, match=r"out \[4, 63\] and input \[4, 64\] must have the same"):
        module.rmsnorm(torch.empty(4, 63), x, w, 1e-6, -1)
    with pytest.raises(ValueError, match=r"gemma_rmsnorm: weight must have shape \[64\]"):
        module.gemma_rmsnorm(torch.empty(4, 64), x, torch.ones(65), 1e-6, -1)
    with pytest.raises(TypeError, match="input must have dtype float32, float16 or bfloat16"):
        module.rmsnorm(torch.empty(4, 64).double(), x.double(), w.double(), 1e-6, -1)
    with pytest.raises(TypeError, match="weight and input must have the same dtype"):
        module.fused_add_rmsnorm(x, x.clone(), w.half(), 1e-6, -1)
    with pytest.raises(ValueError, match="eps must be a finite number >= 0"):
        module.rmsnorm(torch.empty(4, 64), x, w, -1.0, -1)
    with pytest.raises(ValueError, match="must have a contiguous last dim"):
        module.rmsnorm(torch.empty(64, 4).t(), torch.randn(64, 4).t(), torch.ones(4), 1e-6, -1)
    weird = torch.randn(3, 5, 7, 64)[:, :3, :4]  # three levels of strides
    with pytest.raises(ValueError, match="cannot be merged"):
        module.rmsnorm(torch.empty_like(weird), weird, w, 1e-6, -1)
    # Merging leading dims: a [2, 3, 4, H] slice whose first two dims merge is accepted.
    mergeable = torch.randn(2, 3, 8, 64)[:, :, :4]
    with pytest.raises(ValueError, match="wrong device type"):
        module.rmsnorm(torch.empty_like(mergeable), mergeable, w, 1e-6, -1)
    with pytest.raises(ValueError, match="wrong device type"):  # everything else was valid
        module.fused_add_rmsnorm(x, x.clone(), w, 1e-6, -1)


@pytest.mark.parametrize("device", DEVICES)
def test_fused_add_rejects_overlapping_input_and_residual(device):
    buffer = torch.randn(8, 256, device=device)
    w = torch.ones(128, device=device)
    for op in (fused_add_rmsnorm, gemma_fused_add_rmsnorm):
        with pytest.raises(ValueError, match="input and residual must not overlap"):
            op(buffer[:, :128], buffer[:, 64:192], w)
        with pytest.raises(ValueError, match="input and residual must not overlap"):
            x = buffer[:4, :128]
            op(x, x, w)
        # Spans are compared (as in C++): column halves of one buffer are rejected too.
        with pytest.raises(ValueError, match="input and residual must not overlap"):
            op(buffer[:, :128], buffer[:, 128:], w)
    x, r = torch.randn(4, 128, device=device), torch.randn(4, 128, device=device)
    expected, s = reference.fused_add_rmsnorm(x.clone(), r.clone(), w)
    fused_add_rmsnorm(x, r, w)
    assert_close(x, expected)
    assert_close(r, s)
