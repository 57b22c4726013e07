"""Argument checks shared by the memory ops."""

from __future__ import annotations

import torch

from kernels_jit.validation import check_tensor

INDEX_DTYPES = (torch.int32, torch.int64)


def check_index_vector(op: str, name: str, t: object, length: int | None, device) -> None:
    """A 1-D int32/int64 tensor on ``device``, of ``length`` entries when given."""
    check_tensor(op, name, t, dtypes=INDEX_DTYPES, ndim=1, device=device)
    if length is not None and t.shape[0] != length:
        raise ValueError(
            f"{op}: {name} must have {length} entries (one per request), got {t.shape[0]}"
        )


def check_page_size(op: str, page_size: object) -> None:
    if isinstance(page_size, bool) or not isinstance(page_size, int):
        raise TypeError(f"{op}: page_size must be an int, got {type(page_size).__name__}")
    if page_size < 1:
        raise ValueError(f"{op}: page_size must be >= 1, got {page_size}")


def check_flag(op: str, name: str, value: object) -> None:
    if value is not True and value is not False:
        raise TypeError(f"{op}: {name} must be a bool, got {type(value).__name__} {value!r}")


# Value checks. They read index values on the host: free on CPU tensors, a device-to-host sync
# on CUDA ones. The torch reference (the oracle) always runs them; the public ops run them before
# dispatch only when called with ``validate=True``, so a CUDA kernel stays sync-free and
# capturable. Each error names the op, the argument, the first offending index and its value.


def _first(mask: torch.Tensor) -> int:
    """Index of the first True of a 1-D bool tensor that has one."""
    return int(mask.long().argmax())


def check_at_least(op: str, name: str, t: torch.Tensor, low: int, meaning: str = "") -> None:
    """Every ``t[i] >= low``."""
    bad = t < low
    if t.numel() and bool(bad.any()):
        i = _first(bad)
        raise ValueError(f"{op}: {name}[{i}] = {int(t[i])} must be >= {low}{meaning}")


def check_last_loc(
    op: str,
    last_loc: torch.Tensor,
    used: torch.Tensor,
    offset: torch.Tensor,
    page_size: int,
    length_name: str,
    lengths: torch.Tensor,
) -> None:
    """``last_loc >= -1`` everywhere (-1 = empty); where ``used`` (the request continues its
    partly filled last page from ``last_loc + 1``), ``last_loc`` is a slot (>= 0) at in-page
    ``offset`` (the page offset of the last token), else the new slots would run into the next
    page, which belongs to someone else."""
    check_at_least(op, "last_loc", last_loc, -1, " (-1 = empty, other negative values are invalid)")
    negative = used & (last_loc < 0)
    if bool(negative.any()):
        i = _first(negative)
        raise ValueError(
            f"{op}: last_loc[{i}] = {int(last_loc[i])} must be a slot (>= 0): request {i} "
            f"({length_name}[{i}] = {int(lengths[i])}, page_size {page_size}) continues its last "
            "page from last_loc + 1"
        )
    misplaced = used & (last_loc % page_size != offset)
    if bool(misplaced.any()):
        i = _first(misplaced)
        raise ValueError(
            f"{op}: last_loc[{i}] = {int(last_loc[i])} is at page offset "
            f"{int(last_loc[i]) % page_size}, but request {i} ({length_name}[{i}] = "
            f"{int(lengths[i])}) has its last token at offset {int(offset[i])} of a "
            f"{page_size}-slot page"
        )


def check_free_pages(op: str, free_pages: torch.Tensor, needed: int, who: str) -> None:
    """The call takes ``free_pages[:needed]``: the list must be that long, and the pages taken
    must be page ids (>= 0) and distinct (a page handed out twice is shared by two requests).
    Entries past ``needed`` are not read, so they are not checked."""
    if needed > free_pages.shape[0]:
        raise ValueError(
            f"{op}: {who} but free_pages holds {free_pages.shape[0]} "
            "(not enough free pages: the engine must free or evict first)"
        )
    taken = free_pages[:needed].long()
    check_at_least(op, "free_pages", taken, 0, " (a page id)")
    if needed > 1:
        ordered, order = torch.sort(taken, stable=True)
        repeat = ordered[1:] == ordered[:-1]
        if bool(repeat.any()):
            k = _first(repeat)
            first, again = sorted((int(order[k]), int(order[k + 1])))
            raise ValueError(
                f"{op}: free_pages[{first}] and free_pages[{again}] are both page "
                f"{int(ordered[k])}; the pages taken must be distinct"
            )


def check_alloc_decode_values(
    op: str,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    page_size: int,
) -> int:
    """All value preconditions of alloc_decode; returns how many free pages the call takes."""
    seq, last = seq_lens.long(), last_loc.long()
    check_at_least(op, "seq_lens", seq, 1, " (lengths after appending the new token)")
    needs_page = (seq - 1) % page_size == 0
    check_last_loc(op, last, ~needs_page, (seq - 2) % page_size, page_size, "seq_lens", seq)
    needed = int(needs_page.sum())
    check_free_pages(op, free_pages, needed, f"{needed} requests need a new page")
    return needed


def check_alloc_extend_values(
    op: str,
    prefix_lens: torch.Tensor,
    seq_lens: torch.Tensor,
    last_loc: torch.Tensor,
    free_pages: torch.Tensor,
    page_size: int,
    extend_num_tokens: int,
) -> int:
    """All value preconditions of alloc_extend; returns how many free pages the call takes."""
    prefix, seq, last = prefix_lens.long(), seq_lens.long(), last_loc.long()
    check_at_least(op, "prefix_lens", prefix, 0)
    short = seq < prefix
    if bool(short.any()):
        i = _first(short)
        raise ValueError(
            f"{op}: need seq_lens >= prefix_lens, got seq_lens[{i}] = {int(seq[i])} < "
            f"prefix_lens[{i}] = {int(prefix[i])}"
        )
    total = int((seq - prefix).sum()) if seq.numel() else 0
    if total != extend_num_tokens:
        raise ValueError(
            f"{op}: extend_num_tokens must equal sum(seq_lens - prefix_lens) = {total}, "
            f"got {extend_num_tokens}"
        )
    continues = (prefix % page_size != 0) & (seq > prefix)
    check_last_loc(op, last, continues, (prefix - 1) % page_size, page_size, "prefix_lens", prefix)
    new_pages = (seq + page_size - 1) // page_size - (prefix + page_size - 1) // page_size
    needed = int(new_pages.sum()) if new_pages.numel() else 0
    check_free_pages(op, free_pages, needed, f"the requests need {needed} new pages")
    return needed


def check_block_mapping_values(op: str, block_mapping: torch.Tensor, blocks: int) -> None:
    """copy_blocks: every index in [0, blocks), destinations unique and not also sources."""
    mapping = block_mapping.long()
    if not mapping.numel():
        return
    low, high = int(mapping.min()), int(mapping.max())
    if low < 0 or high >= blocks:
        raise ValueError(
            f"{op}: block_mapping values must lie in [0, {blocks}) (blocks of the caches), got "
            f"values in [{low}, {high}]"
        )
    src, dst = mapping[:, 0], mapping[:, 1]
    if torch.unique(dst).numel() != dst.numel():
        raise ValueError(f"{op}: destination blocks must be unique, got {dst.tolist()[:16]}")
    clash = torch.isin(dst, src)
    if bool(clash.any()):
        raise ValueError(
            f"{op}: destination blocks must not also be sources, got {dst[clash].tolist()[:8]} "
            "in both"
        )
