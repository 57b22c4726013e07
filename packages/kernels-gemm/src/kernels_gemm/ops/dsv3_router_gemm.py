"""gemm.dsv3_router_gemm: router logits ``x @ w.T`` for small M (DeepSeek-V3: K = 7168, E = 256),
fp32 out by default because the logits feed sigmoid and top-k routing.

Backends: ``cuda`` (csrc/small_m_gemm.cuh: tensor-core MMAs fed by 16-byte weight loads, the
weight streamed once over every SM; for E = 256 clusters of 4 CTAs split K and reduce through
distributed shared memory) for M <= 16 and K % 8 == 0 with 16-byte aligned rows; the torch
reference (fp32 accumulation) for everything else: larger M (cuBLAS territory), odd K, misaligned
views.

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

OP_ID = "gemm.dsv3_router_gemm"
OUT_DTYPES = (torch.float32, torch.bfloat16)

DSV3_ROUTER_GEMM_CUDA = ModuleSpec(
    name="dsv3_router_gemm",
    package="kernels_gemm",
    sources=("csrc/dsv3_router_gemm.cuh",),
    exports=(("dsv3_router_gemm", "dsv3_router_gemm"),),
    description="CUDA: small-M tensor-core GEMM streaming the weight (clusters split K)",
)

_dsv3_router_gemm_kernel = CompiledFunction(DSV3_ROUTER_GEMM_CUDA, "dsv3_router_gemm")

# The small-M engine's switches (_RING_MAX_M, _CLUSTER_PUSH, _WEIGHT_FIRST: see _small_m.py).
# The router (runs of 7 chunks at K = 7168, 128/96 CTAs in clusters of 4) took both newer choices
# in an H200 A/B against the kernels before them (cold L2: M 1 3.24 -> 2.96 us, M 16 4.19 ->
# 3.69), and in an H100 A/B of the eight settings all three were the fastest or within 0.1 us
# of it at every M (256 x 7168 cold L2 M 1 3.67 -> 3.20 us, L2-warm 3.33 -> 2.82); the ring only
# matters at K past ~16k.
_RING_MAX_M = 16
_CLUSTER_PUSH = True
_WEIGHT_FIRST = True


def _dsv3_router_gemm_cuda(
    out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, enable_pdl: int
) -> None:
    _dsv3_router_gemm_kernel(
        out, x, w, enable_pdl, _RING_MAX_M, int(_CLUSTER_PUSH), int(_WEIGHT_FIRST)
    )


def _check(x: object, w: object, out: object | None, out_dtype: torch.dtype) -> None:
    check_tensor(OP_ID, "x", x, dtypes=(torch.bfloat16,), ndim=2, last_dim_contiguous=True)
    check_tensor(OP_ID, "w", w, dtypes=(torch.bfloat16,), ndim=2, last_dim_contiguous=True)
    assert isinstance(x, torch.Tensor) and isinstance(w, torch.Tensor)
    check_same_device(OP_ID, x=x, w=w)
    if x.shape[1] != w.shape[1]:
        raise ValueError(
            f"{OP_ID}: x [M, K] and w [E, K] must share K, got x {tuple(x.shape)} and "
            f"w {tuple(w.shape)}"
        )
    if out is not None:
        check_out(OP_ID, out, like=x, shape=(x.shape[0], w.shape[0]), dtype=out_dtype)


def _dsv3_router_gemm_torch(out: torch.Tensor, x: torch.Tensor, w: torch.Tensor) -> None:
    _check(x, w, out, out.dtype)
    out.copy_(reference.dsv3_router_gemm(x, w, out.dtype))


def _dsv3_router_gemm_cuda_eligible(
    out: torch.Tensor, x: torch.Tensor, w: torch.Tensor, enable_pdl: int
) -> str | None:
    """The small-M engine's limits (M <= 16, K % 8 == 0, 16-byte aligned rows)."""
    return cuda_refusal(x, w, "x or w rows are not 16-byte aligned")


DSV3_ROUTER_GEMM = Op(
    _dsv3_router_gemm_torch, mutates=("out",), device="x", knobs={"enable_pdl": -1}
)
_TENSOR, _DTYPES = torch.Tensor, DSV3_ROUTER_GEMM.dtypes  # hot-path globals


def dsv3_router_gemm(
    x: torch.Tensor,
    w: torch.Tensor,
    *,
    out_dtype: torch.dtype = torch.float32,
    out: torch.Tensor | None = None,
    backend: str | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """Router logits ``out = x @ w.T`` with fp32 accumulation, rounded once to ``out_dtype``.

    Parameters
    ----------
    x : [M, K] bfloat16, last dim contiguous, any row stride (M <= 16 is the latency-optimised
        CUDA case; any M works).
    w : [E, K] bfloat16, last dim contiguous, any row stride.
    out_dtype : torch.float32 (default) or torch.bfloat16.
    out : optional destination [M, E] of ``out_dtype`` (may be a strided view).
    backend : force ``cuda`` or ``torch`` instead of the best eligible one.
    enable_pdl : programmatic dependent launch; None: on for sm_90+; True: always; False:
        never. With PDL the kernel starts while the previous kernel on the stream finishes and
        reads ``w`` BEFORE that kernel has completed (only ``x`` waits for it), so ``w`` must
        not be written by the kernel launched just before this call (nor by an earlier one still
        running, when that kernel releases its dependents before its own wait). A model's
        weights qualify; after a kernel that writes ``w``, pass False, or launch any kernel
        without PDL in between (``torch.compile`` runs this knob at its default).
    """
    if out_dtype not in OUT_DTYPES:
        raise TypeError(
            f"{OP_ID}: out_dtype must be torch.float32 or torch.bfloat16, got {out_dtype}"
        )
    # On the CUDA fast path the compiled function checks shapes, strides, dtypes and devices.
    fast = (
        (backend is None or backend == "cuda")
        and type(x) is _TENSOR
        and x.is_cuda
        and x.dtype in _DTYPES
        and type(w) is _TENSOR
        and x.dim() == 2
        and w.dim() == 2
    )
    if not fast:
        _check(x, w, out, out_dtype)
    pdl = -1 if enable_pdl is None else check_pdl(OP_ID, enable_pdl)
    if out is None:
        out = torch.empty((x.shape[0], w.shape[0]), dtype=out_dtype, device=x.device)
    elif out.dtype != out_dtype:
        raise TypeError(
            f"{OP_ID}: out must have dtype {str(out_dtype).removeprefix('torch.')}, "
            f"got {str(out.dtype).removeprefix('torch.')}"
        )
    if out.numel():
        DSV3_ROUTER_GEMM.run(out, x, w, pdl, backend=backend)
    return out


def _dsv3_router_gemm_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls: decode-sized M, the DeepSeek-V3 expert count, an odd K, bf16 out."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cases: list[tuple[tuple, dict]] = []
    for m, e, k in ((1, 256, 1024), (5, 256, 1024), (16, 384, 2048), (3, 7, 100)):
        x = torch.randn(m, k, generator=g).to(torch.bfloat16).to(device)
        w = (torch.randn(e, k, generator=g) * 0.05).to(torch.bfloat16).to(device)
        cases.append(((x, w), {}))
    cases.append(((x, w), {"out_dtype": torch.bfloat16}))
    return cases
