"""Pure-torch references of the embedding ops: the correctness oracle and the fallback.

Both ops only move rows, so the references are exact (no arithmetic on values).
"""

from __future__ import annotations

import torch


def vocab_parallel_embedding(
    ids: torch.Tensor,
    weight: torch.Tensor,
    org_vocab_start: int,
    org_vocab_end: int,
    num_org_vocab_padding: int = 0,
    added_vocab_start: int = 0,
    added_vocab_end: int = 0,
) -> torch.Tensor:
    """Rows of this tensor-parallel shard: id in [org_start, org_end) -> row ``id - org_start``;
    id in [added_start, added_end) -> row ``id - added_start + (org_end - org_start) + padding``;
    any other id -> zeros. [*ids.shape, H] in the dtype of weight."""
    index = ids.long()
    in_org = (index >= org_vocab_start) & (index < org_vocab_end)
    in_added = (index >= added_vocab_start) & (index < added_vocab_end)
    added_row = (
        index - added_vocab_start + (org_vocab_end - org_vocab_start) + num_org_vocab_padding
    )
    row = torch.where(in_org, index - org_vocab_start, torch.where(in_added, added_row, 0))
    rows = weight[row.reshape(-1)].reshape(*ids.shape, weight.shape[1])
    return torch.where((in_org | in_added)[..., None], rows, torch.zeros_like(rows))


def scatter_embeddings(
    embeds: torch.Tensor,
    mm_embeds: torch.Tensor,
    *,
    positions: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
) -> None:
    """In place: ``embeds[positions[i]] = mm_embeds[i]``, or the i-th True position of ``mask``
    receives ``mm_embeds[i]``; values are cast to the dtype of embeds."""
    tokens = embeds.shape[0]
    rows = mm_embeds.to(embeds.dtype)
    if positions is not None:
        index = positions.long()
        if index.numel() and (int(index.min()) < 0 or int(index.max()) >= tokens):
            raise ValueError(
                f"embeddings.scatter_embeddings: positions must lie in [0, {tokens}), got values "
                f"in [{int(index.min())}, {int(index.max())}]"
            )
        if torch.unique(index).numel() != index.numel():
            raise ValueError("embeddings.scatter_embeddings: positions must be unique")
        embeds[index] = rows
        return
    if mask is None:
        raise ValueError("embeddings.scatter_embeddings: pass exactly one of positions= and mask=")
    count = int(mask.sum())
    if count != mm_embeds.shape[0]:
        raise ValueError(
            f"embeddings.scatter_embeddings: mask selects {count} positions but mm_embeds has "
            f"{mm_embeds.shape[0]} rows"
        )
    embeds[mask] = rows
