"""Triton exact top-k of the lightning indexer (DeepSeek-V4): the per-row selection the top-k kernel and the fused
logits + top-k tail of :mod:`sparsemla.kernels.indexer.triton` share, the top-k kernel and its launcher.

Semantics are those of :func:`sparsemla.kernels.indexer.reference.indexer_topk_reference` (this module never imports
it).

Top-k (exact, deterministic): one program per row finds the k-th largest key by 8-bit radix passes (``tl.histogram``;
a compare-count 4-bit variant measured 2-3x slower on the H200) over an order-preserving int32 image of the fp32
logits, compacts the winners (ties at the threshold go to the smaller positions), then sorts the k winners by (value
desc, position asc) with one bitonic sort of a packed int64. Each row takes one of three paths, chosen on the device
from its length: ``length <= k`` needs no selection; a row that fits a register tile (``TOPK_ROW_TILES`` /
``FUSED_ROW_TILES``: a small and a large tile, so a short row does not pay for the large one) is loaded once, its keys
stay in registers for every radix pass and the compaction scan, and the search stops after the first pass whose
threshold bin holds exactly the keys still needed (at most four passes); a longer row streams from memory once per
pass (four passes plus the compaction). The tile sizes come from shapes only (``k``, the row capacity and, for the
top-k kernel, the row count), so a captured CUDA graph replays for any lengths.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from sparsemla.kernels import device as dev
from sparsemla.kernels.layouts import IDX_PAGE

TOPK_SIZES = (512, 1024, 2048)
# Register tiles (elements) of the top-k's in-register path, (small, max), per kernel: rows up to max are loaded once
# and selected in registers, longer rows stream. Both compile without spills for sm_90 up to 16384 (see _topk_paths;
# the fused tail runs at the logits kernel's 8 warps, the top-k kernel at TOPK_WARPS); a 16384 tile takes ~250
# registers a thread, so the top-k kernel keeps a large tile only for a single wave of rows (see _topk_row_tiles).
# H200, CUDA-graph replay, top-512 of one row (results/bench/explore/topk_explore-h200-2026-11-29.json): a 4k row
# 19.2 us in a 4096 tile vs 29.4 streaming; a 16k row 128 us in a 16384 tile vs 87 streaming -- so the large tile
# is 4096 too until the in-register passes get cheaper than streaming at 16k.
TOPK_ROW_TILES = (4096, 4096)
FUSED_ROW_TILES = (4096, 4096)
TOPK_WARPS = 8


# ---------------------------------------------------------------------------------------------------------------------
# device helpers
# ---------------------------------------------------------------------------------------------------------------------
@triton.jit
def _order_key(v):
    """int32 image of fp32 ``v`` whose signed order is the float order (-0.0 maps onto +0.0; NaN unsupported)."""
    x = v.to(tl.int32, bitcast=True)
    x = tl.where(x == -2147483647 - 1, 0, x)
    return x ^ ((x >> 31) & 0x7FFFFFFF)


@triton.jit
def _load_row(ptr, mask, FROM_L2: tl.constexpr):
    """fp32 loads; ``FROM_L2`` reads through L2 (.cg) because other CTAs of this launch wrote the data."""
    if FROM_L2:
        v = tl.load(ptr, mask=mask, other=0.0, cache_modifier=".cg")
    else:
        v = tl.load(ptr, mask=mask, other=0.0)
    return v


@triton.jit
def _bin_combine(n_a, ge_a, above_a, n_b, ge_b, above_b):
    return n_a + n_b, tl.minimum(ge_a, ge_b), tl.maximum(above_a, above_b)


@triton.jit
def _pick_bin(hist, k_rem, BIG: tl.constexpr):
    """Radix step over a 256-bin histogram: the bin ``d`` holding the ``k_rem``-th largest key, the number of keys in
    bins above it, and the number in it (one fused reduction after the suffix scan)."""
    ge = tl.cumsum(hist, axis=0, reverse=True)  # [256] keys at or above each bin
    sel = ge >= k_rem  # bins [0, d]
    n_sel, ge_d, above = tl.reduce((sel.to(tl.int32), tl.where(sel, ge, BIG), tl.where(sel, 0, ge)), 0, _bin_combine)
    return n_sel - 1, above, ge_d - above


@triton.jit
def _select_in_registers(src_ptr, length, idx_out_ptr, K: tl.constexpr, ROW: tl.constexpr, FROM_L2: tl.constexpr):
    """Writes the positions of the top-``K`` keys of ``src_ptr[0:length]`` (``K < length <= ROW``) to
    ``idx_out_ptr[0:K]`` in position order. The row is loaded once; every radix pass is a histogram of the keys
    held in registers, and a pass that leaves exactly the keys still needed in the threshold bin ends the search."""
    o_r = tl.arange(0, ROW)
    valid = o_r < length
    key = _order_key(_load_row(src_ptr + o_r, valid, FROM_L2))  # [ROW]
    tl.static_assert(ROW <= 32768, "the compaction scan packs two 16-bit counts")
    prefix = length * 0  # the threshold key, 8 bits at a time from the top
    k_rem = length * 0 + K  # keys still to take from the bin that matches ``prefix``
    low = length * 0 + 32  # low bits of the threshold not determined yet
    more = length * 0 + 1  # 0 once a pass leaves exactly k_rem keys in its threshold bin (all of them win)
    for p in tl.static_range(4):
        if more != 0:
            if p == 0:
                m = valid
                digit = ((key >> 24) + 128) & 255
            else:
                m = valid & ((key >> (32 - 8 * p)) == (prefix >> (32 - 8 * p)))
                digit = (key >> (24 - 8 * p)) & 255
            d, above, in_bin = _pick_bin(tl.histogram(digit, 256, mask=m), k_rem, ROW + 1)
            k_rem -= above
            if p == 0:
                prefix = (d - 128) << 24
            else:
                prefix = prefix | (d << (24 - 8 * p))
            low = length * 0 + (24 - 8 * p)
            more = (in_bin != k_rem).to(tl.int32)
    # keys above the prefix all win; k_rem of the keys equal to it win, smallest positions first
    hi = key >> low
    gt = valid & (hi > (prefix >> low))
    eq = valid & (hi == (prefix >> low))
    both = gt.to(tl.int32) | (eq.to(tl.int32) << 16)  # one scan counts both (ROW <= 32768)
    before = tl.cumsum(both, axis=0) - both
    eq_before = before >> 16
    take = gt | (eq & (eq_before < k_rem))
    slot = (before & 0xFFFF) + tl.minimum(eq_before, k_rem)
    tl.store(idx_out_ptr + slot, o_r, mask=take)


@triton.jit
def _select_streaming(src_ptr, length, idx_out_ptr, K: tl.constexpr, BLOCK: tl.constexpr, FROM_L2: tl.constexpr):
    """Same contract as :func:`_select_in_registers` for rows of any length: four 8-bit radix passes and a compaction
    pass, each streaming the row in ``BLOCK`` pieces."""
    o_b = tl.arange(0, BLOCK)
    o_bin = tl.arange(0, 256)
    prefix = length * 0  # int32 scalar: the threshold key, built 8 bits at a time from the top
    k_rem = length * 0 + K
    for p in tl.static_range(4):
        hist = tl.zeros([256], dtype=tl.int32)
        for start in range(0, length, BLOCK):
            offs = start + o_b
            m = offs < length
            key = _order_key(_load_row(src_ptr + offs, m, FROM_L2))  # [BLOCK]
            if p == 0:
                digit = ((key >> 24) + 128) & 255
            else:
                m = m & ((key >> (32 - 8 * p)) == (prefix >> (32 - 8 * p)))
                digit = (key >> (24 - 8 * p)) & 255
            hist += tl.histogram(digit, 256, mask=m)
        # bins with at least k_rem keys at or above them form [0, d]; d is the k-th key's digit
        ge = tl.sum(hist, axis=0) - tl.cumsum(hist, axis=0) + hist  # [256]
        d = tl.sum((ge >= k_rem).to(tl.int32), axis=0) - 1
        k_rem -= tl.sum(tl.where(o_bin > d, hist, 0), axis=0)
        if p == 0:
            prefix = (d - 128) << 24
        else:
            prefix = prefix | (d << (24 - 8 * p))
    # keys > prefix all win; k_rem of the keys == prefix win, smallest positions first
    n_sel = length * 0
    n_eq = length * 0
    for start in range(0, length, BLOCK):
        offs = start + o_b
        m = offs < length
        key = _order_key(_load_row(src_ptr + offs, m, FROM_L2))  # [BLOCK]
        gt = (m & (key > prefix)).to(tl.int32)
        eq = (m & (key == prefix)).to(tl.int32)
        eq_rank = n_eq + tl.cumsum(eq, axis=0) - eq
        take = gt | (eq & (eq_rank < k_rem).to(tl.int32))
        slot = n_sel + tl.cumsum(take, axis=0) - take
        tl.store(idx_out_ptr + slot, offs, mask=take != 0)
        n_sel += tl.sum(take, axis=0)
        n_eq += tl.sum(eq, axis=0)


@triton.jit
def _topk_row(
    src_ptr,
    length,
    idx_out_ptr,
    slot_out_ptr,
    pt_row_ptr,
    K: tl.constexpr,
    BLOCK: tl.constexpr,
    ROW_SMALL: tl.constexpr,
    ROW_MAX: tl.constexpr,
    STREAM: tl.constexpr,
    WRITE_SLOTS: tl.constexpr,
    WRITE_IDX: tl.constexpr,
    PAGE_BITS: tl.constexpr,
    FROM_L2: tl.constexpr,
):
    """Top-``K`` positions of ``src_ptr[0:length]`` (fp32, contiguous) by (value desc, position asc), -1 padded.

    The selection path is chosen per row on the device: ``length <= K`` needs none, ``length <= ROW_SMALL`` and
    ``length <= ROW_MAX`` hold the row in registers (two register tiles so a short row does not pay for a long tile),
    longer rows stream (compiled only with ``STREAM``). ``idx_out_ptr`` [K] int32 receives positions (it is also the
    selection's scratch, so it is always written); with ``WRITE_SLOTS`` ``slot_out_ptr`` [K] receives
    ``pt_row[pos >> PAGE_BITS] << PAGE_BITS | pos & page_mask``."""
    o_k = tl.arange(0, K)
    if length > K:
        if length <= ROW_SMALL:
            _select_in_registers(src_ptr, length, idx_out_ptr, K, ROW_SMALL, FROM_L2)
        if ROW_MAX > ROW_SMALL:
            if (length > ROW_SMALL) & (length <= ROW_MAX):
                _select_in_registers(src_ptr, length, idx_out_ptr, K, ROW_MAX, FROM_L2)
        if STREAM:
            if length > ROW_MAX:
                _select_streaming(src_ptr, length, idx_out_ptr, K, BLOCK, FROM_L2)
        tl.debug_barrier()
        pos = tl.load(idx_out_ptr + o_k)  # [K] the K winners, in position order
        valid = o_k < K
    else:
        pos = o_k
        valid = o_k < length
    v = _load_row(src_ptr + pos, valid, FROM_L2)  # [K]
    key = tl.where(valid, _order_key(v), -2147483647 - 1)
    packed = (key.to(tl.int64) << 32) | (0x7FFFFFFF - pos).to(tl.int64)
    packed = tl.sort(packed, descending=True)
    pos = 0x7FFFFFFF - packed.to(tl.int32)  # low 32 bits
    count = tl.minimum(length, K)
    ok = o_k < count
    tl.debug_barrier()
    if WRITE_IDX:
        tl.store(idx_out_ptr + o_k, tl.where(ok, pos, -1))
    if WRITE_SLOTS:
        page = tl.load(pt_row_ptr + (pos >> PAGE_BITS), mask=ok, other=0)
        slots = (page << PAGE_BITS) | (pos & ((1 << PAGE_BITS) - 1))
        tl.store(slot_out_ptr + o_k, tl.where(ok, slots, -1))


# ---------------------------------------------------------------------------------------------------------------------
# kernel
# ---------------------------------------------------------------------------------------------------------------------
@triton.jit
def _indexer_topk_kernel(
    logits_ptr,  # fp32 [rows, >= lengths], unit column stride
    lens_ptr,  # int32 [rows]
    pt_ptr,  # int32 [rows, max_pages] (WRITE_SLOTS only)
    idx_ptr,  # int32 [rows, K] positions (always written: it is also the compaction scratch)
    slot_ptr,  # int32 [rows, K] page-table slots (WRITE_SLOTS only)
    stride_l,
    stride_pt,
    stride_idx,
    stride_slot,
    n_cols,
    K: tl.constexpr,
    BLOCK: tl.constexpr,
    ROW_SMALL: tl.constexpr,
    ROW_MAX: tl.constexpr,
    STREAM: tl.constexpr,
    WRITE_SLOTS: tl.constexpr,
    PAGE_BITS: tl.constexpr,
):
    i_r = tl.program_id(0).to(tl.int64)
    n = tl.load(lens_ptr + i_r)
    n = tl.minimum(tl.maximum(n, 0), n_cols)
    _topk_row(
        logits_ptr + i_r * stride_l,
        n,
        idx_ptr + i_r * stride_idx,
        slot_ptr + i_r * stride_slot,
        pt_ptr + i_r * stride_pt,
        K,
        BLOCK,
        ROW_SMALL,
        ROW_MAX,
        STREAM,
        WRITE_SLOTS,
        True,
        PAGE_BITS,
        False,
    )


# ---------------------------------------------------------------------------------------------------------------------
# launcher
# ---------------------------------------------------------------------------------------------------------------------
def _num_sms(device: torch.device) -> int:
    return dev.launch_info(device).num_sms


def _topk_block(k: int) -> int:
    """Row elements per radix-pass iteration of the streaming path."""
    return 2048 if k >= 2048 else 1024


def _topk_row_tiles(rows: int, device: torch.device) -> tuple[int, int]:
    """:data:`TOPK_ROW_TILES` when every row gets its own SM; for more rows than SMs only the small tile, so the
    streaming rows keep several programs per SM resident (a shape-only choice: graph-safe)."""
    if rows <= _num_sms(device):
        return TOPK_ROW_TILES
    return TOPK_ROW_TILES[0], TOPK_ROW_TILES[0]


def _topk_paths(k: int, n_cols: int, tiles: tuple[int, int]) -> tuple[int, int, bool]:
    """Register-tile sizes ``(ROW_SMALL, ROW_MAX)`` and whether the streaming path is compiled, from shapes only (so a
    captured CUDA graph replays for any lengths). Tiles never exceed the row capacity's power of two and stay above
    ``k`` (shorter rows need no selection); rows longer than ``ROW_MAX`` stream."""
    cap = triton.next_power_of_2(max(n_cols, 1))
    small = max(min(tiles[0], cap), 2 * k)
    big = max(min(tiles[1], cap), small)
    return small, big, n_cols > big


def _check_k(k: int) -> None:
    if k not in TOPK_SIZES:
        raise ValueError(f"k must be one of {TOPK_SIZES}, got {k}")


def indexer_topk_fwd(
    logits: torch.Tensor,
    lengths: torch.Tensor,
    k: int,
    *,
    out: torch.Tensor | None = None,
    page_table: torch.Tensor | None = None,
    page_size: int = IDX_PAGE,
    out_slots: torch.Tensor | None = None,
    row_tiles: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Top-``k`` positions ``[rows, k]`` int32 among ``t < lengths[row]`` (value desc, position asc), -1 padded.

    With ``page_table`` [rows, max_pages] int32 also writes ``out_slots`` [rows, k] with
    ``page_table[row, pos // page_size] * page_size + pos % page_size`` (-1 padded). Returns the positions.
    ``row_tiles`` overrides the register tiles of :func:`_topk_row_tiles` (tests use small tiles to reach every
    path)."""
    _check_k(k)
    if logits.dim() != 2 or logits.dtype != torch.float32 or logits.stride(1) != 1:
        got = f"{logits.dtype} {list(logits.shape)}"
        raise ValueError(f"logits must be fp32 [rows, cols] with unit column stride, got {got}")
    rows = logits.shape[0]
    lengths = lengths.reshape(-1)
    if lengths.numel() != rows or lengths.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"lengths must be int [rows={rows}], got {lengths.dtype} {list(lengths.shape)}")
    lengths = lengths.to(torch.int32)
    if out is None:
        out = torch.empty((rows, k), dtype=torch.int32, device=logits.device)
    if out.shape != (rows, k) or out.dtype != torch.int32 or out.stride(1) != 1:
        raise ValueError(f"out must be int32 [{rows}, {k}] with unit column stride")
    write_slots = page_table is not None
    if write_slots:
        if page_size & (page_size - 1):
            raise ValueError(f"page_size must be a power of two, got {page_size}")
        if out_slots is None or out_slots.shape != (rows, k) or out_slots.dtype != torch.int32:
            raise ValueError(f"out_slots must be int32 [{rows}, {k}] when page_table is given")
        if page_table.dtype != torch.int32 or page_table.shape[0] != rows:
            raise ValueError(f"page_table must be int32 [{rows}, max_pages]")
    if rows == 0:
        return out
    pt = page_table if write_slots else lengths
    slots = out_slots if write_slots else out
    tiles = row_tiles or _topk_row_tiles(rows, logits.device)
    row_small, row_max, stream = _topk_paths(k, logits.shape[1], tiles)
    _indexer_topk_kernel[(rows,)](
        logits,
        lengths,
        pt,
        out,
        slots,
        logits.stride(0),
        pt.stride(0),
        out.stride(0),
        slots.stride(0),
        logits.shape[1],
        K=k,
        BLOCK=_topk_block(k),
        ROW_SMALL=row_small,
        ROW_MAX=row_max,
        STREAM=stream,
        WRITE_SLOTS=write_slots,
        PAGE_BITS=max(page_size.bit_length() - 1, 0),
        num_warps=TOPK_WARPS,
    )
    return out


__all__ = ["FUSED_ROW_TILES", "TOPK_ROW_TILES", "TOPK_SIZES", "TOPK_WARPS", "indexer_topk_fwd"]
