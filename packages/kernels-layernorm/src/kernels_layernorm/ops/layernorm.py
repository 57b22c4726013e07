"""layernorm.layernorm: ``(x - mean) * rsqrt(var + eps) * weight + bias`` over the last dim.

Mean and (biased) variance in fp32, the variance as the exact two-pass sum of squared deviations,
output rounded once to the input dtype; ``bias`` is optional.
"""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import (
    check_eps,
    check_like,
    check_param,
    check_pdl,
    check_rows,
    compiled_path,
    eps_ok,
)
from kernels_layernorm import reference

LAYERNORM_CUDA = ModuleSpec(
    name="layernorm",
    package="kernels_layernorm",
    sources=("csrc/layernorm.cuh",),
    exports=(("layernorm", "layernorm"),),
    description="CUDA: LayerNorm (register-resident rows, 16-byte vectors or scalars)",
)

_layernorm_cuda = CompiledFunction(LAYERNORM_CUDA, "layernorm")


def _layernorm_torch(
    out: torch.Tensor,
    input: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    eps: float,
) -> None:
    out.copy_(reference.layernorm(input, weight, bias, eps))


LAYERNORM = Op(_layernorm_torch, mutates=("out",), device="input", knobs={"enable_pdl": -1})
DTYPES = LAYERNORM.dtypes
_OP = LAYERNORM.id


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
    weight : [H] on the device of ``input``, its dtype or float32 (as FlashInfer's callers pass
        fp32 norm weights with bf16 activations).
    bias : optional [H], the dtype and device of ``weight``.
    eps : added to the variance, a float >= 0.
    out : optional destination like ``input`` (any row strides); may be ``input`` itself.
    backend : force ``cuda`` or ``torch`` instead of the best eligible one.
    enable_pdl : programmatic dependent launch; None: on for grids of at most 8 waves on sm_90+
        (larger grids run faster without it); True: always; False: never.
    """
    if not eps_ok(eps):
        eps = check_eps(_OP, eps)
    if not compiled_path(backend, input, DTYPES):
        check_rows(_OP, "input", input, dtypes=DTYPES)
        hidden = input.shape[-1]
        check_param(_OP, "weight", weight, hidden, ref=input, fp32_ok=True)
        if bias is not None:
            check_param(_OP, "bias", bias, hidden, ref=input, fp32_ok=True)
            if bias.dtype != weight.dtype:
                raise TypeError(
                    f"{_OP}: bias must have the dtype of weight ({weight.dtype}), got {bias.dtype}"
                )
        if out is not None:
            check_like(_OP, "out", out, input)
    pdl = -1 if enable_pdl is None else check_pdl(_OP, enable_pdl)
    if out is None:
        out = torch.empty_like(input, memory_format=torch.contiguous_format)
    LAYERNORM.run(out, input, weight, bias, eps, pdl, backend=backend)
    return out


def _layernorm_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Every dtype, the vector and scalar paths, with and without bias, a row-strided view."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cases = []
    for dtype in DTYPES:
        for tokens, hidden in ((1, 4096), (7, 127), (33, 1024)):
            x = (torch.randn(tokens, hidden, generator=g) + 0.5).to(dtype).to(device)
            w = (1 + 0.1 * torch.randn(hidden, generator=g)).to(dtype).to(device)
            b = (0.1 * torch.randn(hidden, generator=g)).to(dtype).to(device)
            cases.append(((x, w, b, 1e-5), {}))
            cases.append(((x, w, None, 1e-5), {}))
    wide = torch.randn(9, 640, generator=g).to(device)
    cases.append(((wide[:, :512], torch.ones(512, device=device), None), {}))
    return cases
