"""communication.custom_all_reduce and communication.all_reduce_add_rmsnorm.

Single process (no process group): the all-reduce is the identity and the fused op is residual
add + RMSNorm, checked against float64 oracles. Two processes on CPU with the gloo backend: both
ops against oracles built from every rank's (seeded) inputs, and bit-identical results on both
ranks. The two ranks run as plain subprocesses (pytest's importlib mode leaves test modules
unimportable by name, which torch.multiprocessing.spawn needs)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from kernels_communication import CustomAllReduce, all_reduce_add_rmsnorm, custom_all_reduce
from shared.testing.compare import assert_close

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _rand(*shape, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g).to(dtype)


def oracle_rmsnorm(partials, residual, weight, eps):
    r = sum(p.double() for p in partials) + residual.double()
    normed = r / torch.sqrt(r.square().mean(-1, keepdim=True) + eps) * weight.double()
    return normed.to(residual.dtype), r.to(residual.dtype)


@pytest.fixture(scope="module")
def comm():
    c = CustomAllReduce()
    yield c
    c.close()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1,), (7, 33), (2, 3, 4096)])
def test_single_process_identity(comm, dtype, shape):
    x = _rand(*shape, seed=len(shape), dtype=dtype)
    y = custom_all_reduce(x, comm)
    assert y.data_ptr() != x.data_ptr()
    assert torch.equal(y, x)
    out = torch.empty_like(x)
    assert custom_all_reduce(x, comm, out=out) is out and torch.equal(out, x)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("tokens", "hidden"), [(1, 1), (5, 129), (16, 1024)])
def test_single_process_add_rmsnorm(comm, dtype, tokens, hidden):
    x, residual = (
        _rand(tokens, hidden, seed=1, dtype=dtype),
        _rand(tokens, hidden, seed=2, dtype=dtype),
    )
    weight = _rand(hidden, seed=3)
    want_x, want_r = oracle_rmsnorm([x], residual, weight, 1e-6)
    all_reduce_add_rmsnorm(x, residual, weight, 1e-6, comm)
    assert_close(residual, want_r)
    assert_close(x, want_x)


def test_communicator_state(comm):
    assert comm.world_size == 1 and comm.rank == 0 and comm.disabled
    assert "world size 1" in comm.disabled_reason
    assert not comm.should_custom_ar(torch.ones(64))
    comm.register_graph_buffers()


def test_empty_and_bad_input(comm):
    assert custom_all_reduce(torch.empty(0, 4), comm).shape == (0, 4)
    x = torch.ones(2, 8)
    with pytest.raises(
        TypeError, match=r"custom_all_reduce: comm must be a CustomAllReduce, got NoneType"
    ):
        custom_all_reduce(x, None)
    with pytest.raises(TypeError, match=r"custom_all_reduce: x must have dtype in .* got float64"):
        custom_all_reduce(x.double(), comm)
    with pytest.raises(ValueError, match=r"x is on cpu, but comm serves meta"):
        custom_all_reduce(x, CustomAllReduce(device="meta"))
    with pytest.raises(
        ValueError, match=r"all_reduce_add_rmsnorm: weight must have H = 8 entries, got 4"
    ):
        all_reduce_add_rmsnorm(x, x.clone(), torch.ones(4), 1e-6, comm)
    with pytest.raises(TypeError, match=r"residual must have dtype in \(float32\), got bfloat16"):
        all_reduce_add_rmsnorm(x, x.bfloat16(), torch.ones(8), 1e-6, comm)
    closed = CustomAllReduce()
    closed.close()
    with pytest.raises(ValueError, match=r"custom_all_reduce: comm was closed"):
        custom_all_reduce(x, closed)
    with pytest.raises(ValueError, match=r"max_size must be a positive int, got 0"):
        CustomAllReduce(max_size=0)


def test_opcheck_and_compile(comm):
    from kernels_communication.ops.all_reduce_add_rmsnorm import ALL_REDUCE_ADD_RMSNORM
    from kernels_communication.ops.custom_all_reduce import CUSTOM_ALL_REDUCE

    x = _rand(4, 64, seed=4)
    torch.library.opcheck(CUSTOM_ALL_REDUCE.torch_op, (torch.empty_like(x), x, comm.handle, None))
    torch.library.opcheck(
        ALL_REDUCE_ADD_RMSNORM.torch_op,
        (x.clone(), x.clone(), torch.ones(64), 1e-6, comm.handle, None),
    )
    compiled = torch.compile(lambda t: custom_all_reduce(t, comm), fullgraph=True)
    assert torch.equal(compiled(x), x)


WORKER = textwrap.dedent(
    """
    import datetime, os, sys
    import torch
    import torch.distributed as dist
    from kernels_communication import CustomAllReduce, all_reduce_add_rmsnorm, custom_all_reduce

    rank, world, init = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    comm = CustomAllReduce(dist.group.WORLD)
    assert comm.world_size == world and comm.rank == rank and comm.disabled

    def rand(seed, *shape, dtype=torch.float32):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(*shape, generator=g).to(dtype)

    def same_on_every_rank(t):
        gathered = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(gathered, t.contiguous())
        return all(torch.equal(g, gathered[0]) for g in gathered)

    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        for shape in ((1,), (3, 333), (2, 4, 64)):
            parts = [rand(100 * r + len(shape), *shape, dtype=dtype) for r in range(world)]
            got = custom_all_reduce(parts[rank], comm)
            want = sum(p.float() for p in parts).to(dtype)
            assert torch.equal(got, want), (dtype, shape, (got.float() - want.float()).abs().max())
            assert same_on_every_rank(got)

        parts = [rand(7 + r, 5, 96, dtype=dtype) for r in range(world)]
        residual = rand(50, 5, 96, dtype=dtype)
        weight = rand(51, 96)
        x, res = parts[rank].clone(), residual.clone()
        all_reduce_add_rmsnorm(x, res, weight, 1e-6, comm)
        r = sum(p.double() for p in parts) + residual.double()
        want_x = r / torch.sqrt(r.square().mean(-1, keepdim=True) + 1e-6) * weight.double()
        tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
        assert torch.allclose(res.double(), r, atol=tol, rtol=tol), dtype
        assert torch.allclose(x.double(), want_x, atol=tol, rtol=tol), dtype
        assert same_on_every_rank(x) and same_on_every_rank(res)

    dist.barrier()
    dist.destroy_process_group()
    print("rank", rank, "ok", flush=True)
    # Skip interpreter teardown: gloo's worker threads can abort in static destructors
    # ("terminate called without an active exception") after all work succeeded.
    os._exit(0)
    """
)


def test_two_processes_gloo(tmp_path):
    world = 2
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, str(rank), str(world), init],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for rank in range(world)
    ]
    results = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        results.append((proc.returncode, out, err))
    for rank, (code, out, err) in enumerate(results):
        assert code == 0, f"rank {rank} failed:\n{out}\n{err[-3000:]}"
        assert f"rank {rank} ok" in out
