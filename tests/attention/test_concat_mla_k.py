"""attention.concat_mla_k against a loop over heads: DeepSeek's H = 128 with 128 + 64, H = 12 and
96, strided views, fp8, empty input, bad arguments, opcheck and torch.compile."""

from __future__ import annotations

import pytest
import torch

from kernels_attention import concat_mla_k
from shared.testing.inputs import randn


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
