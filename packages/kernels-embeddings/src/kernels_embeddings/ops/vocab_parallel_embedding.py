"""embeddings.vocab_parallel_embedding: the embedding rows one tensor-parallel shard owns.

Backends: CUDA (csrc/vocab_parallel_embedding.cuh: a thread group per token, 16-byte packs, zero
rows stored without reading weight), then the pure-torch reference (exact row copies).
"""

from __future__ import annotations

import torch

from kernels_embeddings import reference
from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_same_device, check_tensor

OP_ID = "embeddings.vocab_parallel_embedding"

VOCAB_PARALLEL_EMBEDDING_CUDA = ModuleSpec(
    name="vocab_parallel_embedding",
    package="kernels_embeddings",
    sources=("csrc/vocab_parallel_embedding.cuh",),
    exports=(("vocab_parallel_embedding", "vocab_parallel_embedding"),),
    description="CUDA: masked row gather, a thread group per token, 16-byte packs",
)

_vocab_parallel_embedding_cuda = CompiledFunction(
    VOCAB_PARALLEL_EMBEDDING_CUDA, "vocab_parallel_embedding"
)


def _vocab_parallel_embedding_torch(
    out: torch.Tensor,
    ids: torch.Tensor,
    weight: torch.Tensor,
    org_vocab_start: int,
    org_vocab_end: int,
    num_org_vocab_padding: int,
    added_vocab_start: int,
    added_vocab_end: int,
) -> None:
    out.copy_(
        reference.vocab_parallel_embedding(
            ids,
            weight,
            org_vocab_start,
            org_vocab_end,
            num_org_vocab_padding,
            added_vocab_start,
            added_vocab_end,
        )
    )


def _vocab_parallel_embedding_cuda_eligible(
    out: torch.Tensor,
    ids: torch.Tensor,
    weight: torch.Tensor,
    org_vocab_start: int,
    org_vocab_end: int,
    num_org_vocab_padding: int,
    added_vocab_start: int,
    added_vocab_end: int,
) -> str | None:
    """The kernel reads ids as one flat run (any stride when 1-D)."""
    return None if ids.dim() <= 1 or ids.is_contiguous() else "needs contiguous (or 1-D) ids"


VOCAB_PARALLEL_EMBEDDING = Op(_vocab_parallel_embedding_torch, mutates=("out",), device="weight")
WEIGHT_DTYPES = VOCAB_PARALLEL_EMBEDDING.dtypes


def _check_int(name: str, value: object, minimum: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{OP_ID}: {name} must be an int, got {type(value).__name__}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{OP_ID}: {name} must be >= {minimum}, got {value}")
    return value


def vocab_parallel_embedding(
    ids: torch.Tensor,
    weight: torch.Tensor,
    org_vocab_start: int,
    org_vocab_end: int,
    num_org_vocab_padding: int = 0,
    added_vocab_start: int = 0,
    added_vocab_end: int = 0,
    *,
    backend: str | None = None,
) -> torch.Tensor:
    """Embedding lookup of one vocab shard: ids outside the shard give zero rows, so summing the
    outputs of all tensor-parallel ranks (the engine's all-reduce) gives the full embedding.

    id in ``[org_vocab_start, org_vocab_end)`` -> row ``id - org_vocab_start``; id in
    ``[added_vocab_start, added_vocab_end)`` (LoRA/added tokens) -> row
    ``id - added_vocab_start + (org_vocab_end - org_vocab_start) + num_org_vocab_padding``;
    anything else (other shards, negative padding ids) -> zeros.

    Parameters
    ----------
    ids : int32/int64, any shape.
    weight : [Vs, H] float32, float16 or bfloat16, the shard's rows (original, padding, added).
    org_vocab_start, org_vocab_end, num_org_vocab_padding, added_vocab_start, added_vocab_end :
        the shard's ranges (ints); every addressed row must exist in weight.

    Returns
    -------
    [*ids.shape, H] in the dtype of weight.
    """
    check_tensor(OP_ID, "ids", ids, dtypes=(torch.int32, torch.int64))
    check_tensor(OP_ID, "weight", weight, dtypes=WEIGHT_DTYPES, ndim=2, last_dim_contiguous=True)
    check_same_device(OP_ID, ids=ids, weight=weight)
    org_start = _check_int("org_vocab_start", org_vocab_start, 0)
    org_end = _check_int("org_vocab_end", org_vocab_end, org_start)
    padding = _check_int("num_org_vocab_padding", num_org_vocab_padding, 0)
    added_start = _check_int("added_vocab_start", added_vocab_start, 0)
    added_end = _check_int("added_vocab_end", added_vocab_end, added_start)
    needed = (org_end - org_start) + padding + (added_end - added_start)
    if needed > weight.shape[0]:
        raise ValueError(
            f"{OP_ID}: the ranges address {needed} rows ((org_end - org_start) + padding + "
            f"(added_end - added_start)), but weight has {weight.shape[0]}"
        )
    out = torch.empty(*ids.shape, weight.shape[1], dtype=weight.dtype, device=weight.device)
    if out.numel():
        VOCAB_PARALLEL_EMBEDDING.run(
            out,
            ids,
            weight,
            org_start,
            org_end,
            padding,
            added_start,
            added_end,
            backend=backend,
        )
    return out


def _vocab_parallel_embedding_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: every dtype, int64 and int32 ids, shard 1 of
    4, added tokens, padding ids."""
    g = torch.Generator().manual_seed(0)
    weight = torch.randn(40, 64, generator=g)
    ids = torch.randint(-1, 140, (3, 17), generator=g)
    cases: list[tuple[tuple, dict]] = []
    for dtype in WEIGHT_DTYPES:
        w = weight.to(dtype).to(device)
        cases.append(((ids.to(device), w, 25, 50), {}))
        cases.append(((ids.int().to(device), w, 25, 50, 3, 128, 138), {}))
    return cases
