"""speculative.chain_speculative_sampling: rejection sampling of a draft chain (exact)."""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.rng import seed_offset
from kernels_jit.validation import check_same_device, check_tensor
from kernels_speculative import reference

OP_ID = "speculative.chain_speculative_sampling"

CHAIN_SPECULATIVE_SAMPLING_CUDA = ModuleSpec(
    name="chain_speculative_sampling",
    package="kernels_speculative",
    sources=("csrc/chain_speculative_sampling.cuh", "csrc/speculative_common.cuh"),
    exports=(
        ("chain_speculative_sampling", "chain_speculative_sampling"),
        ("chain_speculative_sampling_cluster", "chain_speculative_sampling_cluster"),
        ("chain_speculative_sampling_in_clusters", "chain_speculative_sampling_in_clusters"),
        (
            "chain_speculative_sampling_resident_clusters",
            "chain_speculative_sampling_resident_clusters",
        ),
    ),
    description=(
        "CUDA: a cluster of up to 8 CTAs per request over vocabulary slices, sized to fill the "
        "GPU in one wave; one pass over the residual rows, the draw in the tile that holds it"
    ),
)
_chain_speculative_sampling_cuda = CompiledFunction(
    CHAIN_SPECULATIVE_SAMPLING_CUDA, "chain_speculative_sampling"
)
# CTAs per request the kernel launches for draft_probs (tests assert the path a shape takes).
_chain_speculative_sampling_cluster = CompiledFunction(
    CHAIN_SPECULATIVE_SAMPLING_CUDA, "chain_speculative_sampling_cluster"
)
# The kernel with a given cluster size, and the clusters of a size the device holds at once
# (tests of every size the host's choice can take).
_chain_speculative_sampling_in_clusters = CompiledFunction(
    CHAIN_SPECULATIVE_SAMPLING_CUDA, "chain_speculative_sampling_in_clusters"
)
_chain_speculative_sampling_resident_clusters = CompiledFunction(
    CHAIN_SPECULATIVE_SAMPLING_CUDA, "chain_speculative_sampling_resident_clusters"
)


def _chain_speculative_sampling_torch(
    output_token_ids: torch.Tensor,
    accepted_num: torch.Tensor,
    emitted_num: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
    deterministic: bool,
) -> None:
    tokens, accepted, emitted = reference.chain_speculative_sampling(
        draft_probs, draft_token_ids, target_probs, seed=seed, offset=offset
    )
    output_token_ids.copy_(tokens)
    accepted_num.copy_(accepted)
    emitted_num.copy_(emitted)


def _chain_speculative_sampling_cuda_eligible(
    output_token_ids: torch.Tensor,
    accepted_num: torch.Tensor,
    emitted_num: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    seed: torch.Tensor,
    offset: torch.Tensor,
    deterministic: bool,
) -> str | None:
    """The kernel reads rows with a contiguous last dim, of one dtype."""
    if draft_probs.dtype != target_probs.dtype:
        return "needs draft_probs and target_probs of one dtype"
    for t in (draft_probs, target_probs):
        if t.shape[2] > 1 and t.stride(2) != 1:
            return "needs draft_probs and target_probs with a contiguous last dim"
    if draft_probs.shape[2] >= 1 << 30:
        return "needs V < 2^30"
    return None


CHAIN_SPECULATIVE_SAMPLING = Op(
    _chain_speculative_sampling_torch,
    mutates=("output_token_ids", "accepted_num", "emitted_num"),
    device="draft_probs",
)
_PROBS = CHAIN_SPECULATIVE_SAMPLING.dtypes


def chain_speculative_sampling(
    draft_probs: torch.Tensor,
    draft_token_ids: torch.Tensor,
    target_probs: torch.Tensor,
    *,
    seed: int | torch.Tensor | None = None,
    offset: int | torch.Tensor | None = None,
    deterministic: bool = True,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Verify a chain of n draft tokens against the target model by rejection sampling.

    With ``u_i = U(seed, offset, b, i)``, draft i is accepted iff ``u_i * q_i < p_i``
    (q, p = draft and target probability of the draft token); the first rejection r stops. Output
    positions < r hold the drafts, position r a sample from ``relu(target[r] - draft[r])``
    (target[r] if that mass is 0), or the bonus sample from target[n] when all n were accepted,
    drawn with ``U(seed, offset, b, n)``; later positions are -1. The emitted tokens follow the
    target distribution exactly.

    Parameters
    ----------
    draft_probs : [B, n, V] float32 (fp16/bf16 read in fp32).
    draft_token_ids : [B, n] int32 (or int64), values in [0, V).
    target_probs : [B, n+1, V] float32 (fp16/bf16 read in fp32).
    seed, offset : ints, or int64 tensors [1] or [B] (per request); ``seed=None`` draws one from
        torch's generator.
    deterministic : accepted for FlashInfer compatibility; every backend is deterministic.

    Returns
    -------
    output_token_ids [B, n+1] int32, accepted_num [B] int32 (drafts passing the test, counted
    independently: FlashInfer's acceptance metric), emitted_num [B] int32 (= r, bonus excluded).
    """
    check_tensor(OP_ID, "draft_probs", draft_probs, dtypes=_PROBS, ndim=3)
    check_tensor(
        OP_ID, "draft_token_ids", draft_token_ids, dtypes=(torch.int32, torch.int64), ndim=2
    )
    check_tensor(OP_ID, "target_probs", target_probs, dtypes=_PROBS, ndim=3)
    batch, n, vocab = draft_probs.shape
    if tuple(draft_token_ids.shape) != (batch, n):
        raise ValueError(
            f"{OP_ID}: draft_token_ids must have shape {(batch, n)} (like draft_probs [B, n, V]), "
            f"got {tuple(draft_token_ids.shape)}"
        )
    if tuple(target_probs.shape) != (batch, n + 1, vocab):
        raise ValueError(
            f"{OP_ID}: target_probs must have shape {(batch, n + 1, vocab)} = [B, n+1, V], "
            f"got {tuple(target_probs.shape)}"
        )
    if batch and vocab == 0:
        raise ValueError(f"{OP_ID}: the vocabulary must not be empty, got V = 0")
    if not isinstance(deterministic, bool):
        raise TypeError(
            f"{OP_ID}: deterministic must be a bool, got {type(deterministic).__name__}"
        )
    check_same_device(
        OP_ID,
        draft_probs=draft_probs,
        draft_token_ids=draft_token_ids,
        target_probs=target_probs,
    )
    seed_t, offset_t = seed_offset(OP_ID, seed, offset, batch, draft_probs.device)
    device = draft_probs.device
    output_token_ids = torch.empty(batch, n + 1, dtype=torch.int32, device=device)
    accepted_num = torch.empty(batch, dtype=torch.int32, device=device)
    emitted_num = torch.empty(batch, dtype=torch.int32, device=device)
    if batch:
        CHAIN_SPECULATIVE_SAMPLING.run(
            output_token_ids,
            accepted_num,
            emitted_num,
            draft_probs,
            draft_token_ids,
            target_probs,
            seed_t,
            offset_t,
            deterministic,
            backend=backend,
        )
    return output_token_ids, accepted_num, emitted_num


def _chain_speculative_sampling_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: drafts sampled from the draft probabilities."""
    g = torch.Generator().manual_seed(0)
    cases = []
    for batch, n, vocab in ((3, 4, 50), (2, 1, 7)):
        draft = (torch.randn(batch, n, vocab, generator=g) * 2).softmax(-1)
        target = (torch.randn(batch, n + 1, vocab, generator=g) * 2).softmax(-1)
        ids = torch.multinomial(draft.reshape(-1, vocab), 1, generator=g).reshape(batch, n)
        for dtype in CHAIN_SPECULATIVE_SAMPLING.dtypes:
            args = (
                draft.to(device, dtype),
                ids.to(device=device, dtype=torch.int32),
                target.to(device, dtype),
            )
            cases.append((args, {"seed": 5, "offset": 1}))
    return cases
