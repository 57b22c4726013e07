"""embeddings.scatter_embeddings: place multimodal embeddings at the placeholder token positions.

Backends: the pure-torch reference only (exact row copies).
"""

from __future__ import annotations

import torch

from kernels_embeddings import reference
from kernels_jit.dispatch import Op
from kernels_jit.validation import check_same_device, check_tensor

OP_ID = "embeddings.scatter_embeddings"


def _scatter_embeddings_torch(
    embeds: torch.Tensor,
    mm_embeds: torch.Tensor,
    positions: torch.Tensor | None,
    mask: torch.Tensor | None,
) -> None:
    reference.scatter_embeddings(embeds, mm_embeds, positions=positions, mask=mask)


SCATTER_EMBEDDINGS = Op(_scatter_embeddings_torch, mutates=("embeds",), device="embeds")
EMBED_DTYPES = SCATTER_EMBEDDINGS.dtypes


def scatter_embeddings(
    embeds: torch.Tensor,
    mm_embeds: torch.Tensor,
    *,
    positions: torch.Tensor | None = None,
    mask: torch.Tensor | None = None,
    backend: str | None = None,
) -> None:
    """Write image/audio embeddings into the text embeddings, in place.

    With ``positions``: ``embeds[positions[i]] = mm_embeds[i]``. With ``mask``: the i-th True
    position (in token order) receives ``mm_embeds[i]``; the count of True positions must equal M
    (the reference raises; GPU kernels leave extra positions unchanged and ignore extra rows).
    Values are cast to the dtype of embeds.

    Parameters
    ----------
    embeds : [T, H] float32, float16 or bfloat16, modified in place.
    mm_embeds : [M, H] float32, float16 or bfloat16.
    positions : int64 (or int32) [M], unique positions in [0, T). Exactly one of positions/mask.
    mask : bool [T], the placeholder tokens.
    """
    check_tensor(OP_ID, "embeds", embeds, dtypes=EMBED_DTYPES, ndim=2)
    check_tensor(OP_ID, "mm_embeds", mm_embeds, dtypes=EMBED_DTYPES, ndim=2)
    check_same_device(OP_ID, embeds=embeds, mm_embeds=mm_embeds)
    if mm_embeds.shape[1] != embeds.shape[1]:
        raise ValueError(
            f"{OP_ID}: mm_embeds must have H = {embeds.shape[1]} columns like embeds, "
            f"got shape {tuple(mm_embeds.shape)}"
        )
    if (positions is None) == (mask is None):
        raise ValueError(f"{OP_ID}: pass exactly one of positions= and mask=")
    rows = mm_embeds.shape[0]
    if positions is not None:
        check_tensor(
            OP_ID,
            "positions",
            positions,
            dtypes=(torch.int64, torch.int32),
            ndim=1,
            device=embeds.device,
        )
        if positions.shape[0] != rows:
            raise ValueError(
                f"{OP_ID}: positions must have M = {rows} entries (one per mm_embeds row), "
                f"got {positions.shape[0]}"
            )
    else:
        check_tensor(OP_ID, "mask", mask, dtypes=(torch.bool,), ndim=1, device=embeds.device)
        if mask.shape[0] != embeds.shape[0]:
            raise ValueError(
                f"{OP_ID}: mask must have T = {embeds.shape[0]} entries like embeds, "
                f"got {mask.shape[0]}"
            )
    if rows and embeds.numel():
        SCATTER_EMBEDDINGS.run(embeds, mm_embeds, positions, mask, backend=backend)


def _scatter_embeddings_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: positions and mask forms, a dtype cast."""
    g = torch.Generator().manual_seed(0)
    embeds = torch.randn(20, 48, generator=g).to(torch.bfloat16)
    mm = torch.randn(5, 48, generator=g)
    positions = torch.tensor([3, 4, 5, 11, 19])
    mask = torch.zeros(20, dtype=torch.bool)
    mask[positions] = True
    return [
        ((embeds.to(device), mm.to(device)), {"positions": positions.to(device)}),
        ((embeds.to(device), mm.to(device)), {"mask": mask.to(device)}),
    ]
