"""embeddings.vocab_parallel_embedding against an explicit per-id loop: every shard of a split
vocabulary (the sum over shards must equal the full embedding), added-token ranges with padding,
negative padding ids, id dtypes and shapes, empty input, bad input, opcheck and torch.compile."""

from __future__ import annotations

import warnings

import pytest
import torch

from kernels_embeddings import reference, vocab_parallel_embedding
from shared.testing.compare import assert_close


def oracle(ids, weight, org_start, org_end, padding=0, added_start=0, added_end=0):
    flat = ids.reshape(-1).tolist()
    out = torch.zeros(len(flat), weight.shape[1], dtype=weight.dtype)
    for i, t in enumerate(flat):
        if org_start <= t < org_end:
            out[i] = weight[t - org_start]
        elif added_start <= t < added_end:
            out[i] = weight[t - added_start + (org_end - org_start) + padding]
    return out.reshape(*ids.shape, weight.shape[1])


@pytest.mark.parametrize("tp", [1, 2, 3])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_shards_sum_to_full_embedding(tp, dtype):
    vocab, hidden = 101, 24
    g = torch.Generator().manual_seed(tp)
    full = torch.randn(vocab, hidden, generator=g).to(dtype)
    ids = torch.randint(0, vocab, (7, 5), generator=g)
    per_shard = -(-vocab // tp)
    total = torch.zeros(7, 5, hidden, dtype=torch.float64)
    for rank in range(tp):
        start, end = rank * per_shard, min((rank + 1) * per_shard, vocab)
        shard = torch.zeros(per_shard, hidden, dtype=dtype)
        shard[: end - start] = full[start:end]
        got = vocab_parallel_embedding(ids, shard, start, end)
        assert got.dtype == dtype
        assert torch.equal(got, oracle(ids, shard, start, end))
        total += got.double()
    assert torch.equal(total.to(dtype), full[ids])


@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64], ids=str)
def test_added_vocab_and_padding(id_dtype):
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 16, generator=g)
    ids = torch.tensor([-1, 0, 24, 25, 49, 50, 127, 128, 137, 138, 500], dtype=id_dtype)
    got = vocab_parallel_embedding(ids, weight, 25, 50, 3, 128, 138)
    assert torch.equal(got, oracle(ids, weight, 25, 50, 3, 128, 138))
    assert torch.equal(got[8], weight[137 - 128 + 25 + 3])
    assert not got[[0, 1, 2, 5, 6, 9, 10]].any()


def test_any_id_shape_and_empty():
    weight = torch.randn(10, 8)
    ids = torch.randint(0, 20, (2, 3, 4))
    assert_close(vocab_parallel_embedding(ids, weight, 5, 15), oracle(ids, weight, 5, 15))
    assert vocab_parallel_embedding(torch.empty(0, 3).long(), weight, 0, 10).shape == (0, 3, 8)
    scalar = vocab_parallel_embedding(torch.tensor(7), weight, 5, 15)
    assert torch.equal(scalar, weight[2])


def test_bad_input():
    weight = torch.randn(10, 8)
    ids = torch.tensor([1, 2])
    with pytest.raises(ValueError, match=r"the ranges address 12 rows .* but weight has 10"):
        vocab_parallel_embedding(ids, weight, 0, 10, 2)
    with pytest.raises(ValueError, match=r"org_vocab_end must be >= 5, got 4"):
        vocab_parallel_embedding(ids, weight, 5, 4)
    with pytest.raises(
        TypeError, match=r"vocab_parallel_embedding: ids must have dtype in \(int32, int64\)"
    ):
        vocab_parallel_embedding(ids.float(), weight, 0, 10)
    with pytest.raises(TypeError, match=r"org_vocab_start must be an int, got float"):
        vocab_parallel_embedding(ids, weight, 0.0, 10)


def test_opcheck_and_compile():
    from kernels_embeddings.ops.vocab_parallel_embedding import VOCAB_PARALLEL_EMBEDDING

    weight = torch.randn(12, 8)
    ids = torch.tensor([[0, 3, 11, 20], [-1, 5, 6, 7]])
    out = torch.empty(2, 4, 8)
    torch.library.opcheck(
        VOCAB_PARALLEL_EMBEDDING.torch_op, (out, ids, weight, 2, 10, 1, 20, 23, None)
    )
    compiled = torch.compile(vocab_parallel_embedding, fullgraph=True)
    assert torch.equal(
        compiled(ids, weight, 2, 10), reference.vocab_parallel_embedding(ids, weight, 2, 10)
    )


# ------------------------------------------------------------------------------------------------
# The CUDA backend against the torch reference on the GPU, the output poisoned first.

GPU = pytest.mark.gpu


def _run_cuda(ids, weight, *ranges):
    from kernels_embeddings.ops.vocab_parallel_embedding import VOCAB_PARALLEL_EMBEDDING

    full = (*ranges, 0, 0, 0, 0)[:5]
    out = torch.full(
        (*ids.shape, weight.shape[1]), float("nan"), dtype=weight.dtype, device=weight.device
    )
    VOCAB_PARALLEL_EMBEDDING.run(out, ids, weight, *full, backend="cuda")
    return out


@GPU
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("id_dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize(("tokens", "hidden"), [(1, 8), (7, 1), (16, 7168), (333, 24), (2049, 64),
                                                (5, 1031), (64, 4096)])  # fmt: skip
def test_cuda_matches_reference(dtype, id_dtype, tokens, hidden):
    g = torch.Generator().manual_seed(tokens + hidden)
    weight = torch.randn(40, hidden, generator=g).to(dtype).cuda()
    ids = torch.randint(-3, 150, (tokens,), generator=g).to(id_dtype).cuda()
    for ranges in ((25, 50), (25, 50, 3, 128, 138), (0, 40), (10, 10, 0, 140, 150)):
        got = _run_cuda(ids, weight, *ranges)
        expected = reference.vocab_parallel_embedding(ids, weight, *ranges)
        assert torch.equal(got, expected), ranges


@GPU
def test_cuda_views_shapes_and_scalar_path():
    g = torch.Generator().manual_seed(5)
    wide = torch.randn(40, 130, generator=g).bfloat16().cuda()
    ids = torch.randint(-1, 60, (6, 9), generator=g).cuda()
    for weight in (wide[:, :128], wide[:, 1:129], wide[:, :127]):  # row stride, misaligned, odd H
        expected = reference.vocab_parallel_embedding(ids, weight, 10, 45, 2, 50, 53)
        assert torch.equal(_run_cuda(ids, weight, 10, 45, 2, 50, 53), expected)
        strided = ids.reshape(-1)[::3]  # 1-D strided ids
        expected = reference.vocab_parallel_embedding(strided, weight, 10, 45)
        assert torch.equal(_run_cuda(strided, weight, 10, 45), expected)
    with warnings.catch_warnings():  # 2-D strided ids: the torch fallback (it warns once)
        warnings.simplefilter("ignore")
        got = vocab_parallel_embedding(ids.t(), wide[:, :128], 10, 45)
    assert torch.equal(got, reference.vocab_parallel_embedding(ids.t(), wide[:, :128], 10, 45))


@GPU
def test_cuda_graph_capture_and_compile():
    weight = torch.randn(16032, 512, device="cuda").bfloat16()
    ids = torch.randint(0, 128256, (16,), device="cuda")
    vocab_parallel_embedding(ids, weight, 16032, 32064)
    out = torch.empty(16, 512, dtype=torch.bfloat16, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out.copy_(vocab_parallel_embedding(ids, weight, 16032, 32064))
    ids.copy_(torch.randint(16000, 32100, (16,), device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, reference.vocab_parallel_embedding(ids, weight, 16032, 32064))
    compiled = torch.compile(vocab_parallel_embedding, fullgraph=True)
    expected = reference.vocab_parallel_embedding(ids, weight, 16032, 32064)
    assert torch.equal(compiled(ids, weight, 16032, 32064), expected)


@GPU
def test_cuda_opcheck():
    from kernels_embeddings.ops.vocab_parallel_embedding import VOCAB_PARALLEL_EMBEDDING

    weight = torch.randn(12, 8, device="cuda")
    ids = torch.tensor([[0, 3, 11, 20], [-1, 5, 6, 7]], device="cuda")
    out = torch.empty(2, 4, 8, device="cuda")
    torch.library.opcheck(
        VOCAB_PARALLEL_EMBEDDING.torch_op, (out, ids, weight, 2, 10, 1, 20, 23, None)
    )
