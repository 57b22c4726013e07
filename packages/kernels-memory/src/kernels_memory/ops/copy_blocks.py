"""memory.copy_blocks: copy whole KV blocks src -> dst in every layer's key and value cache.

CUDA: one launch for every layer: the caches travel as a pointer table in the kernel parameters
(built from tensor metadata on the host: no device allocation, no sync, capturable), one block per
(pair, cache) copying with 16-byte accesses (csrc/copy_blocks.cuh).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_tensor
from kernels_memory import reference
from kernels_memory._checks import INDEX_DTYPES, check_block_mapping_values, check_flag

OP_ID = "memory.copy_blocks"

COPY_BLOCKS_CUDA = ModuleSpec(
    name="copy_blocks",
    package="kernels_memory",
    sources=("csrc/copy_blocks.cuh", "csrc/memory_common.cuh"),
    exports=(("copy_blocks", "copy_blocks"),),
    description="CUDA: a pointer table in the parameters, a block per (pair, cache), 16 B copies",
)
_copy_blocks_compiled = CompiledFunction(COPY_BLOCKS_CUDA, "copy_blocks")


def _copy_blocks_torch(
    key_caches: list[torch.Tensor], value_caches: list[torch.Tensor], block_mapping: torch.Tensor
) -> None:
    reference.copy_blocks(key_caches, value_caches, block_mapping)


def _block_bytes(cache: torch.Tensor) -> int:
    return cache[0].numel() * cache.element_size() if cache.shape[0] else 0


def _copy_blocks_cuda(
    key_caches: list[torch.Tensor], value_caches: list[torch.Tensor], block_mapping: torch.Tensor
) -> None:
    caches = [*key_caches, *value_caches]
    table = torch.tensor(
        [(c.data_ptr(), c.stride(0) * c.element_size(), _block_bytes(c)) for c in caches],
        dtype=torch.int64,
    )
    _copy_blocks_compiled(table, block_mapping, caches[0].shape[0] if caches else 0)


def _copy_blocks_cuda_eligible(
    key_caches: list[torch.Tensor], value_caches: list[torch.Tensor], block_mapping: torch.Tensor
) -> str | None:
    """A block is one contiguous byte range: the trailing dims of every cache contiguous."""
    for cache in (*key_caches, *value_caches):
        if cache.shape[0] and not cache[0].is_contiguous():
            return "needs caches whose trailing dims (one block) are contiguous"
    return None


COPY_BLOCKS = Op(_copy_blocks_torch, mutates=("key_caches", "value_caches"), device="block_mapping")


def copy_blocks(
    key_caches: Sequence[torch.Tensor],
    value_caches: Sequence[torch.Tensor],
    block_mapping: torch.Tensor,
    *,
    validate: bool = False,
    backend: str | None = None,
) -> None:
    """For each row (src, dst) of block_mapping and each layer: ``cache[dst] = cache[src]`` (the
    whole block, every trailing dim), in place. All sources are read before any write.

    Parameters
    ----------
    key_caches, value_caches : L tensors each, [NB, ...] (any trailing shape and dtype), all with
        the same NB, modified in place.
    block_mapping : [N, 2] int64 (or int32); values in [0, NB), destinations unique and
        disjoint from the sources.
    validate : check those values before launching (ValueError). This reads block_mapping on the
        host: a device-to-host sync on CUDA, so not for CUDA graphs; skipped while torch.compile
        traces. The torch reference always checks them; the CUDA kernel (no host sync) skips a
        pair with an index outside [0, NB), and copies blocks in any order, so overlapping
        sources and destinations are a precondition.
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
    check_flag(OP_ID, "validate", validate)
    if validate and blocks is not None and not torch.compiler.is_compiling():
        check_block_mapping_values(OP_ID, block_mapping, blocks)
    if keys and block_mapping.shape[0]:
        COPY_BLOCKS.run(keys, values, block_mapping, backend=backend)


def _copy_blocks_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: two layers, bf16 paged caches."""
    g = torch.Generator().manual_seed(0)
    keys = [torch.randn(10, 4, 2, 8, generator=g).to(torch.bfloat16) for _ in range(2)]
    values = [torch.randn(10, 4, 2, 8, generator=g).to(torch.bfloat16) for _ in range(2)]
    mapping = torch.tensor([[0, 5], [3, 9], [0, 7]], dtype=torch.int64)
    caches = ([k.to(device) for k in keys], [v.to(device) for v in values])
    return [
        ((*caches, mapping.to(device)), {}),
        ((*caches, mapping.to(device, torch.int32)), {}),
    ]
