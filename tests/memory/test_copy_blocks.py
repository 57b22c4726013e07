"""memory.copy_blocks against an explicit per-block copy from a snapshot: several layers, dtypes
and trailing shapes, a copy fan-out (one source, many destinations), empty work, bad input."""

from __future__ import annotations

import pytest
import torch

from kernels_memory import copy_blocks


def _caches(layers: int, blocks: int, shape, dtype, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(blocks, *shape, generator=g).to(dtype) for _ in range(layers)]


def oracle(caches, mapping):
    out = [c.clone() for c in caches]
    for src, dst in mapping:
        for o, c in zip(out, caches, strict=True):
            o[dst] = c[src]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8], ids=str)
@pytest.mark.parametrize(("layers", "shape"), [(1, (3,)), (3, (16, 2, 8)), (2, (5, 7))])
def test_matches_loop(dtype, layers, shape):
    keys = _caches(layers, 12, shape, dtype, seed=1)
    values = _caches(layers, 12, shape, dtype, seed=2)
    mapping = [(0, 5), (3, 9), (0, 7), (11, 1)]
    want_k, want_v = oracle(keys, mapping), oracle(values, mapping)
    copy_blocks(keys, values, torch.tensor(mapping))
    for got, want in zip(keys + values, want_k + want_v, strict=True):
        assert torch.equal(got, want)


def test_empty_work():
    keys = _caches(2, 4, (3,), torch.float32, seed=3)
    before = [k.clone() for k in keys]
    copy_blocks(keys, [k.clone() for k in keys], torch.empty(0, 2, dtype=torch.int64))
    copy_blocks([], [], torch.tensor([[0, 1]]))
    assert all(torch.equal(a, b) for a, b in zip(keys, before, strict=True))


def test_errors():
    keys = _caches(2, 4, (3,), torch.float32, seed=4)
    values = [k.clone() for k in keys]
    with pytest.raises(ValueError, match=r"copy_blocks: destination blocks must be unique"):
        copy_blocks(keys, values, torch.tensor([[0, 1], [2, 1]]))
    with pytest.raises(ValueError, match=r"destination blocks must not also be sources, got \[2\]"):
        copy_blocks(keys, values, torch.tensor([[0, 2], [2, 3]]))
    with pytest.raises(ValueError, match=r"block_mapping values must lie in \[0, 4\)"):
        copy_blocks(keys, values, torch.tensor([[0, 4]]))
    with pytest.raises(ValueError, match=r"block_mapping must have shape \[N, 2\]"):
        copy_blocks(keys, values, torch.tensor([[0, 1, 2]]))
    with pytest.raises(ValueError, match=r"key_caches and value_caches must list the same layers"):
        copy_blocks(keys, values[:1], torch.tensor([[0, 1]]))
    with pytest.raises(ValueError, match=r"every cache must be \[NB, ...\] with one NB = 4"):
        copy_blocks(keys, [values[0], torch.zeros(5, 3)], torch.tensor([[0, 1]]))


def test_opcheck_and_compile():
    from kernels_memory.ops.copy_blocks import COPY_BLOCKS

    keys = _caches(2, 6, (4,), torch.float32, seed=5)
    values = _caches(2, 6, (4,), torch.float32, seed=6)
    mapping = torch.tensor([[1, 4], [2, 5]])
    torch.library.opcheck(COPY_BLOCKS.torch_op, (keys, values, mapping, None))

    def step(k0, k1, v0, v1, m):
        copy_blocks([k0, k1], [v0, v1], m)

    eager = [t.clone() for t in keys + values]
    compiled = [t.clone() for t in keys + values]
    step(*eager, mapping)
    torch.compile(step, fullgraph=True)(*compiled, mapping)
    assert all(torch.equal(a, b) for a, b in zip(compiled, eager, strict=True))


# --- every backend on each device against the loop ----------------------------------------------

DEVICES = [pytest.param("cpu", id="cpu"), pytest.param("cuda", id="cuda", marks=pytest.mark.gpu)]
BACKENDS = {"cpu": ("torch",), "cuda": ("cuda", "torch")}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.uint8], ids=str)
@pytest.mark.parametrize(("layers", "shape"), [(1, (3,)), (3, (16, 2, 8)), (2, (5, 7)), (70, (8,))])
@pytest.mark.parametrize("mapping_dtype", [torch.int32, torch.int64], ids=str)
def test_backends_match_loop(device, dtype, layers, shape, mapping_dtype):
    mapping = [(0, 5), (3, 9), (0, 7), (11, 1)]
    for backend in BACKENDS[device]:
        keys = [c.to(device) for c in _caches(layers, 12, shape, dtype, seed=1)]
        values = [c.to(device) for c in _caches(layers, 12, shape, dtype, seed=2)]
        want_k, want_v = oracle(keys, mapping), oracle(values, mapping)
        block_mapping = torch.tensor(mapping, dtype=mapping_dtype, device=device)
        copy_blocks(keys, values, block_mapping, backend=backend)
        for got, want in zip(keys + values, want_k + want_v, strict=True):
            assert torch.equal(got, want), backend


@pytest.mark.parametrize("device", DEVICES)
def test_backends_strided_blocks_and_mapping(device):
    """Caches whose blocks sit apart (a slice of a wider pool) and a strided mapping view."""
    mapping = [(2, 6), (4, 0)]
    wide = torch.tensor([[2, 6, 0], [4, 0, 0]], device=device)[:, :2]
    for backend in BACKENDS[device]:
        pool = torch.randn(20, 4, 16, device=device)
        keys = [pool[::2]]  # block stride 2 x 64 floats
        values = [torch.randn(10, 4, 16, device=device).half()]
        want_k, want_v = oracle(keys, mapping), oracle(values, mapping)
        copy_blocks(keys, values, wide, backend=backend)
        assert torch.equal(keys[0], want_k[0]) and torch.equal(values[0], want_v[0]), backend


@pytest.mark.gpu
def test_cuda_validate_and_skips():
    keys = [c.cuda() for c in _caches(2, 4, (3,), torch.float32, seed=4)]
    values = [k.clone() for k in keys]
    with pytest.raises(ValueError, match=r"destination blocks must not also be sources"):
        copy_blocks(keys, values, torch.tensor([[0, 2], [2, 3]], device="cuda"), validate=True)
    before = [k.clone() for k in keys]
    copy_blocks(keys, values, torch.tensor([[0, 4], [-1, 2]], device="cuda"), backend="cuda")
    assert all(torch.equal(a, b) for a, b in zip(keys, before, strict=True))


@pytest.mark.gpu
def test_cuda_graph_capture():
    keys = [c.cuda() for c in _caches(4, 64, (16, 8, 32), torch.bfloat16, seed=5)]
    values = [c.cuda() for c in _caches(4, 64, (16, 8, 32), torch.bfloat16, seed=6)]
    mapping = [(i, 32 + i) for i in range(0, 32, 3)]
    want_k, want_v = oracle(keys, mapping), oracle(values, mapping)
    block_mapping = torch.tensor(mapping, device="cuda")
    copy_blocks(keys, values, block_mapping)  # builds before capture
    for c in keys + values:
        c[32:].zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        copy_blocks(keys, values, block_mapping)
    graph.replay()
    torch.cuda.synchronize()
    for got, want in zip(keys + values, want_k + want_v, strict=True):
        assert torch.equal(got[32:][::3][:11], want[32:][::3][:11])
