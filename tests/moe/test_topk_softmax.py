"""moe.topk_softmax against a float64 oracle with explicit per-row selection: Mixtral, Qwen3 and
non-power-of-two expert counts, softcapping, correction bias, renormalisation, exact ties, NaN rows,
empty input, bad arguments, opcheck and torch.compile; every backend on CPU and GPU (poisoned
outputs, E up to 384, E not a power of two, many tokens per block, CUDA graphs)."""

from __future__ import annotations

import math

import pytest
import torch

from kernels_moe import reference, topk_softmax
from kernels_moe.ops.topk_softmax import CUDA_THREAD_MAX_EXPERTS
from shared.testing.compare import assert_close

BACKENDS = {"cpu": ("torch",), "cuda": ("cuda", "torch")}


def _device_params():
    return [
        pytest.param("cpu", id="cpu"),
        pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
    ]


def _spaced_logits(tokens: int, experts: int, seed: int) -> torch.Tensor:
    """Distinct logits at least 0.01 apart in every row, so fp32 and fp64 agree on the order."""
    g = torch.Generator().manual_seed(seed)
    rows = [torch.randperm(experts, generator=g).float() * 0.05 for _ in range(tokens)]
    return torch.stack(rows) - 0.025 * experts if rows else torch.empty(0, experts)


def _expected(gating, k, renormalize, softcap=0.0, bias=None):
    gating = gating.cpu()
    bias = None if bias is None else bias.cpu()
    weights, ids = [], []
    for row in gating.double().tolist():
        logits = [softcap * math.tanh(v / softcap) if softcap else v for v in row]
        if bias is not None:
            logits = [v + b for v, b in zip(logits, bias.double().tolist(), strict=True)]
        peak = max(logits)
        exps = [math.exp(v - peak) for v in logits]
        probs = [e / sum(exps) for e in exps]
        chosen = sorted(range(len(probs)), key=lambda e: (-probs[e], e))[:k]
        w = [probs[e] for e in chosen]
        if renormalize:
            w = [v / sum(w) for v in w]
        weights.append(w)
        ids.append(chosen)
    return (
        torch.tensor(weights, dtype=torch.float64).reshape(-1, k),
        torch.tensor(ids, dtype=torch.int32).reshape(-1, k),
    )


def _run(gating, k, renormalize=False, backend=None, **kwargs):
    w = torch.full((gating.shape[0], k), float("nan"), device=gating.device)
    ids = torch.full((gating.shape[0], k), -7, dtype=torch.int32, device=gating.device)
    out = topk_softmax(w, ids, gating, renormalize, backend=backend, **kwargs)
    assert out[0] is w and out[1] is ids
    return w, ids


CONFIGS = (  # (T, E, k): Mixtral, Qwen3-MoE, GPT-OSS, non-power-of-two E, k = E, one expert
    (5, 8, 2),
    (9, 128, 8),
    (4, 128, 4),
    (7, 60, 6),
    (3, 6, 6),
    (2, 1, 1),
    (11, 256, 8),  # DeepSeek-sized softmax routing: 8 experts per lane
    (6, 384, 8),  # 12 experts per lane
    (5, 33, 32),  # k = 32, one expert past a warp
    (3, 1000, 4),  # 32 experts per lane, a partial last slot
)


@pytest.mark.parametrize("device", _device_params())
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("config", CONFIGS, ids=str)
@pytest.mark.parametrize("renormalize", (False, True))
def test_matches_float64_oracle(device, dtype, config, renormalize):
    tokens, experts, k = config
    gating = _spaced_logits(tokens, experts, seed=experts).to(dtype).to(device)
    w_ref, ids_ref = _expected(gating, k, renormalize)
    for backend in BACKENDS[device]:
        w, ids = _run(gating, k, renormalize, backend=backend)
        assert_close(ids, ids_ref, name=f"{backend} ids")
        assert_close(w, w_ref.float(), name=f"{backend} weights")


@pytest.mark.parametrize("device", _device_params())
def test_softcap_and_correction_bias(device):
    gating = (_spaced_logits(6, 32, seed=1) * 4).to(device)
    bias = torch.linspace(-0.3, 0.3, 32)[
        torch.randperm(32, generator=torch.Generator().manual_seed(2))
    ]
    w_ref, ids_ref = _expected(gating, 4, True, softcap=3.0, bias=bias)
    for b in (bias, bias.bfloat16().float(), bias.bfloat16()):
        w_ref, ids_ref = _expected(gating, 4, True, softcap=3.0, bias=b.float())
        for backend in BACKENDS[device]:
            w, ids = _run(
                gating, 4, True, backend, moe_softcapping=3.0, correction_bias=b.to(device)
            )
            assert_close(ids, ids_ref, name=f"{backend} ids")
            assert_close(w, w_ref.float(), name=f"{backend} weights")


@pytest.mark.parametrize("device", _device_params())
def test_ties_go_to_the_lower_expert(device):
    gating = torch.tensor([[1.0, 3.0, 3.0, 0.0, 3.0], [2.0, 2.0, 2.0, 2.0, 2.0]], device=device)
    for backend in BACKENDS[device]:
        w, ids = _run(gating, 3, backend=backend)
        assert ids.tolist() == [[1, 2, 4], [0, 1, 2]]
        assert_close(w[1], torch.full((3,), 0.2, device=device))
    # Ties across lanes and slots of a wide row: experts 5, 40, 77, 300 share the maximum.
    wide = torch.zeros(2, 320, device=device)
    wide[:, [300, 77, 40, 5]] = 4.0
    for backend in BACKENDS[device]:
        _, ids = _run(wide, 6, backend=backend)
        assert ids.tolist() == [[5, 40, 77, 300, 0, 1]] * 2


@pytest.mark.parametrize("device", _device_params())
@pytest.mark.parametrize("config", ((7, 256, 8), (5, 256, 32), (6, 100, 12), (3, 384, 16)), ids=str)
def test_many_exact_ties_across_lanes_and_slots(device, config):
    """Integer logits in [0, 3]: each lane's slots and the warp's lanes hold many equal
    probabilities (equal logits give equal fp32 and fp64 probabilities, distinct ones stay far
    apart), so the per-lane sort and the head rounds must keep the lower expert first. T is not
    a multiple of the 4 tokens per block."""
    tokens, experts, k = config
    g = torch.Generator().manual_seed(experts + k)
    gating = torch.randint(0, 4, (tokens, experts), generator=g).float().to(device)
    w_ref, ids_ref = _expected(gating, k, True)
    for backend in BACKENDS[device]:
        w, ids = _run(gating, k, True, backend=backend)
        assert_close(ids, ids_ref, name=f"{backend} ids")
        assert_close(w, w_ref.float(), name=f"{backend} weights")


@pytest.mark.parametrize("device", _device_params())
def test_nan_logits_give_nan_weights(device):
    gating = torch.tensor([[0.0, float("nan"), 1.0], [0.0, 1.0, 2.0]], device=device)
    for backend in BACKENDS[device]:
        w, ids = _run(gating, 2, backend=backend)
        assert w[0].isnan().all() and not w[1].isnan().any()
        assert ((ids >= 0) & (ids < 3)).all()


@pytest.mark.parametrize("device", _device_params())
def test_strided_gating_and_empty(device):
    wide = _spaced_logits(4, 40, seed=3).to(device)
    gating = wide[:, 4:36]
    w_ref, ids_ref = _expected(gating, 3, False)
    for backend in BACKENDS[device]:
        w, ids = _run(gating, 3, backend=backend)
        assert_close(ids, ids_ref)
        assert_close(w, w_ref.float())
        w, ids = _run(torch.empty(0, 8, device=device), 2, backend=backend)
        assert w.shape == (0, 2) and ids.shape == (0, 2)


@pytest.mark.parametrize("device", _device_params())
@pytest.mark.parametrize(
    "experts,row,offset",
    (
        (256, 256, 0),  # 8 slots per lane
        (128, 128, 0),  # 4 slots per lane
        (100, 100, 0),  # lanes 4.. past E in the last slot
        (256, 260, 4),  # a padded, 16-byte aligned row
        (254, 254, 0),  # E % 4 != 0
        (256, 258, 0),  # row stride % 4 != 0
        (256, 260, 1),  # rows not 16-byte aligned
    ),
    ids=str,
)
@pytest.mark.parametrize("with_bias", (False, True), ids=("plain", "bias"))
def test_row_widths_strides_and_alignments(device, experts, row, offset, with_bias):
    """Rows of every width, stride and alignment (a float4 load path, since taken out, keyed on
    them) give the oracle's ids and weights, bias included."""
    wide = _spaced_logits(6, row + 4, seed=11).to(device)
    gating = wide[:, offset : offset + experts]
    g = torch.Generator().manual_seed(12)
    bias = (torch.rand(experts, generator=g) * 0.01).to(device) if with_bias else None
    w_ref, ids_ref = _expected(gating, 8, True, bias=bias)
    for backend in BACKENDS[device]:
        w, ids = _run(gating, 8, True, backend, correction_bias=bias)
        assert_close(ids, ids_ref, name=f"{backend} ids")
        assert_close(w, w_ref.float(), name=f"{backend} weights")


@pytest.mark.parametrize("device", _device_params())
def test_strided_outputs(device):
    gating = _spaced_logits(7, 64, seed=6).to(device)
    w_ref, ids_ref = _expected(gating, 4, True)
    for backend in BACKENDS[device]:
        w = torch.full((4, 7), float("nan"), device=device).t()
        ids = torch.full((7, 8), -7, dtype=torch.int32, device=device)[:, ::2]
        topk_softmax(w, ids, gating, True, backend=backend)
        assert_close(ids, ids_ref, name=backend)
        assert_close(w, w_ref.float(), name=backend)


@pytest.mark.parametrize("device", _device_params())
def test_rows_wider_than_66_logits(device):
    """Even rows: 4 logits near 0 and 252 distinct ones in [-82.6, -70] (probabilities below
    2^-96, where the kernel leaves its unchecked division for the plain one), so k = 8 ranks 4 of
    the tiny ones; odd rows are ordinary. Both paths meet in one block of 4 rows."""
    rows = []
    for t in range(8):
        g = torch.Generator().manual_seed(t)
        if t % 2:
            rows.append(torch.randperm(256, generator=g).float() * 0.05 - 6.4)
        else:
            tail = -70.0 - torch.randperm(252, generator=g).float() * 0.05
            rows.append(
                torch.cat([torch.tensor([0.0, -0.1, -0.2, -0.3]), tail])[
                    torch.randperm(256, generator=g)
                ]
            )
    gating = torch.stack(rows).to(device)
    for renormalize in (False, True):
        w_ref, ids_ref = _expected(gating, 8, renormalize)
        for backend in BACKENDS[device]:
            w, ids = _run(gating, 8, renormalize, backend)
            assert_close(ids, ids_ref, name=f"{backend} ids")
            assert_close(w, w_ref.float(), name=f"{backend} weights")


@pytest.mark.parametrize("device", _device_params())
@pytest.mark.parametrize(("experts", "offset"), ((256, -44.4), (512, -22.2), (128, -44.4)), ids=str)
def test_winners_around_the_narrow_key_range(device, experts, offset):
    """The kernel ranks 32-bit keys exact for probabilities >= 2^-64 (E <= 256; 2^-32 for E <=
    512, every probability for E <= 128) and redoes a row with 64-bit keys when a winner falls
    below: one logit at 0 and 7 near `offset` (probabilities near that bound, some repeated across
    lanes and slots), the rest at -100, so rows fall on both sides of it."""
    tokens, k = 13, 8
    g = torch.Generator().manual_seed(experts)
    gating = torch.full((tokens, experts), -100.0)
    for t in range(tokens):
        chosen = torch.randperm(experts, generator=g)[:8]
        gating[t, chosen[0]] = 0.0
        steps = torch.randint(-4, 5, (7,), generator=g).float()
        gating[t, chosen[1:]] = offset + 0.05 * steps
    gating = gating.to(device)
    for renormalize in (False, True):
        w_ref, ids_ref = _expected(gating, k, renormalize)
        for backend in BACKENDS[device]:
            w, ids = _run(gating, k, renormalize, backend)
            assert_close(ids, ids_ref, name=f"{backend} ids")
            assert_close(w, w_ref.float(), name=f"{backend} weights")


# --- Few experts: the CUDA kernel's thread-per-token path (E <= CUDA_THREAD_MAX_EXPERTS) ---------
# E 1..16 take it (slots padded to 4, 8 or 16: E = 4, 8, 16 fill them, odd E leave a partial
# 16-byte chunk for the element loads); 17 and 32 are the warp kernel just past it. T = 130 is
# three blocks of 64 threads, the last one partial.
FEW_EXPERTS = (*range(1, CUDA_THREAD_MAX_EXPERTS + 2), 32)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("experts", FEW_EXPERTS, ids=lambda e: f"E{e}")
def test_few_experts_every_k(dtype, experts):
    """Every k = 1..E, renormalised or not, distinct logits: ids exact, weights to fp32."""
    gating = _spaced_logits(130, experts, seed=100 + experts).to(dtype).cuda()
    for k in range(1, experts + 1):
        for renormalize in (False, True):
            w_ref, ids_ref = _expected(gating, k, renormalize)
            w, ids = _run(gating, k, renormalize, "cuda")
            assert_close(ids, ids_ref, name=f"k {k} ids")
            assert_close(w, w_ref.float(), name=f"k {k} weights")


@pytest.mark.gpu
@pytest.mark.parametrize("gating_dtype", (torch.float32, torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("bias_dtype", (torch.float32, torch.bfloat16, torch.float16), ids=str)
@pytest.mark.parametrize("experts", (3, 7, 8, 13, 16), ids=lambda e: f"E{e}")
def test_few_experts_softcap_and_bias(gating_dtype, bias_dtype, experts):
    """Softcap, then a bias of each dtype (read through its dtype code), with and without each
    other; k = 1, 2 and E."""
    gating = (_spaced_logits(70, experts, seed=experts) * 8).to(gating_dtype).cuda()
    g = torch.Generator().manual_seed(experts)
    bias = (torch.rand(experts, generator=g) * 0.6 - 0.3).to(bias_dtype)
    for softcap, b in ((3.0, None), (0.0, bias), (3.0, bias)):
        for k in sorted({1, min(2, experts), experts}):
            w_ref, ids_ref = _expected(gating, k, True, softcap=softcap, bias=b)
            kwargs = {"moe_softcapping": softcap}
            if b is not None:
                kwargs["correction_bias"] = b.cuda()
            w, ids = _run(gating, k, True, "cuda", **kwargs)
            assert_close(ids, ids_ref, name=f"softcap {softcap} k {k} ids")
            assert_close(w, w_ref.float(), name=f"softcap {softcap} k {k} weights")


@pytest.mark.gpu
@pytest.mark.parametrize("experts", (2, 5, 8, 11, 16), ids=lambda e: f"E{e}")
def test_few_experts_ties_go_to_the_lower_expert(experts):
    """Integer logits in [0, 2]: most rows hold equal probabilities (equal in fp32 and fp64), so
    the per-thread tree must keep the lower expert at every level; every k."""
    g = torch.Generator().manual_seed(experts)
    gating = torch.randint(0, 3, (97, experts), generator=g).float()
    gating[0] = 1.0  # one row all equal: ids 0, 1, ...
    gating = gating.cuda()
    for k in range(1, experts + 1):
        w_ref, ids_ref = _expected(gating, k, True)
        w, ids = _run(gating, k, True, "cuda")
        assert_close(ids, ids_ref, name=f"k {k} ids")
        assert_close(w, w_ref.float(), name=f"k {k} weights")
        assert ids[0].tolist() == list(range(k))


@pytest.mark.gpu
@pytest.mark.parametrize("experts", (1, 3, 8, 9, 16), ids=lambda e: f"E{e}")
def test_few_experts_nan_rows(experts):
    """Rows with a NaN, a +inf or only -inf logits among ordinary rows: NaN weights and ids
    0, 1, ... (the reference on the same device), the ordinary rows untouched."""
    gating = _spaced_logits(8, experts, seed=experts).cuda()
    gating[1, experts // 2] = float("nan")
    gating[3, experts - 1] = float("inf")
    gating[5] = float("-inf")
    nan_rows = torch.tensor([1, 3, 5])
    for k in sorted({1, min(2, experts), experts}):
        for renormalize in (False, True):
            w, ids = _run(gating, k, renormalize, "cuda")
            w_ref, ids_ref = reference.topk_softmax(gating, k, renormalize)
            assert w[nan_rows].isnan().all()
            assert ids[nan_rows].tolist() == [list(range(k))] * 3
            assert_close(ids, ids_ref, name=f"k {k} ids")
            assert_close(w, w_ref, name=f"k {k} weights")  # NaN where the reference is NaN


@pytest.mark.gpu
def test_few_experts_tiny_probabilities():
    """Logits over 66 below the row's peak (probabilities below 2^-96, where the kernel divides
    plainly instead of through one reciprocal) ranked among the k = E winners, beside ordinary
    rows in the same block."""
    rows = []
    for t in range(12):
        g = torch.Generator().manual_seed(t)
        if t % 2:
            rows.append(torch.randperm(8, generator=g).float() * 0.05)
        else:
            row = torch.tensor([0.0, -0.5, -70.0, -71.0, -75.5, -80.0, -85.0, -86.0])
            rows.append(row[torch.randperm(8, generator=g)])
    gating = torch.stack(rows).cuda()
    for renormalize in (False, True):
        w_ref, ids_ref = _expected(gating, 8, renormalize)
        w, ids = _run(gating, 8, renormalize, "cuda")
        assert_close(ids, ids_ref)
        assert_close(w, w_ref.float(), atol=0.0)  # the tiny weights to their own rtol


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize(
    "experts,row,offset",
    (  # what the rows allow (fp32 / bf16): 16-byte loads need every row start 16-byte aligned
        (8, 8, 0),  # vector: 2 whole chunks / 1
        (6, 6, 0),  # 24- / 12-byte rows: element loads
        (6, 8, 0),  # vector: 1 whole chunk, then 2 elements / element loads
        (5, 8, 0),  # vector: 1 chunk and 1 element / elements (no whole bf16 chunk)
        (8, 12, 0),  # padded rows: vector with a gap / 24-byte rows: elements
        (8, 12, 4),  # the same from a 16-byte aligned offset / an 8-byte one: elements
        (8, 9, 1),  # misaligned rows: elements
        (12, 16, 0),  # vector: 3 whole chunks / 1, then 4 elements
        (16, 24, 8),  # vector from a 32-byte offset / a 16-byte offset
        (16, 16, 0),
    ),
    ids=str,
)
def test_few_experts_strides_and_alignments(dtype, experts, row, offset):
    """Gating views of every alignment the thread path keys its 16-byte loads on, strided
    (transposed, every other column) outputs, T = 8195 tokens (129 blocks, a partial last)."""
    wide = _spaced_logits(8195, row, seed=row + offset).to(dtype).cuda()
    gating = wide[:, offset : offset + experts]
    k = min(3, experts)
    w_ref, ids_ref = reference.topk_softmax(gating, k, True)
    w = torch.full((k, gating.shape[0]), float("nan"), device="cuda").t()
    ids = torch.full((gating.shape[0], 2 * k), -7, dtype=torch.int32, device="cuda")[:, ::2]
    topk_softmax(w, ids, gating, True, backend="cuda")
    assert_close(ids, ids_ref)
    assert_close(w, w_ref)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16, torch.float16), ids=str)
def test_few_experts_many_tokens(dtype):
    """Mixtral's routing (E 8, k 2) at T = 65536 + 5 (1025 blocks: several per SM), random
    logits on a grid of 1/16 (exact in every dtype: equal logits tie exactly, distinct ones are
    far apart, so the kernel and torch's softmax rank alike): against the reference on the
    device."""
    g = torch.Generator().manual_seed(7)
    gating = ((torch.randn(65541, 8, generator=g) * 16).round() / 16).to(dtype).cuda()
    for renormalize in (False, True):
        w, ids = _run(gating, 2, renormalize, "cuda")
        w_ref, ids_ref = reference.topk_softmax(gating, 2, renormalize)
        assert_close(ids, ids_ref)
        assert_close(w, w_ref)


@pytest.mark.gpu
@pytest.mark.slow
def test_few_experts_memcheck():
    """compute-sanitizer memcheck over the thread path's load variants: whole 16-byte chunks,
    a partial last chunk read element by element, misaligned rows, padded rows, bias."""
    from shared.testing.builds import run_memcheck

    run_memcheck(
        "moe",
        """
import torch
from kernels_moe import topk_softmax
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for t, e, row, off, k in ((1, 8, 8, 0, 2), (65, 6, 6, 0, 6), (3, 5, 8, 0, 5), (4, 6, 8, 0, 6),
                              (7, 8, 9, 1, 2), (64, 16, 16, 0, 16), (9, 13, 16, 0, 4),
                              (2, 1, 1, 0, 1), (5, 3, 4, 0, 3), (70, 12, 12, 0, 8),
                              (3, 16, 24, 8, 5)):
        g = torch.randn(t, row, device="cuda").to(dtype)[:, off : off + e]
        topk_softmax(torch.empty(t, k, device="cuda"),
                     torch.empty(t, k, dtype=torch.int32, device="cuda"), g, True,
                     moe_softcapping=2.0, correction_bias=torch.randn(e, device="cuda").to(dtype))
torch.cuda.synchronize()
print("done")
""",
    )


@pytest.mark.gpu
def test_many_tokens_match_reference():
    """T = 8192 (2048 blocks of 4 warps), E = 256, distinct logits (no rounding ties): the CUDA
    kernel against the torch reference on the same device."""
    gating = _spaced_logits(8192, 256, seed=8).cuda()
    w, ids = _run(gating, 8, True, "cuda")
    w_ref, ids_ref = reference.topk_softmax(gating, 8, True)
    assert_close(ids, ids_ref)
    assert_close(w, w_ref)


@pytest.mark.gpu
def test_cuda_graph_and_compile():
    gating = _spaced_logits(64, 256, seed=9).cuda()
    w = torch.empty(64, 8, device="cuda")
    ids = torch.empty(64, 8, dtype=torch.int32, device="cuda")
    topk_softmax(w, ids, gating, True)  # builds and loads before capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        topk_softmax(w, ids, gating, True)
    w.fill_(float("nan"))
    ids.fill_(-7)
    graph.replay()
    torch.cuda.synchronize()
    w_ref, ids_ref = reference.topk_softmax(gating, 8, True)
    assert_close(ids, ids_ref)
    assert_close(w, w_ref)

    def route(g):
        a = torch.empty(g.shape[0], 8, device=g.device)
        b = torch.empty(g.shape[0], 8, dtype=torch.int32, device=g.device)
        topk_softmax(a, b, g * 2, True)
        return a, b

    wc, idc = torch.compile(route, fullgraph=True)(gating)
    w_ref, ids_ref = reference.topk_softmax(gating * 2, 8, True)
    assert_close(idc, ids_ref)
    assert_close(wc, w_ref)
    from kernels_moe.ops.topk_softmax import TOPK_SOFTMAX

    torch.library.opcheck(TOPK_SOFTMAX.torch_op, (w, ids, gating, True, 0.0, None, None))


def test_bad_arguments():
    gating = torch.randn(4, 8)
    w, ids = torch.empty(4, 2), torch.empty(4, 2, dtype=torch.int32)
    with pytest.raises(ValueError, match=r"topk_softmax: k = 9 must be <= the number of experts"):
        topk_softmax(torch.empty(4, 9), torch.empty(4, 9, dtype=torch.int32), gating)
    with pytest.raises(TypeError, match=r"topk_ids must have dtype in \(int32\), got int64"):
        topk_softmax(w, ids.long(), gating)
    with pytest.raises(ValueError, match=r"topk_weights must have T = 4 rows like gating"):
        topk_softmax(torch.empty(3, 2), ids, gating)
    with pytest.raises(ValueError, match=r"correction_bias must have shape \[8\] \(E\), got \[7\]"):
        topk_softmax(w, ids, gating, correction_bias=torch.zeros(7))
    with pytest.raises(TypeError, match="moe_softcapping must be a Python float, got Tensor"):
        topk_softmax(w, ids, gating, moe_softcapping=torch.tensor(1.0))


def test_opcheck():
    from kernels_moe.ops.topk_softmax import TOPK_SOFTMAX

    gating = _spaced_logits(5, 16, seed=4)
    w, ids = torch.empty(5, 4), torch.empty(5, 4, dtype=torch.int32)
    torch.library.opcheck(TOPK_SOFTMAX.torch_op, (w, ids, gating, True, 0.0, None, None))
    torch.library.opcheck(TOPK_SOFTMAX.torch_op, (w, ids, gating, False, 5.0, gating[0], None))


def test_torch_compile_fullgraph():
    """Inductor, so the custom op is traced, functionalised and lowered (about 5 s on CPU)."""

    def route(gating):
        w = torch.empty(gating.shape[0], 2)
        ids = torch.empty(gating.shape[0], 2, dtype=torch.int32)
        topk_softmax(w, ids, gating * 2, True)
        return w, ids

    gating = _spaced_logits(6, 8, seed=5)
    w, ids = torch.compile(route, fullgraph=True)(gating)
    w_ref, ids_ref = reference.topk_softmax(gating * 2, 2, True)
    assert_close(ids, ids_ref)
    assert_close(w, w_ref)
