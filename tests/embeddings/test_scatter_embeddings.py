"""embeddings.scatter_embeddings against explicit loops: positions and mask forms, dtype casts,
untouched rows, empty work, bad input, opcheck."""

from __future__ import annotations

import pytest
import torch

from kernels_embeddings import scatter_embeddings


def _inputs(tokens: int, rows: int, hidden: int, seed: int, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(seed)
    embeds = torch.randn(tokens, hidden, generator=g).to(dtype)
    mm = torch.randn(rows, hidden, generator=g)
    positions = torch.randperm(tokens, generator=g)[:rows]
    return embeds, mm, positions


@pytest.mark.parametrize(("tokens", "rows", "hidden"), [(1, 1, 1), (10, 3, 7), (300, 129, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_positions_and_mask_match_loops(tokens, rows, hidden, dtype):
    embeds, mm, positions = _inputs(tokens, rows, hidden, seed=tokens + rows, dtype=dtype)
    expected = embeds.clone()
    for i, p in enumerate(positions.tolist()):
        expected[p] = mm[i].to(dtype)
    by_position = embeds.clone()
    scatter_embeddings(by_position, mm, positions=positions)
    assert torch.equal(by_position, expected)

    mask = torch.zeros(tokens, dtype=torch.bool)
    mask[positions] = True
    expected = embeds.clone()
    for i, p in enumerate(sorted(positions.tolist())):  # i-th True position in token order
        expected[p] = mm[i].to(dtype)
    by_mask = embeds.clone()
    scatter_embeddings(by_mask, mm, mask=mask)
    assert torch.equal(by_mask, expected)


def test_empty_work_leaves_embeds_untouched():
    embeds, mm, positions = _inputs(5, 0, 4, seed=1)
    before = embeds.clone()
    scatter_embeddings(embeds, mm, positions=positions)
    scatter_embeddings(embeds, mm, mask=torch.zeros(5, dtype=torch.bool))
    assert torch.equal(embeds, before)


def test_bad_input():
    embeds, mm, positions = _inputs(8, 3, 4, seed=2)
    mask = torch.zeros(8, dtype=torch.bool)
    with pytest.raises(
        ValueError, match=r"scatter_embeddings: pass exactly one of positions= and mask="
    ):
        scatter_embeddings(embeds, mm)
    with pytest.raises(ValueError, match=r"pass exactly one of positions= and mask="):
        scatter_embeddings(embeds, mm, positions=positions, mask=mask)
    with pytest.raises(ValueError, match=r"mask selects 2 positions but mm_embeds has 3 rows"):
        scatter_embeddings(embeds, mm, mask=torch.tensor([True, True] + [False] * 6))
    with pytest.raises(ValueError, match=r"positions must be unique"):
        scatter_embeddings(embeds, mm, positions=torch.tensor([1, 1, 2]))
    with pytest.raises(ValueError, match=r"positions must lie in \[0, 8\), got values in \[1, 8\]"):
        scatter_embeddings(embeds, mm, positions=torch.tensor([1, 8, 2]))
    with pytest.raises(ValueError, match=r"mm_embeds must have H = 4 columns like embeds"):
        scatter_embeddings(embeds, mm[:, :3], positions=positions)
    with pytest.raises(ValueError, match=r"mask must have T = 8 entries like embeds, got 7"):
        scatter_embeddings(embeds, mm, mask=mask[:7])


def test_opcheck():
    from kernels_embeddings.ops.scatter_embeddings import SCATTER_EMBEDDINGS

    embeds, mm, positions = _inputs(9, 4, 6, seed=3)
    torch.library.opcheck(SCATTER_EMBEDDINGS.torch_op, (embeds, mm, positions, None, None))


# ------------------------------------------------------------------------------------------------
# The CUDA backend on the GPU against the torch reference (or, where the reference raises, the
# documented GPU behaviour), compared byte for byte: NaN rows in embeds show untouched rows.

GPU = pytest.mark.gpu
DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _gpu_inputs(tokens, rows, hidden, seed, dtype, mm_dtype, clustered=False):
    g = torch.Generator().manual_seed(seed)
    embeds = torch.randn(tokens, hidden, generator=g).to(dtype)
    embeds[::3] = float("nan")
    mm = torch.randn(rows, hidden, generator=g).to(mm_dtype)
    if clustered:  # image tokens as one span, as a VLM prompt has them
        start = int(torch.randint(0, tokens - rows + 1, (1,), generator=g))
        positions = torch.arange(start, start + rows)[torch.randperm(rows, generator=g)]
    else:
        positions = torch.randperm(tokens, generator=g)[:rows]
    return embeds.cuda(), mm.cuda(), positions.cuda()


def _same(a, b):
    return torch.equal(a.contiguous().view(torch.uint8), b.contiguous().view(torch.uint8))


@GPU
@pytest.mark.parametrize(
    ("tokens", "rows", "hidden"),
    [(1, 1, 1), (10, 3, 7), (300, 129, 64), (5000, 1700, 24), (20000, 9000, 8), (4100, 4100, 16),
     (64, 16, 4096)],
)  # fmt: skip
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("mm_dtype", DTYPES, ids=str)
@pytest.mark.parametrize("clustered", (False, True), ids=("random", "span"))
def test_cuda_matches_reference(tokens, rows, hidden, dtype, mm_dtype, clustered):
    embeds, mm, positions = _gpu_inputs(
        tokens, rows, hidden, tokens + rows, dtype, mm_dtype, clustered
    )
    mask = torch.zeros(tokens, dtype=torch.bool, device="cuda")
    mask[positions] = True
    for index_dtype in (torch.int32, torch.int64):
        pos = positions.to(index_dtype)
        expected, got = embeds.clone(), embeds.clone()
        scatter_embeddings(expected, mm, positions=pos, backend="torch")
        scatter_embeddings(got, mm, positions=pos, backend="cuda")
        assert _same(got, expected)
    expected, got = embeds.clone(), embeds.clone()
    scatter_embeddings(expected, mm, mask=mask, backend="torch")
    scatter_embeddings(got, mm, mask=mask, backend="cuda")
    assert _same(got, expected)


@GPU
def test_cuda_mask_count_mismatch_and_bad_positions():
    embeds, mm, positions = _gpu_inputs(5000, 700, 32, 1, torch.bfloat16, torch.bfloat16)
    mask = torch.zeros(5000, dtype=torch.bool, device="cuda")
    mask[positions] = True
    order = mask.nonzero().reshape(-1)
    # More True flags than rows: the first M in token order receive the rows, the rest unchanged.
    got = embeds.clone()
    scatter_embeddings(got, mm[:500], mask=mask, backend="cuda")
    expected = embeds.clone()
    expected[order[:500]] = mm[:500]
    assert _same(got, expected)
    # Fewer True flags than rows: the extra rows are ignored.
    got = embeds.clone()
    extra = torch.cat((mm, mm[:50]))
    scatter_embeddings(got, extra, mask=mask, backend="cuda")
    expected = embeds.clone()
    expected[order] = mm
    assert _same(got, expected)
    # Positions outside [0, T) are skipped on the GPU (the reference raises).
    bad = positions.clone()
    bad[0], bad[1] = -1, 5000
    got = embeds.clone()
    scatter_embeddings(got, mm, positions=bad, backend="cuda")
    expected = embeds.clone()
    expected[positions[2:]] = mm[2:]
    assert _same(got, expected)


@GPU
def test_cuda_strided_and_misaligned_rows():
    embeds, mm, positions = _gpu_inputs(400, 150, 130, 2, torch.bfloat16, torch.float32)
    mask = torch.zeros(400, dtype=torch.bool, device="cuda")
    mask[positions] = True
    for cols, m_view in (
        (slice(0, 128), mm[:, :128]),  # row strides
        (slice(1, 129), mm[:, 2:130]),  # misaligned: the scalar path
        (slice(0, 127), mm[:, :127]),  # odd width
    ):
        for kw in ({"positions": positions}, {"mask": mask}):
            expected, got = embeds.clone(), embeds.clone()
            scatter_embeddings(expected[:, cols], m_view, backend="torch", **kw)
            scatter_embeddings(got[:, cols], m_view, backend="cuda", **kw)
            assert _same(got, expected)


@GPU
def test_cuda_graph_capture_and_compile():
    embeds, mm, positions = _gpu_inputs(2048, 576, 1024, 3, torch.bfloat16, torch.bfloat16)
    mask = torch.zeros(2048, dtype=torch.bool, device="cuda")
    mask[positions] = True
    target = embeds.clone()
    scatter_embeddings(target, mm, mask=mask)  # build and load outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        scatter_embeddings(target, mm, mask=mask)
    mm.copy_(torch.randn_like(mm))
    target.copy_(embeds)
    graph.replay()
    torch.cuda.synchronize()
    expected = embeds.clone()
    expected[mask] = mm
    assert _same(target, expected)

    def place(e, m, p):
        scatter_embeddings(e, m * 2, positions=p)

    got = embeds.clone()
    torch.compile(place, fullgraph=True)(got, mm, positions)
    expected = embeds.clone()
    expected[positions] = mm * 2
    assert _same(got, expected)


@GPU
def test_cuda_opcheck():
    from kernels_embeddings.ops.scatter_embeddings import SCATTER_EMBEDDINGS

    embeds, mm, positions = _gpu_inputs(9, 4, 6, 3, torch.bfloat16, torch.float32)
    torch.library.opcheck(SCATTER_EMBEDDINGS.torch_op, (embeds, mm, positions, None, None))
    mask = torch.zeros(9, dtype=torch.bool, device="cuda")
    mask[positions] = True
    torch.library.opcheck(SCATTER_EMBEDDINGS.torch_op, (embeds, mm, None, mask, None))
