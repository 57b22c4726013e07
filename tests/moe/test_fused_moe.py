"""moe.fused_moe: the reference against a naive per-slot loop with the same rounding points; the
Triton backend under the interpreter (CPU, tiny shapes) and on the GPU against the reference
(Mixtral and DeepSeek-style shapes at small T, odd shapes, -1 slots, fp16/bf16, gelu, weight on
input, out= and in place), CUDA-graph capture, torch.compile(fullgraph=True), opcheck, the config
table and its lookup, bad arguments."""

from __future__ import annotations

import json

import pytest
import torch

from kernels_moe import fused_moe, reference
from shared.testing.compare import assert_close
from shared.testing.devices import GPU, TRITON_DEVICES
from shared.testing.inputs import poison

# The Triton kernel accumulates the GEMMs in another order than the reference, so a value near a
# rounding boundary of the two intermediate roundings (GEMM1, activation) can land one ulp apart
# and carry through the down GEMM: bf16 gets twice its output tolerance (the L2 bound stays).
TOL = {
    torch.bfloat16: {"atol": 3.2e-2, "rtol": 3.2e-2},
    torch.float16: {"atol": 2e-3, "rtol": 2e-3},
}


def _expert_weights(shape, scale, dtype, device, g, seed):
    """On the CPU from the shared generator `g`; on the GPU drawn there, in the dtype: DeepSeek's
    w1 and w2 (11e9 values) took tens of seconds a test when drawn on the host in fp32."""
    if torch.device(device).type == "cpu":
        return (torch.randn(*shape, generator=g) * scale).to(dtype)
    gen = torch.Generator(device=device).manual_seed(seed)
    return torch.randn(*shape, generator=gen, dtype=dtype, device=device).mul_(scale)


def _inputs(tokens, k, experts, dim, inter, dtype, device="cpu", seed=0, filtered=True):
    g = torch.Generator().manual_seed(seed)
    hidden = (torch.randn(tokens, dim, generator=g) * 0.5).to(dtype).to(device)
    w1 = _expert_weights((experts, 2 * inter, dim), dim**-0.5, dtype, device, g, seed)
    w2 = _expert_weights((experts, dim, inter), inter**-0.5, dtype, device, g, seed + 1)
    low = -1 if filtered else 0
    ids = torch.randint(low, experts, (tokens, k), generator=g, dtype=torch.int32).to(device)
    weights = torch.rand(tokens, k, generator=g).to(device)
    return hidden, w1, w2, weights, ids


def _naive(hidden, w1, w2, weights, ids, activation="silu", on_input=False, scale=1.0):
    """One slot at a time, the rounding points of OPS.md spelled out."""
    dtype, inter = hidden.dtype, w2.shape[2]
    tokens, k = ids.shape
    out = torch.zeros(tokens, hidden.shape[1], dtype=torch.float32)
    for t in range(tokens):
        for j in range(k):
            e = int(ids[t, j])
            if e < 0:
                continue
            x = hidden[t].cpu().float()
            w = float(weights[t, j])
            if on_input:
                x = (x * w).to(dtype).float()
            gu = (w1[e].cpu().float() @ x).to(dtype).float()
            gate, up = gu[:inter], gu[inter:]
            a = (
                torch.nn.functional.silu(gate)
                if activation == "silu"
                else torch.nn.functional.gelu(gate)
            )
            a = (a * up).to(dtype).float()
            y = w2[e].cpu().float() @ a
            if not on_input:
                y = y * w
            out[t] += y.to(dtype).float()
    return (out * scale).to(dtype)


@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("activation", ("silu", "gelu"))
@pytest.mark.parametrize("on_input", (False, True))
def test_reference_matches_naive_loop(dtype, activation, on_input):
    args = _inputs(7, 3, 5, 48, 40, dtype, seed=1)
    got = reference.fused_moe(*args, activation, on_input, 2.5)
    assert_close(got, _naive(*args, activation=activation, on_input=on_input, scale=2.5))


def test_reference_filtered_slots_give_zeros():
    hidden, w1, w2, weights, ids = _inputs(4, 2, 3, 32, 16, torch.bfloat16, seed=2)
    ids[1] = -1
    out = reference.fused_moe(hidden, w1, w2, weights, ids)
    assert (out[1] == 0).all()
    ids[:] = -1
    assert (reference.fused_moe(hidden, w1, w2, weights, ids) == 0).all()


def test_reference_rejects_out_of_range_ids():
    hidden, w1, w2, weights, ids = _inputs(3, 2, 4, 32, 16, torch.bfloat16)
    ids[0, 1] = 4
    with pytest.raises(ValueError, match=r"moe.fused_moe: topk_ids must lie in \[-1, 4\)"):
        fused_moe(hidden, w1, w2, weights, ids)
    ids[0, 1] = -2
    with pytest.raises(ValueError, match="found -2"):
        fused_moe(hidden, w1, w2, weights, ids)


def _run(device, out, *args):
    """The Triton backend: called directly under the interpreter (CPU tensors, where dispatch
    would pick the reference), through the public function on the GPU."""
    if device == "cpu":
        from kernels_moe.ops import fused_moe as m

        m._fused_moe_triton(out, *args)
    else:
        fused_moe(
            *args[:5],
            activation=args[5],
            apply_router_weight_on_input=args[6],
            routed_scaling_factor=args[7],
            out=out,
            backend="triton",
        )
    return out


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize("tokens", range(1, 10))
def test_triton_tiny(device, tokens):
    """E 4, k 2, H 64, I 32: every T from 1 to 9 (blocks of one expert, padding, -1 slots)."""
    args = _inputs(tokens, 2, 4, 64, 32, torch.bfloat16, device, seed=tokens)
    out = poison(torch.empty(tokens, 64, dtype=torch.bfloat16, device=device))
    _run(device, out, *args, "silu", False, 1.0)
    assert_close(out, reference.fused_moe(*args), **TOL[torch.bfloat16])


@pytest.mark.parametrize("device", TRITON_DEVICES)
@pytest.mark.parametrize(
    ("dtype", "activation", "on_input", "dim", "inter"),
    [
        (torch.float16, "silu", False, 64, 32),
        (torch.float16, "gelu", False, 64, 32),
        (torch.bfloat16, "gelu", True, 64, 32),
        (torch.bfloat16, "silu", False, 80, 24),  # K not a multiple of BLOCK_K, N tail
    ],
    ids=str,
)
def test_triton_variants(device, dtype, activation, on_input, dim, inter):
    args = _inputs(5, 2, 4, dim, inter, dtype, device, seed=dim + inter)
    out = poison(torch.empty(5, dim, dtype=dtype, device=device))
    _run(device, out, *args, activation, on_input, 2.5)
    expected = reference.fused_moe(*args, activation, on_input, 2.5)
    assert_close(out, expected, **TOL[dtype])


@pytest.mark.parametrize("device", TRITON_DEVICES)
def test_triton_filtered_and_k_above_t(device):
    """A token with every slot -1 sums zero rows; k = 4 > T = 2; one expert gets nothing."""
    hidden, w1, w2, weights, ids = _inputs(2, 4, 4, 64, 32, torch.bfloat16, device, seed=9)
    ids[0] = -1
    ids[1] = torch.tensor([0, 2, -1, 0], dtype=torch.int32)
    out = poison(torch.empty(2, 64, dtype=torch.bfloat16, device=device))
    _run(device, out, hidden, w1, w2, weights, ids, "silu", False, 1.0)
    assert (out[0] == 0).all()
    assert_close(out, reference.fused_moe(hidden, w1, w2, weights, ids), **TOL[torch.bfloat16])


# --- GPU -----------------------------------------------------------------------------------------

MODELS = {
    "mixtral": (8, 2, 4096, 14336),
    "deepseek": (256, 8, 7168, 2048),
}


@pytest.mark.gpu
@pytest.mark.parametrize("model", sorted(MODELS))
@pytest.mark.parametrize("tokens", (1, 3, 16, 64))
def test_gpu_model_shapes(model, tokens):
    experts, k, dim, inter = MODELS[model]
    hidden, w1, w2, weights, ids = _inputs(
        tokens, k, experts, dim, inter, torch.bfloat16, "cuda", seed=tokens, filtered=False
    )
    out = poison(torch.empty(tokens, dim, dtype=torch.bfloat16, device="cuda"))
    fused_moe(hidden, w1, w2, weights, ids, out=out, backend="triton")
    assert_close(out, reference.fused_moe(hidden, w1, w2, weights, ids), **TOL[torch.bfloat16])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize(
    ("tokens", "k", "experts", "dim", "inter"),
    [(1, 1, 1, 64, 16), (37, 3, 5, 200, 72), (129, 8, 16, 136, 104), (300, 2, 7, 72, 328)],
    ids=str,
)
def test_gpu_odd_shapes(dtype, tokens, k, experts, dim, inter):
    args = _inputs(tokens, k, experts, dim, inter, dtype, "cuda", seed=tokens)
    for activation, on_input in (("silu", False), ("gelu", True)):
        out = poison(torch.empty(tokens, dim, dtype=dtype, device="cuda"))
        _run("cuda", out, *args, activation, on_input, 0.5)
        assert_close(out, reference.fused_moe(*args, activation, on_input, 0.5), **TOL[dtype])


@pytest.mark.gpu
def test_gpu_large_t_default_and_table_configs():
    """T past the decode buckets (BLOCK_M 64/128 configs) on a shape with and one without a
    table entry."""
    for experts, k, dim, inter, tokens in ((8, 2, 4096, 14336, 600), (12, 4, 512, 384, 2000)):
        args = _inputs(tokens, k, experts, dim, inter, torch.bfloat16, "cuda", seed=3)
        out = poison(torch.empty(tokens, dim, dtype=torch.bfloat16, device="cuda"))
        _run("cuda", out, *args, "silu", False, 1.0)
        assert_close(out, reference.fused_moe(*args), **TOL[torch.bfloat16])


@pytest.mark.gpu
def test_gpu_inplace_and_strided_out():
    hidden, w1, w2, weights, ids = _inputs(9, 2, 4, 128, 64, torch.bfloat16, "cuda", seed=4)
    expected = reference.fused_moe(hidden, w1, w2, weights, ids)
    wide = torch.zeros(9, 160, dtype=torch.bfloat16, device="cuda")
    out = wide[:, 16:144]
    assert fused_moe(hidden, w1, w2, weights, ids, out=out) is out
    assert_close(out, expected, **TOL[torch.bfloat16])
    assert (wide[:, :16] == 0).all() and (wide[:, 144:] == 0).all()
    h = hidden.clone()
    assert fused_moe(h, w1, w2, weights, ids, inplace=True) is h
    assert_close(h, expected, **TOL[torch.bfloat16])


@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    hidden, w1, w2, weights, ids = _inputs(16, 2, 8, 256, 128, torch.bfloat16, "cuda", seed=5)
    out = torch.empty(16, 256, dtype=torch.bfloat16, device="cuda")
    fused_moe(hidden, w1, w2, weights, ids, out=out)  # compiles the kernels before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fused_moe(hidden, w1, w2, weights, ids, out=out)
    poison(out)
    ids.copy_(torch.randint(-1, 8, ids.shape, dtype=torch.int32, device="cuda"))  # new routing
    graph.replay()
    torch.cuda.synchronize()
    assert_close(out, reference.fused_moe(hidden, w1, w2, weights, ids), **TOL[torch.bfloat16])


@pytest.mark.gpu
def test_gpu_torch_compile_fullgraph():
    args = _inputs(6, 2, 4, 128, 64, torch.bfloat16, "cuda", seed=6)
    compiled = torch.compile(
        lambda h, a, b, w, i: fused_moe(h, a, b, w, i, routed_scaling_factor=2.5) * 2,
        fullgraph=True,
    )
    expected = reference.fused_moe(*args, "silu", False, 2.5) * 2
    assert_close(compiled(*args), expected, **TOL[torch.bfloat16])


def test_torch_compile_fullgraph_cpu_inplace():
    args = _inputs(5, 2, 4, 32, 16, torch.bfloat16, seed=7)
    expected = reference.fused_moe(*args, "gelu", False, 1.0)

    def fn(h, a, b, w, i):
        h = h.clone()
        fused_moe(h, a, b, w, i, activation="gelu", inplace=True)
        return h

    compiled = torch.compile(fn, fullgraph=True, backend="aot_eager")
    assert_close(compiled(*args), expected)


@pytest.mark.parametrize("device", ["cpu", GPU])
def test_opcheck(device):
    from kernels_moe.ops.fused_moe import FUSED_MOE

    hidden, w1, w2, weights, ids = _inputs(4, 2, 3, 32, 16, torch.bfloat16, device)
    out = torch.empty(4, 32, dtype=torch.bfloat16, device=device)
    torch.library.opcheck(
        FUSED_MOE.torch_op, (out, hidden, w1, w2, weights, ids, "silu", False, 1.0, None)
    )


@pytest.mark.parametrize("device", ["cpu", GPU])
def test_empty_tokens(device):
    hidden, w1, w2, weights, ids = _inputs(0, 2, 3, 32, 16, torch.float16, device)
    out = fused_moe(hidden, w1, w2, weights, ids)
    assert out.shape == (0, 32) and out.dtype == torch.float16


def test_bad_arguments():
    hidden, w1, w2, weights, ids = _inputs(3, 2, 4, 32, 16, torch.bfloat16)
    op = "moe.fused_moe"
    with pytest.raises(TypeError, match=f"{op}: hidden must have dtype in"):
        fused_moe(hidden.float(), w1, w2, weights, ids)
    with pytest.raises(TypeError, match=f"{op}: w1 must have dtype in \\(bfloat16\\)"):
        fused_moe(hidden, w1.half(), w2, weights, ids)
    with pytest.raises(TypeError, match=f"{op}: topk_ids must have dtype in \\(int32\\)"):
        fused_moe(hidden, w1, w2, weights, ids.long())
    with pytest.raises(TypeError, match=f"{op}: topk_weights must have dtype in \\(float32\\)"):
        fused_moe(hidden, w1, w2, weights.half(), ids)
    with pytest.raises(ValueError, match=f"{op}: w1 must be \\[E, 2I, H\\] with H = 32"):
        fused_moe(hidden, w1[:, :, :16], w2, weights, ids)
    with pytest.raises(ValueError, match=f"{op}: w1 must be \\[E, 2I, H\\] with an even 2I"):
        fused_moe(hidden, w1[:, :31], w2, weights, ids)
    with pytest.raises(ValueError, match=f"{op}: w2 must be \\[E, H, I\\]"):
        fused_moe(hidden, w1, w2[:, :, :8], weights, ids)
    with pytest.raises(ValueError, match=f"{op}: topk_ids must be \\[T, k\\] with T = 3"):
        fused_moe(hidden, w1, w2, weights[:2], ids[:2])
    with pytest.raises(ValueError, match=f"{op}: topk_weights must have the shape of topk_ids"):
        fused_moe(hidden, w1, w2, weights[:, :1], ids)
    with pytest.raises(ValueError, match=f"{op}: hidden must have a contiguous last dim"):
        fused_moe(hidden.t().contiguous().t(), w1, w2, weights, ids)
    with pytest.raises(ValueError, match=f"{op}: activation must be one of"):
        fused_moe(hidden, w1, w2, weights, ids, activation="relu")
    with pytest.raises(ValueError, match=f"{op}: pass either out= or inplace=True"):
        fused_moe(hidden, w1, w2, weights, ids, out=torch.empty_like(hidden), inplace=True)
    with pytest.raises(ValueError, match=f"{op}: out must have shape"):
        fused_moe(hidden, w1, w2, weights, ids, out=torch.empty(3, 16, dtype=torch.bfloat16))
    with pytest.raises(TypeError, match=f"{op}: routed_scaling_factor must be a Python float"):
        fused_moe(hidden, w1, w2, weights, ids, routed_scaling_factor=None)


def test_debug_checks_flag_out_of_range_ids(monkeypatch):
    from kernels_moe.ops import fused_moe as m

    hidden, w1, w2, weights, ids = _inputs(3, 2, 4, 32, 16, torch.bfloat16)
    ids[2, 0] = 7
    monkeypatch.setenv("KERNELS_DEBUG_CHECKS", "1")
    assert m._debug_checks()
    with pytest.raises(ValueError, match="found 7"):
        fused_moe(hidden, w1, w2, weights, ids, backend="torch")


# --- configs -------------------------------------------------------------------------------------


def test_config_table_is_well_formed():
    from kernels_moe.triton_kernels import fused_moe as kernels

    path = kernels.config_path("NVIDIA H200")
    table = json.loads(path.read_text())
    assert kernels.shape_key(8, 14336, 4096, torch.bfloat16) in table
    assert kernels.shape_key(256, 2048, 7168, torch.bfloat16) in table
    for buckets in table.values():
        assert buckets and all(int(t) >= 1 for t in buckets)
        for config in buckets.values():
            assert config["BLOCK_M"] in (16, 32, 64, 128)
            for gemm in ("gate_up", "down"):
                assert set(config[gemm]) == set(kernels.GEMM_KEYS)
                for key in ("BLOCK_N", "BLOCK_K"):
                    assert config[gemm][key] in (16, 32, 64, 128, 256)


def test_config_lookup():
    from kernels_moe.triton_kernels import fused_moe as kernels

    buckets = {"1": "a", "16": "b", "64": "c"}
    assert [kernels.nearest_bucket(buckets, t) for t in (1, 8, 9, 40, 41, 5000)] == list("aabbcc")
    small = kernels.default_config(1, 2, 8, 14336, 4096)
    large = kernels.default_config(16384, 2, 8, 14336, 4096)
    assert small["BLOCK_M"] == 16 and large["BLOCK_M"] == 128
    assert kernels.get_config(4, 2, 8, 64, 32, torch.bfloat16, torch.device("cpu")) == (
        kernels.interpreter_config()
    )
