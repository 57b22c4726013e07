"""attention.concat_mla_k against a loop over heads: DeepSeek's H = 128 with 128 + 64, H = 12 and
96, strided views, fp8, empty input, bad arguments, opcheck and torch.compile."""

from __future__ import annotations

import pytest
import torch

from kernels_attention import concat_mla_k
from shared.testing.inputs import poison, randn


def _expected(k_nope: torch.Tensor, k_rope: torch.Tensor) -> torch.Tensor:
    t, h, dn = k_nope.shape
    out = torch.empty(t, h, dn + k_rope.shape[2], dtype=k_nope.dtype)
    for head in range(h):
        out[:, head] = torch.cat((k_nope[:, head], k_rope[:, 0]), dim=-1)
    return out


@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float8_e4m3fn), ids=str)
@pytest.mark.parametrize(
    ("t", "h", "dn", "dr"),
    [(1, 1, 1, 1), (3, 128, 128, 64), (5, 12, 128, 64), (2, 96, 40, 24), (7, 3, 5, 3)],
)
def test_matches_loop(dtype, t, h, dn, dr):
    k_nope = randn(t, h, dn, seed=1).to(dtype)
    k_rope = randn(t, 1, dr, seed=2).to(dtype)
    k = torch.full((t, h, dn + dr), 7.0).to(dtype)
    assert concat_mla_k(k, k_nope, k_rope) is None
    assert torch.equal(k.view(torch.uint8), _expected(k_nope, k_rope).view(torch.uint8))


def test_strided_views():
    kv = randn(4, 12, 256, dtype=torch.bfloat16, seed=3)
    k_nope = kv[..., :128]  # the nope part of the kv_b projection, row stride 256
    latent = randn(4, 600, dtype=torch.bfloat16, seed=4)
    k_rope = latent[:, 512:576].unsqueeze(1)  # [T, 1, 64] view of the latent output
    storage = torch.zeros(4, 12, 200, dtype=torch.bfloat16)
    k = storage[..., :192]
    concat_mla_k(k, k_nope, k_rope)
    assert torch.equal(k, _expected(k_nope, k_rope)) and (storage[..., 192:] == 0).all()


def test_empty_and_bad_arguments():
    concat_mla_k(torch.empty(0, 4, 12), torch.empty(0, 4, 8), torch.empty(0, 1, 4))
    k, nope, rope = torch.empty(2, 4, 12), torch.ones(2, 4, 8), torch.ones(2, 1, 4)
    with pytest.raises(
        ValueError, match=r"concat_mla_k: k's last dim 12 must be Dn \+ Dr = 8 \+ 5"
    ):
        concat_mla_k(k, nope, torch.ones(2, 1, 5))
    with pytest.raises(
        ValueError, match=r"k_rope must be \[T, 1, Dr\] with T = 2, got shape \(2, 4, 4\)"
    ):
        concat_mla_k(k, nope, torch.ones(2, 4, 4))
    with pytest.raises(ValueError, match=r"k_nope \[T, H, Dn\] must share T = 2 and H = 4 with k"):
        concat_mla_k(k, torch.ones(2, 3, 8), rope)
    with pytest.raises(TypeError, match=r"k_rope must have dtype in \(float32\), got bfloat16"):
        concat_mla_k(k, nope, rope.bfloat16())
    with pytest.raises(ValueError, match="k_nope must have a contiguous last dim"):
        concat_mla_k(k, torch.ones(2, 8, 4).transpose(1, 2), rope)


def test_opcheck():
    from kernels_attention.ops.concat_mla_k import CONCAT_MLA_K

    k = torch.empty(3, 4, 24, dtype=torch.bfloat16)
    nope, rope = randn(3, 4, 16, dtype=torch.bfloat16), randn(3, 1, 8, dtype=torch.bfloat16, seed=1)
    torch.library.opcheck(CONCAT_MLA_K.torch_op, (k, nope, rope, None))


def test_torch_compile_fullgraph_aot():
    def assemble(nope, rope):
        k = torch.empty(nope.shape[0], nope.shape[1], nope.shape[2] + rope.shape[2])
        concat_mla_k(k, nope, rope)
        return k

    nope, rope = randn(3, 5, 16, seed=1), randn(3, 1, 8, seed=2)
    out = torch.compile(assemble, fullgraph=True, backend="aot_eager")(nope, rope)
    assert torch.equal(out, _expected(nope, rope))


# --- every backend against the loop (the CUDA kernel on the GPU) --------------------------------

BACKENDS = {"cpu": ("torch",), "cuda": ("cuda", "torch")}
DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float8_e4m3fn)


def _device_params():
    return [
        pytest.param("cpu", id="cpu"),
        pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
    ]


def _check_backends(device, make_k, k_nope, k_rope):
    """Every backend into a poisoned k (``make_k()``: a fresh view), compared bit for bit with
    the loop; bytes of k's storage outside the view stay as they were."""
    expected = _expected(k_nope.cpu(), k_rope.cpu())
    for backend in BACKENDS[device]:
        k = make_k()
        storage = k.as_strided((k.untyped_storage().nbytes() // k.element_size(),), (1,), 0)
        if k.dtype == torch.float8_e4m3fn:
            storage.view(torch.uint8).fill_(0x7F)  # NaN in e4m3fn
        else:
            poison(storage)
        before = storage.clone()
        concat_mla_k(k, k_nope, k_rope, backend=backend)
        got = k.cpu().view(torch.uint8)
        assert torch.equal(got, expected.view(torch.uint8)), f"{backend}: k differs"
        mask = torch.ones(storage.shape, dtype=torch.bool, device=storage.device)
        mask.as_strided(k.shape, k.stride(), k.storage_offset()).fill_(False)
        assert torch.equal(storage[mask].view(torch.uint8), before[mask].view(torch.uint8))


@pytest.mark.parametrize("device", _device_params())
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    ("t", "h", "dn", "dr"),
    [(1, 1, 1, 1), (3, 128, 128, 64), (5, 12, 128, 64), (2, 96, 40, 24), (7, 3, 5, 3),
     (16, 128, 128, 64), (4, 1, 512, 64)],
)  # fmt: skip
def test_backends_match_loop(device, dtype, t, h, dn, dr):
    k_nope = randn(t, h, dn, device=device, seed=1).to(dtype)
    k_rope = randn(t, 1, dr, device=device, seed=2).to(dtype)
    _check_backends(
        device, lambda: torch.empty(t, h, dn + dr, dtype=dtype, device=device), k_nope, k_rope
    )


@pytest.mark.parametrize("device", _device_params())
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float8_e4m3fn), ids=str)
def test_non_contiguous_and_misaligned_views(device, dtype):
    t, h, dn, dr = 6, 12, 128, 64
    kv = randn(t, h, 256, device=device, seed=3).to(dtype)
    latent = randn(t, 600, device=device, seed=4).to(dtype)
    # the nope part of the kv_b projection; the rope part of the latent output
    _check_backends(
        device,
        lambda: torch.empty(t, h, 200, dtype=dtype, device=device)[..., : dn + dr],
        kv[..., :dn],
        latent[:, 512 : 512 + dr].unsqueeze(1),
    )
    # transposed BMM output: k_nope stored [H, T, Dn]
    nope_t = randn(h, t, dn, device=device, seed=5).to(dtype).transpose(0, 1)
    _check_backends(
        device, lambda: torch.empty(t, h, dn + dr, dtype=dtype, device=device), nope_t,
        latent[:, 512 : 512 + dr].unsqueeze(1),
    )  # fmt: skip
    # odd offsets: 8-, 4-, 2- and 1-byte chunks
    for shift in (1, 2, 4):
        _check_backends(
            device,
            lambda shift=shift: torch.empty(t, h, dn + dr + 8, dtype=dtype, device=device)[
                ..., shift : shift + dn + dr
            ],
            kv[..., shift : shift + dn],
            latent[:, shift : shift + dr].unsqueeze(1),
        )


@pytest.mark.gpu
def test_cuda_many_tokens_and_empty():
    t, h = 4099, 96
    k_nope = randn(t, h, 128, dtype=torch.bfloat16, device="cuda", seed=6)
    k_rope = randn(t, 1, 64, dtype=torch.bfloat16, device="cuda", seed=7)
    k = poison(torch.empty(t, h, 192, dtype=torch.bfloat16, device="cuda"))
    concat_mla_k(k, k_nope, k_rope)
    expected = torch.cat((k_nope, k_rope.expand(t, h, 64)), dim=-1)
    assert torch.equal(k, expected)
    concat_mla_k(
        torch.empty(0, 4, 12, device="cuda"),
        torch.empty(0, 4, 8, device="cuda"),
        torch.empty(0, 1, 4, device="cuda"),
    )


def test_compiled_kernel_rejects_bad_input_itself():
    """A direct call of the raw function, past the Python checks, fails cleanly in C++ (the
    arguments are checked before the device, so CPU tensors exercise every check)."""
    from kernels_attention.ops.concat_mla_k import CONCAT_MLA_K_CUDA
    from kernels_jit import load_module
    from shared.testing.builds import cuda_arch

    with cuda_arch():  # builds for sm_90a where no GPU says which arch
        raw = load_module(CONCAT_MLA_K_CUDA).concat_mla_k
    nope, rope = torch.ones(2, 4, 8), torch.ones(2, 1, 4)
    with pytest.raises(ValueError, match=r"must be Dn \+ Dr"):
        raw(torch.empty(2, 4, 13), nope, rope)
    with pytest.raises(TypeError, match="same dtype"):
        raw(torch.empty(2, 4, 12), nope.half(), rope)
    with pytest.raises(ValueError, match="k and k_nope must not overlap"):
        buf = torch.empty(2, 4, 12)
        raw(buf, buf[..., :8], rope)
    with pytest.raises(ValueError, match="k is on the wrong device type"):
        raw(torch.empty(2, 4, 12), nope, rope)


@pytest.mark.gpu
def test_cuda_graph_capture():
    t, h = 9, 128
    k_nope = randn(t, h, 128, dtype=torch.bfloat16, device="cuda", seed=8)
    k_rope = randn(t, 1, 64, dtype=torch.bfloat16, device="cuda", seed=9)
    k = torch.empty(t, h, 192, dtype=torch.bfloat16, device="cuda")
    concat_mla_k(k, k_nope, k_rope)  # builds and loads before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        concat_mla_k(k, k_nope, k_rope)
    poison(k)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(k, torch.cat((k_nope, k_rope.expand(t, h, 64)), dim=-1))


@pytest.mark.gpu
def test_torch_compile_fullgraph_cuda():
    def assemble(nope, rope):
        k = torch.empty(nope.shape[0], nope.shape[1], nope.shape[2] + rope.shape[2],
                        dtype=nope.dtype, device=nope.device)  # fmt: skip
        concat_mla_k(k, nope, rope)
        return k

    nope = randn(3, 12, 128, dtype=torch.bfloat16, device="cuda", seed=1)
    rope = randn(3, 1, 64, dtype=torch.bfloat16, device="cuda", seed=2)
    out = torch.compile(assemble, fullgraph=True)(nope, rope)
    assert torch.equal(out.cpu(), _expected(nope.cpu(), rope.cpu()))


@pytest.mark.gpu
def test_opcheck_cuda():
    from kernels_attention.ops.concat_mla_k import CONCAT_MLA_K

    k = torch.empty(3, 12, 192, dtype=torch.bfloat16, device="cuda")
    nope = randn(3, 12, 256, dtype=torch.bfloat16, device="cuda")[..., :128]
    rope = randn(3, 1, 64, dtype=torch.bfloat16, device="cuda", seed=1)
    torch.library.opcheck(CONCAT_MLA_K.torch_op, (k, nope, rope, None))
