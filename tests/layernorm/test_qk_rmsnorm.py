"""qk_rmsnorm against its reference: contiguous and head-strided q/k (views of a fused qkv
buffer), head dims on the vector and scalar paths, GQA head counts, every dtype, empty input,
CUDA graphs, torch.compile, opcheck, and argument errors."""

from __future__ import annotations

import pytest
import torch

from kernels_layernorm import qk_rmsnorm, reference
from shared.testing.compare import assert_close
from shared.testing.inputs import FLOAT_DTYPES, misaligned

BACKENDS = {"cpu": ("torch",), "cuda": ("cuda", "torch")}
# 128: the common head; 64/256: other models; 60 (and fp32 62): not a multiple of the 16-byte
# vector (scalar path); 8: one vector per head (one thread per head for 16-bit dtypes).
HEAD_DIMS = (8, 60, 64, 128, 256)
HEADS = ((32, 8), (8, 1), (1, 1), (40, 8))
TOKENS = (1, 7, 128, 1000)
DEVICES = [pytest.param("cpu"), pytest.param("cuda", marks=pytest.mark.gpu)]


def _rand(*shape, dtype=torch.float32, device="cpu", seed=0, scale=1.0) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(*shape, generator=g, device=device) * scale).to(dtype)


def _weight(d, dtype, device, seed) -> torch.Tensor:
    return (1.0 + 0.25 * _rand(d, device=device, seed=seed)).to(dtype)


def _qkv(tokens, hq, hk, d, *, dtype, device, seed=0):
    """q and k as the head-strided views of a [T, (Hq + 2 Hk) D] projection output."""
    qkv = _rand(tokens, (hq + 2 * hk) * d, dtype=dtype, device=device, seed=seed, scale=2.0)
    q = qkv[:, : hq * d].view(tokens, hq, d)
    k = qkv[:, hq * d : (hq + hk) * d].view(tokens, hk, d)
    return qkv, q, k


def _params():
    cases = [
        pytest.param("cpu", dtype, 7, (8, 2), 128, id=f"cpu-{str(dtype)[6:]}")
        for dtype in FLOAT_DTYPES
    ]
    for dtype in FLOAT_DTYPES:
        for d in HEAD_DIMS:
            for hq, hk in HEADS:
                for t in TOKENS:
                    cases.append(
                        pytest.param(
                            "cuda",
                            dtype,
                            t,
                            (hq, hk),
                            d,
                            id=f"cuda-{str(dtype)[6:]}-{t}x({hq},{hk})x{d}",
                            marks=pytest.mark.gpu,
                        )
                    )
    return cases


@pytest.mark.parametrize(("device", "dtype", "tokens", "heads", "d"), _params())
def test_matches_reference(device, dtype, tokens, heads, d):
    hq, hk = heads
    qkv0, q0, k0 = _qkv(tokens, hq, hk, d, dtype=dtype, device=device, seed=tokens + d)
    qw, kw = _weight(d, dtype, device, 1), _weight(d, dtype, device, 2)
    q_expected, k_expected = reference.qk_rmsnorm(q0, k0, qw, kw, 1e-6)
    v_expected = qkv0[:, (hq + hk) * d :]
    for backend in BACKENDS[device]:
        tag = f"{backend} {tokens}x({hq},{hk})x{d}"
        # Contiguous q and k.
        q, k = q0.clone(), k0.clone()
        assert qk_rmsnorm(q, k, qw, kw, 1e-6, backend=backend) is None
        assert_close(q, q_expected, name=f"{tag} q")
        assert_close(k, k_expected, name=f"{tag} k")
        # Head-strided views of the fused buffer; v must stay untouched.
        qkv = qkv0.clone()
        q = qkv[:, : hq * d].view(tokens, hq, d)
        k = qkv[:, hq * d : (hq + hk) * d].view(tokens, hk, d)
        qk_rmsnorm(q, k, qw, kw, 1e-6, backend=backend)
        assert_close(q, q_expected, name=f"{tag} q strided")
        assert_close(k, k_expected, name=f"{tag} k strided")
        assert torch.equal(qkv[:, (hq + hk) * d :], v_expected), f"{tag}: v was written"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_misaligned_and_odd_layouts(device, dtype):
    d = 128
    q0 = _rand(5, 4, d, dtype=dtype, device=device, seed=3)
    k0 = _rand(5, 2, d, dtype=dtype, device=device, seed=4)
    qw, kw = _weight(d, dtype, device, 5), _weight(d, dtype, device, 6)
    q_expected, k_expected = reference.qk_rmsnorm(q0, k0, qw, kw)
    for backend in BACKENDS[device]:
        q, k = misaligned(q0), misaligned(k0)
        qk_rmsnorm(q, k, qw, kw, backend=backend)
        assert_close(q, q_expected, name=f"{backend} misaligned q")
        assert_close(k, k_expected, name=f"{backend} misaligned k")
        # Heads transposed in memory ([T, H, D] view of an [H, T, D] buffer): two levels.
        q = q0.transpose(0, 1).contiguous().transpose(0, 1)
        k = k0.clone()
        qk_rmsnorm(q, k, misaligned(qw), kw, backend=backend)
        assert_close(q, q_expected, name=f"{backend} head-major q")
        assert_close(k, k_expected, name=f"{backend} head-major k")


@pytest.mark.parametrize("device", DEVICES)
def test_empty_tokens(device):
    q = torch.empty(0, 4, 64, device=device)
    k = torch.empty(0, 2, 64, device=device)
    w = torch.ones(64, device=device)
    assert qk_rmsnorm(q, k, w, w) is None


@pytest.mark.gpu
@pytest.mark.parametrize("tokens", (1, 64, 4096))
def test_cuda_graph_capture(tokens):
    dtype = torch.bfloat16
    qkv0, q0, k0 = _qkv(tokens, 32, 8, 128, dtype=dtype, device="cuda", seed=7)
    qw, kw = _weight(128, dtype, "cuda", 8), _weight(128, dtype, "cuda", 9)
    qkv = qkv0.clone()
    q = qkv[:, : 32 * 128].view(tokens, 32, 128)
    k = qkv[:, 32 * 128 : 40 * 128].view(tokens, 8, 128)
    qk_rmsnorm(q, k, qw, kw)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        qk_rmsnorm(q, k, qw, kw)
    qkv.copy_(qkv0)
    graph.replay()
    torch.cuda.synchronize()
    q_expected, k_expected = reference.qk_rmsnorm(q0, k0, qw, kw)
    assert_close(q, q_expected)
    assert_close(k, k_expected)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    hq, hk, d = 4, 2, 64
    qkv0, q0, k0 = _qkv(6, hq, hk, d, dtype=dtype, device=device, seed=10)
    qw, kw = _weight(d, dtype, device, 11), _weight(d, dtype, device, 12)

    def fn(qkv):
        q = qkv[:, : hq * d].view(-1, hq, d)
        k = qkv[:, hq * d : (hq + hk) * d].view(-1, hk, d)
        qk_rmsnorm(q, k, qw, kw)
        return qkv * 1

    compiled = torch.compile(fn, fullgraph=True)
    q_expected, k_expected = reference.qk_rmsnorm(q0, k0, qw, kw)
    qkv = qkv0.clone()
    result = compiled(qkv)
    assert_close(result[:, : hq * d].view(-1, hq, d), q_expected)
    assert_close(result[:, hq * d : (hq + hk) * d].view(-1, hk, d), k_expected)
    assert_close(qkv, result)  # the input buffer was updated in place too


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    from kernels_layernorm.ops.qk_rmsnorm import QK_RMSNORM

    q = _rand(3, 4, 64, device=device, seed=13)
    k = _rand(3, 2, 64, device=device, seed=14)
    w = torch.ones(64, device=device)
    torch.library.opcheck(QK_RMSNORM.torch_op, (q, k, w, w, 1e-6, None))


def test_bad_input_errors():
    q, k, w = torch.randn(3, 4, 64), torch.randn(3, 2, 64), torch.ones(64)
    op = "layernorm.qk_rmsnorm"
    with pytest.raises(ValueError, match=rf"{op}: q must have at least 3 dim"):
        qk_rmsnorm(torch.randn(3, 64), k, w, w)
    with pytest.raises(ValueError, match=r"q and k must be \[T, heads, head_dim\]"):
        qk_rmsnorm(q, torch.randn(3, 2, 2, 64), w, w)
    with pytest.raises(ValueError, match="same tokens and head_dim"):
        qk_rmsnorm(q, torch.randn(4, 2, 64), w, w)
    with pytest.raises(ValueError, match="same tokens and head_dim"):
        qk_rmsnorm(q, torch.randn(3, 2, 32), w, w)
    with pytest.raises(TypeError, match="k must have the dtype of q"):
        qk_rmsnorm(q, k.half(), w, w)
    with pytest.raises(TypeError, match=r"q must have dtype in .*got float64"):
        qk_rmsnorm(q.double(), k.double(), w.double(), w.double())
    with pytest.raises(ValueError, match=r"k_weight must have shape \(64,\)"):
        qk_rmsnorm(q, k, w, torch.ones(32))
    with pytest.raises(TypeError, match=r"q_weight must have the dtype of q"):
        qk_rmsnorm(q, k, w.half(), w)
    with pytest.raises(ValueError, match="k must have a contiguous last dim"):
        qk_rmsnorm(q, torch.randn(3, 64, 2).transpose(1, 2), w, w)
    with pytest.raises(TypeError, match="eps must be a float"):
        qk_rmsnorm(q, k, w, w, "x")
    with pytest.raises(TypeError, match="k must be a torch.Tensor"):
        qk_rmsnorm(q, None, w, w)


@pytest.mark.gpu
def test_bad_input_errors_on_gpu():
    q = torch.randn(3, 4, 64, device="cuda")
    k = torch.randn(3, 2, 64, device="cuda")
    w = torch.ones(64, device="cuda")
    with pytest.raises(ValueError, match="same tokens and head_dim"):
        qk_rmsnorm(q, torch.randn(4, 2, 64, device="cuda"), w, w)
    with pytest.raises(ValueError, match=r"k_weight must have shape \[64\]"):
        qk_rmsnorm(q, k, w, torch.ones(32, device="cuda"))
    with pytest.raises(ValueError, match="k and q must be on the same device"):
        qk_rmsnorm(q, k.cpu(), w, w)
    with pytest.raises(ValueError, match=r"q and k must be \[T, heads, head_dim\]"):
        qk_rmsnorm(q, k.view(3, 2, 2, 32), w, w)


def test_compiled_function_validates_its_arguments():
    from kernels_jit import load_module
    from kernels_layernorm.ops.rmsnorm import RMSNORM_CUDA
    from shared.testing.builds import cuda_arch

    with cuda_arch():
        raw = load_module(RMSNORM_CUDA).qk_rmsnorm
    q, k, w = torch.randn(3, 4, 64), torch.randn(3, 2, 64), torch.ones(64)
    with pytest.raises(ValueError, match="same tokens and head_dim"):
        raw(q, torch.randn(2, 2, 64), w, w, 1e-6, -1)
    with pytest.raises(ValueError, match=r"q_weight must have shape \[64\] \(the last dim of q\)"):
        raw(q, k, torch.ones(63), w, 1e-6, -1)
    with pytest.raises(ValueError, match="wrong device type"):
        raw(q, k, w, w, 1e-6, -1)
