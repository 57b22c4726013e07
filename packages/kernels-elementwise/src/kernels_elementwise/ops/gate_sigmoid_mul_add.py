"""elementwise.gate_sigmoid_mul_add: the shared-expert gate of Qwen2-MoE-style blocks,
``out = sigmoid(h @ w)[:, None] * shared (+ routed)``.

h [T, K] are the hidden states the gate reads, w [K] the weight of the one-output gate linear
(its [1, K] weight is accepted too), shared [T, H] the shared expert's output and routed [T, H]
the routed experts' sum. ``out=routed`` accumulates in place.
"""

from __future__ import annotations

import torch

from kernels_elementwise import reference
from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_out, check_tensor, last_dim_contiguous

GATE_SIGMOID_MUL_ADD_CUDA = ModuleSpec(
    name="gate_sigmoid_mul_add",
    package="kernels_elementwise",
    sources=("csrc/gate_sigmoid_mul_add.cuh",),
    exports=(("gate_sigmoid_mul_add", "gate_sigmoid_mul_add"),),
    description="CUDA: per-token dot product, block reduction, gated multiply-add in one pass",
)

_gate_sigmoid_mul_add_cuda = CompiledFunction(GATE_SIGMOID_MUL_ADD_CUDA, "gate_sigmoid_mul_add")


def _gate_sigmoid_mul_add_torch(
    out: torch.Tensor,
    h: torch.Tensor,
    w: torch.Tensor,
    shared: torch.Tensor,
    routed: torch.Tensor | None,
) -> None:
    # The operands are checked by the backend that runs (here; in C++ for the compiled kernel),
    # which keeps ~2 us of checks off the public function's eager path.
    _check(out, h, w, shared, routed)
    out.copy_(reference.gate_sigmoid_mul_add(h, w, shared, routed))


def _check(
    out: torch.Tensor,
    h: torch.Tensor,
    w: torch.Tensor,
    shared: torch.Tensor,
    routed: torch.Tensor | None,
) -> None:
    name = "elementwise.gate_sigmoid_mul_add"
    check_tensor(name, "h", h, dtypes=DTYPES, ndim=2)
    check_tensor(name, "w", w, dtypes=(h.dtype,), ndim=1, device=h.device)
    check_tensor(name, "shared", shared, dtypes=(h.dtype,), ndim=2, device=h.device)
    if w.shape[0] != h.shape[1] or shared.shape[0] != h.shape[0]:
        raise ValueError(
            f"{name}: h [T, K], w [K] and shared [T, H] disagree: h {tuple(h.shape)}, "
            f"w {tuple(w.shape)}, shared {tuple(shared.shape)}"
        )
    if routed is not None:
        check_tensor(name, "routed", routed, dtypes=(h.dtype,), ndim=2, device=h.device)
        if routed.shape != shared.shape:
            raise ValueError(
                f"{name}: routed must have shared's shape {tuple(shared.shape)}, "
                f"got {tuple(routed.shape)}"
            )
    check_out(name, out, like=shared)


def _gate_sigmoid_mul_add_cuda_eligible(
    out: torch.Tensor,
    h: torch.Tensor,
    w: torch.Tensor,
    shared: torch.Tensor,
    routed: torch.Tensor | None,
) -> str | None:
    contiguous = last_dim_contiguous
    if not (contiguous(h) and contiguous(w) and contiguous(shared) and contiguous(out)):
        return "needs contiguous last dims"
    if routed is not None and not contiguous(routed):
        return "needs contiguous last dims"
    return None


GATE_SIGMOID_MUL_ADD = Op(_gate_sigmoid_mul_add_torch, mutates=("out",), device="h")
DTYPES = GATE_SIGMOID_MUL_ADD.dtypes


def gate_sigmoid_mul_add(
    h: torch.Tensor,
    w: torch.Tensor,
    shared: torch.Tensor,
    routed: torch.Tensor | None = None,
    *,
    out: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """``sigmoid(h @ w)[:, None] * shared (+ routed)``: dot product and sum in fp32, rounded once.

    Parameters
    ----------
    h : [T, K], float32/float16/bfloat16; row stride arbitrary.
    w : [K] or [1, K], h's dtype.
    shared : [T, H], h's dtype.
    routed : optional [T, H], h's dtype, added after gating.
    out : optional [T, H] destination (h's dtype and device); may be ``routed`` (in place).
    backend : force ``cuda`` or ``torch`` instead of the best eligible one.
    """
    name = "elementwise.gate_sigmoid_mul_add"
    if type(h) is not torch.Tensor or h.dtype not in DTYPES:
        check_tensor(name, "h", h, dtypes=DTYPES)  # raises, naming why
    if type(w) is not torch.Tensor:
        check_tensor(name, "w", w)  # raises: not a tensor
    if type(shared) is not torch.Tensor:
        check_tensor(name, "shared", shared)  # raises: not a tensor
    if routed is not None and type(routed) is not torch.Tensor:
        check_tensor(name, "routed", routed)  # raises: not a tensor
    if w.dim() == 2:  # the [1, K] weight of a one-output linear
        if w.shape[0] != 1:
            raise ValueError(f"{name}: w must be [K] or [1, K], got {tuple(w.shape)}")
        w = w[0]
    if out is None:
        out = torch.empty(shared.shape, dtype=h.dtype, device=h.device)
    elif type(out) is not torch.Tensor:
        check_out(name, out, like=shared)  # raises: not a tensor
    GATE_SIGMOID_MUL_ADD.run(out, h, w, shared, routed, backend=backend)
    return out


def _gate_sigmoid_mul_add_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: with and without routed, every dtype, a
    [1, K] weight, odd widths (scalar path) and a row-strided h."""
    g = torch.Generator(device="cpu").manual_seed(0)

    def rand(*shape: int, dtype: torch.dtype, scale: float = 1.0) -> torch.Tensor:
        return (torch.randn(shape, generator=g) * scale).to(dtype).to(device)

    cases: list[tuple[tuple, dict]] = []
    for dtype in DTYPES:
        h, w = rand(5, 256, dtype=dtype), rand(256, dtype=dtype, scale=0.1)
        shared, routed = rand(5, 128, dtype=dtype), rand(5, 128, dtype=dtype)
        cases.append(((h, w, shared, routed), {}))
        cases.append(((h, w.reshape(1, -1), shared), {}))
    wide = rand(4, 300, dtype=torch.bfloat16)
    cases.append(
        (
            (
                wide[:, 2:259],
                rand(257, dtype=torch.bfloat16, scale=0.1),
                rand(4, 99, dtype=torch.bfloat16),
                rand(4, 99, dtype=torch.bfloat16),
            ),
            {},
        )
    )
    return cases
