"""Slot id -> (page, row in page) for the paged KV caches, by shifts where the page size is a power of two.

Why: the decode kernels split every gathered slot id by the cache's page size, a runtime integer, which Triton lowers
to a signed division (~10 instructions an element with the reciprocal hoisted; the 64-head V3.2 tile on sm_90 does
it for several register layouts of the same ids every tile). The caches sglang passes have power-of-two pages (64
for DeepSeek-V3.2 and the V4 caches), so the launcher passes the shift as a constexpr and the split is a shift and a
mask; any other page size keeps the division (the same results).
"""

import triton
import triton.language as tl


def page_shift(page_size: int) -> int:
    """log2(page_size) for a power of two, else -1 (the kernels then divide)."""
    return page_size.bit_length() - 1 if page_size > 0 and page_size & (page_size - 1) == 0 else -1


@triton.jit
def page_split(slot, page_size, PAGE_SHIFT: tl.constexpr):
    """(page, row in page) of slot ids ``slot`` (any shape, >= 0) in a cache of ``page_size``-slot pages;
    ``PAGE_SHIFT`` = :func:`page_shift` of it."""
    if PAGE_SHIFT >= 0:
        return slot >> PAGE_SHIFT, slot & ((1 << PAGE_SHIFT) - 1)
    return slot // page_size, slot % page_size


@triton.jit
def page_split_either(slot, in_main, page_size, page_size_x, PAGE_SHIFT: tl.constexpr, PAGE_SHIFT_X: tl.constexpr):
    """:func:`page_split` for a tile of one of two caches, the main one where ``in_main`` (a scalar) and else the
    extra one, with their page sizes and shifts (equal shifts: one constexpr shift, no select)."""
    if PAGE_SHIFT >= 0 and PAGE_SHIFT == PAGE_SHIFT_X:
        return page_split(slot, page_size, PAGE_SHIFT)
    if PAGE_SHIFT >= 0 and PAGE_SHIFT_X >= 0:
        shift = tl.where(in_main, PAGE_SHIFT, PAGE_SHIFT_X)
        return slot >> shift, slot & ((1 << shift) - 1)
    psz = tl.where(in_main, page_size, page_size_x)
    return slot // psz, slot % psz
