"""embeddings.scatter_embeddings: place multimodal embeddings at the placeholder token positions.

Backends: CUDA (csrc/scatter_embeddings.cuh: one launch, no host sync; with a mask each block
finds its rows' positions by a block-wide scan of the mask, then thread groups copy the rows in
16-byte packs, casting), then the pure-torch reference (exact row copies).
"""

from __future__ import annotations

import torch

from kernels_embeddings import reference
from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_same_device, check_tensor

OP_ID = "embeddings.scatter_embeddings"

SCATTER_EMBEDDINGS_CUDA = ModuleSpec(
    name="scatter_embeddings",
    package="kernels_embeddings",
    sources=("csrc/scatter_embeddings.cuh",),
    exports=(("scatter_embeddings", "scatter_embeddings"),),
    description="CUDA: row scatter by positions or by an in-kernel prefix sum of the mask",
)

_scatter_embeddings_cuda = CompiledFunction(SCATTER_EMBEDDINGS_CUDA, "scatter_embeddings")


def _scatter_embeddings_torch(
    embeds: torch.Tensor,
    mm_embeds: torch.Tensor,
    positions: torch.Tensor | None,
    mask: torch.Tensor | None,
) -> None:
    reference.scatter_embeddings(embeds, mm_embeds, positions=positions, mask=mask)


def _scatter_embeddings_cuda_eligible(
    embeds: torch.Tensor,
    mm_embeds: torch.Tensor,
    positions: torch.Tensor | None,
    mask: torch.Tensor | None,
) -> str | None:
    """The kernel reads rows of a contiguous last dim (any row stride)."""
    if embeds.stride(-1) != 1 and embeds.shape[-1] > 1:
        return "needs embeds with a contiguous last dim"
    if mm_embeds.stride(-1) != 1 and mm_embeds.shape[-1] > 1:
        return "needs mm_embeds with a contiguous last dim"
    return None


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
    Values are cast to the dtype of embeds. The CUDA backend never synchronises with the host (the
    mask's prefix sum runs on the device), so it is CUDA-graph safe; positions outside [0, T),
    which the reference rejects, are skipped there, and duplicate positions leave one of the rows.

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
    """Small random calls for ``kernels-ops check``: every dtype, positions and mask forms, dtype
    casts."""
    g = torch.Generator().manual_seed(0)
    embeds = torch.randn(20, 48, generator=g)
    mm = torch.randn(5, 48, generator=g)
    positions = torch.tensor([3, 4, 5, 11, 19])
    mask = torch.zeros(20, dtype=torch.bool)
    mask[positions] = True
    cases: list[tuple[tuple, dict]] = []
    for dtype in EMBED_DTYPES:
        e = embeds.to(dtype).to(device)
        cases.append(((e, mm.to(device)), {"positions": positions.to(device)}))
        cases.append(((e.clone(), mm.to(torch.bfloat16).to(device)), {"mask": mask.to(device)}))
    return cases
