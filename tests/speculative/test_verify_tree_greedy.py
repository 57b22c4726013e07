"""speculative.verify_tree_greedy against an explicit per-request walk of OPS.md's algorithm on
random trees (random parents, shuffled flat positions, a small vocabulary so paths match), a
hand-checked tree, cyclic sibling lists, empty batches, bad input, opcheck and torch.compile."""

from __future__ import annotations

import itertools
import random

import pytest
import torch

from kernels_speculative import verify_tree_greedy
from kernels_speculative.ops.verify_tree_greedy import chain_tree


def oracle(cand, index, child, sibling, target, steps, predicts, accept_index, accept_num):
    """The algorithm of OPS.md section 7, one request at a time on Python lists."""
    batch, nodes = len(cand), len(cand[0])
    for b in range(batch):
        last = index[b][0]
        accept_index[b][0] = last
        n, cur = 0, 0
        for _ in range(1, steps):
            cur = child[b][cur]
            walked = 0
            while cur != -1 and walked < nodes:
                if cand[b][cur] == target[last]:
                    break
                cur = sibling[b][cur]
                walked += 1
            else:
                cur = -1
            if cur == -1:
                break
            predicts[last] = cand[b][cur]
            n += 1
            accept_index[b][n] = index[b][cur]
            last = index[b][cur]
        accept_num[b] = n
        predicts[last] = target[last]


def random_trees(batch: int, nodes: int, vocab: int, seed: int):
    rng = random.Random(seed)
    child = [[-1] * nodes for _ in range(batch)]
    sibling = [[-1] * nodes for _ in range(batch)]
    for b in range(batch):
        kids: list[list[int]] = [[] for _ in range(nodes)]
        for i in range(1, nodes):
            kids[rng.randrange(i)].append(i)
        for parent, ks in enumerate(kids):
            if ks:
                child[b][parent] = ks[0]
            for a, c in itertools.pairwise(ks):
                sibling[b][a] = c
    flat = list(range(batch * nodes))
    rng.shuffle(flat)
    index = [flat[b * nodes : (b + 1) * nodes] for b in range(batch)]
    cand = [[rng.randrange(vocab) for _ in range(nodes)] for _ in range(batch)]
    target = [rng.randrange(vocab) for _ in range(batch * nodes)]
    return cand, index, child, sibling, target


def _run(cand, index, child, sibling, target, steps, dtype=torch.int64):
    batch, nodes = len(cand), len(cand[0]) if cand else 0
    predicts = torch.full((batch * nodes,), -1, dtype=torch.int32)
    accept_index = torch.full((batch, steps), -1, dtype=torch.int32)
    accept_num = torch.full((batch,), -7, dtype=torch.int32)
    verify_tree_greedy(
        predicts,
        accept_index,
        accept_num,
        torch.tensor(cand, dtype=dtype).reshape(batch, nodes),
        torch.tensor(index, dtype=dtype).reshape(batch, nodes),
        torch.tensor(child, dtype=dtype).reshape(batch, nodes),
        torch.tensor(sibling, dtype=dtype).reshape(batch, nodes),
        torch.tensor(target, dtype=dtype),
    )
    return predicts.tolist(), accept_index.tolist(), accept_num.tolist()


@pytest.mark.parametrize(
    ("batch", "nodes", "steps"), [(1, 1, 1), (3, 5, 3), (8, 16, 6), (5, 64, 8)]
)
@pytest.mark.parametrize("vocab", [2, 4])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=str)
def test_matches_oracle_on_random_trees(batch, nodes, steps, vocab, dtype):
    tree = random_trees(batch, nodes, vocab, seed=batch * 100 + nodes + vocab)
    predicts = [-1] * (batch * nodes)
    accept_index = [[-1] * steps for _ in range(batch)]
    accept_num = [-7] * batch
    oracle(*tree, steps, predicts, accept_index, accept_num)
    assert _run(*tree, steps, dtype=dtype) == (predicts, accept_index, accept_num)


def test_hand_checked_tree():
    # Root 0 has children 1 (token 5) and 2 (token 6); node 2 has child 3 (token 7).
    cand = [[9, 5, 6, 7]]
    index = [[0, 1, 2, 3]]
    child = [[1, -1, 3, -1]]
    sibling = [[-1, 2, -1, -1]]
    target = [6, 0, 7, 8]  # after root: 6 (node 2 matches); after node 2: 7 (node 3); then bonus 8
    predicts, accept_index, accept_num = _run(cand, index, child, sibling, target, steps=4)
    assert accept_num == [2]
    assert accept_index == [[0, 2, 3, -1]]
    assert predicts == [6, -1, 7, 8]


def test_chain_accepts_matching_prefix():
    index, child, sibling = chain_tree(2, 5)
    cand = [[0, 11, 12, 13, 14], [0, 21, 99, 23, 24]]
    target = [11, 12, 13, 14, 15, 21, 22, 23, 24, 25]
    predicts, accept_index, accept_num = _run(
        cand, index.tolist(), child.tolist(), sibling.tolist(), target, steps=5
    )
    assert accept_num == [4, 1]
    assert accept_index == [[0, 1, 2, 3, 4], [5, 6, -1, -1, -1]]
    assert predicts == [11, 12, 13, 14, 15, 21, 22, -1, -1, -1]


def test_cyclic_siblings_terminate():
    cand = [[0, 1, 2]]
    child = [[1, -1, -1]]
    sibling = [[-1, 2, 1]]  # 1 -> 2 -> 1 -> ...: no node matches target 9
    predicts, accept_index, accept_num = _run(cand, [[0, 1, 2]], child, sibling, [9, 9, 9], 3)
    assert accept_num == [0] and accept_index == [[0, -1, -1]] and predicts == [9, -1, -1]


def test_empty_batch():
    e = torch.empty(0, 4, dtype=torch.int64)
    verify_tree_greedy(
        torch.empty(0, dtype=torch.int32),
        torch.empty(0, 2, dtype=torch.int32),
        torch.empty(0, dtype=torch.int32),
        e,
        e,
        e,
        e,
        torch.empty(0, dtype=torch.int64),
    )


def _valid_args(batch=2, nodes=4, steps=3):
    index, child, sibling = chain_tree(batch, nodes)
    return [
        torch.full((batch * nodes,), -1, dtype=torch.int32),
        torch.full((batch, steps), -1, dtype=torch.int32),
        torch.zeros(batch, dtype=torch.int32),
        torch.zeros(batch, nodes, dtype=torch.int64),
        index,
        child,
        sibling,
        torch.zeros(batch * nodes, dtype=torch.int64),
    ]


def test_bad_input():
    args = _valid_args()
    bad = list(args)
    bad[0] = args[0].long()
    with pytest.raises(
        TypeError, match=r"verify_tree_greedy: predicts must have dtype in \(int32\)"
    ):
        verify_tree_greedy(*bad)
    bad = list(args)
    bad[1] = torch.zeros(2, 5, dtype=torch.int32)
    with pytest.raises(
        ValueError, match=r"accept_index must have 1 <= S <= N = 4 columns, got S = 5"
    ):
        verify_tree_greedy(*bad)
    bad = list(args)
    bad[5] = args[5][:, :3]
    with pytest.raises(ValueError, match=r"retrive_next_token must have the shape of candidates"):
        verify_tree_greedy(*bad)
    bad = list(args)
    bad[7] = args[7][:5]
    with pytest.raises(ValueError, match=r"target_predict must have B\*N = 8 entries, got 5"):
        verify_tree_greedy(*bad)
    bad = list(args)
    bad[6] = torch.full_like(args[6], 4)
    with pytest.raises(ValueError, match=r"retrive_next_sibling values must lie in \[-1, 4\)"):
        verify_tree_greedy(*bad)


def test_opcheck():
    from kernels_speculative.ops.verify_tree_greedy import VERIFY_TREE_GREEDY

    cand, index, child, sibling, target = random_trees(3, 6, 2, seed=1)
    args = (
        torch.full((18,), -1, dtype=torch.int32),
        torch.full((3, 4), -1, dtype=torch.int32),
        torch.zeros(3, dtype=torch.int32),
        torch.tensor(cand),
        torch.tensor(index),
        torch.tensor(child),
        torch.tensor(sibling),
        torch.tensor(target),
        None,
    )
    torch.library.opcheck(VERIFY_TREE_GREEDY.torch_op, args)


def test_torch_compile_fullgraph():
    tree = random_trees(4, 8, 2, seed=2)
    tensors = [torch.tensor(t) for t in tree]

    def step(cand, index, child, sibling, target):
        predicts = torch.full((32,), -1, dtype=torch.int32)
        accept_index = torch.full((4, 5), -1, dtype=torch.int32)
        accept_num = torch.zeros(4, dtype=torch.int32)
        verify_tree_greedy(predicts, accept_index, accept_num, cand, index, child, sibling, target)
        return predicts, accept_index, accept_num

    compiled = torch.compile(step, fullgraph=True)
    for got, want in zip(compiled(*tensors), step(*tensors), strict=True):
        assert torch.equal(got, want)


# ---- every backend against the reference (the CUDA kernel on the GPU) ----

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _backend_case(batch, nodes, steps, vocab, seed, device, dtype=torch.int64, cyclic=False):
    cand, index, child, sibling, target = random_trees(batch, nodes, vocab, seed)
    if cyclic:  # every sibling list loops back to its first member: walks must stop at N
        for b in range(batch):
            for i in range(nodes):
                if sibling[b][i] == -1 and i > 0:
                    sibling[b][i] = 1 if nodes > 1 else -1
    t = lambda v: torch.tensor(v, dtype=dtype, device=device)  # noqa: E731
    tree = (t(cand), t(index), t(child), t(sibling), t(target))
    return tuple(x.reshape(batch, nodes) if x.dim() == 2 else x for x in tree)


def _outputs(batch, nodes, steps, device, strided=False):
    predicts = torch.full((batch * nodes,), -1, dtype=torch.int32, device=device)
    if strided:
        accept_index = torch.full((batch, steps + 3), -1, dtype=torch.int32, device=device)
        accept_index = accept_index[:, 1 : steps + 1]
    else:
        accept_index = torch.full((batch, steps), -1, dtype=torch.int32, device=device)
    accept_num = torch.full((batch,), -12345, dtype=torch.int32, device=device)
    return predicts, accept_index, accept_num


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(
    ("batch", "nodes", "steps"),
    [(1, 1, 1), (1, 4, 2), (3, 7, 3), (16, 33, 8), (64, 64, 8), (5, 65, 6), (4, 200, 12)],
)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32], ids=str)
@pytest.mark.parametrize("cyclic", [False, True])
def test_backend_matches_reference(device, batch, nodes, steps, dtype, cyclic):
    tree = _backend_case(batch, nodes, steps, 3, batch + nodes, device, dtype, cyclic)
    want = _outputs(batch, nodes, steps, device)
    verify_tree_greedy(*want, *tree, backend="torch")
    for strided in (False, True):
        got = _outputs(batch, nodes, steps, device, strided)
        verify_tree_greedy(*got, *tree)
        for g, w in zip(got, want, strict=True):
            assert torch.equal(g, w)


@pytest.mark.gpu
def test_cuda_graph_capture():
    batch, nodes, steps = 8, 16, 5
    tree = _backend_case(batch, nodes, steps, 3, 1, "cuda")
    want = _outputs(batch, nodes, steps, "cuda")
    verify_tree_greedy(*want, *tree, backend="torch")
    got = _outputs(batch, nodes, steps, "cuda")
    verify_tree_greedy(*_outputs(batch, nodes, steps, "cuda"), *tree)  # build outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        verify_tree_greedy(*got, *tree)
    graph.replay()
    torch.cuda.synchronize()
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)


@pytest.mark.gpu
def test_cuda_compile_fullgraph():
    batch, nodes, steps = 4, 9, 4
    tree = _backend_case(batch, nodes, steps, 3, 2, "cuda")
    want = _outputs(batch, nodes, steps, "cuda")
    verify_tree_greedy(*want, *tree, backend="torch")
    got = _outputs(batch, nodes, steps, "cuda")
    torch.compile(verify_tree_greedy, fullgraph=True)(*got, *tree)
    for g, w in zip(got, want, strict=True):
        assert torch.equal(g, w)
