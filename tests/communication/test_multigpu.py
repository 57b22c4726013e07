"""Multi-GPU tests of communication, one process per GPU under torchrun
(shared/bench/multi_gpu_session.sh runs ``torchrun --nproc-per-node=N -m pytest tests/communication
-m multigpu``). Skipped below 2 GPUs (tests/conftest.py) and outside torchrun."""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.multigpu

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


@pytest.fixture(scope="module")
def dist_env():
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        pytest.skip("run under torchrun (one process per GPU)")
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl")
    local = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
    torch.cuda.set_device(local)
    gloo = dist.new_group(backend="gloo")
    from kernels_communication import CustomAllReduce

    comm = CustomAllReduce(gloo, device=f"cuda:{local}", max_size=8 << 20, timeout_s=60.0)
    yield dist, comm, gloo
    comm.close()


def _parts(world, shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*shape, generator=g).to(dtype) for _ in range(world)]


def _same_everywhere(dist, t):
    gathered = [torch.empty_like(t) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, t.contiguous())
    return all(torch.equal(g, gathered[0]) for g in gathered)


@pytest.mark.parametrize("algo", [-1, 0, 1])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_all_reduce_bit_identical(dist_env, algo, dtype):
    dist, comm, _ = dist_env
    from kernels_communication import custom_all_reduce

    world, rank = dist.get_world_size(), dist.get_rank()
    assert comm.disabled == (world not in (2, 4, 6, 8)), comm.disabled_reason
    comm.algo = algo
    for numel in (8, 4096, 1 << 18, (8 << 20) // 4):
        parts = _parts(world, (numel,), dtype, numel)
        x = parts[rank].cuda()
        got = custom_all_reduce(x, comm)
        acc = parts[0].float()
        for p in parts[1:]:
            acc = acc + p.float()
        assert torch.equal(got.cpu(), acc.to(dtype)), (numel, algo)
        assert _same_everywhere(dist, got)
    comm.algo = -1
    comm.check(sync=True)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("tokens", "hidden"), [(1, 4096), (7, 4096), (128, 8192), (300, 8192)])
def test_fused_matches_all_reduce(dist_env, dtype, tokens, hidden):
    dist, comm, _ = dist_env
    from kernels_communication import all_reduce_add_rmsnorm, custom_all_reduce

    world, rank = dist.get_world_size(), dist.get_rank()
    parts = _parts(world, (tokens, hidden), dtype, tokens)
    residual = torch.zeros(tokens, hidden, dtype=dtype).cuda()
    x = parts[rank].cuda()
    summed = custom_all_reduce(x, comm)
    w = torch.ones(hidden, dtype=dtype).cuda()
    xx, rr = x.clone(), residual.clone()
    all_reduce_add_rmsnorm(xx, rr, w, 1e-6, comm)
    assert torch.equal(rr, summed)  # residual 0: the stored sum is custom_all_reduce's
    assert _same_everywhere(dist, xx) and _same_everywhere(dist, rr)
    comm.check(sync=True)


def test_graph_capture_and_registration(dist_env):
    dist, comm, _ = dist_env
    from kernels_communication import custom_all_reduce

    world, rank = dist.get_world_size(), dist.get_rank()
    x = torch.full((4096,), float(rank + 1), device="cuda", dtype=torch.bfloat16)
    out = torch.empty_like(x)
    custom_all_reduce(x, comm, out=out)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        custom_all_reduce(x, comm, out=out)
    comm.register_graph_buffers()
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.all(out == world * (world + 1) / 2)
    comm.check(sync=True)


def test_fallback_above_max_size(dist_env):
    dist, comm, _ = dist_env
    from kernels_communication import custom_all_reduce

    world = dist.get_world_size()
    x = torch.ones((comm.max_size // 4) + 4, device="cuda")
    assert not comm.should_custom_ar(x)
    assert torch.all(custom_all_reduce(x, comm) == world)
