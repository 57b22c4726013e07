"""gemm.dsv3_fused_a_gemm: DeepSeek-V3's fused q_a/kv_a projection ``out = a @ b`` for small M
(K = 7168 hidden, N = 2112 = q_lora 1536 + kv_lora 512 + rope 64), bf16 out.

``b`` is [K, N] column-major, as in sgl-kernel's ``dsv3_fused_a_gemm(output, mat_a, mat_b)``: the
transpose view ``w.t()`` of the checkpoint's row-major [N, K] weight, so nothing is copied; pass
``w.t()``, not ``w``.

Backends: ``cuda`` (csrc/small_m_gemm.cuh: each of 132 CTAs owns 16 whole output columns over all
of K for N = 2112, streaming the 30 MB weight once with 16-byte loads into tensor-core MMAs;
the shared-memory ring kernel only where _RING_MAX_M says; no split-K workspace) for
M <= 16 and K % 8 == 0 with 16-byte aligned rows; the torch reference (fp32 accumulation, rounded
once) for everything else.

PDL contract: with ``enable_pdl`` (on by default on sm_90+) the weight is read before the
preceding kernel on the stream completes, so that kernel must not write it (see the parameter).
"""

from __future__ import annotations

import torch

from kernels_gemm import reference
from kernels_gemm._small_m import cuda_refusal
from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_out, check_pdl, check_same_device, check_tensor

OP_ID = "gemm.dsv3_fused_a_gemm"

DSV3_FUSED_A_GEMM_CUDA = ModuleSpec(
    name="dsv3_fused_a_gemm",
    package="kernels_gemm",
    sources=("csrc/dsv3_fused_a_gemm.cuh",),
    exports=(("dsv3_fused_a_gemm", "dsv3_fused_a_gemm"),),
    description="CUDA: small-M tensor-core GEMM, each CTA owning whole output columns",
)

_dsv3_fused_a_gemm_kernel = CompiledFunction(DSV3_FUSED_A_GEMM_CUDA, "dsv3_fused_a_gemm")

# The small-M engine's switches (_RING_MAX_M, _CLUSTER_PUSH, _WEIGHT_FIRST: see _small_m.py).
# fused_a (132 CTAs of 16 columns, no split) takes the ring and the weight-first order without
# the push instantiation: the H100 A/B of the eight settings (2026-12-05,
# docs/benchmarks/runs/2026-12-05/h100-pending-tests-switches-thresholds.md) had it fastest at every
# M, cold L2 M 1 / 16 14.85 / 16.67 -> 11.74 / 13.43 us and L2-warm 7.65 / 11.19 -> 6.98 / 9.99
# against the kernel of before all three. With split == 1 _CLUSTER_PUSH only picks the
# instantiation, yet the push one lost at every M with the ring (cold M 16 24.47 us), as the H200
# A/B of ring + push + weight first had shown (M 8 12.59 -> 16.81).
_RING_MAX_M = 16
_CLUSTER_PUSH = False
_WEIGHT_FIRST = True


def _dsv3_fused_a_gemm_cuda(
    out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, enable_pdl: int
) -> None:
    _dsv3_fused_a_gemm_kernel(
        out, a, b, enable_pdl, _RING_MAX_M, int(_CLUSTER_PUSH), int(_WEIGHT_FIRST)
    )


def _check(a: object, b: object, out: object | None) -> None:
    check_tensor(OP_ID, "a", a, dtypes=(torch.bfloat16,), ndim=2, last_dim_contiguous=True)
    check_tensor(OP_ID, "b", b, dtypes=(torch.bfloat16,), ndim=2)
    assert isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)
    check_same_device(OP_ID, a=a, b=b)
    if b.shape[0] > 1 and b.stride(0) != 1:
        raise ValueError(
            f"{OP_ID}: b [K, N] must be column-major (stride 1 along K; pass w.t() of a "
            f"row-major [N, K] weight), got strides {b.stride()}"
        )
    if a.shape[1] != b.shape[0]:
        raise ValueError(
            f"{OP_ID}: a [M, K] and b [K, N] must share K, got a {tuple(a.shape)} and "
            f"b {tuple(b.shape)}"
        )
    if out is not None:
        check_out(OP_ID, out, like=a, shape=(a.shape[0], b.shape[1]), dtype=torch.bfloat16)


def _dsv3_fused_a_gemm_torch(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    _check(a, b, out)
    out.copy_(reference.dsv3_fused_a_gemm(a, b))


def _dsv3_fused_a_gemm_cuda_eligible(
    out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, enable_pdl: int
) -> str | None:
    """The small-M engine's limits (M <= 16, K % 8 == 0, 16-byte aligned rows) on a and the
    weight, b's columns (b.t(): [N, K])."""
    if b.dim() != 2:
        return None  # malformed: left to the kernel, which rejects it
    return cuda_refusal(a, b.t(), "a rows or b columns are not 16-byte aligned")


DSV3_FUSED_A_GEMM = Op(
    _dsv3_fused_a_gemm_torch, mutates=("out",), device="a", knobs={"enable_pdl": -1}
)
_TENSOR, _DTYPES = torch.Tensor, DSV3_FUSED_A_GEMM.dtypes  # hot-path globals


def dsv3_fused_a_gemm(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    backend: str | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """``out = a @ b`` with fp32 accumulation, rounded once to bf16 (DeepSeek-V3's fused
    q_a/kv_a projection).

    Parameters
    ----------
    a : [M, K] bfloat16 hidden states, last dim contiguous, any row stride (M <= 16 is the
        latency-optimised CUDA case; any M works).
    b : [K, N] bfloat16, column-major (stride 1 along K): ``w.t()`` of the row-major [N, K]
        weight (DeepSeek-V3: [2112, 7168]), as sgl-kernel and vLLM take it.
    out : optional destination [M, N] bfloat16 (may be a strided view).
    backend : force ``cuda`` or ``torch`` instead of the best eligible one.
    enable_pdl : programmatic dependent launch; None: on for sm_90+; True: always; False:
        never. With PDL the kernel starts while the previous kernel on the stream finishes and
        reads ``b`` BEFORE that kernel has completed (only ``a`` waits for it), so ``b`` must
        not be written by the kernel launched just before this call (nor by an earlier one still
        running, when that kernel releases its dependents before its own wait). A model's
        weights qualify; after a kernel that writes ``b``, pass False, or launch any kernel
        without PDL in between (``torch.compile`` runs this knob at its default).
    """
    # On the CUDA fast path the compiled function checks shapes, strides, dtypes and devices.
    fast = (
        (backend is None or backend == "cuda")
        and type(a) is _TENSOR
        and a.is_cuda
        and a.dtype in _DTYPES
        and type(b) is _TENSOR
        and a.dim() == 2
        and b.dim() == 2
    )
    if not fast:
        _check(a, b, out)
    pdl = -1 if enable_pdl is None else check_pdl(OP_ID, enable_pdl)
    if out is None:
        out = torch.empty((a.shape[0], b.shape[1]), dtype=torch.bfloat16, device=a.device)
    if out.numel():
        DSV3_FUSED_A_GEMM.run(out, a, b, pdl, backend=backend)
    return out


def _dsv3_fused_a_gemm_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls: decode-sized M, both CUDA row halves, an odd K (the torch path)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cases: list[tuple[tuple, dict]] = []
    for m, n, k in ((1, 2112, 1024), (5, 64, 512), (16, 200, 768), (3, 24, 100)):
        a = torch.randn(m, k, generator=g).to(torch.bfloat16).to(device)
        w = (torch.randn(n, k, generator=g) * 0.05).to(torch.bfloat16).to(device)
        cases.append(((a, w.t()), {}))
    return cases
