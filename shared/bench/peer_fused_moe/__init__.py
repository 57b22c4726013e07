"""vLLM's Triton fused MoE kernel as a benchmark peer of moe.fused_moe, with vLLM's shipped H200
configs, run from the source that ``python -m shared.bench.fetch_peers vllm_fused_moe`` cut out
of the vLLM wheel into ``.peers/vllm_fused_moe/`` (ignored; never committed).

The peer runs vLLM's bf16 pipeline (``fused_experts``): GEMM1 into [T*k, 2I] without weights,
silu_and_mul (torch eager here: vLLM's CUDA op is timed apart in the activation suite), GEMM2
with MUL_ROUTED_WEIGHT, then the k-sum. Alignment and the k-sum are ours (the same CUDA ops as
in our pipeline), so the comparison is of the two grouped GEMMs and the activation. The kernel
is called by argument name (``JITFunction.arg_names``): arguments this code does not know (bias,
quantization scales and flags of newer versions) get None / 0 / False.

Config: vLLM's file for (E, N=I) on the H200 (nearest token key, as vLLM's ``try_get_optimal_
moe_config``), else vLLM's default for unquantised bf16 (BLOCK_M 16/64 by M <= E).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import torch

from shared.bench.peers import PEERS_DIR, peer_source

PEER_DIR = PEERS_DIR / "vllm_fused_moe"


def kernel_module() -> Any | None:
    """The extracted kernel module, or None when absent (not fetched) or not loadable."""
    return peer_source("vllm_fused_moe", "fused_moe_kernel")


def config_file(experts: int, inter: int) -> Path | None:
    path = PEER_DIR / "configs" / f"E={experts},N={inter},device_name=NVIDIA_H200.json"
    return path if path.is_file() else None


def get_config(tokens: int, experts: int, inter: int) -> dict:
    path = config_file(experts, inter)
    if path is not None:
        table = {int(m): c for m, c in json.loads(path.read_text()).items()}
        return dict(table[min(table, key=lambda m: abs(m - tokens))])
    if tokens <= experts:
        return {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1}
    return {"BLOCK_SIZE_M": 64, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 32, "GROUP_SIZE_M": 8}


def _params(kernel) -> list[tuple[str, Any, bool]]:
    """(name, default or inspect.Parameter.empty, is constexpr) of each kernel argument, from the
    Python signature (a JITFunction on the GPU, an InterpretedFunction under TRITON_INTERPRET)."""
    out = []
    for param in inspect.signature(kernel.fn).parameters.values():
        constexpr = "constexpr" in str(param.annotation)
        out.append((param.name, param.default, constexpr))
    return out


def _invoke(kernel, a, b, c, weights, sorted_ids, expert_ids, post, top_k, mul_weight, config):
    """One launch of vLLM's fused_moe_kernel: C[slot] = A[slot // top_k or slot] @ B[e]^T."""
    import triton.language as tl

    n_out, k_in = b.shape[1], b.shape[2]
    em = sorted_ids.numel()
    meta = {k: v for k, v in config.items() if k not in ("num_warps", "num_stages")}
    values = {
        "a_ptr": a,
        "b_ptr": b,
        "c_ptr": c,
        "topk_weights_ptr": weights,
        "sorted_token_ids_ptr": sorted_ids,
        "expert_ids_ptr": expert_ids,
        "num_tokens_post_padded_ptr": post,
        "N": n_out,
        "K": k_in,
        "EM": em,
        "num_valid_tokens": weights.numel(),
        "stride_am": a.stride(0),
        "stride_ak": a.stride(1),
        "stride_be": b.stride(0),
        "stride_bk": b.stride(2),
        "stride_bn": b.stride(1),
        "stride_cm": c.stride(-2),
        "stride_cn": c.stride(-1),
        "MUL_ROUTED_WEIGHT": mul_weight,
        "top_k": top_k,
        "compute_type": tl.bfloat16 if a.dtype == torch.bfloat16 else tl.float16,
        "even_Ks": k_in % config["BLOCK_SIZE_K"] == 0,
        **meta,
    }
    args = {}
    for name, default, constexpr in _params(kernel):
        if name in values:
            args[name] = values[name]
        elif name.endswith("_ptr"):
            args[name] = None
        elif default is not inspect.Parameter.empty:
            args[name] = default
        elif constexpr and name not in ("group_n", "group_k"):
            args[name] = False  # quantisation / bias / TMA flags: off
        else:
            args[name] = 0  # strides of absent tensors, block-quant group sizes
    grid = (-(-em // config["BLOCK_SIZE_M"]) * -(-n_out // config["BLOCK_SIZE_N"]),)
    kernel[grid](
        **args,
        num_warps=config.get("num_warps", 4),
        num_stages=config.get("num_stages", 3),
    )


def fused_moe(hidden, w1, w2, topk_weights, topk_ids, out) -> torch.Tensor:
    """vLLM's bf16 fused_experts pipeline into ``out`` [T, H] (see the module docstring)."""
    from kernels_moe import moe_align_block_size, moe_sum_reduce

    module = kernel_module()
    tokens, top_k = topk_ids.shape
    experts, inter = w1.shape[0], w2.shape[2]
    config = get_config(tokens, experts, inter)
    sorted_ids, expert_ids, post = moe_align_block_size(topk_ids, experts, config["BLOCK_SIZE_M"])
    weights = topk_weights.reshape(-1)
    n = tokens * top_k
    cache1 = torch.empty(n, 2 * inter, dtype=hidden.dtype, device=hidden.device)
    cache3 = torch.empty(n, hidden.shape[1], dtype=hidden.dtype, device=hidden.device)
    kernel = module.fused_moe_kernel
    _invoke(kernel, hidden, w1, cache1, weights, sorted_ids, expert_ids, post, top_k, False, config)
    cache2 = torch.nn.functional.silu(cache1[:, :inter]) * cache1[:, inter:]
    _invoke(kernel, cache2, w2, cache3, weights, sorted_ids, expert_ids, post, 1, True, config)
    return moe_sum_reduce(cache3.view(tokens, top_k, -1), out=out)


def describe() -> dict:
    return {
        "source": str(PEER_DIR / "kernel.py"),
        "loaded": kernel_module() is not None,
        "configs": sorted(p.name for p in (PEER_DIR / "configs").glob("*.json"))[:4]
        if (PEER_DIR / "configs").is_dir()
        else [],
    }
