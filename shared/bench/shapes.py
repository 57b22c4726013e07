"""The benchmark grid of the token-major groups and the shapes the targets are judged on.

Tokens 1-64 are decode batches (launch-bound, timed under CUDA graphs), 128-1024 mixed batches,
8192 and 32768 prefill chunks; the widths are common hidden sizes (Llama-8B 4096, DeepSeek-V3
7168, Llama-70B 8192). DESIGN.md section 7 judges bandwidth at ``BANDWIDTH_SHAPES`` and latency
at ``DECODE_TOKENS``.
"""

from __future__ import annotations

TOKENS = (1, 16, 64, 128, 1024, 8192, 32768)
HIDDEN = (4096, 7168, 8192)
QUICK = ((1, 4096), (16, 8192), (64, 7168), (1024, 7168), (8192, 4096), (32768, 8192))
BANDWIDTH_SHAPES = ((8192, 4096), (8192, 8192), (32768, 4096), (32768, 8192))
DECODE_TOKENS = (1, 16, 64)
# Where the torch_compile peer gets a static graph per shape (--static-compile targets): the
# prefill chunks of the bandwidth targets and every batch up to 128 tokens.
PREFILL_TOKENS = (8192, 32768)
DECODE_MAX_TOKENS = 128


def token_grid(quick: bool) -> list[tuple[int, int]]:
    """(tokens, hidden) pairs to benchmark: the full grid, or a few spanning it with ``quick``."""
    if quick:
        return list(QUICK)
    return [(tokens, hidden) for hidden in HIDDEN for tokens in TOKENS]
