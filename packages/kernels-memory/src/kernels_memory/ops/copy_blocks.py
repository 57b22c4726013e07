"""memory.copy_blocks: copy whole KV blocks src -> dst in every layer's key and value cache.

The only backend for now is the pure-torch reference (exact int64 index math).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernels_jit.dispatch import Op
from kernels_jit.validation import check_tensor
from kernels_memory import reference
from kernels_memory._checks import INDEX_DTYPES

OP_ID = "memory.copy_blocks"


def _copy_blocks_torch(
    key_caches: list[torch.Tensor], value_caches: list[torch.Tensor], block_mapping: torch.Tensor
) -> None:
    reference.copy_blocks(key_caches, value_caches, block_mapping)


COPY_BLOCKS = Op(_copy_blocks_torch, mutates=("key_caches", "value_caches"), device="block_mapping")


def copy_blocks(
    key_caches: Sequence[torch.Tensor],
    value_caches: Sequence[torch.Tensor],
    block_mapping: torch.Tensor,
    *,
    backend: str | None = None,
) -> None:
    """For each row (src, dst) of block_mapping and each layer: ``cache[dst] = cache[src]`` (the
    whole block, every trailing dim), in place. All sources are read before any write.

    Parameters
    ----------
    key_caches, value_caches : L tensors each, [NB, ...] (any trailing shape and dtype), all with
        the same NB, modified in place.
    block_mapping : [N, 2] int64 (or int32); destinations unique and disjoint from the sources.
    """
    check_tensor(OP_ID, "block_mapping", block_mapping, dtypes=INDEX_DTYPES, ndim=2)
    if block_mapping.shape[1] != 2:
        raise ValueError(
            f"{OP_ID}: block_mapping must have shape [N, 2] (src, dst), "
            f"got {tuple(block_mapping.shape)}"
        )
    keys, values = list(key_caches), list(value_caches)
    if len(keys) != len(values):
        raise ValueError(
            f"{OP_ID}: key_caches and value_caches must list the same layers, got {len(keys)} "
            f"and {len(values)}"
        )
    blocks = None
    for name, caches in (("key_caches", keys), ("value_caches", values)):
        for i, cache in enumerate(caches):
            check_tensor(OP_ID, f"{name}[{i}]", cache, device=block_mapping.device)
            if cache.dim() < 1 or (blocks is not None and cache.shape[0] != blocks):
                raise ValueError(
                    f"{OP_ID}: every cache must be [NB, ...] with one NB = {blocks}, "
                    f"got {name}[{i}] of shape {tuple(cache.shape)}"
                )
            blocks = cache.shape[0]
    if keys and block_mapping.shape[0]:
        COPY_BLOCKS.run(keys, values, block_mapping, backend=backend)


def _copy_blocks_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: two layers, bf16 paged caches."""
    g = torch.Generator().manual_seed(0)
    keys = [torch.randn(10, 4, 2, 8, generator=g).to(torch.bfloat16) for _ in range(2)]
    values = [torch.randn(10, 4, 2, 8, generator=g).to(torch.bfloat16) for _ in range(2)]
    mapping = torch.tensor([[0, 5], [3, 9], [0, 7]], dtype=torch.int64)
    return [
        (
            ([k.to(device) for k in keys], [v.to(device) for v in values], mapping.to(device)),
            {},
        )
    ]
