"""layernorm.layernorm: ``(x - mean) * rsqrt(var + eps) * weight + bias`` over the last dim.

Mean and (biased) variance in fp32, the variance as the exact two-pass sum of squared deviations,
output rounded once to the input dtype; ``bias`` is optional.
"""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_layernorm import checks, reference

LAYERNORM_CUDA = ModuleSpec(
    name="layernorm",
    package="kernels_layernorm",
    sources=("csrc/layernorm.cuh",),
    exports=(("layernorm", "layernorm"),),
    description="CUDA: LayerNorm (register-resident rows, 16-byte vectors or scalars)",
)

_layernorm_cuda = LAYERNORM_CUDA.function("layernorm")


def _layernorm_torch(
    out: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float,
    enable_pdl: int,
) -> None:
    out.copy_(reference.layernorm(input, weight, bias, eps))


LAYERNORM = Op("layernorm.layernorm", _layernorm_torch, mutates_args=("out",), device_arg=1)

_OP = "layernorm.layernorm"


def layernorm(
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    eps: float = 1e-5,
    *,
    out: torch.Tensor | None = None,
    backend: str | None = None,
    enable_pdl: bool | None = None,
) -> torch.Tensor:
    """LayerNorm over the last dim: ``(input - mean) * rsqrt(var + eps) * weight + bias``.

    Parameters
    ----------
    input : [..., H] float32, float16 or bfloat16; the last dim contiguous, the leading dims may
        be strided.
    weight : [H], the dtype and device of ``input``.
    bias : optional [H], the dtype and device of ``input``.
    eps : added to the variance, a float >= 0.
    out : optional destination like ``input`` (any row strides); may be ``input`` itself.
    backend : force ``cuda`` or ``torch`` instead of the best eligible one.
    enable_pdl : programmatic dependent launch; None: on for grids of at most 8 waves on sm_90+
        (larger grids run faster without it); True: always; False: never.
    """
    if not checks.eps_ok(eps):
        eps = checks.eps(_OP, eps)
    if not checks.compiled_checks(backend, input):
        checks.rows(_OP, "input", input)
        hidden = input.shape[-1]
        checks.param(_OP, "weight", weight, hidden, ref=input, ref_name="input")
        if bias is not None:
            checks.param(_OP, "bias", bias, hidden, ref=input, ref_name="input")
        if out is not None:
            checks.like(_OP, "out", out, input)
    pdl = -1 if enable_pdl is None else checks.pdl(_OP, enable_pdl)
    if out is None:
        out = torch.empty_like(input, memory_format=torch.contiguous_format)
    LAYERNORM.run(out, input, weight, bias, eps, pdl, backend=backend)
    return out


def layernorm_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Every dtype, the vector and scalar paths, with and without bias, a row-strided view."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cases = []
    for dtype in checks.DTYPES:
        for tokens, hidden in ((1, 4096), (7, 127), (33, 1024)):
            x = (torch.randn(tokens, hidden, generator=g) + 0.5).to(dtype).to(device)
            w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype).to(device)
            b = (0.1 * torch.randn(hidden, generator=g)).to(dtype).to(device)
            cases.append(((x, w, b, 1e-5), {}))
            cases.append(((x, w, None, 1e-5), {}))
    wide = torch.randn(9, 640, generator=g).to(device)
    cases.append(((wide[:, :512], torch.ones(512, device=device), None), {}))
    return cases
