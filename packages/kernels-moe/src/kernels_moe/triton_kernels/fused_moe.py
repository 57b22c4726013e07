# ruff: noqa: N803 (Triton kernels name constexprs and sizes in capitals)
"""Triton kernels of moe.fused_moe: two grouped GEMMs over the expert-sorted token slots.

The slots (t, j) of top-k routing are sorted by expert into BLOCK_M-padded buckets by
``moe_align_block_size`` (bucket -1 first, then experts 0..E-1; padding entries hold n = T*k),
so every BLOCK_M block of ``sorted_token_ids`` belongs to one expert (``expert_ids[block]``).

1. ``_gate_up_kernel``: a program owns one block of slots and BLOCK_N columns of I; it
   accumulates the gate tile (rows n of w1[e]) and the up tile (rows I + n) in fp32 from the
   same A tile, rounds both to the dtype, and stores ``act(g) * u`` rounded to act[slot]
   ([n, I]): silu_and_mul fused in the epilogue, no [n, 2I] intermediate.
2. ``_down_kernel``: y[slot] = act[slot] @ w2[e]^T with the slot's top-k weight multiplied in
   fp32 in the epilogue, rounded; blocks of expert -1 store zero rows.
3. ``moe_sum_reduce`` (the group's op) sums the k rows of each token in fp32, times the scaling.

Programs are ordered GROUP_M blocks at a time along M (L2 reuse of weight tiles); programs of
blocks past ``num_tokens_post_padded`` return at once (the grid is sized by the worst-case
padded length, so a launch needs no host synchronisation and is CUDA-graph safe).

Block configs come from ``configs/fused_moe_<device>.json`` (keyed by E, I, H and dtype, then by
the token count T; the nearest T bucket is taken), else from :func:`default_config`.
``python -m kernels_moe.tune_fused_moe`` writes that table.

Under Triton's interpreter (CPU tensors, ``INTERPRETED``) two workarounds keep the CPU check
exact: the dot operands are widened to fp32 first (triton 3.9's interpreter misreads bf16
``tl.dot`` operands, results off by ~1e10; products of 16-bit values are exact in fp32), and fp32
-> bf16 rounds to nearest even by bit arithmetic (the interpreter's conversion does not round to
nearest). Neither is compiled into the GPU kernels.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
GEMM_KEYS = ("BLOCK_N", "BLOCK_K", "GROUP_M", "num_warps", "num_stages")
ACTIVATIONS = {"silu": 0, "gelu": 1}


@triton.jit
def _round(x, dtype: tl.constexpr, INTERPRETED: tl.constexpr):
    """fp32 ``x`` rounded (to nearest even) to ``dtype``."""
    if INTERPRETED and dtype == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
        x = bits.to(tl.float32, bitcast=True)
    return x.to(dtype)


@triton.jit
def _block_of(pid, EM, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of program ``pid``: GROUP_M blocks along M per column sweep."""
    num_pid_m = tl.cdiv(EM, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _gate_up_kernel(
    a_ptr,  # hidden [T, H]
    w_ptr,  # w1 [E, 2I, H]
    c_ptr,  # act [n, I]
    weights_ptr,  # topk_weights [n] fp32 (read only with MUL_INPUT)
    sorted_ptr,  # sorted_token_ids [EM] int32
    expert_ids_ptr,  # [EM / BLOCK_M] int32
    post_ptr,  # num_tokens_post_padded [1] int32
    N,  # I
    K,  # H
    EM,
    num_valid,  # n = T * k
    stride_am,
    stride_we,
    stride_wn,
    stride_cm,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    TOP_K: tl.constexpr,
    MUL_INPUT: tl.constexpr,
    ACTIVATION: tl.constexpr,
    EVEN_K: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    pid_m, pid_n = _block_of(tl.program_id(0), EM, N, BLOCK_M, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(post_ptr):
        return
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    if expert < 0:
        return  # filtered slots: the down kernel writes their zero rows
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slot = tl.load(sorted_ptr + offs_m).to(tl.int64)
    slot_mask = slot < num_valid
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows_n = (offs_n % N).to(tl.int64)  # in range: loads need no column mask
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + (slot // TOP_K)[:, None] * stride_am + offs_k[None, :]
    g_ptrs = w_ptr + expert * stride_we + rows_n[None, :] * stride_wn + offs_k[:, None]
    u_ptrs = g_ptrs + N * stride_wn
    if MUL_INPUT:
        w = tl.load(weights_ptr + slot, mask=slot_mask, other=0.0)
    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=slot_mask[:, None], other=0.0)
            bg = tl.load(g_ptrs)
            bu = tl.load(u_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=slot_mask[:, None] & (offs_k[None, :] < k_left), other=0.0)
            bg = tl.load(g_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
            bu = tl.load(u_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if MUL_INPUT:
            a = _round(a.to(tl.float32) * w[:, None], a_ptr.dtype.element_ty, INTERPRETED)
        if INTERPRETED:
            a, bg, bu = a.to(tl.float32), bg.to(tl.float32), bu.to(tl.float32)
        acc_g = tl.dot(a, bg, acc=acc_g)
        acc_u = tl.dot(a, bu, acc=acc_u)
        a_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K
    dtype = c_ptr.dtype.element_ty
    g = _round(acc_g, dtype, INTERPRETED).to(tl.float32)  # GEMM1 output rounded (OPS.md)
    u = _round(acc_u, dtype, INTERPRETED).to(tl.float32)
    if ACTIVATION == 0:
        act = g * tl.sigmoid(g)
    else:
        act = 0.5 * g * (1.0 + tl.math.erf(g * 0.7071067811865476))
    c_ptrs = c_ptr + slot[:, None] * stride_cm + offs_n[None, :]
    out = _round(act * u, dtype, INTERPRETED)
    tl.store(c_ptrs, out, mask=slot_mask[:, None] & (offs_n[None, :] < N))


@triton.jit
def _down_kernel(
    a_ptr,  # act [n, I]
    w_ptr,  # w2 [E, H, I]
    c_ptr,  # y [n, H]
    weights_ptr,  # topk_weights [n] fp32
    sorted_ptr,
    expert_ids_ptr,
    post_ptr,
    N,  # H
    K,  # I
    EM,
    num_valid,
    stride_am,
    stride_we,
    stride_wn,
    stride_cm,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    MUL_WEIGHT: tl.constexpr,
    EVEN_K: tl.constexpr,
    INTERPRETED: tl.constexpr,
):
    pid_m, pid_n = _block_of(tl.program_id(0), EM, N, BLOCK_M, BLOCK_N, GROUP_M)
    if pid_m * BLOCK_M >= tl.load(post_ptr):
        return
    dtype = c_ptr.dtype.element_ty
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    slot = tl.load(sorted_ptr + offs_m).to(tl.int64)
    slot_mask = slot < num_valid
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    c_ptrs = c_ptr + slot[:, None] * stride_cm + offs_n[None, :]
    c_mask = slot_mask[:, None] & (offs_n[None, :] < N)
    expert = tl.load(expert_ids_ptr + pid_m).to(tl.int64)
    if expert < 0:  # slots filtered out (id -1): zero rows, so the k-sum reads no garbage
        tl.store(c_ptrs, tl.zeros((BLOCK_M, BLOCK_N), dtype=dtype), mask=c_mask)
        return
    rows_n = (offs_n % N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + slot[:, None] * stride_am + offs_k[None, :]
    b_ptrs = w_ptr + expert * stride_we + rows_n[None, :] * stride_wn + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=slot_mask[:, None], other=0.0)
            b = tl.load(b_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(a_ptrs, mask=slot_mask[:, None] & (offs_k[None, :] < k_left), other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        if INTERPRETED:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc=acc)
        a_ptrs += BLOCK_K
        b_ptrs += BLOCK_K
    if MUL_WEIGHT:
        w = tl.load(weights_ptr + slot, mask=slot_mask, other=0.0)
        acc = acc * w[:, None]  # fp32, then one rounding (OPS.md)
    tl.store(c_ptrs, _round(acc, dtype, INTERPRETED), mask=c_mask)


# --- configs -------------------------------------------------------------------------------------


def shape_key(experts: int, inter: int, hidden: int, dtype: torch.dtype | str) -> str:
    """The table key of one model shape: ``E=8,N=14336,H=4096,dtype=bfloat16`` (N = I)."""
    name = dtype if isinstance(dtype, str) else str(dtype).removeprefix("torch.")
    return f"E={experts},N={inter},H={hidden},dtype={name}"


def config_path(device_name: str) -> Path:
    return CONFIG_DIR / f"fused_moe_{device_name.replace(' ', '_')}.json"


@functools.cache
def load_table(path: Path) -> dict[str, dict[str, Any]]:
    """The config table at ``path`` ({} when absent)."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return {}


def default_config(tokens: int, topk: int, experts: int, inter: int, hidden: int) -> dict:
    """A sensible config for a shape the table lacks: small BLOCK_M and narrow N tiles while
    few slots per expert (the GEMMs read the weights once: bandwidth-bound), 64/128 x 128 tiles
    with deeper pipelines once each expert has a full block of slots (compute-bound)."""
    per_expert = tokens * topk / max(experts, 1)
    if per_expert <= 16:
        return {
            "BLOCK_M": 16,
            "gate_up": {
                "BLOCK_N": 64,
                "BLOCK_K": 128,
                "GROUP_M": 1,
                "num_warps": 4,
                "num_stages": 4,
            },
            "down": {"BLOCK_N": 64, "BLOCK_K": 128, "GROUP_M": 1, "num_warps": 4, "num_stages": 4},
        }
    if per_expert <= 64:
        return {
            "BLOCK_M": 32,
            "gate_up": {
                "BLOCK_N": 64,
                "BLOCK_K": 64,
                "GROUP_M": 8,
                "num_warps": 4,
                "num_stages": 4,
            },
            "down": {"BLOCK_N": 64, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 4, "num_stages": 4},
        }
    block_m = 64 if per_expert <= 256 else 128
    return {
        "BLOCK_M": block_m,
        "gate_up": {"BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 3},
        "down": {"BLOCK_N": 128, "BLOCK_K": 64, "GROUP_M": 8, "num_warps": 8, "num_stages": 4},
    }


def interpreter_config() -> dict:
    """Small tiles for Triton's interpreter (CPU tensors): the fewest programs worth checking."""
    gemm = {"BLOCK_N": 16, "BLOCK_K": 32, "GROUP_M": 2, "num_warps": 4, "num_stages": 1}
    return {"BLOCK_M": 16, "gate_up": dict(gemm), "down": dict(gemm)}


def nearest_bucket(buckets: dict[str, Any], tokens: int) -> Any:
    """The entry whose T bucket is nearest to ``tokens`` (ties to the smaller bucket)."""
    best = min(buckets, key=lambda b: (abs(int(b) - tokens), int(b)))
    return buckets[best]


def get_config(
    tokens: int,
    topk: int,
    experts: int,
    inter: int,
    hidden: int,
    dtype: torch.dtype,
    device: torch.device,
) -> dict:
    """The block config of one call: the device's table (this dtype's shape, else the other
    16-bit dtype's: same bytes), the nearest T bucket; else :func:`default_config`."""
    if device.type != "cuda":
        return interpreter_config()
    table = load_table(config_path(torch.cuda.get_device_name(device)))
    for name in (dtype, torch.float16 if dtype == torch.bfloat16 else torch.bfloat16):
        buckets = table.get(shape_key(experts, inter, hidden, name))
        if buckets:
            return nearest_bucket(buckets, tokens)
    return default_config(tokens, topk, experts, inter, hidden)


# --- launcher ------------------------------------------------------------------------------------


def invoke_gate_up(
    act: torch.Tensor,
    hidden: torch.Tensor,
    w1: torch.Tensor,
    topk_weights: torch.Tensor,
    sorted_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    post: torch.Tensor,
    topk: int,
    block_m: int,
    gemm: dict,
    activation: str,
    mul_input: bool,
) -> None:
    inter, dim = act.shape[1], hidden.shape[1]
    em = sorted_ids.numel()
    grid = (triton.cdiv(em, block_m) * triton.cdiv(inter, gemm["BLOCK_N"]),)
    _gate_up_kernel[grid](
        hidden,
        w1,
        act,
        topk_weights,
        sorted_ids,
        expert_ids,
        post,
        inter,
        dim,
        em,
        act.shape[0],
        hidden.stride(0),
        w1.stride(0),
        w1.stride(1),
        act.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=gemm["BLOCK_N"],
        BLOCK_K=gemm["BLOCK_K"],
        GROUP_M=gemm["GROUP_M"],
        TOP_K=topk,
        MUL_INPUT=mul_input,
        ACTIVATION=ACTIVATIONS[activation],
        EVEN_K=dim % gemm["BLOCK_K"] == 0,
        INTERPRETED=hidden.device.type != "cuda",
        num_warps=gemm["num_warps"],
        num_stages=gemm["num_stages"],
    )


def invoke_down(
    y: torch.Tensor,
    act: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    sorted_ids: torch.Tensor,
    expert_ids: torch.Tensor,
    post: torch.Tensor,
    block_m: int,
    gemm: dict,
    mul_weight: bool,
) -> None:
    dim, inter = y.shape[1], act.shape[1]
    em = sorted_ids.numel()
    grid = (triton.cdiv(em, block_m) * triton.cdiv(dim, gemm["BLOCK_N"]),)
    _down_kernel[grid](
        act,
        w2,
        y,
        topk_weights,
        sorted_ids,
        expert_ids,
        post,
        dim,
        inter,
        em,
        y.shape[0],
        act.stride(0),
        w2.stride(0),
        w2.stride(1),
        y.stride(0),
        BLOCK_M=block_m,
        BLOCK_N=gemm["BLOCK_N"],
        BLOCK_K=gemm["BLOCK_K"],
        GROUP_M=gemm["GROUP_M"],
        MUL_WEIGHT=mul_weight,
        EVEN_K=inter % gemm["BLOCK_K"] == 0,
        INTERPRETED=act.device.type != "cuda",
        num_warps=gemm["num_warps"],
        num_stages=gemm["num_stages"],
    )


def fused_moe(
    out: torch.Tensor,
    hidden: torch.Tensor,
    w1: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    activation: str,
    apply_router_weight_on_input: bool,
    routed_scaling_factor: float,
    config: dict | None = None,
) -> None:
    """Run fused MoE into ``out`` [T, H]: align, gate/up + activation, down + weight, k-sum.

    ``config`` overrides the table (the tuner passes its candidates here). Needs hidden with a
    contiguous last dim, w1/w2 with contiguous last dims, T >= 1.
    """
    from kernels_moe.ops.moe_align_block_size import moe_align_block_size
    from kernels_moe.ops.moe_sum_reduce import moe_sum_reduce

    tokens, topk = topk_ids.shape
    experts, inter, dim = w1.shape[0], w2.shape[2], hidden.shape[1]
    if config is None:
        config = get_config(tokens, topk, experts, inter, dim, hidden.dtype, hidden.device)
    block_m = config["BLOCK_M"]
    n = tokens * topk
    sorted_ids, expert_ids, post = moe_align_block_size(topk_ids.contiguous(), experts, block_m)
    weights = topk_weights.contiguous().reshape(-1)
    act = torch.empty((n, inter), dtype=hidden.dtype, device=hidden.device)
    y = torch.empty((n, dim), dtype=hidden.dtype, device=hidden.device)
    gate_up = config["gate_up"]
    down = config["down"]
    invoke_gate_up(
        act,
        hidden,
        w1,
        weights,
        sorted_ids,
        expert_ids,
        post,
        topk,
        block_m,
        gate_up,
        activation,
        apply_router_weight_on_input,
    )
    invoke_down(
        y,
        act,
        w2,
        weights,
        sorted_ids,
        expert_ids,
        post,
        block_m,
        down,
        not apply_router_weight_on_input,
    )
    moe_sum_reduce(y.view(tokens, topk, dim), routed_scaling_factor=routed_scaling_factor, out=out)
