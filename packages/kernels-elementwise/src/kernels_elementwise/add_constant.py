"""elementwise.add_constant: ``out = x + constant``. The reference kernel: every op follows it.

Order of an op file: module declarations, backends (destination-passing, same signature), the
registered :class:`~kernels_jit.dispatch.Op`, then the public function that validates, allocates
``out`` and dispatches.
"""

from __future__ import annotations

import torch

from kernels_elementwise import reference
from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.validation import check_out, check_tensor

ADD_CONSTANT_CUDA = ModuleSpec(
    name="add_constant",
    package="kernels_elementwise",
    sources=("csrc/add_constant.cuh",),
    exports=(("add_constant", "add_constant"),),
    description="CUDA: scalar path plus 16-byte vectorised path for aligned inputs",
)
ADD_CONSTANT_CPU = ModuleSpec(
    name="add_constant",
    package="kernels_elementwise",
    sources=("csrc/add_constant_cpu.h",),
    exports=(("add_constant", "add_constant_cpu"),),
    device="cpu",
    description="CPU C++: the same pipeline, exercised on machines without a GPU",
)

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int32)
_TENSOR, _INT32 = torch.Tensor, torch.int32  # module globals: the hot path skips two lookups


_add_constant_cuda = ADD_CONSTANT_CUDA.function("add_constant")
_add_constant_cpu = ADD_CONSTANT_CPU.function("add_constant")


def _add_constant_torch(out: torch.Tensor, x: torch.Tensor, constant: float) -> None:
    check_out("elementwise.add_constant", out, like=x)
    out.copy_(reference.add_constant(x, constant))


def _contiguous(out: torch.Tensor, x: torch.Tensor, constant: float) -> str | None:
    """The compiled kernels index flat memory; strided views go to the torch backend."""
    return None if x.is_contiguous() and out.is_contiguous() else "needs contiguous x and out"


ADD_CONSTANT = Op(
    "elementwise.add_constant", _add_constant_torch, mutates_args=("out",), device_arg=1
)


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
    x : any shape; float32, float16, bfloat16 or int32 (an int32 ``x`` needs an integral constant).
    constant : the value to add; fp16/bf16 compute in fp32 and round once.
    out : optional destination, same shape, dtype and device as ``x``; may alias ``x`` (in place).
    backend : force ``cuda``, ``cpu`` or ``torch`` instead of the best eligible one.
    """
    if type(x) is not _TENSOR or x.dtype not in DTYPES:
        check_tensor("elementwise.add_constant", "x", x, dtypes=DTYPES)  # raises, naming why
    if x.dtype is _INT32 and constant != int(constant):
        raise ValueError(
            f"elementwise.add_constant: constant {constant!r} is not an integer but x is int32"
        )
    if out is None:
        out = torch.empty_like(x, memory_format=torch.contiguous_format)
    # The shape, dtype and device of ``out`` are checked by the backend that runs, before it
    # writes: in C++ by the compiled kernels, by check_out in the torch backend. Checking them
    # here too would double the host cost of the hot path (~2 us per call on the H200's host).
    ADD_CONSTANT.run(out, x, float(constant), backend=backend)
    return out


def samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls for ``kernels-ops check``: every dtype, an odd size, a strided view."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cases = []
    for dtype in DTYPES:
        for n in (1, 127, 4099):
            if dtype == torch.int32:
                x = torch.randint(-1000, 1000, (n,), generator=g, dtype=dtype)
            else:
                x = torch.randn(n, generator=g).to(dtype)
            cases.append(((x.to(device), 3.0 if dtype == torch.int32 else 0.75), {}))
    wide = torch.randn(8, 64, generator=g).to(device)
    cases.append(((wide[:, 1:33], -2.5), {}))
    return cases
