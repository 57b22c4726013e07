"""The CUDA backends of communication: the set-up protocol on the CPU (the joint decision, and
the handshake with several gloo processes and the CUDA parts mocked), the world-size-1 path and
the kernels' barrier protocol on one GPU (loopback: several ranks in one process, each on its own
stream, sharing their buffers directly)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

from kernels_communication import (
    CommunicationError,
    CustomAllReduce,
    all_reduce_add_rmsnorm,
    custom_all_reduce,
)
from kernels_communication.comm import decide, one_shot
from shared.testing.compare import assert_close

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _info(device, visible="0,1", access=(True, True), host="h", reason=None):
    return {"host": host, "visible": visible, "device": device, "peer_access": list(access),
            "reason": reason}  # fmt: skip


def test_decide():
    ok = [_info(0), _info(1)]
    assert decide(ok) is None
    assert "world size 3" in decide([_info(0), _info(1), _info(2)])
    assert decide([_info(0), _info(1, reason="no CUDA")]) == "rank 1: no CUDA"
    assert "more than one host" in decide([_info(0), _info(1, host="other")])
    assert "share a device" in decide([_info(0), _info(0)])
    assert "rank 1 has no peer access to ranks [0]" in decide(
        [_info(0), _info(1, access=(False, True))]
    )
    # different CUDA_VISIBLE_DEVICES per rank: peer access cannot be compared, IPC decides
    assert decide([_info(0, visible="0", access=(True,)), _info(0, visible="1")]) is None


def test_one_shot_thresholds():
    assert one_shot(2, 8 << 20)
    assert one_shot(4, (512 << 10) - 16) and not one_shot(4, 512 << 10)
    assert one_shot(8, (256 << 10) - 16) and not one_shot(8, 256 << 10)


_PROTOCOL_WORKER = textwrap.dedent(
    """
    import datetime, os, sys
    import torch
    import torch.distributed as dist
    from kernels_communication import comm as cm

    rank, world, init, case = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=60))
    calls = []

    def fake_local_info(self):
        self.device = torch.device("cuda", rank)
        return {"host": "h", "visible": "all", "device": rank,
                "peer_access": [case != "no_p2p" or i == rank for i in range(world)],
                "reason": None}

    def fake_allocate(self):
        if case == "alloc_fails" and rank == world - 1:
            raise RuntimeError("cudaMalloc: out of memory")
        self._region = 4096 * (rank + 1)
        self._slots = 1

    def fake_fn(name):
        def f(*args):
            calls.append(name)
            if name == "car_ipc_handle":
                args[2].fill_(rank + 1)
                return 0
            if name == "car_ipc_open":
                if case == "open_fails" and rank == 0:
                    raise RuntimeError("cudaIpcOpenMemHandle: invalid handle")
                return 1000 * int(args[1][0])
            if name == "car_signal_bytes":
                return 65536
            if name == "car_create":
                sigs = args[3].tolist()
                assert sigs[rank] == 4096 * (rank + 1), sigs
                assert [s for r, s in enumerate(sigs) if r != rank] == [
                    1000 * (r + 1) for r in range(world) if r != rank], sigs
                return 77
            return 0
        return f

    cm.CustomAllReduce._local_info = fake_local_info
    cm.CustomAllReduce._allocate = fake_allocate
    cm._fn = fake_fn
    comm = cm.CustomAllReduce(dist.group.WORLD)
    want = {"ok": None, "no_p2p": "no peer access",
            "alloc_fails": f"set-up failed on rank {world - 1}",
            "open_fails": "opening peer buffers failed on rank 0"}[case]
    if want is None:
        assert not comm.disabled, comm.disabled_reason
        assert comm._state == 77 and "car_h2d" in calls
        assert comm.ineligible(torch.ones(8)) == "x is not on the communicator's device"
    else:
        assert comm.disabled and want in comm.disabled_reason, comm.disabled_reason
        assert comm._state == 0
    print("rank", rank, "ok", flush=True)
    os._exit(0)
    """
)


@pytest.mark.parametrize("case", ["ok", "no_p2p", "alloc_fails", "open_fails"])
def test_handshake_protocol_gloo(tmp_path, case):
    world = 2
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
    init = f"file://{tmp_path / 'rendezvous'}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _PROTOCOL_WORKER, str(r), str(world), init, case],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(world)
    ]
    for r, proc in enumerate(procs):
        try:
            out, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for p in procs:
                p.kill()
            raise
        assert proc.returncode == 0, f"rank {r} failed:\n{out}\n{err[-3000:]}"
        assert f"rank {r} ok" in out


# ---- one GPU -----------------------------------------------------------------------------


def _oracle_sum(parts):
    acc = parts[0].float()
    for p in parts[1:]:
        acc = acc + p.float()
    return acc


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1,), (7, 33), (16, 4096)])
def test_world1_cuda(dtype, shape):
    comm = CustomAllReduce(device="cuda")
    x = torch.randn(*shape, device="cuda").to(dtype)
    out = torch.full_like(x, float("nan"))
    assert custom_all_reduce(x, comm, out=out, backend="cuda") is out
    assert torch.equal(out, x)
    if len(shape) == 2 and shape[1] * x.element_size() % 16 == 0:
        res = torch.randn_like(x)
        w = torch.randn(shape[1], device="cuda").to(dtype)
        want_x, want_r = x.clone(), res.clone()
        all_reduce_add_rmsnorm(want_x, want_r, w, 1e-6, comm, backend="torch")
        all_reduce_add_rmsnorm(x, res, w, 1e-6, comm, backend="cuda")
        assert_close(res, want_r)
        assert_close(x, want_x)
    comm.close()


@pytest.mark.gpu
def test_world1_graph_and_compile():
    comm = CustomAllReduce(device="cuda")
    x = torch.randn(8, 4096, device="cuda", dtype=torch.bfloat16)
    res, w = torch.randn_like(x), torch.ones(4096, device="cuda", dtype=torch.bfloat16)
    xs, rs = x.clone(), res.clone()
    all_reduce_add_rmsnorm(xs, rs, w, 1e-6, comm)  # warm up (load) outside the capture
    xs.copy_(x)
    rs.copy_(res)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        all_reduce_add_rmsnorm(xs, rs, w, 1e-6, comm)
    want_x, want_r = x.clone(), res.clone()
    all_reduce_add_rmsnorm(want_x, want_r, w, 1e-6, comm)
    xs.copy_(x)
    rs.copy_(res)
    graph.replay()
    assert torch.equal(xs, want_x) and torch.equal(rs, want_r)
    compiled = torch.compile(lambda t: custom_all_reduce(t, comm), fullgraph=True)
    assert torch.equal(compiled(x), x)
    comm.close()


def _loopback_run(comms, fn):
    streams = [torch.cuda.Stream() for _ in comms]
    torch.cuda.synchronize()
    for rank, (c, s) in enumerate(zip(comms, streams, strict=True)):
        with torch.cuda.stream(s):
            fn(rank, c)
    torch.cuda.synchronize()
    for c in comms:
        c.check()


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("algo", [0, 1])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_loopback_all_reduce(world, algo, dtype):
    comms = CustomAllReduce.loopback(world, "cuda", max_size=1 << 20, max_blocks=4)
    for c in comms:
        c.algo = algo
    for numel in (8, 1000 * 8, 64 * 1024 // 4):
        numel -= numel % (16 // torch.empty(0, dtype=dtype).element_size())
        parts = [torch.randn(numel, device="cuda").to(dtype) for _ in comms]
        outs = [torch.full_like(p, float("nan")) for p in parts]
        _loopback_run(
            comms, lambda r, c, parts=parts, outs=outs: custom_all_reduce(parts[r], c, out=outs[r])
        )
        want = _oracle_sum(parts).to(dtype)
        for out in outs:
            assert torch.equal(out, want)
    for c in comms:
        c.close()


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("algo", [0, 1])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_loopback_add_rmsnorm(world, algo, dtype):
    comms = CustomAllReduce.loopback(world, "cuda", max_size=1 << 20, max_blocks=4)
    for c in comms:
        c.algo = algo
    for tokens, hidden in ((1, 64), (7, 1024), (13, 4096)):
        if tokens * hidden * 4 > 1 << 20:
            continue
        parts = [torch.randn(tokens, hidden, device="cuda").to(dtype) for _ in comms]
        residual = torch.randn(tokens, hidden, device="cuda").to(dtype)
        weight = torch.randn(hidden, device="cuda").to(dtype)
        xs, rs = [p.clone() for p in parts], [residual.clone() for _ in comms]
        _loopback_run(
            comms,
            lambda r, c, xs=xs, rs=rs, w=weight: all_reduce_add_rmsnorm(xs[r], rs[r], w, 1e-6, c),
        )
        r32 = _oracle_sum(parts) + residual.float()
        want_x = r32 * torch.rsqrt(r32.square().mean(-1, keepdim=True) + 1e-6) * weight.float()
        for x, res in zip(xs, rs, strict=True):
            assert torch.equal(res, r32.to(dtype))  # the sum of custom_all_reduce, bit for bit
            assert_close(x, want_x.to(dtype))
            assert torch.equal(x, xs[0])
    for c in comms:
        c.close()


@pytest.mark.gpu
def test_loopback_graph_registration():
    comms = CustomAllReduce.loopback(2, "cuda", max_size=1 << 20, max_blocks=4)
    parts = [torch.randn(4, 1024, device="cuda", dtype=torch.bfloat16) for _ in comms]
    outs = [torch.empty_like(p) for p in parts]
    _loopback_run(
        comms, lambda r, c, parts=parts, outs=outs: custom_all_reduce(parts[r], c, out=outs[r])
    )  # warm up
    streams = [torch.cuda.Stream() for _ in comms]
    graphs = [torch.cuda.CUDAGraph() for _ in comms]
    for r, (c, g) in enumerate(zip(comms, graphs, strict=True)):
        with torch.cuda.graph(g, stream=streams[r]):
            custom_all_reduce(parts[r], c, out=outs[r])
    for registered in (False, True):
        if registered:
            CustomAllReduce.loopback_register(comms)
        for p in parts:
            p.copy_(torch.randn_like(p))
        for o in outs:
            o.fill_(float("nan"))
        torch.cuda.synchronize()
        for r, g in enumerate(graphs):
            with torch.cuda.stream(streams[r]):
                g.replay()
        torch.cuda.synchronize()
        want = _oracle_sum(parts).to(torch.bfloat16)
        assert all(torch.equal(o, want) for o in outs)
    for c in comms:
        c.close()


@pytest.mark.gpu
def test_loopback_peer_missing_times_out():
    comms = CustomAllReduce.loopback(2, "cuda", max_size=1 << 20, timeout_s=0.2, max_blocks=2)
    x = torch.ones(1024, device="cuda")
    custom_all_reduce(x, comms[0])  # rank 1 never joins
    with pytest.raises(CommunicationError, match=r"rank 0 of 2 waited more than 0.2 s for rank 1"):
        comms[0].check(sync=True)
    with pytest.raises(CommunicationError, match="aborted"):
        custom_all_reduce(x, comms[0])
    for c in comms:
        c.close()
