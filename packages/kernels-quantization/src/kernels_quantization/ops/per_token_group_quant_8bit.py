"""quantization.per_token_group_quant_8bit: one scale per ``group_size`` consecutive elements of
the last dim, fp8 e4m3 or int8, with the scale layouts DeepGEMM-style GEMMs consume.

Scale layouts (s is always indexed ``s[..., m, g]``; M = ``x.shape[-2]`` rows, G = K / group_size):

- row-major (default): fp32 contiguous ``[..., M, G]`` (here M may be the product of the leading
  dims: s has the shape ``x.shape[:-1] + (G,)``);
- ``column_major_scales``: fp32 storage ``[..., G, M]``, s its transpose view (M is the fast dim);
- ``+ scale_tma_aligned``: storage ``[..., G, ceil4(M)]`` (16-byte TMA rows), s = its transpose
  ``[..., :M, :]``; the padding rows are unspecified;
- ``+ pack_ue8m0`` (needs ``scale_ue8m0``): int32 storage ``[..., ceil(G/4), ceil4(M)]``,
  s = its transpose ``[..., :M, :]``; byte i of word j is the biased exponent of group 4j + i.

The op writes s through whatever strides the view has, so one backend signature covers all four.

Optional modes (OPS.md, SGL's unified kernel): ``fuse_silu_and_mul`` (x [..., 2K]: q and s of
``reference.silu_and_mul(x)``, fp32 math rounded to x's dtype) and ``masked_m`` (int32 [E] for
x [E, T_pad, K]: rows t >= masked_m[e] of q and s are left untouched, no host sync).
"""

from __future__ import annotations

import torch

from kernels_jit import ModuleSpec
from kernels_jit.dispatch import Op
from kernels_jit.loader import CompiledFunction
from kernels_jit.validation import check_out, check_tensor
from kernels_quantization import reference
from kernels_quantization._checks import ACTIVATION_DTYPES

OP_ID = "quantization.per_token_group_quant_8bit"
GROUP_SIZES = (16, 32, 64, 128, 256)
DST_DTYPES = (torch.float8_e4m3fn, torch.int8)

PER_TOKEN_GROUP_QUANT_8BIT_CUDA = ModuleSpec(
    name="per_token_group_quant_8bit",
    package="kernels_quantization",
    sources=("csrc/per_token_group_quant_8bit.cuh",),
    exports=(("per_token_group_quant_8bit", "per_token_group_quant_8bit"),),
    description="CUDA: lane teams per group, 16-element pieces in registers (16-byte loads and "
    "stores), every scale layout, fused silu_and_mul and masked EP rows in one kernel",
)

_per_token_group_quant_8bit_cuda = CompiledFunction(
    PER_TOKEN_GROUP_QUANT_8BIT_CUDA, "per_token_group_quant_8bit"
)


def _per_token_group_quant_8bit_torch(
    q: torch.Tensor,
    s: torch.Tensor,
    x: torch.Tensor,
    group_size: int,
    eps: float,
    scale_ue8m0: bool,
    pack_ue8m0: bool,
    fuse_silu_and_mul: bool,
    masked_m: torch.Tensor | None,
) -> None:
    q_ref, s_ref = reference.per_token_group_quant_8bit(
        x, group_size, q.dtype, eps, scale_ue8m0, fuse_silu_and_mul
    )
    if pack_ue8m0:
        s_ref = reference.pack_ue8m0(s_ref)
    if masked_m is None:
        q.copy_(q_ref)
        s.copy_(s_ref)
        return
    # Rows t >= masked_m[e] keep their contents (a device-side select: no host sync).
    # (q as bytes: torch.where need not support the fp8 dtypes on every device.)
    live = reference.masked_rows(masked_m, x.shape[1]).unsqueeze(-1)
    q_bytes = q.view(torch.uint8)
    q_bytes.copy_(torch.where(live, q_ref.view(torch.uint8), q_bytes))
    s.copy_(torch.where(live, s_ref, s))


def _row_levels(*tensors: torch.Tensor) -> int:
    """Levels of rows the leading dims of same-shaped ``tensors`` merge into (as
    kernels::collapse_rows does: a dim joins the previous level when every tensor's strides
    allow it; size-1 dims are skipped)."""
    levels, prev = 0, None
    for d, size in enumerate(tensors[0].shape[:-1]):
        if size == 1:
            continue
        strides = [t.stride(d) for t in tensors]
        if prev is None or any(p != st * size for p, st in zip(prev, strides, strict=True)):
            levels += 1
        prev = strides
    return levels


def _per_token_group_quant_8bit_cuda_eligible(
    q: torch.Tensor,
    s: torch.Tensor,
    x: torch.Tensor,
    group_size: int,
    eps: float,
    scale_ue8m0: bool,
    pack_ue8m0: bool,
    fuse_silu_and_mul: bool,
    masked_m: torch.Tensor | None,
) -> str | None:
    """The kernel indexes rows through at most two levels of leading dims."""
    if x.dim() > 3 and _row_levels(x, q, s) > 2:
        return "needs leading dims of x, q and s that merge into (outer, inner) rows"
    return None


PER_TOKEN_GROUP_QUANT_8BIT = Op(_per_token_group_quant_8bit_torch, mutates=("q", "s"), device="x")


def _ceil4(n: int) -> int:
    return (n + 3) // 4 * 4


def _scale_view(
    x: torch.Tensor, groups: int, column_major: bool, tma_aligned: bool, packed: bool
) -> torch.Tensor:
    """Allocate the scale storage of the chosen layout and return the [..., M, G'] view of it."""
    lead = tuple(x.shape[:-1])
    if not column_major:
        return torch.empty((*lead, groups), dtype=torch.float32, device=x.device)
    *batch, m = lead
    width = -(-groups // 4) if packed else groups
    rows = _ceil4(m) if tma_aligned else m
    dtype = torch.int32 if packed else torch.float32
    storage = torch.empty((*batch, width, rows), dtype=dtype, device=x.device)
    return storage.transpose(-1, -2)[..., :m, :]


def _check_options(
    x: torch.Tensor,
    group_size: int,
    dst_dtype: torch.dtype,
    eps: float,
    column_major_scales: bool,
    scale_tma_aligned: bool,
    scale_ue8m0: bool,
    pack_ue8m0: bool,
    fuse_silu_and_mul: bool,
    masked_m: torch.Tensor | None,
) -> None:
    if type(group_size) is not int or group_size not in GROUP_SIZES:
        raise ValueError(f"{OP_ID}: group_size must be one of {GROUP_SIZES}, got {group_size!r}")
    if fuse_silu_and_mul and x.shape[-1] % 2:
        raise ValueError(
            f"{OP_ID}: fuse_silu_and_mul=True needs x [..., 2K] with an even last dim, got shape "
            f"{tuple(x.shape)}"
        )
    k = x.shape[-1] // 2 if fuse_silu_and_mul else x.shape[-1]
    if k % group_size:
        what = "half the last dim of x" if fuse_silu_and_mul else "the last dim of x"
        raise ValueError(
            f"{OP_ID}: {what} ({k}) must be a multiple of group_size "
            f"({group_size}); x has shape {tuple(x.shape)}"
        )
    if masked_m is not None:
        if not isinstance(masked_m, torch.Tensor):
            raise TypeError(f"{OP_ID}: masked_m must be a torch.Tensor or None, got {masked_m!r}")
        if x.dim() != 3:
            raise ValueError(
                f"{OP_ID}: masked_m needs x of shape [E, T_pad, K], got shape {tuple(x.shape)}"
            )
        if masked_m.dtype != torch.int32:
            raise TypeError(f"{OP_ID}: masked_m must have dtype torch.int32, got {masked_m.dtype}")
        if masked_m.shape != (x.shape[0],):
            raise ValueError(
                f"{OP_ID}: masked_m must have shape [E] = ({x.shape[0]},) (one row count per "
                f"expert of x), got {tuple(masked_m.shape)}"
            )
        if masked_m.device != x.device:
            raise ValueError(
                f"{OP_ID}: masked_m must be on x's device {x.device}, got {masked_m.device}"
            )
    if dst_dtype not in DST_DTYPES:
        raise TypeError(
            f"{OP_ID}: dst_dtype must be torch.float8_e4m3fn or torch.int8, got {dst_dtype}"
        )
    if not float(eps) > 0.0:
        raise ValueError(f"{OP_ID}: eps must be > 0 (it floors each group's absmax), got {eps!r}")
    if scale_tma_aligned and not column_major_scales:
        raise ValueError(f"{OP_ID}: scale_tma_aligned=True needs column_major_scales=True")
    if pack_ue8m0 and not (scale_ue8m0 and column_major_scales and scale_tma_aligned):
        raise ValueError(
            f"{OP_ID}: pack_ue8m0=True needs scale_ue8m0, column_major_scales and "
            f"scale_tma_aligned all True, got scale_ue8m0={scale_ue8m0}, "
            f"column_major_scales={column_major_scales}, scale_tma_aligned={scale_tma_aligned}"
        )
    if column_major_scales and x.dim() < 2:
        raise ValueError(
            f"{OP_ID}: column-major scales need x with at least 2 dims [..., M, K], got shape "
            f"{tuple(x.shape)}"
        )


def per_token_group_quant_8bit(
    x: torch.Tensor,
    group_size: int = 128,
    *,
    dst_dtype: torch.dtype = torch.float8_e4m3fn,
    eps: float = reference.DEFAULT_EPS,
    column_major_scales: bool = False,
    scale_tma_aligned: bool = False,
    scale_ue8m0: bool = False,
    pack_ue8m0: bool = False,
    fuse_silu_and_mul: bool = False,
    masked_m: torch.Tensor | None = None,
    out_q: torch.Tensor | None = None,
    out_s: torch.Tensor | None = None,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token-group 8-bit quantization: per group ``a = max(eps, max|x|)``, ``s = a / qmax``
    (qmax 448 for fp8, 127 for int8; ``2^ceil(log2 s)`` when ``scale_ue8m0``), ``q = cvt(x / s)``.

    Parameters
    ----------
    x : [..., K] float16, bfloat16 or float32; last dim contiguous, any leading strides.
    group_size : 16, 32, 64, 128 or 256; K must be a multiple of it.
    dst_dtype : torch.float8_e4m3fn (saturating, round to nearest even) or torch.int8 (round to
        nearest even, saturate to [-128, 127]).
    eps : floor of each group's absmax (> 0).
    column_major_scales, scale_tma_aligned, pack_ue8m0 : the scale layout (module docstring).
    scale_ue8m0 : round every scale up to a power of two (bit-exact, from the fp32 bits).
    fuse_silu_and_mul : x is [..., 2K]; quantize ``silu(x[..., :K]) * x[..., K:]``, computed in
        fp32 and rounded to x's dtype first (``reference.silu_and_mul``: an unfused
        silu_and_mul followed by this op gives the same bits). q and s then have K columns.
    masked_m : optional int32 [E] on x's device for the masked EP layout x [E, T_pad, K]: rows
        t >= masked_m[e] of q and s are left untouched (read on the device: no host sync).
    out_q : optional destination for q, the shape of x, ``dst_dtype``.
    out_s : optional destination for s, shape ``[..., M, G]`` (packed: ``[..., M, ceil(G/4)]``),
        fp32 (packed: int32), with M as the stride-1 dim for column-major layouts.
    backend : force a backend by name instead of the best eligible one.

    Returns
    -------
    (q like x in ``dst_dtype``, s in the chosen layout)
    """
    check_tensor(OP_ID, "x", x, dtypes=ACTIVATION_DTYPES, last_dim_contiguous=True)
    if x.dim() == 0:
        raise ValueError(f"{OP_ID}: x must have at least 1 dim [..., K], got a 0-dim tensor")
    _check_options(
        x,
        group_size,
        dst_dtype,
        eps,
        column_major_scales,
        scale_tma_aligned,
        scale_ue8m0,
        pack_ue8m0,
        fuse_silu_and_mul,
        masked_m,
    )
    q_shape = (*x.shape[:-1], x.shape[-1] // 2 if fuse_silu_and_mul else x.shape[-1])
    groups = q_shape[-1] // group_size
    if out_q is None:
        out_q = torch.empty(q_shape, dtype=dst_dtype, device=x.device)
    else:
        check_out(OP_ID, out_q, like=x, shape=q_shape, dtype=dst_dtype, arg="out_q")
    if out_s is None:
        out_s = _scale_view(x, groups, column_major_scales, scale_tma_aligned, pack_ue8m0)
    else:
        width = -(-groups // 4) if pack_ue8m0 else groups
        check_out(
            OP_ID,
            out_s,
            like=x,
            shape=(*x.shape[:-1], width),
            dtype=torch.int32 if pack_ue8m0 else torch.float32,
            arg="out_s",
        )
        if column_major_scales and out_s.shape[-2] > 1 and out_s.stride(-2) != 1:
            raise ValueError(
                f"{OP_ID}: out_s must be column-major (stride 1 along M, dim -2) when "
                f"column_major_scales=True, got strides {out_s.stride()}"
            )
        if scale_tma_aligned and out_s.shape[-1] > 1 and out_s.stride(-1) % 4:
            raise ValueError(
                f"{OP_ID}: out_s columns must start 16 bytes apart (stride along dim -1 a "
                f"multiple of 4) when scale_tma_aligned=True, got strides {out_s.stride()}"
            )
    if out_q.numel():
        PER_TOKEN_GROUP_QUANT_8BIT.run(
            out_q,
            out_s,
            x,
            group_size,
            float(eps),
            bool(scale_ue8m0),
            bool(pack_ue8m0),
            bool(fuse_silu_and_mul),
            masked_m,
            backend=backend,
        )
    return out_q, out_s


def _per_token_group_quant_8bit_samples(device: torch.device) -> list[tuple[tuple, dict]]:
    """Small random calls: both 8-bit dtypes, every scale layout, M not a multiple of 4."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cases: list[tuple[tuple, dict]] = []
    for dtype in ACTIVATION_DTYPES:
        x = (torch.randn(5, 256, generator=g) * 4).to(dtype).to(device)
        cases.append(((x, 128), {}))
        cases.append(((x, 64), {"dst_dtype": torch.int8}))
    x = torch.randn(7, 512, generator=g).to(torch.bfloat16).to(device)
    cases.append(((x, 128), {"column_major_scales": True}))
    cases.append(((x, 128), {"column_major_scales": True, "scale_tma_aligned": True}))
    ue8m0 = {"column_major_scales": True, "scale_tma_aligned": True, "scale_ue8m0": True}
    cases.append(((x, 32), ue8m0))
    cases.append(((x, 32), {**ue8m0, "pack_ue8m0": True}))
    x = torch.randn(3, 4, 512, generator=g).to(torch.bfloat16).to(device)
    cases.append(((x, 128), {"fuse_silu_and_mul": True}))
    masked_m = torch.tensor([4, 0, 2], dtype=torch.int32).to(device)
    cases.append(((x, 128), {"masked_m": masked_m}))
    return cases
