"""diffusion.group_norm_silu against a float64 oracle written with explicit group reshapes (not
F.group_norm): group counts, spatial ranks and sizes incl. 1, channels-last inputs, half dtypes,
empty batches, bad input, opcheck."""

from __future__ import annotations

import pytest
import torch

from kernels_diffusion import group_norm_silu
from shared.testing.compare import assert_close


def oracle(x, groups, weight, bias, eps=1e-5):
    """x [N, C, *spatial] in float64."""
    n, c = x.shape[:2]
    xd = x.double().reshape(n, groups, -1)
    mean = xd.mean(-1, keepdim=True)
    var = ((xd - mean) ** 2).mean(-1, keepdim=True)
    y = ((xd - mean) / torch.sqrt(var + eps)).reshape(x.shape)
    shape = (1, c) + (1,) * (x.dim() - 2)
    y = y * weight.double().reshape(shape) + bias.double().reshape(shape)
    return (y * torch.sigmoid(y)).to(x.dtype)


def _inputs(shape, channels, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, generator=g) * 2 + 0.5).to(dtype)
    weight = torch.randn(channels, generator=g)
    bias = torch.randn(channels, generator=g)
    return x, weight, bias


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    ("shape", "groups"),
    [((1, 4, 1), 2), ((2, 32, 5, 7), 32), ((2, 64, 3, 3), 8), ((1, 12, 2, 3, 4), 3), ((3, 6), 6)],
)
def test_matches_oracle(dtype, shape, groups):
    x, weight, bias = _inputs(shape, shape[1], seed=sum(shape), dtype=dtype)
    got = group_norm_silu(x, groups, weight, bias)
    assert got.shape == x.shape and got.dtype == dtype
    assert_close(got, oracle(x, groups, weight, bias))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_channels_last(dtype):
    x, weight, bias = _inputs((2, 4, 5, 64), 64, seed=1, dtype=dtype)
    got = group_norm_silu(x, 16, weight, bias, 1e-6, channels_last=True)
    assert got.shape == x.shape
    expected = oracle(x.movedim(-1, 1), 16, weight, bias, eps=1e-6).movedim(1, -1)
    assert_close(got, expected)


def test_empty_and_bad_input():
    x, weight, bias = _inputs((0, 8, 4), 8, seed=2)
    assert group_norm_silu(x, 4, weight, bias).shape == (0, 8, 4)
    x, weight, bias = _inputs((2, 8, 4), 8, seed=3)
    with pytest.raises(ValueError, match=r"num_groups must be >= 1 and divide C = 8, got 3"):
        group_norm_silu(x, 3, weight, bias)
    with pytest.raises(ValueError, match=r"group_norm_silu: bias must have C = 8 entries, got 4"):
        group_norm_silu(x, 4, weight, bias[:4])
    with pytest.raises(ValueError, match=r"weight must have C = 4 entries, got 8"):
        group_norm_silu(x, 4, weight, bias, channels_last=True)
    with pytest.raises(ValueError, match=r"x must have >= 2 dims \[N, C, ...\], got shape \(8,\)"):
        group_norm_silu(x[0, :, 0], 4, weight, bias)


def test_opcheck():
    from kernels_diffusion.ops.group_norm_silu import GROUP_NORM_SILU

    x, weight, bias = _inputs((2, 8, 3, 3), 8, seed=4)
    out = torch.empty_like(x)
    torch.library.opcheck(GROUP_NORM_SILU.torch_op, (out, x, 4, weight, bias, 1e-5, False, None))


# The streamed CUDA kernel (x of at least _STREAM_MIN_BYTES; the tests lower the threshold) ----


def _gpu_inputs(shape, channels, dtype, w_dtype, seed):
    from shared.testing.inputs import randn

    x = randn(*shape, dtype=dtype, device="cuda", seed=seed, scale=2.0) + 0.5
    w = randn(channels, dtype=w_dtype, device="cuda", seed=seed + 1)
    b = randn(channels, dtype=w_dtype, device="cuda", seed=seed + 2)
    return x, w, b


def _spy_arrived(monkeypatch, threshold: str) -> list[torch.Tensor]:
    """Sets the module's `threshold` attribute to 0 and returns the list that collects the
    `arrived` buffer of each CUDA call (counters[N x G]: the ticket counter, > 0 only if the
    streamed or the staged kernel ran)."""
    from kernels_diffusion.ops import group_norm_silu as mod

    seen = []
    real = mod._group_norm_silu_kernels

    def spy(*args):
        seen.append(args[8])
        return real(*args)

    monkeypatch.setattr(mod, threshold, 0)
    monkeypatch.setattr(mod, "_group_norm_silu_kernels", spy)
    return seen


def _needs_sm90():
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the staged kernel needs sm_90+ (TMA bulk copies)")


@pytest.fixture
def streamed(monkeypatch):
    """Every CUDA call takes the streamed kernel (the staged one, which would take packed x of
    _STAGED_MIN_BYTES on sm_90+, off); yields the `arrived` buffers of the calls."""
    from kernels_diffusion.ops import group_norm_silu as mod

    monkeypatch.setattr(mod, "_STAGED_MIN_BYTES", -1)
    return _spy_arrived(monkeypatch, "_STREAM_MIN_BYTES")


def _groups_of(arrived: torch.Tensor) -> int:
    """N x G of a call, from its `arrived` buffer ([3 * N * G + 2])."""
    return (arrived.numel() - 2) // 3


def _ran_streamed(arrived: torch.Tensor) -> bool:
    """Whether the streamed (or the staged) kernel ran: its ticket counter moved."""
    torch.cuda.synchronize()
    return int(arrived[_groups_of(arrived)]) > 0


def _ran_staged(arrived: torch.Tensor) -> bool:
    """Whether the staged kernel ran: every group's word was published."""
    torch.cuda.synchronize()
    ng = _groups_of(arrived)
    at = (ng + 2) & ~1
    words = arrived[at : at + 2 * ng].view(ng, 2).cpu()
    return bool((words[:, 1] != 0).all())


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    ("shape", "groups", "channels_last"),
    [
        ((1, 4, 1), 2, False),  # one element a channel, one tile a group
        ((3, 6), 3, False),  # no spatial dims
        ((2, 32, 5, 7), 32, False),  # odd spatial: scalar units
        ((1, 12, 2, 3, 4), 3, False),
        ((2, 64, 8, 8), 8, False),
        ((1, 128, 64, 64), 32, False),  # 4 tiles a group (bf16), all stats before the norms
        ((2, 64, 300, 300), 32, False),  # tiles of 11 a group (bf16): stats and norms interleave
        ((1, 33, 2049), 3, False),  # groups of 22539 elements: a short last tile
        ((1, 16, 16, 128), 32, True),  # channels-last, 4 channels a group
        ((2, 40, 40, 96), 32, True),  # channels-last, 3 channels a group: scalar units
        ((1, 128, 128, 512), 32, True),  # channels-last, interleaved (bf16: 16 tiles a group)
    ],
)
@pytest.mark.parametrize("w_fp32", [False, True])
def test_streamed_kernel(streamed, dtype, shape, groups, channels_last, w_fp32):
    from kernels_diffusion import reference

    c = shape[-1] if channels_last else shape[1]
    x, w, b = _gpu_inputs(shape, c, dtype, torch.float32 if w_fp32 else dtype, seed=sum(shape))
    got = group_norm_silu(x, groups, w, b, channels_last=channels_last, backend="cuda")
    assert _ran_streamed(streamed[-1])
    expected = reference.group_norm_silu(x, groups, w, b, 1e-5, channels_last)
    assert_close(got, expected)
    # Misaligned x: the scalar units of the same kernel (more, shorter tiles).
    from shared.testing.inputs import misaligned

    got = group_norm_silu(misaligned(x), groups, w, b, channels_last=channels_last, backend="cuda")
    assert _ran_streamed(streamed[-1])
    assert_close(got, expected)
    ng = shape[0] * groups
    counters = streamed[-1].cpu()
    assert (counters[:ng] == counters[0]).all()  # every group arrived: its tile count


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", ["streamed", "staged"])
def test_large_offset_mean(request, kernel):
    """The shifted sums keep the variance accurate across the tiles of a group (fp64 combine),
    in the streamed and the staged kernel."""
    from kernels_diffusion import reference
    from shared.testing.inputs import randn

    if kernel == "staged":
        _needs_sm90()
    seen = request.getfixturevalue(kernel)
    x = randn(1, 64, 128, 128, device="cuda", seed=3) + 1000.0
    w, b = torch.ones(64, device="cuda"), torch.zeros(64, device="cuda")
    got = group_norm_silu(x, 32, w, b, backend="cuda")
    assert (_ran_staged if kernel == "staged" else _ran_streamed)(seen[-1])
    torch.testing.assert_close(got, reference.group_norm_silu(x, 32, w, b), atol=3e-4, rtol=1e-4)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("shape", "channels_last"),
    [((2, 64, 300, 300), False), ((1, 128, 128, 512), True), ((1, 64, 8, 256, 256), False)],
    ids=str,
)
def test_streamed_kernel_no_lag_margin(streamed, monkeypatch, shape, channels_last):
    """A lag of exactly one group (no margin): norm tiles follow their group's last stats tile
    as closely as the ticket order allows, so they wait on the arrivals (the release/acquire
    path that the default lag rarely exercises)."""
    from kernels_diffusion import reference
    from kernels_diffusion.ops import group_norm_silu as mod

    monkeypatch.setattr(mod, "_STREAM_LAG_EIGHTHS", 0)
    c = shape[-1] if channels_last else shape[1]
    x, w, b = _gpu_inputs(shape, c, torch.bfloat16, torch.bfloat16, seed=len(shape))
    expected = reference.group_norm_silu(x, 32, w, b, 1e-5, channels_last)
    for _ in range(3):  # the arrivals race differently each time
        got = group_norm_silu(x, 32, w, b, channels_last=channels_last, backend="cuda")
        assert _ran_streamed(streamed[-1])
        assert_close(got, expected)


@pytest.mark.gpu
def test_streamed_threshold_edges(streamed, monkeypatch):
    """x of exactly _STREAM_MIN_BYTES takes the streamed kernel, one byte more of threshold the
    one-read kernel; a negative threshold never streams."""
    from kernels_diffusion import reference
    from kernels_diffusion.ops import group_norm_silu as mod

    x, w, b = _gpu_inputs((2, 64, 40, 48), 64, torch.bfloat16, torch.bfloat16, seed=9)
    nbytes = x.numel() * x.element_size()
    seen = streamed
    expected = reference.group_norm_silu(x, 32, w, b)
    for threshold, streams in ((nbytes, True), (nbytes + 1, False), (-1, False), (0, True)):
        monkeypatch.setattr(mod, "_STREAM_MIN_BYTES", threshold)
        assert_close(group_norm_silu(x, 32, w, b, backend="cuda"), expected)
        assert _ran_streamed(seen[-1]) == streams, threshold


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 64, 8, 256, 256), (1, 128, 20, 256, 256)], ids=str)
def test_streamed_default_threshold_large(shape):
    """Shapes above the default threshold (67 MB, and the HunyuanVideo VAE shape, 335 MB of
    bf16: 32 groups of 320 tiles, stats and norms interleaved ~650 tiles apart) stream: through
    the staged kernel on sm_90+ (_STAGED_MIN_BYTES is the same threshold), else the streamed."""
    from kernels_diffusion import reference
    from kernels_diffusion.ops import group_norm_silu as mod

    x, w, b = _gpu_inputs(shape, shape[1], torch.bfloat16, torch.bfloat16, seed=11)
    assert x.numel() * x.element_size() >= mod._STREAM_MIN_BYTES
    got = group_norm_silu(x, 32, w, b, backend="cuda")
    expected = reference.group_norm_silu(x, 32, w, b)
    assert_close(got, expected)


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("shape", "channels_last"), [((1, 64, 300, 300), False), ((1, 64, 64, 256), True)]
)
def test_streamed_cuda_graph_replays(streamed, shape, channels_last):
    """Captured once, replayed twice on new inputs: the counters and the ticket counter are
    zeroed by a node of the graph, so every replay starts from zero."""
    from kernels_diffusion import reference

    c = shape[-1] if channels_last else shape[1]
    x, w, b = _gpu_inputs(shape, c, torch.bfloat16, torch.bfloat16, seed=5)
    group_norm_silu(x, 32, w, b, channels_last=channels_last, backend="cuda")  # warm up / build
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = group_norm_silu(x, 32, w, b, channels_last=channels_last, backend="cuda")
    for seed in (6, 7):
        x.copy_(_gpu_inputs(shape, c, torch.bfloat16, torch.bfloat16, seed=seed)[0])
        out.fill_(float("nan"))
        graph.replay()
        assert _ran_streamed(streamed[-1])
        assert_close(out, reference.group_norm_silu(x, 32, w, b, 1e-5, channels_last))


# The staged CUDA kernel (packed NC* x of at least _STAGED_MIN_BYTES on sm_90+) ----------------


@pytest.fixture
def staged(monkeypatch):
    """Every CUDA call may take the staged kernel; yields the `arrived` buffers of the calls."""
    return _spy_arrived(monkeypatch, "_STAGED_MIN_BYTES")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    ("shape", "groups"),
    [
        ((1, 4, 8), 2),  # one pack a channel, a short tile a group
        ((2, 64, 8, 8), 8),
        ((1, 128, 64, 64), 32),  # one tile a group (bf16)
        ((2, 64, 300, 300), 32),  # 11 tiles a group (bf16), the last short
        ((1, 48, 1000, 16), 3),  # 16 channels a group: tiles across channels
    ],
)
@pytest.mark.parametrize("w_fp32", [False, True])
def test_staged_kernel(staged, dtype, shape, groups, w_fp32):
    from kernels_diffusion import reference

    _needs_sm90()
    x, w, b = _gpu_inputs(shape, shape[1], dtype, torch.float32 if w_fp32 else dtype, seed=7)
    out = torch.full_like(x, float("nan"))
    from kernels_diffusion.ops.group_norm_silu import GROUP_NORM_SILU

    GROUP_NORM_SILU.run(out, x, groups, w, b, 1e-5, False, backend="cuda")
    assert _ran_staged(staged[-1])
    assert_close(out, reference.group_norm_silu(x, groups, w, b, 1e-5, False))
    ng = shape[0] * groups
    counters = staged[-1].cpu()
    assert (counters[:ng] == counters[0]).all()  # every group arrived: its tile count


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("shape", "channels_last", "aligned"),
    [((2, 32, 5, 7), False, True), ((1, 16, 16, 128), True, True), ((2, 64, 40, 48), False, False)],
)
def test_staged_kernel_not_taken(staged, shape, channels_last, aligned):
    """Scalar units (odd spatial sizes, misaligned x) and channels-last x stream instead."""
    from kernels_diffusion import reference
    from shared.testing.inputs import misaligned

    _needs_sm90()
    c = shape[-1] if channels_last else shape[1]
    x, w, b = _gpu_inputs(shape, c, torch.bfloat16, torch.bfloat16, seed=8)
    xx = x if aligned else misaligned(x)
    got = group_norm_silu(xx, 32, w, b, channels_last=channels_last, backend="cuda")
    assert not _ran_staged(staged[-1])
    assert_close(got, reference.group_norm_silu(x, 32, w, b, 1e-5, channels_last))


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(1, 64, 8, 256, 256), (1, 128, 20, 256, 256)], ids=str)
def test_staged_kernel_large(staged, shape):
    """The benchmark's shapes (67 MB; the HunyuanVideo VAE's 335 MB of bf16: 32 groups of 320
    tiles), repeated: the arrivals and the group words race differently each time."""
    from kernels_diffusion import reference

    _needs_sm90()
    x, w, b = _gpu_inputs(shape, shape[1], torch.bfloat16, torch.bfloat16, seed=12)
    expected = reference.group_norm_silu(x, 32, w, b)
    for _ in range(2):
        got = group_norm_silu(x, 32, w, b, backend="cuda")
        assert _ran_staged(staged[-1])
        assert_close(got, expected)


@pytest.mark.gpu
def test_staged_cuda_graph_replays(staged):
    """Captured once, replayed on new inputs: the counters and the group words are zeroed by a
    node of the graph."""
    from kernels_diffusion import reference

    _needs_sm90()
    shape = (1, 64, 300, 300)
    x, w, b = _gpu_inputs(shape, 64, torch.bfloat16, torch.bfloat16, seed=5)
    group_norm_silu(x, 32, w, b, backend="cuda")  # warm up / build
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = group_norm_silu(x, 32, w, b, backend="cuda")
    for seed in (6, 7):
        x.copy_(_gpu_inputs(shape, 64, torch.bfloat16, torch.bfloat16, seed=seed)[0])
        out.fill_(float("nan"))
        graph.replay()
        assert _ran_staged(staged[-1])
        assert_close(out, reference.group_norm_silu(x, 32, w, b))
