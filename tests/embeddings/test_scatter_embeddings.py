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
