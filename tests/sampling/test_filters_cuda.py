"""The CUDA backends of top_k_renorm_probs, top_p_renorm_probs, min_p_renorm_probs and
top_k_mask_logits (csrc/filters.cuh) against the torch reference on the same device: odd and
large vocabularies, every dtype, strided and misaligned rows, per-row parameters, ties, invalid
rows, CUDA graphs and torch.compile. Every test here runs on the GPU only."""

from __future__ import annotations

import pytest
import torch

from kernels_sampling import (
    min_p_renorm_probs,
    reference,
    top_k_mask_logits,
    top_k_renorm_probs,
    top_p_renorm_probs,
)
from shared.testing.compare import assert_close
from shared.testing.graphs import eager_and_replayed
from shared.testing.inputs import FLOAT_DTYPES, misaligned, row_strided

pytestmark = pytest.mark.gpu

SHAPES = [(1, 1), (3, 7), (5, 333), (4, 4096), (2, 4099), (3, 128256)]
LAYOUTS = ["contiguous", "row_strided", "misaligned"]


def _layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    if layout == "row_strided":
        return row_strided(t, extra=8)
    if layout == "misaligned":
        return misaligned(t)
    return t


def _logits(b: int, v: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, v, generator=g) * 3).to(device="cuda", dtype=dtype)


def _probs(b: int, v: int, seed: int, dtype=torch.float32) -> torch.Tensor:
    return _logits(b, v, seed).softmax(dim=1).to(dtype)


def _ambiguous_top_p(probs: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """bool [B, V]: entries whose float64 S_gt lies within rounding of top_p (either way ok)."""
    p = probs.double()
    asc = p.sort(dim=1).values
    suffix = asc.flip(1).cumsum(1).flip(1)
    suffix = torch.cat([suffix, suffix.new_zeros(p.shape[0], 1)], dim=1)
    s_gt = suffix.gather(1, torch.searchsorted(asc, p, right=True))
    return (s_gt - top_p.double()[:, None]).abs() < 1e-5 * (1 + p.sum(1, keepdim=True))


def _check_top_p(got: torch.Tensor, probs: torch.Tensor, top_p) -> None:
    tp = reference._per_row(top_p, probs.shape[0], torch.float32, probs.device)
    expected = reference.top_p_renorm_probs(probs, top_p)
    ambiguous = _ambiguous_top_p(probs.float(), tp)
    rows_ok = ~ambiguous.any(dim=1)
    # Rows without a near-tie with top_p: the reference exactly (up to the sum's rounding).
    assert_close(got[rows_ok], expected[rows_ok])
    # Rows with one: the same kept set outside the ambiguous entries, renormalised.
    if (~rows_ok).any():
        g, p, amb = got[~rows_ok], probs[~rows_ok].float(), ambiguous[~rows_ok]
        ref_keep = expected[~rows_ok].float() > 0
        assert torch.equal((g.float() > 0)[~amb], ref_keep[~amb])
        kept = torch.where(g.float() > 0, p.double(), 0.0)
        total = kept.sum(1, keepdim=True)
        # Bad rows (NaN out) and all-zero rows keep nothing: their outcome is the reference's.
        renormed = torch.where(total > 0, kept / total, expected[~rows_ok].double())
        assert_close(g, renormed.to(g.dtype))


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize(("b", "v"), SHAPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_top_k_renorm_matches_reference(dtype, b, v, layout):
    probs = _layout(_probs(b, v, seed=b * 7 + v, dtype=dtype), layout)
    for k in (-1, 0, 1, 5, 50, v - 1, v, v + 3):
        got = top_k_renorm_probs(probs, k, backend="cuda")
        assert_close(got, reference.top_k_renorm_probs(probs, k), name=f"k={k}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize(("b", "v"), SHAPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_top_k_mask_logits_matches_reference(dtype, b, v, layout):
    logits = _layout(_logits(b, v, seed=b * 11 + v, dtype=dtype), layout)
    for k in (-1, 0, 1, 5, 50, v - 1, v):
        got = top_k_mask_logits(logits, k, backend="cuda")
        assert torch.equal(got, reference.top_k_mask_logits(logits, k)), f"k={k}"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize(("b", "v"), SHAPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_min_p_matches_reference(dtype, b, v, layout):
    probs = _layout(_probs(b, v, seed=b * 13 + v, dtype=dtype), layout)
    for mp in (0.0, 0.05, 0.3, 1.0):
        got = min_p_renorm_probs(probs, mp, backend="cuda")
        assert_close(got, reference.min_p_renorm_probs(probs, mp), name=f"min_p={mp}")


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize(("b", "v"), SHAPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_top_p_matches_reference(dtype, b, v, layout):
    probs = _layout(_probs(b, v, seed=b * 17 + v, dtype=dtype), layout)
    for p in (-0.5, 0.0, 0.1, 0.5, 0.9, 0.999, 1.0, 2.0):
        _check_top_p(top_p_renorm_probs(probs, p, backend="cuda"), probs, p)


def test_per_row_parameters():
    b, v = 8, 5000
    probs = _probs(b, v, seed=1)
    logits = _logits(b, v, seed=2)
    for dtype in (torch.int32, torch.int64):
        ks = torch.tensor([1, 2, 0, -3, v, v - 1, 64, 1000], dtype=dtype, device="cuda")
        assert_close(
            top_k_renorm_probs(probs, ks, backend="cuda"), reference.top_k_renorm_probs(probs, ks)
        )
        assert torch.equal(
            top_k_mask_logits(logits, ks, backend="cuda"), reference.top_k_mask_logits(logits, ks)
        )
    tps = torch.tensor([0.0, -1.0, 0.2, 0.5, 0.9, 0.95, 1.0, 3.0], device="cuda")
    _check_top_p(top_p_renorm_probs(probs, tps, backend="cuda"), probs, tps)
    mps = torch.tensor([0.0, 0.01, 0.1, 0.5, 0.9, 1.0, 0.3, 0.05], device="cuda")
    assert_close(
        min_p_renorm_probs(probs, mps, backend="cuda"), reference.min_p_renorm_probs(probs, mps)
    )


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_ties(dtype):
    """Quantized values: long runs of equal values are kept or dropped together."""
    g = torch.Generator().manual_seed(5)
    raw = torch.randint(0, 16, (6, 3000), generator=g).float()
    probs = (raw / raw.sum(1, keepdim=True)).to(device="cuda", dtype=dtype)
    logits = (raw - 8).to(device="cuda", dtype=dtype)
    ks = torch.tensor([1, 10, 100, 187, 1500, 2999], device="cuda")
    assert_close(
        top_k_renorm_probs(probs, ks, backend="cuda"), reference.top_k_renorm_probs(probs, ks)
    )
    assert torch.equal(
        top_k_mask_logits(logits, ks, backend="cuda"), reference.top_k_mask_logits(logits, ks)
    )
    for mp in (0.1, 0.5, 1.0):
        got = min_p_renorm_probs(probs, mp, backend="cuda")
        assert_close(got, reference.min_p_renorm_probs(probs, mp))
    for p in (0.0, 0.3, 0.9):
        _check_top_p(top_p_renorm_probs(probs, p, backend="cuda"), probs, p)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_invalid_rows_become_nan_and_zero_rows_stay_zero(dtype):
    probs = _probs(7, 1031, seed=9).clone()
    probs[1, 5] = float("nan")
    probs[2, 700] = float("inf")
    probs[3, 1] = -1e-3
    probs[4] = 0.0
    probs[5, 3] = -0.0  # not negative: a valid row
    probs = probs.to(dtype)
    for k in (0, 10):
        assert_close(
            top_k_renorm_probs(probs, k, backend="cuda"), reference.top_k_renorm_probs(probs, k)
        )
    for mp in (0.0, 0.1):
        assert_close(
            min_p_renorm_probs(probs, mp, backend="cuda"), reference.min_p_renorm_probs(probs, mp)
        )
    for p in (0.0, 0.5, 1.0):
        _check_top_p(top_p_renorm_probs(probs, p, backend="cuda"), probs, p)
    bad_mp = torch.tensor([0.1, 0.1, 0.1, 0.1, 0.1, -0.5, float("nan")], device="cuda")
    assert_close(
        min_p_renorm_probs(probs, bad_mp, backend="cuda"),
        reference.min_p_renorm_probs(probs, bad_mp),
    )
    bad_tp = torch.tensor([0.5, 0.5, 0.5, 0.5, 0.5, float("nan"), 0.9], device="cuda")
    _check_top_p(top_p_renorm_probs(probs, bad_tp, backend="cuda"), probs, bad_tp)


def test_mask_logits_non_finite():
    logits = _logits(4, 777, seed=3).clone()
    logits[0, :10] = float("-inf")
    logits[1, 3] = float("inf")
    logits[2, 4] = float("nan")
    logits[3, ::2] = -0.0
    logits[3, 1::2] = 0.0
    for k in (1, 5, 400, 776):
        assert torch.equal(
            top_k_mask_logits(logits, k, backend="cuda").isnan(),
            reference.top_k_mask_logits(logits, k).isnan(),
        )
        got = top_k_mask_logits(logits, k, backend="cuda")
        exp = reference.top_k_mask_logits(logits, k)
        same = (got == exp) | (got.isnan() & exp.isnan())
        assert bool(same.all()), f"k={k}"


def test_overflowing_kept_sum_is_invalid():
    probs = torch.full((2, 64), 3e38, device="cuda")
    probs[1] = 0.01
    assert_close(
        top_k_renorm_probs(probs, 10, backend="cuda"), reference.top_k_renorm_probs(probs, 10)
    )
    assert_close(
        min_p_renorm_probs(probs, 0.1, backend="cuda"), reference.min_p_renorm_probs(probs, 0.1)
    )


def test_compiled_kernel_rejects_bad_input_itself():
    from kernels_jit import load_module
    from kernels_sampling._common import FILTERS_CUDA

    raw = load_module(FILTERS_CUDA)
    x = _probs(3, 100, seed=0)
    with pytest.raises(ValueError, match="same shape"):
        raw.top_k_renorm_probs(torch.empty(3, 99, device="cuda"), x, None, 5)
    with pytest.raises(ValueError, match="top_k must have shape"):
        raw.top_k_mask_logits(torch.empty_like(x), x, torch.ones(2, device="cuda").int(), 5)
    with pytest.raises(TypeError, match="top_p must be float32"):
        raw.top_p_renorm_probs(torch.empty_like(x), x, torch.ones(3, device="cuda").int(), 0.5)
    with pytest.raises(TypeError, match="unsupported dtype"):
        raw.min_p_renorm_probs(torch.empty_like(x).double(), x.double(), None, 0.5)


def test_cuda_graph_capture():
    probs = _probs(16, 128256, seed=4)
    ks = torch.full((16,), 50, device="cuda", dtype=torch.int32)
    calls = {
        "top_k": lambda: top_k_renorm_probs(probs, ks),
        "top_p": lambda: top_p_renorm_probs(probs, 0.9),
        "min_p": lambda: min_p_renorm_probs(probs, 0.05),
        "mask": lambda: top_k_mask_logits(probs, 50),
    }
    expected, outs, _graph = eager_and_replayed(calls)
    for name in calls:
        assert torch.equal(outs[name], expected[name]), name


def test_torch_compile_fullgraph():
    probs = _probs(4, 3000, seed=6)
    fn = torch.compile(
        lambda p: top_k_renorm_probs(p, 20) + min_p_renorm_probs(p, 0.1) + top_k_mask_logits(p, 7),
        fullgraph=True,
    )
    expected = (
        reference.top_k_renorm_probs(probs, 20)
        + reference.min_p_renorm_probs(probs, 0.1)
        + reference.top_k_mask_logits(probs, 7)
    )
    assert_close(fn(probs), expected)


# ---- the two launch paths: cached clusters (small batches) and streamed CTAs (large) ----


def _filters_path(x: torch.Tensor, mode: int) -> int:
    from kernels_jit.loader import CompiledFunction
    from kernels_sampling._common import FILTERS_CUDA

    return int(CompiledFunction(FILTERS_CUDA, "sampling_filters_path")(x, mode))


def test_auto_path_follows_the_batch():
    # V = 128256 fp32: 4+ CTAs per row of <= 160 KB each, so one wave holds ~33 rows at most.
    # min_p (mode 0) streams at every batch size: it reads the row twice (choose_shape).
    assert _filters_path(_probs(1, 128256, seed=0), 0) < 0
    for mode in range(4):
        if mode > 0:
            assert _filters_path(_probs(1, 128256, seed=0), mode) >= 4, mode
        assert _filters_path(_probs(64, 128256, seed=0), mode) < 0, mode
        assert _filters_path(_probs(512, 4096, seed=0), mode) == -1, mode


def test_streamed_clusters_are_one_wave():
    """Streamed CTAs per row (min_p): a power of two up to 8 (8 at B 1), at most the SMs' worth
    of CTAs, never more as the batch grows (fewer where the clusters would not all be
    resident at once)."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    sizes = [-_filters_path(_probs(b, 128256, seed=0), 0) for b in range(1, 41)]
    assert sizes[0] == 8, sizes
    for b, c in enumerate(sizes, start=1):
        assert c in (1, 2, 4, 8) and (c == 1 or b * c <= sms), (b, sizes)
    assert sizes == sorted(sizes, reverse=True), sizes


@pytest.mark.parametrize("path", ["cached", "streamed"])
@pytest.mark.parametrize("b", [1, 3, 64])
@pytest.mark.parametrize("v", [4099, 128256])
def test_both_paths_match_reference(path, b, v):
    from kernels_sampling._common import force_cuda_path

    probs = _probs(b, v, seed=b + v).clone()
    logits = _logits(b, v, seed=b * v).clone()
    ks = torch.randint(-2, v + 3, (b,), device="cuda", dtype=torch.int32)
    ks[0] = 50
    tps = torch.rand(b, device="cuda") * 1.2 - 0.1
    tps[0] = 0.9
    mps = torch.rand(b, device="cuda") * 0.3
    if b >= 3:  # bad rows: NaN, negative (per-row parameters stay in range for the others)
        probs[1, v // 2] = float("nan")
        probs[2, v - 1] = -1e-3
        logits[1, 3] = float("inf")
    tied = torch.randint(0, 8, (b, v), device="cuda").float()  # long runs of equal values
    tied = tied / tied.sum(1, keepdim=True)
    with force_cuda_path(path):
        assert (_filters_path(probs, 1) > 0) == (path == "cached")
        assert _filters_path(probs, 0) != 0
        for x in (probs, tied):
            for k in (ks, 1, 50):
                assert_close(
                    top_k_renorm_probs(x, k, backend="cuda"), reference.top_k_renorm_probs(x, k)
                )
            for p in (tps, 0.9):
                _check_top_p(top_p_renorm_probs(x, p, backend="cuda"), x, p)
            assert_close(
                min_p_renorm_probs(x, mps, backend="cuda"), reference.min_p_renorm_probs(x, mps)
            )
        for k in (ks, 7):
            got = top_k_mask_logits(logits, k, backend="cuda")
            exp = reference.top_k_mask_logits(logits, k)
            assert bool(((got == exp) | (got.isnan() & exp.isnan())).all())


@pytest.mark.parametrize("path", ["cached", "streamed"])
def test_cuda_graph_capture_of_each_path(path):
    from kernels_sampling._common import force_cuda_path

    probs = _probs(1, 128256, seed=8)
    calls = {
        "top_k": lambda: top_k_renorm_probs(probs, 50),
        "top_p": lambda: top_p_renorm_probs(probs, 0.9),
        "min_p": lambda: min_p_renorm_probs(probs, 0.05),
        "mask": lambda: top_k_mask_logits(probs, 50),
    }
    with force_cuda_path(path):
        expected, outs, _graph = eager_and_replayed(calls)
    for name in calls:
        assert torch.equal(outs[name], expected[name]), name
    assert_close(outs["top_k"], reference.top_k_renorm_probs(probs, 50))


def _one_bin_rows(b: int, v: int, group: int, seed: int) -> torch.Tensor:
    """fp32 rows where `group` entries (random positions, ties in runs of about 20) share one
    first-pass radix bin, values in [1, 1.25) * 2^-12 (one exponent and its top two mantissa
    bits), above 16 larger values and below tiny ones: the threshold of top_k (k inside the group)
    and of top_p (p = 0.5) falls inside that bin."""
    g = torch.Generator().manual_seed(seed)
    x = torch.full((b, v), 1e-9)
    for r in range(b):
        cols = torch.randperm(v, generator=g)
        steps = torch.randint(0, group // 20 + 1, (group,), generator=g).float()
        x[r, cols[:group]] = (1 + steps / (4 * (group // 20 + 1))) * 2.0**-12
        x[r, cols[group : group + 16]] = 0.01
    return x.cuda()


@pytest.mark.parametrize("path", ["cached", "streamed"])
@pytest.mark.parametrize("group", [40, 3071, 3072, 3073, 5000])
@pytest.mark.parametrize("v", [4099, 128256])
def test_threshold_bin_of_every_size(path, group, v):
    # The last two digits run over a shared-memory list of the first digit's bin when it holds
    # at most kCandidates = 3072 of the row's keys (filters.cuh), else over the row: both sides
    # of that limit, ties across the CTAs of a cluster, per-row k.
    from kernels_sampling._common import force_cuda_path

    if group + 16 > v:
        pytest.skip("the group does not fit the row")
    x = _one_bin_rows(3, v, group, seed=group + v)
    ks = torch.tensor([16 + group // 2, 17, 16 + group], device="cuda", dtype=torch.int32)
    logits = x.log()
    with force_cuda_path(path):
        for k in (ks, 16 + group // 3):
            assert_close(
                top_k_renorm_probs(x, k, backend="cuda"), reference.top_k_renorm_probs(x, k)
            )
            got = top_k_mask_logits(logits, k, backend="cuda")
            assert torch.equal(got, reference.top_k_mask_logits(logits, k))
        for p in (0.5, torch.tensor([0.2, 0.5, 0.9], device="cuda")):
            _check_top_p(top_p_renorm_probs(x, p, backend="cuda"), x, p)


def _sparse_rows(b: int, v: int, where: list[int], dtype, seed: int) -> torch.Tensor:
    """Probabilities whose few large entries sit at `where` (every row; -1: the last), the rest
    small and distinct: the streamed passes after the first read only their groups."""
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(b, v, generator=g) * 1e-6 + 1e-7
    for i, pos in enumerate(where):
        x[:, pos] = 0.5 / (i + 1)
    return (x / x.sum(1, keepdim=True)).to(device="cuda", dtype=dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("layout", ["contiguous", "misaligned"])
@pytest.mark.parametrize(("b", "v"), [(1, 4099), (3, 128256), (40, 65536 + 33)])
def test_streamed_group_skipping(dtype, layout, b, v):
    # Streamed (clusters of 8 CTAs at B 1 and 3, 2 at B 40): the first sweep records each group's
    # largest key (32 packs: 128 fp32 / 256 bf16 values, 32 values on the misaligned scalar
    # path); the top-k passes, the kept sums and the writes then read only the groups that hold
    # a kept value. Large entries at the row's ends, a group's edges and slice edges.
    from kernels_sampling._common import force_cuda_path

    slice_edge = v // 8
    where = [0, v - 1, 127, 128, slice_edge - 1, slice_edge, v // 2 + 5, 255, 256]
    probs = _layout(_sparse_rows(b, v, where, dtype, seed=b + v), layout)
    logits = probs.float().log().to(dtype)
    logits[:, 3] = float("-inf")
    with force_cuda_path("streamed"):
        for k in (1, 3, len(where), 50):
            assert_close(
                top_k_renorm_probs(probs, k, backend="cuda"),
                reference.top_k_renorm_probs(probs, k),
                name=f"k={k}",
            )
            got = top_k_mask_logits(logits, k, backend="cuda")
            assert torch.equal(got, reference.top_k_mask_logits(logits, k)), f"k={k}"
        for mp in (0.0, 0.3, 0.9, 1.0):
            assert_close(
                min_p_renorm_probs(probs, mp, backend="cuda"),
                reference.min_p_renorm_probs(probs, mp),
                name=f"min_p={mp}",
            )
        for p in (0.0, 0.4, 0.8, 1.0):
            _check_top_p(top_p_renorm_probs(probs, p, backend="cuda"), probs, p)
        bad = probs.clone()
        bad[-1, v // 2 + 5] = float("nan")  # a NaN in a read group: the row is NaN
        bad[0, 1000] = float("nan")  # and in a group the later passes would skip
        assert_close(
            top_k_renorm_probs(bad, 3, backend="cuda"), reference.top_k_renorm_probs(bad, 3)
        )
        assert_close(
            min_p_renorm_probs(bad, 0.3, backend="cuda"), reference.min_p_renorm_probs(bad, 0.3)
        )


# ---- exact mass histograms (filters.cuh exact_mass_add) and their fp32 fallback ----


@pytest.mark.parametrize("path", ["cached", "streamed"])
def test_top_p_is_deterministic(path):
    # top_p's bin masses are integer sums (one rounding per bin after the cluster's sum): the
    # same bits on every run, whatever order the shared atomics land in.
    from kernels_sampling._common import force_cuda_path

    probs = _probs(3, 128256, seed=31)
    tps = torch.tensor([0.3, 0.9, 0.99], device="cuda")
    with force_cuda_path(path):
        first = top_p_renorm_probs(probs, tps, backend="cuda")
        for _ in range(3):
            assert torch.equal(top_p_renorm_probs(probs, tps, backend="cuda"), first)
    _check_top_p(first, probs, tps)


def _one_bin_row(v: int, seed: int) -> torch.Tensor:
    """One fp32 row whose values all share one first-pass bin ([1, 1.25) * 2^-24) with key bits
    10-20 mostly set: the largest sums the 32-bit bin counters of exact_mass_add take."""
    g = torch.Generator().manual_seed(seed)
    frac = 0.2 + 0.0499 * torch.rand(1, v, generator=g, dtype=torch.float64)
    return ((1 + frac) * 2.0**-24).float().cuda()


@pytest.mark.parametrize("extra", [0, 8 * 4096])
def test_top_p_long_slices(extra):
    # Streamed, one row over 8 CTAs: slices of 2^21 values (the exact histograms' limit,
    # kExactMassSlice, every value in one bin) and longer ones (the fp32 atomics).
    from kernels_sampling._common import force_cuda_path

    if extra == 0:  # (one bin of 2^24 values through fp32 atomics would take seconds)
        x = _one_bin_row(2**24, seed=1)
        with force_cuda_path("streamed"):
            for p in (0.5, 0.9):
                _check_top_p(top_p_renorm_probs(x, p, backend="cuda"), x, p)
    probs = _probs(1, 2**24 + extra, seed=extra)
    with force_cuda_path("streamed"):
        _check_top_p(top_p_renorm_probs(probs, 0.9, backend="cuda"), probs, 0.9)
