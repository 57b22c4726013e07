"""Pure-torch references of the memory ops: the correctness oracle and the fallback.

SGLang's memory model: ``req_to_token [R, L]`` maps (request row, token position) to a KV slot;
page p holds slots ``[p * page_size, (p + 1) * page_size)``. Index values are preconditions: a value
out of range raises ValueError here (the GPU kernels skip or assert instead), so these references
synchronise with the host to check them. All index arithmetic is exact int64.
"""

from __future__ import annotations

import torch

from kernels_memory._checks import check_alloc_decode_values, check_alloc_extend_values


def _check_range(op: str, name: str, t: torch.Tensor, low: int, high: int) -> None:
    if t.numel() and (int(t.min()) < low or int(t.max()) >= high):
        raise ValueError(
            f"memory.{op}: {name} values must lie in [{low}, {high}), got values in "
            f"[{int(t.min())}, {int(t.max())}]"
        )


def _exclusive_cumsum(t: torch.Tensor) -> torch.Tensor:
    return torch.cumsum(t, 0) - t


def get_last_loc(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, prefix_lens: torch.Tensor
) -> torch.Tensor:
    """``req_to_token[req_pool_indices[i], prefix_lens[i] - 1]``, or -1 where the prefix is empty;
    in the dtype of prefix_lens."""
    rows, cols = req_to_token.shape
    index, prefix = req_pool_indices.long(), prefix_lens.long()
    _check_range("get_last_loc", "req_pool_indices", index, 0, rows)
    _check_range("get_last_loc", "prefix_lens", prefix, 0, cols + 1)
    last = req_to_token[index, (prefix - 1).clamp(min=0)].long()
    return torch.where(prefix > 0, last, -1).to(prefix_lens.dtype)


def write_req_to_token_pool(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    starts: torch.Tensor,
    ends: torch.Tensor,
    out_cache_loc: torch.Tensor,
    *,
    prefixes: list[torch.Tensor] | tuple[torch.Tensor, ...] = (),
) -> None:
    """``req_to_token[req_pool_indices[i], starts[i]:ends[i]] = out_cache_loc[off_i : ...]`` with
    ``off_i = sum_{j<i}(ends_j - starts_j)``; each given ``prefixes[i]`` is written first to
    ``req_to_token[req_pool_indices[i], :len(prefixes[i])]``. In place."""
    rows, cols = req_to_token.shape
    index, start, end = req_pool_indices.long(), starts.long(), ends.long()
    _check_range("write_req_to_token_pool", "req_pool_indices", index, 0, rows)
    lens = end - start
    if start.numel() and (int(start.min()) < 0 or int(lens.min()) < 0 or int(end.max()) > cols):
        raise ValueError(
            f"memory.write_req_to_token_pool: need 0 <= starts <= ends <= L = {cols}, got starts "
            f"{start.tolist()[:8]} and ends {end.tolist()[:8]}"
        )
    total = int(lens.sum()) if lens.numel() else 0
    if total != out_cache_loc.shape[0]:
        raise ValueError(
            f"memory.write_req_to_token_pool: out_cache_loc must hold sum(ends - starts) = {total} "
            f"slots, got {out_cache_loc.shape[0]}"
        )
    for i, prefix in enumerate(prefixes):
        if prefix.shape[0] > cols:
            raise ValueError(
                f"memory.write_req_to_token_pool: prefixes[{i}] has {prefix.shape[0]} slots, "
                f"more than L = {cols}"
            )
        req_to_token[index[i], : prefix.shape[0]] = prefix.to(req_to_token.dtype)
    if total == 0:
        return
    request = torch.repeat_interleave(torch.arange(lens.shape[0], device=lens.device), lens)
    within = torch.arange(total, device=lens.device) - _exclusive_cumsum(lens)[request]
    req_to_token[index[request], start[request] + within] = out_cache_loc.to(req_to_token.dtype)


def alloc_decode(
    seq_lens: torch.Tensor, last_loc: torch.Tensor, free_pages: torch.Tensor, page_size: int
) -> torch.Tensor:
    """One new slot per request (seq_lens counts the new token): ``last_loc + 1`` inside a page,
    else ``free_pages[rank] * page_size`` where rank counts earlier requests that needed a page.
    int64 [B]. Every value precondition is checked (``_checks.check_alloc_decode_values``)."""
    pages = check_alloc_decode_values(
        "memory.alloc_decode", seq_lens, last_loc, free_pages, page_size
    )
    seq = seq_lens.long()
    needs_page = (seq - 1) % page_size == 0
    rank = torch.cumsum(needs_page.long(), 0) - 1
    if pages == 0:
        return last_loc.long() + 1
    page = free_pages.long()[rank.clamp(min=0)]
    return torch.where(needs_page, page * page_size, last_loc.long() + 1)


def alloc_extend(
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    page_size: int,
    *,
    extend_num_tokens: int,
) -> torch.Tensor:
    """Slots for tokens [prefix, seq) of every request, in request then token order: first the rest
    of the partially filled last page (``last_loc + 1, ...``), then whole and partial new pages
    taken in order from ``free_pages``. int64 [extend_num_tokens]. Every value precondition is
    checked (``_checks.check_alloc_extend_values``)."""
    needed = check_alloc_extend_values(
        "memory.alloc_extend",
        prefix_lens,
        seq_lens,
        last_loc,
        free_pages,
        page_size,
        extend_num_tokens,
    )
    prefix, seq = prefix_lens.long(), seq_lens.long()
    extend = seq - prefix
    total = extend_num_tokens
    first_new = (prefix + page_size - 1) // page_size * page_size  # first slot of a new page
    new_pages = (seq + page_size - 1) // page_size - first_new // page_size
    if total == 0:
        return torch.empty(0, dtype=torch.int64, device=prefix.device)
    request = torch.repeat_interleave(torch.arange(extend.shape[0], device=extend.device), extend)
    within = torch.arange(total, device=extend.device) - _exclusive_cumsum(extend)[request]
    position = prefix[request] + within
    in_last_page = position < first_new[request]
    continued = last_loc.long()[request] + 1 + within
    page_index = (
        _exclusive_cumsum(new_pages)[request] + (position - first_new[request]) // page_size
    )
    pages = free_pages.long()
    page = pages[page_index.clamp(0, max(pages.shape[0] - 1, 0))] if needed else position
    fresh = page * page_size + position % page_size
    return torch.where(in_last_page, continued, fresh)


def copy_blocks(
    key_caches: list[torch.Tensor], value_caches: list[torch.Tensor], block_mapping: torch.Tensor
) -> None:
    """``cache[dst] = cache[src]`` for every (src, dst) row of block_mapping and every cache, in
    place; every source block is read before any write."""
    mapping = block_mapping.long()
    src, dst = mapping[:, 0], mapping[:, 1]
    caches = [*key_caches, *value_caches]
    if not caches or mapping.shape[0] == 0:
        return
    blocks = caches[0].shape[0]
    _check_range("copy_blocks", "block_mapping", mapping, 0, blocks)
    if torch.unique(dst).numel() != dst.numel():
        raise ValueError(
            f"memory.copy_blocks: destination blocks must be unique, got {dst.tolist()[:16]}"
        )
    if torch.isin(dst, src).any():
        clash = dst[torch.isin(dst, src)].tolist()[:8]
        raise ValueError(
            f"memory.copy_blocks: destination blocks must not also be sources, got {clash} in both"
        )
    for cache in caches:
        cache[dst] = cache[src]
