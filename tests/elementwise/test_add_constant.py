"""elementwise.add_constant against its reference: sizes around the block and vector widths,
every dtype, constants of both signs, misaligned and strided views, empty input, out= and in place,
torch.compile and CUDA graphs on the GPU."""

from __future__ import annotations

import pytest
import torch

from kernels_elementwise import add_constant, reference
from shared.testing.builds import compile_group_for_hopper
from shared.testing.compare import assert_close
from shared.testing.inputs import misaligned, poison, randn

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32)
# 1 and 7: below one 16-byte vector; 127/128/129: around one block of fp32 vectors; 1025/4097:
# past the vector threshold with and without a tail.
SIZES = (1, 7, 127, 128, 129, 1025, 4097)
BACKENDS = {"cpu": ("cpu", "torch"), "cuda": ("cuda", "torch")}


def _input(n: int, dtype: torch.dtype, device: str) -> torch.Tensor:
    if dtype == torch.int32:
        g = torch.Generator().manual_seed(n)
        return torch.randint(-(2**31), 2**31 - 1, (n,), generator=g, dtype=dtype).to(device)
    return randn(n, dtype=dtype, device=device, seed=n)


def _device_params():
    return [
        pytest.param("cpu", id="cpu"),
        pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
    ]


@pytest.mark.parametrize("device", _device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("constant", (0.0, 3.0, -7.0))
def test_matches_reference(device, dtype, n, constant):
    x = _input(n, dtype, device)
    expected = reference.add_constant(x, constant)
    for backend in BACKENDS[device]:
        out = poison(torch.empty_like(x))
        add_constant(x, constant, out=out, backend=backend)
        assert_close(out, expected, name=f"{backend} n={n}")


@pytest.mark.parametrize("device", _device_params())
def test_int32_wraps_like_torch(device):
    x = torch.tensor([2**31 - 1, -(2**31)], dtype=torch.int32, device=device)
    assert_close(add_constant(x, 1), reference.add_constant(x, 1))
    assert add_constant(x, 1).tolist() == [-(2**31), -(2**31) + 1]


@pytest.mark.parametrize("device", _device_params())
@pytest.mark.parametrize("dtype", (torch.float16, torch.bfloat16), ids=str)
def test_misaligned_input_takes_scalar_path(device, dtype):
    x = misaligned(randn(1031, dtype=dtype, device=device))
    assert_close(add_constant(x, 1.5), reference.add_constant(x, 1.5))


@pytest.mark.parametrize("device", _device_params())
def test_strided_input_falls_back_to_torch(device):
    x = randn(16, 40, device=device)[:, 3:35]
    assert not x.is_contiguous()
    assert_close(add_constant(x, 2.0), reference.add_constant(x, 2.0))


@pytest.mark.parametrize("device", _device_params())
def test_in_place_and_empty(device):
    x = randn(333, device=device)
    expected = reference.add_constant(x, 4.0)
    assert add_constant(x, 4.0, out=x) is x
    assert_close(x, expected)
    empty = torch.empty(0, 5, device=device)
    assert add_constant(empty, 1.0).shape == (0, 5)


def test_bad_input_errors_name_op_and_argument():
    x = torch.ones(4)
    with pytest.raises(TypeError, match=r"add_constant: x must have dtype in .*got float64"):
        add_constant(x.double(), 1.0)
    # The backend that runs checks ``out``: C++ for the compiled kernels, Python for torch.
    with pytest.raises(ValueError, match=r"add_constant: out \[5\] and x \[4\] must have the same"):
        add_constant(x, 1.0, out=torch.empty(5))
    with pytest.raises(TypeError, match=r"add_constant: out and x must have the same dtype"):
        add_constant(x, 1.0, out=torch.empty(4, dtype=torch.float16))
    with pytest.raises(ValueError, match=r"add_constant: out must have shape \(4,\), got \(5,\)"):
        add_constant(x, 1.0, out=torch.empty(5), backend="torch")
    with pytest.raises(ValueError, match="x is int32, so constant must be a finite integer"):
        add_constant(torch.ones(3, dtype=torch.int32), 0.5)
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="x is int32, so constant must be a finite integer"):
            add_constant(torch.ones(3, dtype=torch.int32), bad)
    with pytest.raises(
        ValueError, match=r"in int32 range \[-2147483648, 2147483647\], got 2147483648"
    ):
        add_constant(torch.ones(3, dtype=torch.int32), 2**31)
    assert add_constant(torch.ones(3, dtype=torch.int32), -(2**31)).tolist() == [-(2**31) + 1] * 3
    with pytest.raises(TypeError, match="x must be a torch.Tensor"):
        add_constant([1.0], 1.0)
    with pytest.raises(ValueError, match="backend 'cuda' cannot run here"):
        add_constant(x, 1.0, backend="cuda")


def test_compiled_kernel_rejects_bad_input_itself():
    """A direct call of the raw function, past the Python checks, fails cleanly in C++."""
    from kernels_elementwise.ops.add_constant import ADD_CONSTANT_CPU
    from kernels_jit import load_module

    raw = load_module(ADD_CONSTANT_CPU).add_constant
    with pytest.raises(ValueError, match="same shape"):
        raw(torch.empty(3), torch.empty(4), 1.0)
    with pytest.raises(TypeError, match="unsupported dtype"):
        raw(torch.empty(3, dtype=torch.float64), torch.empty(3, dtype=torch.float64), 1.0)


@pytest.mark.parametrize("device", _device_params())
def test_torch_compile_fullgraph(device):
    x = randn(1000, device=device)
    compiled = torch.compile(lambda t: add_constant(t, 2.0) * 2, fullgraph=True)
    assert_close(compiled(x), reference.add_constant(x, 2.0) * 2)


def test_opcheck():
    from kernels_elementwise.ops.add_constant import ADD_CONSTANT

    x = randn(64)
    out = torch.empty_like(x)
    torch.library.opcheck(ADD_CONSTANT.torch_op, (out, x, 1.5, None))


@pytest.mark.gpu
def test_cuda_graph_capture():
    x = randn(1 << 20, device="cuda")
    out = torch.empty_like(x)
    add_constant(x, 1.0, out=out)  # builds and loads before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        add_constant(x, 5.0, out=out)
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, reference.add_constant(x, 5.0))


def test_cuda_source_compiles_for_sm90a():
    assert "add_constant_cuda" in compile_group_for_hopper("elementwise")
