"""Triton lightning indexer for DeepSeek-V4: paged MQA logits over the real lengths, exact top-k, and a fused
logits + top-k decode path.

Semantics are those of :mod:`sparsemla.kernels.indexer.reference` (this module never imports it).

Schedule (why the cost follows the real length, not the page-table width ``cap``)
----------------------------------------------------------------------------------
The logits grid is ``(B, num_splits)`` with ``num_splits`` chosen from ``B`` and the SM count only (never from
``cap`` or the lengths), so a CUDA graph captured for a batch size replays for any lengths. Program ``(b, s)`` reads
``seq_len[b]`` on the device and walks the key blocks ``s, s + num_splits, s + 2 * num_splits, ...`` below
``cdiv(L_b, BLOCK_N)``: a program whose first block is past the length runs zero iterations (no load at all), and no
page-table entry, key or scale past ``L_b`` is ever read. All ``next_n`` query rows of a request share each key load
(one ``[next_n * H, 128] x [128, BLOCK_N]`` dot).

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

Fused decode path: the logits kernel writes the request's logits into a reused, grow-only workspace (not the
``[rows, max_seq_len]`` output), counts finished programs per request with an acq_rel atomic, and the last program of
each request runs the top-k of its rows while the logits are still in L2 -- one launch, no logits output tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from sparsemla import flags
from sparsemla.kernels import device as dev
from sparsemla.kernels.dequant import e4m3_bits_to_bf16_value
from sparsemla.kernels.layouts import IDX_DIM, IDX_PAGE, IDX_SCALE_OFFSET

PAGE = IDX_PAGE  # tokens per indexer page
DIM = IDX_DIM  # key / query width
SCALE_OFFSET = tl.constexpr(IDX_SCALE_OFFSET)  # bytes: the page's fp32 scale plane starts here

DOT_FP8, DOT_BF16, DOT_FP32 = 0, 1, 2
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
# kernels
# ---------------------------------------------------------------------------------------------------------------------
@triton.jit
def _indexer_logits_kernel(
    q_ptr,  # uint8 view of fp8 [B, NEXT_N, H, 128]
    kv_ptr,  # uint8 pages, stride_kv_page bytes apart
    w_ptr,  # fp32 [B * NEXT_N, H]
    lens_ptr,  # int32 [B, 1] or [B, NEXT_N]
    pt_ptr,  # int32 [B, max_pages]
    out_ptr,  # fp32 logits rows (the output, or the fused workspace)
    count_ptr,  # int32 [B] programs finished per request (fused only; left at 0)
    idx_ptr,  # int32 [B * NEXT_N, K] top-k positions (fused only)
    stride_qb,
    stride_qn,
    stride_qh,
    stride_kv_page,
    stride_wr,
    stride_lb,
    stride_ln,
    stride_pt,
    stride_out,
    stride_idx,
    max_seq_len,
    NEXT_N: tl.constexpr,
    H: tl.constexpr,
    D: tl.constexpr,
    PER_ROW_LENS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_MODE: tl.constexpr,
    SWAP_AB: tl.constexpr,
    FUSE_TOPK: tl.constexpr,
    K: tl.constexpr,
    TOPK_BLOCK: tl.constexpr,
    TOPK_ROW_SMALL: tl.constexpr,
    TOPK_ROW_MAX: tl.constexpr,
    TOPK_STREAM: tl.constexpr,
):
    i_b = tl.program_id(0)
    i_s = tl.program_id(1)
    n_s = tl.num_programs(1)
    M: tl.constexpr = NEXT_N * H

    # -- per-row lengths: DeepGEMM-style causal rows unless given per row ---------------------------------------------
    o_r = tl.arange(0, NEXT_N)
    if PER_ROW_LENS:
        lens = tl.load(lens_ptr + i_b * stride_lb + o_r * stride_ln)  # [NEXT_N]
    else:
        lens = tl.load(lens_ptr + i_b * stride_lb) - NEXT_N + 1 + o_r  # [NEXT_N]
    lens = tl.minimum(tl.maximum(lens, 0), max_seq_len)
    longest = tl.max(lens, axis=0)
    n_blocks = tl.cdiv(longest, BLOCK_N)

    o_m = tl.arange(0, M)
    o_d = tl.arange(0, D)
    o_n = tl.arange(0, BLOCK_N)
    rows = i_b.to(tl.int64) * NEXT_N + o_r  # [NEXT_N]
    p_out = out_ptr + rows[:, None] * stride_out  # [NEXT_N, 1]

    if i_s < n_blocks:
        p_q = q_ptr + i_b.to(tl.int64) * stride_qb + (o_m // H) * stride_qn + (o_m % H) * stride_qh
        b_q = tl.load(p_q[:, None] + o_d[None, :])  # [M, D] uint8 (e4m3 bits)
        if DOT_MODE == 0:
            b_q = b_q.to(tl.float8e4nv, bitcast=True)
        elif DOT_MODE == 1:  # no e4m3 type needed (sm_80/86): integer dequant, exact
            b_q = e4m3_bits_to_bf16_value(b_q)
        else:
            b_q = b_q.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        b_w = tl.load(w_ptr + (i_b.to(tl.int64) * NEXT_N + o_m // H) * stride_wr + o_m % H)  # [M]
        p_pt = pt_ptr + i_b.to(tl.int64) * stride_pt
        for blk in range(i_s, n_blocks, n_s):
            o_t = blk * BLOCK_N + o_n  # [BLOCK_N] token positions
            m_t = o_t < longest
            page = tl.load(p_pt + o_t // 64, mask=m_t, other=0).to(tl.int64)  # [BLOCK_N]
            p_page = kv_ptr + page * stride_kv_page
            p_k = p_page + (o_t % 64) * D  # [BLOCK_N]
            b_k = tl.load(p_k[:, None] + o_d[None, :], mask=m_t[:, None], other=0)  # [BLOCK_N, D] uint8
            p_s = (p_page + SCALE_OFFSET + (o_t % 64) * 4).to(tl.pointer_type(tl.float32))
            b_sc = tl.load(p_s, mask=m_t, other=0.0)  # [BLOCK_N]
            if DOT_MODE == 0:
                b_k = b_k.to(tl.float8e4nv, bitcast=True)
            elif DOT_MODE == 1:
                b_k = e4m3_bits_to_bf16_value(b_k)
            else:
                b_k = b_k.to(tl.float8e4nv, bitcast=True).to(tl.float32)
            if SWAP_AB:
                # tokens on the MMA's M side: the head sum stays inside a thread quad (no shared-memory reduction)
                b_s = tl.dot(b_k, tl.trans(b_q))  # [BLOCK_N, M] fp32
                b_s = tl.maximum(b_s, 0.0) * b_w[None, :]
                b_l = tl.sum(tl.reshape(b_s, [BLOCK_N, NEXT_N, H]), axis=2) * b_sc[:, None]  # [BLOCK_N, NEXT_N]
                m_out = o_t[:, None] < lens[None, :]
                tl.store(out_ptr + rows[None, :] * stride_out + o_t[:, None], b_l, mask=m_out)
            else:
                b_s = tl.dot(b_q, tl.trans(b_k))  # [M, BLOCK_N] fp32
                b_s = tl.maximum(b_s, 0.0) * b_w[:, None]
                b_l = tl.sum(tl.reshape(b_s, [NEXT_N, H, BLOCK_N]), axis=1) * b_sc[None, :]  # [NEXT_N, BLOCK_N]
                m_out = o_t[None, :] < lens[:, None]
                tl.store(p_out + o_t[None, :], b_l, mask=m_out)

    if FUSE_TOPK:
        # Last program of request b to finish runs its rows' top-k. The barrier orders this CTA's logit stores before
        # the release; the acquire side reads with .cg (L2), so other CTAs' logits are visible.
        tl.debug_barrier()
        done = tl.atomic_add(count_ptr + i_b, 1, sem="acq_rel", scope="gpu")
        if done == n_s - 1:
            tl.debug_barrier()
            for i in tl.static_range(NEXT_N):
                row = i_b.to(tl.int64) * NEXT_N + i
                if PER_ROW_LENS:
                    n_i = tl.load(lens_ptr + i_b * stride_lb + i * stride_ln)
                else:
                    n_i = tl.load(lens_ptr + i_b * stride_lb) - NEXT_N + 1 + i
                n_i = tl.minimum(tl.maximum(n_i, 0), max_seq_len)
                _topk_row(
                    out_ptr + row * stride_out,
                    n_i,
                    idx_ptr + row * stride_idx,
                    idx_ptr,
                    pt_ptr,
                    K,
                    TOPK_BLOCK,
                    TOPK_ROW_SMALL,
                    TOPK_ROW_MAX,
                    TOPK_STREAM,
                    False,
                    True,
                    6,
                    True,
                )
            tl.store(count_ptr + i_b, 0)  # ready for the next launch (CUDA-graph replays included)


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
# launchers
# ---------------------------------------------------------------------------------------------------------------------
def _interpreting() -> bool:
    return flags.TRITON_INTERPRET.get()


def _info(device: torch.device) -> dev.DeviceInfo:
    """The device facts the launch is configured for (the interpreter's under TRITON_INTERPRET)."""
    return dev.INTERPRETER if _interpreting() else dev.device_info(device)


def _dot_mode(info: dev.DeviceInfo) -> int:
    """fp8 MMAs where the target has an e4m3 type (sm_89+); bf16 MMAs fed by the integer dequant on sm_80/86 (no
    ``tl.float8e4nv`` there); fp32 under the interpreter, whose fp8/bf16 dots are wrong."""
    if info is dev.INTERPRETER:
        return DOT_FP32
    return DOT_FP8 if info.has_fp8 else DOT_BF16


def _num_sms(device: torch.device) -> int:
    return _info(device).num_sms


def num_splits_for(batch: int, num_sms: int, programs_per_sm: int = 8, max_splits: int = 256) -> int:
    """Programs per request: enough to give every SM ``programs_per_sm`` programs; a function of B only (graph-safe)."""
    want = num_sms * programs_per_sm
    return max(1, min(max_splits, -(-want // max(batch, 1))))


def _check_logits_inputs(q_fp8, kv_cache_fp8, weights, seq_lens, page_table) -> tuple[int, int, int]:
    if q_fp8.dim() != 4 or q_fp8.shape[-1] != DIM:
        raise ValueError(f"q_fp8 must be [B, next_n, H, {DIM}], got {list(q_fp8.shape)}")
    batch, next_n, heads, _ = q_fp8.shape
    if next_n not in (1, 2):
        raise ValueError(f"next_n must be 1 or 2, got {next_n}")
    if heads & (heads - 1) or heads < 16:
        raise ValueError(f"heads must be a power of two >= 16, got {heads}")
    if q_fp8.element_size() != 1 or q_fp8.stride(-1) != 1:
        raise ValueError("q_fp8 must be a 1-byte (fp8) tensor with a contiguous last dim")
    if kv_cache_fp8.dim() != 4 or tuple(kv_cache_fp8.shape[1:]) != (PAGE, 1, DIM + 4):
        raise ValueError(f"kv_cache_fp8 must be [num_pages, 64, 1, 132], got {list(kv_cache_fp8.shape)}")
    if kv_cache_fp8.element_size() != 1 or kv_cache_fp8.stride(1) != DIM + 4 or kv_cache_fp8.stride(3) != 1:
        raise ValueError("kv_cache_fp8 must be a 1-byte tensor with dense pages (stride(1) == 132)")
    if weights.shape != (batch * next_n, heads) or weights.dtype != torch.float32 or weights.stride(-1) != 1:
        raise ValueError(f"weights must be fp32 [{batch * next_n}, {heads}] with unit last stride")
    if page_table.dim() != 2 or page_table.shape[0] != batch or page_table.dtype != torch.int32:
        got = f"{page_table.dtype} {list(page_table.shape)}"
        raise ValueError(f"page_table must be int32 [{batch}, max_pages], got {got}")
    if seq_lens.dtype != torch.int32 or seq_lens.numel() not in (batch, batch * next_n):
        got = f"{seq_lens.dtype} {list(seq_lens.shape)}"
        raise ValueError(f"seq_lens must be int32 [B], [B, 1] or [B, next_n], got {got}")
    return batch, next_n, heads


def _lens_2d(seq_lens: torch.Tensor, batch: int, next_n: int) -> tuple[torch.Tensor, bool]:
    lens = seq_lens.reshape(batch, -1)
    per_row = lens.shape[1] == next_n and next_n > 1
    return lens, per_row


@dataclass(frozen=True)
class LogitsConfig:
    """Launch shape of the logits kernel (also the fused logits + top-k launch).

    block_n: key tokens per tile; swap_ab: tokens on the MMA's M side (the head sum stays inside a thread quad);
    num_splits: programs per request (grid ``(B, num_splits)``); dot_mode: DOT_FP8 / DOT_BF16 / DOT_FP32."""

    block_n: int
    swap_ab: bool
    num_splits: int
    num_warps: int
    num_stages: int
    dot_mode: int


def choose_logits_config(
    info: dev.DeviceInfo, batch: int, next_n: int, heads: int, fuse_topk: bool = False
) -> LogitsConfig:
    """From the device and shapes only (graph-safe). H200 sweep (graph replay, H=64, cap 64k): 5 cp.async stages keep
    more key tiles in flight per program; B=64 at 4k / 16k / 64k: 24.6 / 56.2 / 171 us vs 24.3 / 62.5 / 204 with 3
    (3 and 4 measure the same). One key tile per program at small B: 2 stages (B=1, 4k: 7.7 vs 8.0 us). Every target
    takes the same tiles (43 KB of shared memory at most: within the 101,376 B of sm_86/89/120); sm_80/86 have no
    e4m3 type and run bf16 MMAs on integer-dequantized keys."""
    interp = info is dev.INTERPRETER
    num_warps = 4 if next_n * heads <= 64 else 8
    if fuse_topk:
        num_warps = max(num_warps, 8)  # the tail program sorts k <= 2048 keys
    return LogitsConfig(
        block_n=64 if interp else 128,
        swap_ab=not interp,
        num_splits=num_splits_for(batch, info.num_sms),
        num_warps=num_warps,
        num_stages=1 if interp else (2 if batch <= 4 else 5),
        dot_mode=_dot_mode(info),
    )


def _launch_logits(
    q_fp8: torch.Tensor,
    kv_cache_fp8: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    out: torch.Tensor,
    max_seq_len: int,
    *,
    fuse_topk: bool = False,
    counters: torch.Tensor | None = None,
    idx_out: torch.Tensor | None = None,
    k: int = 512,
    row_tiles: tuple[int, int] | None = None,
    **overrides: int | bool,
) -> None:
    """``overrides``: fields of :class:`LogitsConfig` to replace (benchmarks and tests)."""
    batch, next_n, heads, _ = q_fp8.shape
    lens, per_row = _lens_2d(seq_lens, batch, next_n)
    cfg = choose_logits_config(_info(q_fp8.device), batch, next_n, heads, fuse_topk)
    cfg = replace(cfg, **{key: v for key, v in overrides.items() if v is not None})
    q_u8 = q_fp8.view(torch.uint8)
    kv_u8 = kv_cache_fp8.view(torch.uint8)
    dummy = out if idx_out is None else idx_out
    if fuse_topk:
        row_small, row_max, stream = _topk_paths(k, max_seq_len, row_tiles or FUSED_ROW_TILES)
    else:  # fixed constexprs: the logits-only kernel compiles once for every max_seq_len
        row_small, row_max, stream = 2 * k, 2 * k, False
    _indexer_logits_kernel[(batch, cfg.num_splits)](
        q_u8,
        kv_u8,
        weights,
        lens,
        page_table,
        out,
        counters if counters is not None else page_table,
        dummy,
        q_u8.stride(0),
        q_u8.stride(1),
        q_u8.stride(2),
        kv_u8.stride(0),
        weights.stride(0),
        lens.stride(0),
        lens.stride(1),
        page_table.stride(0),
        out.stride(0),
        dummy.stride(0),
        max_seq_len,
        NEXT_N=next_n,
        H=heads,
        D=DIM,
        PER_ROW_LENS=per_row,
        BLOCK_N=cfg.block_n,
        DOT_MODE=cfg.dot_mode,
        SWAP_AB=cfg.swap_ab,
        FUSE_TOPK=fuse_topk,
        K=k,
        TOPK_BLOCK=_topk_block(k),
        TOPK_ROW_SMALL=row_small,
        TOPK_ROW_MAX=row_max,
        TOPK_STREAM=stream,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )


def indexer_logits_fwd(
    q_fp8: torch.Tensor,
    kv_cache_fp8: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    max_seq_len: int | None = None,
    clean_logits: bool = False,
    **tuning: int,
) -> torch.Tensor:
    """Logits fp32 ``[B * next_n, max_seq_len]`` (see the module docstring). With ``clean_logits=False`` the positions
    at or past a row's length are left as ``torch.empty`` gave them; with ``True`` they are ``-inf``."""
    batch, next_n, _ = _check_logits_inputs(q_fp8, kv_cache_fp8, weights, seq_lens, page_table)
    if max_seq_len is None:
        max_seq_len = page_table.shape[1] * PAGE
    if clean_logits:
        out = torch.full((batch * next_n, max_seq_len), float("-inf"), dtype=torch.float32, device=q_fp8.device)
    else:
        out = torch.empty((batch * next_n, max_seq_len), dtype=torch.float32, device=q_fp8.device)
    if batch == 0 or max_seq_len == 0:
        return out
    _launch_logits(q_fp8, kv_cache_fp8, weights, seq_lens, page_table, out, max_seq_len, **tuning)
    return out


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
    page_size: int = PAGE,
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


# ---------------------------------------------------------------------------------------------------------------------
# fused logits + top-k (decode)
# ---------------------------------------------------------------------------------------------------------------------
class _Workspace:
    """Grow-only per-device buffers for the fused path: the logits scratch and the per-request counters.

    Grown (never shrunk) on the first call of a larger shape; warm up every batch size before CUDA-graph capture so
    no growth happens inside a capture. Counters start at zero and every launch leaves them at zero."""

    def __init__(self) -> None:
        self.logits: dict[torch.device, torch.Tensor] = {}
        self.counters: dict[torch.device, torch.Tensor] = {}

    def get(self, device: torch.device, rows: int, cols: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        buf = self.logits.get(device)
        if buf is None or buf.numel() < rows * cols:
            buf = torch.empty(max(rows * cols, 1), dtype=torch.float32, device=device)
            self.logits[device] = buf
        cnt = self.counters.get(device)
        if cnt is None or cnt.numel() < batch:
            cnt = torch.zeros(max(batch, 1), dtype=torch.int32, device=device)
            self.counters[device] = cnt
        return buf[: rows * cols].view(rows, cols), cnt


_WORKSPACE = _Workspace()


def indexer_logits_topk_fwd(
    q_fp8: torch.Tensor,
    kv_cache_fp8: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    k: int,
    max_seq_len: int | None = None,
    *,
    out: torch.Tensor | None = None,
    **tuning: int | tuple[int, int],
) -> torch.Tensor:
    """Fused decode path: top-``k`` positions ``[B * next_n, k]`` int32 of the indexer logits (value desc, position
    asc, -1 padded), in one launch; the logits live only in a reused workspace. ``tuning`` goes to the logits launch
    (``row_tiles`` overrides :data:`FUSED_ROW_TILES`)."""
    _check_k(k)
    batch, next_n, _ = _check_logits_inputs(q_fp8, kv_cache_fp8, weights, seq_lens, page_table)
    if max_seq_len is None:
        max_seq_len = page_table.shape[1] * PAGE
    rows = batch * next_n
    if out is None:
        out = torch.empty((rows, k), dtype=torch.int32, device=q_fp8.device)
    if out.shape != (rows, k) or out.dtype != torch.int32 or out.stride(1) != 1:
        raise ValueError(f"out must be int32 [{rows}, {k}] with unit column stride")
    if batch == 0:
        return out
    if max_seq_len == 0:
        return out.fill_(-1)
    scratch, counters = _WORKSPACE.get(q_fp8.device, rows, max_seq_len, batch)
    _launch_logits(
        q_fp8,
        kv_cache_fp8,
        weights,
        seq_lens,
        page_table,
        scratch,
        max_seq_len,
        fuse_topk=True,
        counters=counters,
        idx_out=out,
        k=k,
        **tuning,
    )
    return out
