"""grammar.apply_token_bitmask_inplace: mask the logits of tokens a grammar forbids (in place).

CUDA: one warp per 32 mask words of a row; fully allowed words cost only their mask read, fully
masked 16-byte chunks are one -inf store (csrc/apply_token_bitmask_inplace.cuh).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kernels_grammar import reference
from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_same_device, check_tensor, last_dim_contiguous

OP_ID = "grammar.apply_token_bitmask_inplace"

APPLY_TOKEN_BITMASK_INPLACE_CUDA = ModuleSpec(
    name="apply_token_bitmask_inplace",
    package="kernels_grammar",
    sources=("csrc/apply_token_bitmask_inplace.cuh",),
    exports=(("apply_token_bitmask_inplace", "apply_token_bitmask_inplace"),),
    description="CUDA: a warp per 32 mask words, allowed words skipped, 16-byte -inf stores",
)
_apply_token_bitmask_inplace_cuda = CompiledFunction(
    APPLY_TOKEN_BITMASK_INPLACE_CUDA, "apply_token_bitmask_inplace"
)


def _apply_token_bitmask_inplace_torch(
    logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None, vocab_size: int
) -> None:
    reference.apply_token_bitmask_inplace(logits, bitmask, indices=indices, vocab_size=vocab_size)


def _apply_token_bitmask_inplace_cuda_eligible(
    logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None, vocab_size: int
) -> str | None:
    """The kernel indexes rows of a contiguous last dim (any row stride)."""
    if not (last_dim_contiguous(logits) and last_dim_contiguous(bitmask)):
        return "needs a contiguous last dim in logits and bitmask"
    return None


APPLY_TOKEN_BITMASK_INPLACE = Op(
    _apply_token_bitmask_inplace_torch, mutates=("logits",), device="logits"
)
LOGIT_DTYPES = APPLY_TOKEN_BITMASK_INPLACE.dtypes


def apply_token_bitmask_inplace(
    logits: torch.Tensor,
    bitmask: torch.Tensor,
    *,
    indices: torch.Tensor | Sequence[int] | None = None,
    vocab_size: int | None = None,
    backend: str | None = None,
) -> None:
    """Set ``logits[r, t] = -inf`` for every token t whose bit in ``bitmask[r]`` is 0.

    Token t is bit ``t % 32`` (counted from the LSB, bit 31 included) of word ``t // 32``; 1 means
    allowed. Columns >= ``vocab_size`` (a padded vocabulary) are left untouched.

    Parameters
    ----------
    logits : [B, V] or [V] float32, float16 or bfloat16, modified in place.
    bitmask : int32 [B, W] or [W] (same number of dims as logits), W >= ceil(vocab_size / 32).
    indices : optional int32/int64 tensor or list of row ids: mask only these rows, each with
        its own ``bitmask[r]``; other rows are untouched, duplicates are harmless. Without indices
        the bitmask must have B rows. A list is checked against ``[0, min(B, B'))`` here; a
        tensor is checked by the torch reference, while the CUDA kernel (no host sync) skips a
        row id outside that range.
    vocab_size : tokens to mask, default ``min(V, 32 * W)``; at most that.
    """
    check_tensor(OP_ID, "logits", logits, dtypes=LOGIT_DTYPES, ndim=(1, 2))
    check_tensor(OP_ID, "bitmask", bitmask, dtypes=(torch.int32,), ndim=logits.dim())
    check_same_device(OP_ID, logits=logits, bitmask=bitmask)
    vocab, words = logits.shape[-1], bitmask.shape[-1]
    limit = min(vocab, 32 * words)
    if vocab_size is None:
        vocab_size = limit
    elif isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"{OP_ID}: vocab_size must be an int, got {type(vocab_size).__name__}")
    elif not 0 <= vocab_size <= limit:
        raise ValueError(
            f"{OP_ID}: vocab_size must lie in [0, min(V, 32*W)] = [0, {limit}] for logits with "
            f"V = {vocab} and bitmask with W = {words}, got {vocab_size}"
        )
    if indices is not None:
        if not isinstance(indices, torch.Tensor):
            indices = list(indices)
            limit_rows = min(logits.shape[0], bitmask.shape[0]) if logits.dim() == 2 else 1
            if indices and (min(indices) < 0 or max(indices) >= limit_rows):
                raise ValueError(
                    f"{OP_ID}: indices must lie in [0, {limit_rows}) (rows of logits and "
                    f"bitmask), got values in [{min(indices)}, {max(indices)}]"
                )
            indices = torch.tensor(indices, dtype=torch.int32, device=logits.device)
        check_tensor(
            OP_ID,
            "indices",
            indices,
            dtypes=(torch.int32, torch.int64),
            ndim=1,
            device=logits.device,
        )
        if logits.dim() == 1:
            raise ValueError(f"{OP_ID}: indices need 2-D logits [B, V], got shape {(vocab,)}")
    elif logits.dim() == 2 and bitmask.shape[0] != logits.shape[0]:
        raise ValueError(
            f"{OP_ID}: bitmask must have B = {logits.shape[0]} rows like logits (or pass indices), "
            f"got shape {tuple(bitmask.shape)}"
        )
    if logits.dim() == 1:
        rows = 1
    else:
        rows = logits.shape[0] if indices is None else indices.shape[0]
    if rows and vocab_size:
        APPLY_TOKEN_BITMASK_INPLACE.run(logits, bitmask, indices, vocab_size, backend=backend)


def _apply_token_bitmask_inplace_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: V % 32 != 0, indices, a padded vocab."""
    g = torch.Generator().manual_seed(0)
    cases = []
    for batch, vocab in ((3, 100), (4, 1000)):
        words = (vocab + 31) // 32
        logits = torch.randn(batch, vocab, generator=g)
        bitmask = torch.randint(-(2**31), 2**31 - 1, (batch, words), generator=g, dtype=torch.int32)
        cases.append(((logits.to(device), bitmask.to(device)), {}))
    logits = torch.randn(2, 100, generator=g).to(torch.float16)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (2, 4), generator=g, dtype=torch.int32)
    cases.append(((logits.to(device), bitmask.to(device)), {}))
    logits = torch.randn(5, 70, generator=g).to(torch.bfloat16)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (5, 2), generator=g, dtype=torch.int32)
    kwargs = {"indices": torch.tensor([4, 1, 1], device=device), "vocab_size": 60}
    cases.append(((logits.to(device), bitmask.to(device)), kwargs))
    return cases
