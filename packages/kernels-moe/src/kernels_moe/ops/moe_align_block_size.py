"""moe.moe_align_block_size: sort the token slots of top-k routing by expert and pad each expert's
run to the GEMM block size, so a grouped GEMM processes one expert per block.

Buckets come in the order -1 (slots filtered out by expert parallelism), then experts 0..E-1;
padding entries hold n = topk_ids.numel(). Keeping the -1 slots lets fused MoE write zero rows for
them, so a later reduction never reads uninitialised memory.
"""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_tensor
from kernels_moe import reference
from kernels_moe._checks import check_int

OP_ID = "moe.moe_align_block_size"

MOE_ALIGN_BLOCK_SIZE_CUDA = ModuleSpec(
    name="moe_align_block_size",
    package="kernels_moe",
    sources=("csrc/moe_align_block_size.cuh",),
    exports=(("moe_align_block_size", "moe_align_block_size"),),
    description="CUDA: one launch (small n) or count / scan / scatter over blocks of slots",
)
# Up to SMALL_SLOTS slots one launch does everything (one block, or past the kernel's
# kOneBlockMaxEntries entries blocks that each count every slot and write their share of the
# buckets); above, blocks of SLOTS_PER_CTA slots (at most MAX_CTAS of them) count and scatter
# around a one-block scan. E <= CUDA_MAX_EXPERTS (the bucket counts live in shared memory).
SMALL_SLOTS, SLOTS_PER_CTA, MAX_CTAS, CUDA_MAX_EXPERTS = 4096, 1024, 128, 1024

_align_cuda = CompiledFunction(MOE_ALIGN_BLOCK_SIZE_CUDA, "moe_align_block_size")
_NO_WORKSPACE: dict[torch.device, torch.Tensor] = {}


def _moe_align_block_size_cuda(
    sorted_token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor,
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    pad_sorted_token_ids: bool,
) -> None:
    """The compiled entry plus its workspace: per-block bucket counts [E + 1, G] int32 for the
    multi-block path (every entry is written by the op, so it needs no zeroing)."""
    n = topk_ids.numel()
    device = topk_ids.device
    if n <= SMALL_SLOTS:
        workspace = _NO_WORKSPACE.get(device)
        if workspace is None:
            workspace = _NO_WORKSPACE[device] = torch.empty(0, dtype=torch.int32, device=device)
    else:
        ctas = min(MAX_CTAS, -(-n // SLOTS_PER_CTA))
        workspace = torch.empty((num_experts + 1) * ctas, dtype=torch.int32, device=device)
    _align_cuda(
        sorted_token_ids,
        expert_ids,
        num_tokens_post_padded,
        topk_ids,
        num_experts,
        block_size,
        pad_sorted_token_ids,
        workspace,
    )


def _moe_align_block_size_cuda_eligible(
    sorted_token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor,
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    pad_sorted_token_ids: bool,
) -> str | None:
    if num_experts > CUDA_MAX_EXPERTS:
        return f"num_experts = {num_experts} > {CUDA_MAX_EXPERTS}"
    if not topk_ids.is_contiguous():
        return "needs a contiguous topk_ids"
    return None


def _moe_align_block_size_torch(
    sorted_token_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    num_tokens_post_padded: torch.Tensor,
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    pad_sorted_token_ids: bool,
) -> None:
    sorted_ids, experts, total = reference.moe_align_block_size(topk_ids, num_experts, block_size)
    sorted_token_ids.copy_(sorted_ids)
    expert_ids.copy_(experts)
    num_tokens_post_padded.copy_(total)


MOE_ALIGN_BLOCK_SIZE = Op(
    _moe_align_block_size_torch,
    mutates=("sorted_token_ids", "expert_ids", "num_tokens_post_padded"),
    device="topk_ids",
)
ID_DTYPES = MOE_ALIGN_BLOCK_SIZE.dtypes


def moe_align_block_size(
    topk_ids: torch.Tensor,
    num_experts: int,
    block_size: int,
    *,
    pad_sorted_token_ids: bool = True,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Group the n = T*k slots (slot ``t*k + j``) by bucket: -1 first, then experts 0..E-1; a
    bucket of c slots takes ``ceil(c/bs)*bs`` entries, its slots first, then padding n.

    Parameters
    ----------
    topk_ids : [T, k] int32 (or int64) expert ids in [-1, E); -1 = filtered slot.
        Other values raise ValueError (torch reference).
    num_experts : E >= 1.
    block_size : bs >= 1 (16, 32, 64, 128 in practice).
    pad_sorted_token_ids : fill the entries past num_tokens_post_padded with n (otherwise they
        are unspecified; the torch reference always fills them).
    backend : force a backend by name instead of the best eligible one.

    Returns
    -------
    sorted_token_ids : int32 [P], P = min(n + (E+1)(bs-1), n*bs); the order of the slots inside
        one bucket is unspecified (consumers must not rely on it).
    expert_ids : int32 [ceil(P/bs)], the bucket of each block (-1 for the filtered bucket);
        entries past the used blocks are unspecified.
    num_tokens_post_padded : int32 [1], the sum of the padded bucket sizes.
    """
    check_tensor(OP_ID, "topk_ids", topk_ids, dtypes=ID_DTYPES, ndim=2)
    num_experts = check_int(OP_ID, "num_experts", num_experts, minimum=1)
    block_size = check_int(OP_ID, "block_size", block_size, minimum=1)
    n = topk_ids.numel()
    padded_len, blocks = reference.moe_align_block_size_sizes(n, num_experts, block_size)
    device = topk_ids.device
    sorted_token_ids = torch.empty(padded_len, dtype=torch.int32, device=device)
    expert_ids = torch.empty(blocks, dtype=torch.int32, device=device)
    if n == 0:
        return sorted_token_ids, expert_ids, torch.zeros(1, dtype=torch.int32, device=device)
    num_tokens_post_padded = torch.empty(1, dtype=torch.int32, device=device)
    MOE_ALIGN_BLOCK_SIZE.run(
        sorted_token_ids,
        expert_ids,
        num_tokens_post_padded,
        topk_ids,
        num_experts,
        block_size,
        bool(pad_sorted_token_ids),
        backend=backend,
    )
    return sorted_token_ids, expert_ids, num_tokens_post_padded


def _moe_align_block_size_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls: tiny n (single-block path), filtered -1 slots, E = 256 top-8, int64
    ids past the single-block size."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cases: list[tuple[tuple, dict]] = []
    for tokens, k, experts, bs in ((3, 2, 8, 16), (37, 8, 256, 64), (100, 4, 60, 32)):
        ids = torch.randint(-1, experts, (tokens, k), generator=g, dtype=torch.int32)
        cases.append(((ids.to(device), experts, bs), {}))
    wide = torch.randint(-1, 16, (600, 8), generator=g)  # int64 ids, the multi-block path
    cases.append(((wide.to(device), 16, 16), {}))
    return cases
