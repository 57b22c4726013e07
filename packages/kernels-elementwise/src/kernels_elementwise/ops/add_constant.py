"""elementwise.add_constant: ``out = x + constant``. The reference kernel: every op follows it.

An op file reads top to bottom: the compiled modules, the backends (destination-passing, one
signature: outputs first), the :class:`~kernels_jit.dispatch.Op` built from the torch backend,
the public function (validate, allocate, dispatch), and the samples ``kernels-ops check`` runs.
The names are fixed by the one-line declaration in the group's ``__init__``
(``op("add_constant", ..., "cuda cpu", ...)``): ``_add_constant_cuda``, ``_add_constant_cpu``,
``_add_constant_torch``, optional ``_add_constant_<backend>_eligible``, ``_add_constant_samples``.
"""

from __future__ import annotations

import math

import torch

from kernels_elementwise import reference
from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_out, check_tensor

ADD_CONSTANT_CUDA = ModuleSpec(
    name="add_constant",
    package="kernels_elementwise",
    sources=("csrc/add_constant.cuh",),
    exports=(("add_constant", "add_constant"),),
    description="CUDA: the pointwise engine (16-byte packs when aligned, scalars otherwise)",
)
ADD_CONSTANT_CPU = ModuleSpec(
    name="add_constant",
    package="kernels_elementwise",
    sources=("csrc/add_constant_cpu.h",),
    exports=(("add_constant", "add_constant_cpu"),),
    device="cpu",
    description="CPU C++: the same pipeline, exercised on machines without a GPU",
)
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1

_add_constant_cuda = CompiledFunction(ADD_CONSTANT_CUDA, "add_constant")
_add_constant_cpu = CompiledFunction(ADD_CONSTANT_CPU, "add_constant")


def _add_constant_torch(out: torch.Tensor, x: torch.Tensor, constant: float) -> None:
    check_out("elementwise.add_constant", out, like=x)
    out.copy_(reference.add_constant(x, constant))


def _add_constant_cuda_eligible(out: torch.Tensor, x: torch.Tensor, constant: float) -> str | None:
    """The compiled kernels index flat memory; strided views go to the torch backend."""
    return None if x.is_contiguous() and out.is_contiguous() else "needs contiguous x and out"


_add_constant_cpu_eligible = _add_constant_cuda_eligible

ADD_CONSTANT = Op(_add_constant_torch, mutates=("out",), device="x")
_TENSOR, _DTYPES, _INT32 = torch.Tensor, ADD_CONSTANT.dtypes, torch.int32  # hot-path globals


def add_constant(
    x: torch.Tensor,
    constant: float,
    *,
    out: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """``x + constant`` elementwise.

    Parameters
    ----------
    x : any shape; float32, float16, bfloat16 or int32.
    constant : the value to add. fp16/bf16 compute in fp32 and round once (a NaN or infinite
        constant propagates as IEEE arithmetic does). For an int32 ``x`` it must be an integer in
        int32 range; the sums wrap modulo 2^32, as torch's int32 addition does.
    out : optional destination, same shape, dtype and device as ``x``; may alias ``x`` (in place).
    backend : force ``cuda``, ``cpu`` or ``torch`` instead of the best eligible one.
    """
    if type(x) is not _TENSOR or x.dtype not in _DTYPES:
        check_tensor("elementwise.add_constant", "x", x, dtypes=_DTYPES)  # raises, naming why
    constant = float(constant)
    if x.dtype is _INT32:
        _check_int32_constant(constant)
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    # The shape, dtype and device of ``out`` are checked by the backend that runs, before it
    # writes: in C++ by the compiled kernels, by check_out in the torch backend. Checking them
    # here too would double the host cost of the hot path (~2 us per call on the H200's host).
    ADD_CONSTANT.run(out, x, constant, backend=backend)
    return out


def _check_int32_constant(constant: float) -> None:
    if not math.isfinite(constant) or constant != int(constant):
        raise ValueError(
            f"elementwise.add_constant: x is int32, so constant must be a finite integer, "
            f"got {constant!r}"
        )
    if not _INT32_MIN <= constant <= _INT32_MAX:
        raise ValueError(
            f"elementwise.add_constant: x is int32, so constant must be in int32 range "
            f"[{_INT32_MIN}, {_INT32_MAX}], got {int(constant)}"
        )


def _add_constant_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: every dtype, an odd size, a strided view."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cases = []
    for dtype in ADD_CONSTANT.dtypes:
        for n in (1, 127, 4099):
            if dtype == torch.int32:
                x = torch.randint(-1000, 1000, (n,), generator=g, dtype=dtype)
            else:
                x = torch.randn(n, generator=g).to(dtype)
            cases.append(((x.to(device), 3.0 if dtype == torch.int32 else 0.75), {}))
    wide = torch.randn(8, 64, generator=g).to(device)
    cases.append(((wide[:, 1:33], -2.5), {}))
    return cases
