"""grammar.apply_token_bitmask_inplace against an explicit per-token loop over the uint32 words:
V around multiples of 32, bit 31 set (negative int32 words), padded vocabularies, row indices with
duplicates, 1-D inputs, half dtypes, strided logits, empty work, bad input, opcheck, compile."""

from __future__ import annotations

import pytest
import torch

from kernels_grammar import apply_token_bitmask_inplace, reference
from shared.testing.compare import assert_close

NEG_INF = float("-inf")


def oracle(logits: torch.Tensor, bitmask: torch.Tensor, rows, vocab_size: int) -> torch.Tensor:
    out = logits.clone()
    words = bitmask.tolist()
    for r in rows:
        for t in range(vocab_size):
            word = words[r][t // 32] & 0xFFFFFFFF
            if not (word >> (t % 32)) & 1:
                out[r, t] = NEG_INF
    return out


def _inputs(batch: int, vocab: int, seed: int, dtype=torch.float32, words=None):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch, vocab, generator=g).to(dtype)
    words = (vocab + 31) // 32 if words is None else words
    bitmask = torch.randint(-(2**31), 2**31 - 1, (batch, words), generator=g, dtype=torch.int32)
    return logits, bitmask


@pytest.mark.parametrize(
    ("batch", "vocab"), [(1, 1), (2, 31), (3, 32), (3, 33), (4, 1000), (2, 4099)]
)
def test_matches_oracle(batch, vocab):
    logits, bitmask = _inputs(batch, vocab, seed=vocab)
    expected = oracle(logits, bitmask, range(batch), vocab)
    apply_token_bitmask_inplace(logits, bitmask)
    assert_close(logits, expected)


def test_bit_31_is_an_ordinary_bit():
    logits = torch.zeros(1, 64)
    bitmask = torch.tensor([[-(2**31), 0x7FFFFFFF]], dtype=torch.int32)  # only bit 31; all but 63
    apply_token_bitmask_inplace(logits, bitmask)
    allowed = (logits[0] == 0).nonzero().flatten().tolist()
    assert allowed == [31, *range(32, 63)]


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_half_dtypes(dtype):
    logits, bitmask = _inputs(3, 77, seed=1, dtype=dtype)
    expected = oracle(logits, bitmask, range(3), 77)
    apply_token_bitmask_inplace(logits, bitmask)
    assert logits.dtype == dtype
    assert_close(logits, expected)


def test_padded_vocab_columns_untouched():
    logits, bitmask = _inputs(2, 130, seed=2, words=3)  # 96 bits cover tokens < 96 only
    expected = oracle(logits, bitmask, range(2), 96)
    apply_token_bitmask_inplace(logits, bitmask)
    assert_close(logits, expected)
    logits, bitmask = _inputs(2, 130, seed=3)
    expected = oracle(logits, bitmask, range(2), 100)
    apply_token_bitmask_inplace(logits, bitmask, vocab_size=100)
    assert_close(logits, expected)


@pytest.mark.parametrize("as_list", [False, True])
def test_indices_mask_only_listed_rows(as_list):
    logits, bitmask = _inputs(6, 90, seed=4)
    rows = [5, 0, 5, 2]
    expected = oracle(logits, bitmask, sorted(set(rows)), 90)
    indices = rows if as_list else torch.tensor(rows, dtype=torch.int64)
    apply_token_bitmask_inplace(logits, bitmask, indices=indices)
    assert_close(logits, expected)


def test_one_dimensional_and_strided():
    logits, bitmask = _inputs(1, 45, seed=5)
    flat, words = logits[0].clone(), bitmask[0].clone()
    apply_token_bitmask_inplace(flat, words)
    assert_close(flat, oracle(logits, bitmask, [0], 45)[0])
    wide, bitmask = _inputs(3, 200, seed=6)
    view = wide[:, 10:110]
    expected = wide.clone()
    expected[:, 10:110] = oracle(view.contiguous(), bitmask[:, :4], range(3), 100)
    apply_token_bitmask_inplace(view, bitmask[:, :4].contiguous())
    assert_close(wide, expected)


def test_empty_work_leaves_logits_untouched():
    apply_token_bitmask_inplace(torch.empty(0, 64), torch.empty(0, 2, dtype=torch.int32))
    logits, bitmask = _inputs(2, 64, seed=7)
    before = logits.clone()
    apply_token_bitmask_inplace(logits, bitmask, indices=[])
    apply_token_bitmask_inplace(logits, bitmask, vocab_size=0)
    assert torch.equal(logits, before)


def test_bad_input():
    logits, bitmask = _inputs(2, 64, seed=8)
    with pytest.raises(
        TypeError,
        match=r"apply_token_bitmask_inplace: bitmask must have dtype in \(int32\), got int64",
    ):
        apply_token_bitmask_inplace(logits, bitmask.long())
    with pytest.raises(ValueError, match=r"bitmask must have 2 dims, got shape \(2,\)"):
        apply_token_bitmask_inplace(logits, bitmask[0])
    with pytest.raises(
        ValueError, match=r"bitmask must have B = 2 rows like logits \(or pass indices\)"
    ):
        apply_token_bitmask_inplace(logits, bitmask[:1])
    with pytest.raises(
        ValueError, match=r"vocab_size must lie in \[0, min\(V, 32\*W\)\] = \[0, 64\].* got 65"
    ):
        apply_token_bitmask_inplace(logits, bitmask, vocab_size=65)
    with pytest.raises(ValueError, match=r"indices must lie in \[0, 2\) .* got values in \[0, 2\]"):
        apply_token_bitmask_inplace(logits, bitmask, indices=[0, 2])
    with pytest.raises(
        TypeError, match=r"logits must have dtype in \(float32, float16, bfloat16\), got int32"
    ):
        apply_token_bitmask_inplace(bitmask, bitmask)


def test_opcheck():
    from kernels_grammar.ops.apply_token_bitmask_inplace import APPLY_TOKEN_BITMASK_INPLACE

    logits, bitmask = _inputs(4, 100, seed=9)
    op = APPLY_TOKEN_BITMASK_INPLACE.torch_op
    torch.library.opcheck(op, (logits, bitmask, None, 100, None))
    torch.library.opcheck(op, (logits, bitmask, torch.tensor([3, 1], dtype=torch.int32), 90, None))


def test_torch_compile_fullgraph():
    logits, bitmask = _inputs(3, 300, seed=10)
    expected = reference.unpack_bitmask(bitmask, 300)

    def masked_softmax(x, m):
        x = x.clone()
        apply_token_bitmask_inplace(x, m)
        return x.softmax(-1)

    probs = torch.compile(masked_softmax, fullgraph=True)(logits, bitmask)
    assert torch.equal(probs > 0, expected)


# --- every backend on each device against the reference -----------------------------------------

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]
BACKENDS = {"cpu": ("torch",), "cuda": ("cuda", "torch")}


def _device_inputs(batch, vocab, dtype, device, seed, density=None, words=None):
    logits, bitmask = _inputs(batch, vocab, seed=seed, dtype=dtype, words=words)
    if density is not None:  # words fully allowed with this probability, else random
        g = torch.Generator().manual_seed(seed + 1)
        full = torch.rand(bitmask.shape, generator=g) < density
        bitmask = torch.where(full, torch.full_like(bitmask, -1), bitmask)
    return logits.to(device), bitmask.to(device)


def _check_backends(device, logits, bitmask, **kwargs):
    expected = logits.clone()
    reference.apply_token_bitmask_inplace(expected, bitmask, **kwargs)
    for backend in BACKENDS[device]:
        got = logits.clone()
        apply_token_bitmask_inplace(got, bitmask, backend=backend, **kwargs)
        assert torch.equal(got.isneginf(), expected.isneginf()), backend
        assert_close(got, expected)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    ("batch", "vocab"), [(1, 1), (2, 31), (3, 33), (2, 1023), (3, 1025), (2, 4097), (2, 128256)]
)
@pytest.mark.parametrize("density", [None, 0.95, 1.0])
def test_backends_match_reference(device, dtype, batch, vocab, density):
    logits, bitmask = _device_inputs(batch, vocab, dtype, device, seed=vocab, density=density)
    _check_backends(device, logits, bitmask)
    if density is None:
        _check_backends(device, logits, torch.zeros_like(bitmask))  # everything masked


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_backends_layouts(device, dtype):
    from shared.testing.inputs import misaligned, row_strided

    logits, bitmask = _device_inputs(4, 1000, dtype, device, seed=11)
    _check_backends(device, row_strided(logits, extra=3), bitmask)  # scalar path (odd stride)
    _check_backends(device, row_strided(logits, extra=8), bitmask)
    _check_backends(device, misaligned(logits), bitmask)
    _check_backends(device, logits, bitmask, vocab_size=777)
    wide, words = _device_inputs(4, 1100, dtype, device, seed=12, words=40)  # padded vocab
    _check_backends(device, wide, words)
    _check_backends(device, logits[0].clone(), bitmask[0].clone())  # 1-D
    for dt in (torch.int32, torch.int64):
        rows = torch.tensor([3, 9, 0, 9, 3, 9, 2], device=device, dtype=dt)[::2]  # strided
        _check_backends(device, logits, bitmask, indices=rows)
        _check_backends(device, logits, bitmask[:3].clone(), indices=rows[[1, 3]])
    _check_backends(
        device, logits, bitmask, indices=torch.empty(0, device=device, dtype=torch.int32)
    )


@pytest.mark.gpu
def test_cuda_skips_out_of_range_device_indices():
    logits, bitmask = _device_inputs(3, 100, torch.float32, "cuda", seed=13)
    got = logits.clone()
    apply_token_bitmask_inplace(got, bitmask, indices=torch.tensor([5, -1, 1], device="cuda"))
    expected = logits.clone()
    reference.apply_token_bitmask_inplace(expected, bitmask, indices=torch.tensor([1]))
    assert_close(got, expected)


@pytest.mark.gpu
def test_cuda_graph_capture():
    logits, bitmask = _device_inputs(16, 128256, torch.float32, "cuda", seed=14)
    expected = logits.clone()
    reference.apply_token_bitmask_inplace(expected, bitmask)
    work = logits.clone()
    apply_token_bitmask_inplace(work, bitmask)  # builds and loads before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        apply_token_bitmask_inplace(work, bitmask)
    work.copy_(logits)
    graph.replay()
    torch.cuda.synchronize()
    assert_close(work, expected)


@pytest.mark.gpu
def test_cuda_torch_compile_fullgraph():
    logits, bitmask = _device_inputs(3, 300, torch.bfloat16, "cuda", seed=15)

    def masked(x, m):
        x = x.clone()
        apply_token_bitmask_inplace(x, m)
        return x

    expected = logits.clone()
    reference.apply_token_bitmask_inplace(expected, bitmask)
    assert_close(torch.compile(masked, fullgraph=True)(logits, bitmask), expected)
