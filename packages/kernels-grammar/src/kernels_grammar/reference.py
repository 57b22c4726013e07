"""Pure-torch reference of the grammar ops: the correctness oracle and the fallback."""

from __future__ import annotations

import torch


def unpack_bitmask(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """bool [..., vocab_size]: token t is allowed iff bit t%32 (from the LSB) of word t//32 is 1.

    The int32 words are read as uint32: an arithmetic shift copies the sign bit down, but ``& 1``
    keeps only bit t%32, so bit 31 is a normal bit.
    """
    shifts = torch.arange(32, dtype=torch.int32, device=bitmask.device)
    bits = (bitmask.unsqueeze(-1) >> shifts) & 1
    return bits.flatten(-2)[..., :vocab_size].bool()


def apply_token_bitmask_inplace(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    *,
    indices: torch.Tensor | None = None,
    vocab_size: int | None = None,
) -> None:
    """``logits[r, t] = -inf`` where bit t of ``bitmask[r]`` is 0, for t < vocab_size and every row
    r (or only the rows in ``indices``); everything else is left untouched."""
    rows2d = logits if logits.dim() == 2 else logits.unsqueeze(0)
    mask2d = bitmask if bitmask.dim() == 2 else bitmask.unsqueeze(0)
    if vocab_size is None:
        vocab_size = min(rows2d.shape[1], 32 * mask2d.shape[1])
    if indices is None:
        rows = torch.arange(rows2d.shape[0], device=logits.device)
    else:
        rows = indices.to(device=logits.device, dtype=torch.long)
        limit = min(rows2d.shape[0], mask2d.shape[0])
        if rows.numel() and (int(rows.min()) < 0 or int(rows.max()) >= limit):
            raise ValueError(
                f"grammar.apply_token_bitmask_inplace: indices must lie in [0, {limit}) (rows of "
                f"logits and bitmask), got values in [{int(rows.min())}, {int(rows.max())}]"
            )
    if rows.numel() == 0 or vocab_size == 0:
        return
    allowed = unpack_bitmask(mask2d[rows], vocab_size)
    current = rows2d[rows, :vocab_size]
    rows2d[rows, :vocab_size] = current.masked_fill(~allowed, float("-inf"))
