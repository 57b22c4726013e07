"""speculative.verify_tree_greedy: accept the longest draft-tree path matching greedy decoding."""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_same_device, check_tensor
from kernels_speculative import reference

OP_ID = "speculative.verify_tree_greedy"
_INDEX = (torch.int32, torch.int64)

VERIFY_TREE_GREEDY_CUDA = ModuleSpec(
    name="verify_tree_greedy",
    package="kernels_speculative",
    sources=("csrc/verify_tree_greedy.cuh", "csrc/speculative_common.cuh"),
    exports=(("verify_tree_greedy", "verify_tree_greedy"),),
    description="CUDA: one warp per request, the tree staged in shared memory (N <= 64)",
)
_verify_tree_greedy_cuda = CompiledFunction(VERIFY_TREE_GREEDY_CUDA, "verify_tree_greedy")


def _verify_tree_greedy_torch(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
) -> None:
    reference.verify_tree_greedy(
        predicts,
        accept_index,
        accept_token_num,
        candidates,
        retrive_index,
        retrive_next_token,
        retrive_next_sibling,
        target_predict,
    )


VERIFY_TREE_GREEDY = Op(
    _verify_tree_greedy_torch,
    mutates=("predicts", "accept_index", "accept_token_num"),
    device="candidates",
)


def verify_tree_greedy(
    predicts: torch.Tensor,
    accept_index: torch.Tensor,
    accept_token_num: torch.Tensor,
    candidates: torch.Tensor,
    retrive_index: torch.Tensor,
    retrive_next_token: torch.Tensor,
    retrive_next_sibling: torch.Tensor,
    target_predict: torch.Tensor,
    *,
    backend: str | None = None,
) -> None:
    """Greedy verification of a draft token tree (EAGLE), in place.

    Per request b: start at the root (``last = retrive_index[b, 0]``); for each of S-1 steps go to
    the first child and walk its siblings (at most N nodes) until a node's candidate equals
    ``target_predict[last]``; accept it (``predicts[last] = token``, record its flat position) or
    stop. Finally ``predicts[last] = target_predict[last]`` (the bonus token) and
    ``accept_token_num[b]`` = accepted count. Entries not visited are left untouched.

    Parameters
    ----------
    predicts : [B*N] int32, in place.
    accept_index : [B, S] int32, in place; S <= N, column 0 receives the root.
    accept_token_num : [B] int32, in place.
    candidates : [B, N] int64 (or int32): the draft token of each node; node 0 is the root.
    retrive_index : [B, N] int64 (or int32): flat position of each node in [0, B*N).
    retrive_next_token, retrive_next_sibling : [B, N] int64 (or int32): first child / next
        sibling (local node index) or -1.
    target_predict : [B*N] int64 (or int32): the target's argmax after each flat position.
    """
    check_tensor(OP_ID, "predicts", predicts, dtypes=(torch.int32,), ndim=1, contiguous=True)
    check_tensor(OP_ID, "accept_index", accept_index, dtypes=(torch.int32,), ndim=2)
    check_tensor(OP_ID, "accept_token_num", accept_token_num, dtypes=(torch.int32,), ndim=1)
    check_tensor(OP_ID, "candidates", candidates, dtypes=_INDEX, ndim=2)
    batch, nodes = candidates.shape
    for name, t in (
        ("retrive_index", retrive_index),
        ("retrive_next_token", retrive_next_token),
        ("retrive_next_sibling", retrive_next_sibling),
    ):
        check_tensor(OP_ID, name, t, dtypes=_INDEX, ndim=2)
        if t.shape != candidates.shape:
            raise ValueError(
                f"{OP_ID}: {name} must have the shape of candidates {(batch, nodes)}, "
                f"got {tuple(t.shape)}"
            )
    check_tensor(OP_ID, "target_predict", target_predict, dtypes=_INDEX, ndim=1)
    for name, t in (("predicts", predicts), ("target_predict", target_predict)):
        if t.shape[0] != batch * nodes:
            raise ValueError(
                f"{OP_ID}: {name} must have B*N = {batch * nodes} entries, got {t.shape[0]}"
            )
    if accept_index.shape[0] != batch or accept_token_num.shape[0] != batch:
        raise ValueError(
            f"{OP_ID}: accept_index [B, S] and accept_token_num [B] need B = {batch}, got "
            f"{tuple(accept_index.shape)} and {tuple(accept_token_num.shape)}"
        )
    steps = accept_index.shape[1]
    if batch and not 1 <= steps <= nodes:
        raise ValueError(
            f"{OP_ID}: accept_index must have 1 <= S <= N = {nodes} columns, got S = {steps}"
        )
    check_same_device(
        OP_ID,
        predicts=predicts,
        accept_index=accept_index,
        accept_token_num=accept_token_num,
        candidates=candidates,
        retrive_index=retrive_index,
        retrive_next_token=retrive_next_token,
        retrive_next_sibling=retrive_next_sibling,
        target_predict=target_predict,
    )
    if batch:
        VERIFY_TREE_GREEDY.run(
            predicts,
            accept_index,
            accept_token_num,
            candidates,
            retrive_index,
            retrive_next_token,
            retrive_next_sibling,
            target_predict,
            backend=backend,
        )


def chain_tree(batch: int, nodes: int, device="cpu"):
    """``(retrive_index, next_token, next_sibling)`` of B chains 0 -> 1 -> ... -> N-1."""
    local = torch.arange(nodes, device=device)
    index = (torch.arange(batch, device=device)[:, None] * nodes + local).long()
    child = torch.where(local + 1 < nodes, local + 1, -1).expand(batch, nodes).contiguous()
    sibling = torch.full((batch, nodes), -1, dtype=torch.long, device=device)
    return index, child.long(), sibling


def _verify_tree_greedy_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: binary trees whose matches are random."""
    g = torch.Generator().manual_seed(0)
    cases = []
    for batch, nodes, steps in ((2, 7, 3), (5, 15, 4)):
        local = torch.arange(nodes)
        index = (torch.arange(batch)[:, None] * nodes + local).long()
        child = torch.where(2 * local + 1 < nodes, 2 * local + 1, -1).expand(batch, nodes)
        sibling = torch.where((local % 2 == 1) & (local + 1 < nodes), local + 1, -1)
        sibling = sibling.expand(batch, nodes)
        cand = torch.randint(0, 3, (batch, nodes), generator=g)
        target = torch.randint(0, 3, (batch * nodes,), generator=g)
        args = (
            torch.full((batch * nodes,), -1, dtype=torch.int32),
            torch.full((batch, steps), -1, dtype=torch.int32),
            torch.zeros(batch, dtype=torch.int32),
            cand,
            index,
            child.contiguous(),
            sibling.contiguous(),
            target,
        )
        cases.append((tuple(a.to(device) for a in args), {}))
        # int32 tree tensors (the declared dtypes are those of candidates).
        narrow = tuple(
            a.to(device) if i < 3 else a.to(device, torch.int32) for i, a in enumerate(args)
        )
        cases.append((narrow, {}))
    return cases
