"""Exploratory (not in the package): the V4 sparse decode's wgmma tile written in Gluon (Triton 3.8's
``triton.experimental.gluon``), so that the two warpgroups split the scores' tokens instead of both computing the
whole 64 x 64 score tile (plain Triton gives a dot that feeds another dot ``warpsPerCTA = [8, 1]``: with 64 heads
= one warpgroup's M, both warpgroups compute all of QK; see README.md, twenty-ninth session).

One program per row, 64-head block and split (the package's split rule and combine kernel; the pipelined variant:
one head block, no split), 64-token tiles, 8 warps, one stage, full-length rows (128 SWA + extra indices, -1 entries
masked), sink applied: issue #13's prefill rows and decode shapes. Partials are bf16 (the package's wgmma tile keeps
fp32 ones below 16 programs, so its error reads lower there). Per tile:

* gather and dequantize the tile [64, 512] (fp8 NoPE x ue8m0 scale, bf16 RoPE) into registers, store it to shared
  memory (one NVMMA-swizzled copy that both dots read);
* S [64 heads, 64 tokens] = q K^T by ``warpgroup_mma`` with ``warps_per_cta = [4, 2]``: each warpgroup 32 tokens;
* online softmax (the row maximum and sum cross the two warpgroups through Gluon's reduction);
* P (bf16) to shared memory, O [64, 512] += P V by ``warpgroup_mma`` with ``warps_per_cta = [4, 2]``: each warpgroup
  256 output columns.

    PYTHONPATH=src:. .venv/bin/python results/bench/explore/gluon_decode.py aot      # here: Triton 3.8, sm_90 cubin
    PYTHONPATH=src:. .venv/bin/python results/bench/explore/gluon_decode.py build    # here: .gpu-cubins/gluon
    run(command="SHA=<sha> bash results/bench/explore/gpu_t38.sh gluon", carry=[".gpu-cubins/gluon", ".gpu"])

No software pipelining or warp specialization yet: this first step only removes the duplicated QK."""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

import torch
import triton
import typer
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    async_copy,
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))

from sparsemla.kernels.dequant import E4M3_TO_BF16_PTX  # noqa: E402 - the package's integer e4m3 -> bf16 PTX

_barrier = getattr(gl, "barrier", None) or gl.thread_barrier  # Triton 3.8's name; 3.6 (the GPU machine): thread_barrier

app = typer.Typer(add_completion=False)

DATA_ROW: gl.constexpr = gl.constexpr(576)  # bytes: 448 fp8 NoPE, then 64 bf16 RoPE
ROPE_OFFSET: gl.constexpr = gl.constexpr(448)
SCALE_ROW: gl.constexpr = gl.constexpr(8)  # 7 ue8m0 scales + 1 pad, after the page's data rows
LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)
E4M3_PTX: gl.constexpr = E4M3_TO_BF16_PTX
TWO_POW_120_F: gl.constexpr = gl.constexpr(2.0**120)


@gluon.jit
def _e4m3_bits_to_bf16(x):
    """uint8 e4m3 bytes -> bf16 of the value times 2^-120, exactly (the package's PTX: PRMT/SHL/AND, four bytes a
    block; :func:`sparsemla.kernels.dequant.e4m3_bits_to_bf16`)."""
    return gl.inline_asm_elementwise(asm=E4M3_PTX, constraints="=r,=r,r", args=[x], dtype=gl.bfloat16, is_pure=True,
                                     pack=4)  # fmt: skip


@gluon.jit
def _dequant_chunk(b_u, b_e, INT_DEQUANT: gl.constexpr):
    """[N, 64] e4m3 bytes ``b_u`` (uint8) times 2^(``b_e`` - 127) per row ([N] fp32) -> bf16: the integer bit path
    (INT_DEQUANT: times 2^120, exact, then times the scale; one multiply by 2^(e - 7) would overflow bf16 from
    e = 135 on) or the fp8 conversion instructions (e4m3 -> f16 -> bf16)."""
    if INT_DEQUANT:
        two_120 = gl.full([1, 1], TWO_POW_120_F, gl.bfloat16, b_u.type.layout)
        return (_e4m3_bits_to_bf16(b_u) * two_120) * gl.exp2(b_e - 127.0).to(gl.bfloat16)[:, None]
    else:
        return b_u.to(gl.float8e4nv, bitcast=True).to(gl.bfloat16) * gl.exp2(b_e - 127.0).to(gl.bfloat16)[:, None]


@gluon.jit
def _gather_store_tile(p_cache, b_idx, page_size, page_stride, k_smem, o_d, BLOCK_N: gl.constexpr,
                       INT_DEQUANT: gl.constexpr):  # fmt: skip
    """The [BLOCK_N, 512] bf16 rows of slot ids ``b_idx`` [BLOCK_N] (-1: zeros) of one V4 cache (uint8 base
    ``p_cache``) into ``k_smem``, one 64-column chunk at a time (a chunk's values live in registers, not the tile's):
    chunks 0-6 fp8 NoPE x its ue8m0 scale, chunk 7 the bf16 RoPE. ``o_d`` [64] the chunk's columns, in the layout
    whose rows ``b_idx`` indexes."""
    m_n = b_idx >= 0
    b_slot = gl.where(m_n, b_idx, 0)
    b_page = (b_slot // page_size).to(gl.int64)
    b_off = (b_slot % page_size).to(gl.int64)
    o_tok = b_page * page_stride + b_off * DATA_ROW  # [BLOCK_N] byte offset of the 576-byte data row
    o_scale = b_page * page_stride + page_size * DATA_ROW + b_off * SCALE_ROW  # its 8 scale bytes
    for c in gl.static_range(7):
        b_u = gl.load(p_cache + (o_tok + c * 64)[:, None] + o_d[None, :], mask=m_n[:, None], other=0)  # [N, 64] u8
        b_e = gl.load(p_cache + o_scale + c, mask=m_n, other=127).to(gl.float32)  # [BLOCK_N] ue8m0
        k_smem.slice(c * 64, 64, dim=1).store(_dequant_chunk(b_u, b_e, INT_DEQUANT))
    p_rope = (p_cache + ROPE_OFFSET).to(gl.pointer_type(gl.bfloat16), bitcast=True)
    b_r = gl.load(p_rope + (o_tok // 2)[:, None] + o_d[None, :], mask=m_n[:, None], other=0.0)  # [BLOCK_N, 64]
    k_smem.slice(ROPE_OFFSET, 64, dim=1).store(b_r)


@gluon.jit
def _softmax_pv(b_s, valid, qk_scale, m_i, l_i, acc, p_smem, k_smem, o_layout: gl.constexpr):
    """One online-softmax step and the PV dot of a tile: scores ``b_s`` [BLOCK_H, BLOCK_N] (the scores' layout; each
    warpgroup half the tokens), ``valid`` [BLOCK_N] along its columns; P goes through ``p_smem`` to the
    ``warpgroup_mma`` with V = ``k_smem`` [BLOCK_N, 512] into ``acc`` (``o_layout``). Returns (acc, m_i, l_i)."""
    b_s = gl.where(valid[None, :], b_s * qk_scale, float("-inf"))
    m_new = gl.maximum(m_i, gl.max(b_s, 1))
    m_use = gl.where(m_new == float("-inf"), 0.0, m_new)  # heads with nothing valid yet stay at zero weight
    alpha = gl.exp2(m_i - m_use)
    b_p = gl.exp2(b_s - m_use[:, None])
    l_i = l_i * alpha + gl.sum(b_p, 1)
    p_smem.store(b_p.to(gl.bfloat16))
    fence_async_shared()
    _barrier()  # both warpgroups' halves of P are in before either PV reads all of it
    alpha_o = gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))
    acc = warpgroup_mma(p_smem, k_smem, acc * alpha_o[:, None], is_async=True)  # [BLOCK_H, 512]
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    return acc, m_new, l_i


@gluon.jit
def _gluon_decode_kernel(
    q, cache, idx, cache_x, idx_x, sink, out, lse, o_part, lse_part,
    S, H, TOPK, TOPK_X, page_size, page_stride, page_size_x, page_stride_x, num_splits, qk_scale,
    stride_qb, stride_qs, stride_qh, stride_ib, stride_is, stride_xb, stride_xs,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, HAS_SINK: gl.constexpr, INT_DEQUANT: gl.constexpr,
    SINGLE: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    """Grid (B * S, cdiv(H, BLOCK_H), num_splits); a split owns a contiguous run of the concatenated list's tiles.
    SINGLE: out [B*S, H, 512] bf16 and lse [B*S, H] (natural log, sink excluded; the sink scales out); else the
    split's normalised partial o_part [rows, splits, H, 512] and base-2 lse_part (-inf when empty) for the package's
    combine kernel, which applies the sink."""
    gl.static_assert(num_warps == 8, "two warpgroups")
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])  # [rows, 512], 16-byte runs
    ck: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])  # [rows, 64] gather chunks
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, 256, 16])  # fmt: skip
    q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, 512], gl.bfloat16)
    k_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 512], gl.bfloat16)
    p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], gl.bfloat16)

    i_r = gl.program_id(0)
    i_hb = gl.program_id(1)
    i_sp = gl.program_id(2)
    i_b = i_r // S
    i_s = i_r % S
    o_hl = i_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ld))
    o_c = gl.arange(0, 512, layout=gl.SliceLayout(0, ld))
    p_q = q + i_b.to(gl.int64) * stride_qb + i_s.to(gl.int64) * stride_qs + o_hl.to(gl.int64)[:, None] * stride_qh
    b_q = gl.load(p_q + o_c[None, :], mask=(o_hl < H)[:, None], other=0.0)  # [BLOCK_H, 512] bf16
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, 512], q_sl, b_q)
    k_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, 512], k_sl)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, BLOCK_N], p_sl)

    acc = gl.zeros([BLOCK_H, 512], gl.float32, o_layout)
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, s_layout))
    o_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ck))
    o_d = gl.arange(0, 64, layout=gl.SliceLayout(0, ck))
    o_ns = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    n_main = gl.cdiv(TOPK, BLOCK_N)
    n_tiles = n_main + gl.cdiv(TOPK_X, BLOCK_N)
    per = gl.cdiv(n_tiles, num_splits)
    t_lo = i_sp * per
    t_hi = gl.minimum(t_lo + per, n_tiles)
    p_idx = idx + i_b.to(gl.int64) * stride_ib + i_s.to(gl.int64) * stride_is
    p_idx_x = idx_x + i_b.to(gl.int64) * stride_xb + i_s.to(gl.int64) * stride_xs
    for i_t in range(t_lo, t_hi):
        in_main = i_t < n_main
        t0 = gl.where(in_main, i_t, i_t - n_main) * BLOCK_N
        n_len = gl.where(in_main, TOPK, TOPK_X)
        p_row = gl.where(in_main, p_idx, p_idx_x)
        b_idx = gl.load(p_row + t0 + o_n, mask=t0 + o_n < n_len, other=-1)  # [BLOCK_N] slot ids
        b_ids = gl.load(p_row + t0 + o_ns, mask=t0 + o_ns < n_len, other=-1)  # the same, along S's columns
        _barrier()  # every warpgroup's dots of the last tile are done (each waited) before the tile is replaced
        if in_main:
            _gather_store_tile(cache, b_idx, page_size, page_stride, k_smem, o_d, BLOCK_N, INT_DEQUANT)
        else:
            _gather_store_tile(cache_x, b_idx, page_size_x, page_stride_x, k_smem, o_d, BLOCK_N, INT_DEQUANT)
        fence_async_shared()
        _barrier()
        b_s = warpgroup_mma(q_smem, k_smem.permute((1, 0)), gl.zeros([BLOCK_H, BLOCK_N], gl.float32, s_layout),
                            use_acc=False, is_async=True)  # fmt: skip
        b_s = warpgroup_mma_wait(num_outstanding=0, deps=(b_s,))  # [BLOCK_H, BLOCK_N]: each warpgroup 32 tokens
        acc, m_i, l_i = _softmax_pv(b_s, b_ids >= 0, qk_scale, m_i, l_i, acc, p_smem, k_smem, o_layout)

    o_hs = i_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, s_layout))
    lse2 = gl.where(l_i > 0.0, m_i + gl.log2(l_i), float("-inf"))
    inv_l = gl.where(l_i > 0.0, 1.0 / l_i, 0.0)
    o_ho = i_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, o_layout))
    o_co = gl.arange(0, 512, layout=gl.SliceLayout(0, o_layout))
    if SINGLE:
        if HAS_SINK:
            b_sink = gl.load(sink + o_hs, mask=o_hs < H, other=float("-inf")) * LOG2E
            inv_l = gl.where(l_i > 0.0, inv_l / (1.0 + gl.exp2(b_sink - lse2)), 0.0)
        gl.store(lse + i_r.to(gl.int64) * H + o_hs, lse2 * 0.6931471805599453, mask=o_hs < H)
        p_o = out + i_r.to(gl.int64) * H * 512 + o_ho.to(gl.int64)[:, None] * 512 + o_co[None, :]
    else:
        i_part = i_r.to(gl.int64) * num_splits + i_sp
        gl.store(lse_part + i_part * H + o_hs, lse2, mask=o_hs < H)
        p_o = o_part + (i_part * H + o_ho.to(gl.int64))[:, None] * 512 + o_co[None, :]
    b_o = acc * gl.convert_layout(inv_l, gl.SliceLayout(1, o_layout))[:, None]
    gl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=(o_ho < H)[:, None])


@gluon.jit
def _tile_rows(idx_row, t0, n_len, o_n, page_size, page_stride):
    """(valid [N], data-row byte offsets [N] int64, scale-row byte offsets [N] int64) of the slot ids at
    ``idx_row[t0 + o_n]`` (past ``n_len``: invalid), in ``o_n``'s layout."""
    b_idx = gl.load(idx_row + t0 + o_n, mask=t0 + o_n < n_len, other=-1)
    m_n = b_idx >= 0
    b_slot = gl.where(m_n, b_idx, 0)
    b_page = (b_slot // page_size).to(gl.int64)
    b_off = (b_slot % page_size).to(gl.int64)
    o_tok = b_page * page_stride + b_off * DATA_ROW
    o_scale = b_page * page_stride + page_size * DATA_ROW + b_off * SCALE_ROW
    return m_n, o_tok, o_scale


@gluon.jit
def _issue_tile_copies(i_t, n_main, p_idx, p_idx_x, TOPK, TOPK_X, cache, cache_x, page_size, page_stride,
                       page_size_x, page_stride_x, nope_raw, rope_raw, o_nn, o_cn, o_nr, o_cr, o_nc,
                       BLOCK_N: gl.constexpr):  # fmt: skip
    """cp.async of tile ``i_t``'s NoPE bytes ([N, 512], columns >= 448 skipped) and RoPE ([N, 64] bf16) into the raw
    buffers, one commit group; returns the tile's 8 scale bytes per token ([N] int64, in ``o_nc``'s layout)."""
    in_main = i_t < n_main
    t0 = gl.where(in_main, i_t, i_t - n_main) * BLOCK_N
    n_len = gl.where(in_main, TOPK, TOPK_X)
    idx_row = gl.where(in_main, p_idx, p_idx_x)
    p_cache = gl.where(in_main, cache, cache_x)
    psz = gl.where(in_main, page_size, page_size_x)
    pst = gl.where(in_main, page_stride, page_stride_x)
    m_n, o_tok, _ = _tile_rows(idx_row, t0, n_len, o_nn, psz, pst)
    async_copy.async_copy_global_to_shared(nope_raw, p_cache + o_tok[:, None] + o_cn[None, :],
                                           mask=m_n[:, None] & (o_cn < ROPE_OFFSET)[None, :])  # fmt: skip
    m_r, o_tr, _ = _tile_rows(idx_row, t0, n_len, o_nr, psz, pst)
    p_rope = (p_cache + ROPE_OFFSET).to(gl.pointer_type(gl.bfloat16), bitcast=True)
    async_copy.async_copy_global_to_shared(rope_raw, p_rope + (o_tr // 2)[:, None] + o_cr[None, :],
                                           mask=m_r[:, None])  # fmt: skip
    async_copy.commit_group()
    m_c, _, o_sc = _tile_rows(idx_row, t0, n_len, o_nc, psz, pst)
    p_w = p_cache.to(gl.pointer_type(gl.int64), bitcast=True)
    return gl.load(p_w + o_sc // 8, mask=m_c, other=0x7F7F7F7F7F7F7F7F)  # [N] 8 ue8m0 bytes (127: 1.0)


@gluon.jit
def _gluon_decode_async_kernel(
    q, cache, idx, cache_x, idx_x, sink, out, lse,
    S, H, TOPK, TOPK_X, page_size, page_stride, page_size_x, page_stride_x, qk_scale,
    stride_qb, stride_qs, stride_qh, stride_ib, stride_is, stride_xb, stride_xs,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, HAS_SINK: gl.constexpr, INT_DEQUANT: gl.constexpr,
    num_warps: gl.constexpr,
):  # fmt: skip
    """``_gluon_decode_kernel`` with the next tile's rows copied asynchronously (cp.async) into raw shared buffers
    while this tile's dots run; the dequantization then reads shared memory instead of waiting on global loads.
    Needs 16-byte aligned data rows (page strides multiple of 16) and 8-byte aligned scale rows."""
    gl.static_assert(num_warps == 8, "two warpgroups")
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    ck: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])  # [N, 64] dequant chunks
    cp_n: gl.constexpr = gl.BlockedLayout([1, 16], [2, 16], [num_warps, 1], [1, 0])  # [N, 512] u8: 16-byte copies
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, 256, 16])  # fmt: skip
    q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, 512], gl.bfloat16)
    k_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 512], gl.bfloat16)
    p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], gl.bfloat16)
    raw_sl: gl.constexpr = gl.SwizzledSharedLayout(16, 1, 8, [1, 0])

    i_r = gl.program_id(0)
    i_b = i_r // S
    i_s = i_r % S
    o_hl = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ld))
    o_c = gl.arange(0, 512, layout=gl.SliceLayout(0, ld))
    p_q = q + i_b.to(gl.int64) * stride_qb + i_s.to(gl.int64) * stride_qs + o_hl.to(gl.int64)[:, None] * stride_qh
    b_q = gl.load(p_q + o_c[None, :], mask=(o_hl < H)[:, None], other=0.0)  # [BLOCK_H, 512] bf16
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, 512], q_sl, b_q)
    k_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, 512], k_sl)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, BLOCK_N], p_sl)
    nope_raw = gl.allocate_shared_memory(gl.uint8, [BLOCK_N, 512], raw_sl)
    rope_raw = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, 64], raw_sl)

    o_nn = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, cp_n))
    o_cn = gl.arange(0, 512, layout=gl.SliceLayout(0, cp_n))
    o_nr = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ck))
    o_cr = gl.arange(0, 64, layout=gl.SliceLayout(0, ck))
    o_ns = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    acc = gl.zeros([BLOCK_H, 512], gl.float32, o_layout)
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, s_layout))
    n_main = gl.cdiv(TOPK, BLOCK_N)
    n_tiles = n_main + gl.cdiv(TOPK_X, BLOCK_N)
    p_idx = idx + i_b.to(gl.int64) * stride_ib + i_s.to(gl.int64) * stride_is
    p_idx_x = idx_x + i_b.to(gl.int64) * stride_xb + i_s.to(gl.int64) * stride_xs
    b_w = _issue_tile_copies(0, n_main, p_idx, p_idx_x, TOPK, TOPK_X, cache, cache_x, page_size, page_stride,
                             page_size_x, page_stride_x, nope_raw, rope_raw, o_nn, o_cn, o_nr, o_cr, o_nr,
                             BLOCK_N)  # fmt: skip
    for i_t in range(0, n_tiles):
        in_main = i_t < n_main
        t0 = gl.where(in_main, i_t, i_t - n_main) * BLOCK_N
        b_ids = gl.load(gl.where(in_main, p_idx, p_idx_x) + t0 + o_ns, mask=t0 + o_ns < gl.where(in_main, TOPK, TOPK_X),
                        other=-1)  # fmt: skip
        async_copy.wait_group(0)
        _barrier()  # tile i_t's raw rows are in; every warpgroup's PV of the last tile is done
        for c in gl.static_range(7):
            b_u = nope_raw.slice(c * 64, 64, dim=1).load(ck)  # [N, 64] e4m3 bits
            b_e = ((b_w >> (8 * c)) & 255).to(gl.float32)  # [N] ue8m0
            k_smem.slice(c * 64, 64, dim=1).store(_dequant_chunk(b_u, b_e, INT_DEQUANT))
        k_smem.slice(ROPE_OFFSET, 64, dim=1).store(rope_raw.load(ck))
        fence_async_shared()
        _barrier()  # the tile is in k_smem for the dots; the raw buffers are free
        b_s = warpgroup_mma(q_smem, k_smem.permute((1, 0)), gl.zeros([BLOCK_H, BLOCK_N], gl.float32, s_layout),
                            use_acc=False, is_async=True)  # fmt: skip
        if i_t + 1 < n_tiles:  # the next tile's index loads and copies while the score dot runs (it never reads them)
            b_w = _issue_tile_copies(i_t + 1, n_main, p_idx, p_idx_x, TOPK, TOPK_X, cache, cache_x, page_size,
                                     page_stride, page_size_x, page_stride_x, nope_raw, rope_raw, o_nn, o_cn, o_nr,
                                     o_cr, o_nr, BLOCK_N)  # fmt: skip
        b_s = warpgroup_mma_wait(num_outstanding=0, deps=(b_s,))
        acc, m_i, l_i = _softmax_pv(b_s, b_ids >= 0, qk_scale, m_i, l_i, acc, p_smem, k_smem, o_layout)
    async_copy.wait_group(0)  # no tile: the prologue's copies are still outstanding

    o_hs = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, s_layout))
    lse2 = gl.where(l_i > 0.0, m_i + gl.log2(l_i), float("-inf"))
    inv_l = gl.where(l_i > 0.0, 1.0 / l_i, 0.0)
    if HAS_SINK:
        b_sink = gl.load(sink + o_hs, mask=o_hs < H, other=float("-inf")) * LOG2E
        inv_l = gl.where(l_i > 0.0, inv_l / (1.0 + gl.exp2(b_sink - lse2)), 0.0)
    gl.store(lse + i_r.to(gl.int64) * H + o_hs, lse2 * 0.6931471805599453, mask=o_hs < H)
    b_o = acc * gl.convert_layout(inv_l, gl.SliceLayout(1, o_layout))[:, None]
    o_ho = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, o_layout))
    o_co = gl.arange(0, 512, layout=gl.SliceLayout(0, o_layout))
    p_o = out + i_r.to(gl.int64) * H * 512 + o_ho.to(gl.int64)[:, None] * 512 + o_co[None, :]
    gl.store(p_o, b_o.to(gl.bfloat16), mask=(o_ho < H)[:, None])


def _cache_bytes(k_cache: torch.Tensor) -> tuple[torch.Tensor, int, int]:
    """(uint8 base, page size, page stride in bytes) of a [pages, page_size, 1, 584] uint8 V4 cache view."""
    return k_cache, k_cache.shape[1], k_cache.stride(0)


def gluon_decode(q, k_cache, indices, extra_k_cache, extra_indices_in_kvcache, attn_sink, softmax_scale,  # noqa: ANN001
                 pipelined: bool = False, int_dequant: bool = False):  # fmt: skip
    """(out [B, S, H, 512] bf16, lse [B, H, S] fp32: the package's contract) for full-length rows (-1 entries
    masked). The synchronous kernel takes any H (64-head blocks) and the package's split rule with its combine
    kernel; the pipelined one H <= 64 and no split."""
    batch, s_q, heads, _ = q.shape
    assert q.stride(3) == 1 and q.dtype == torch.bfloat16
    assert k_cache.dtype == extra_k_cache.dtype == torch.uint8, "uint8 cache views (byte strides)"
    assert k_cache.stride(0) % 2 == 0 and extra_k_cache.stride(0) % 2 == 0, "even page strides (bf16 RoPE)"
    assert indices.dtype == extra_indices_in_kvcache.dtype == torch.int32
    assert indices.stride(2) == 1 and extra_indices_in_kvcache.stride(2) == 1
    softmax_scale = 512**-0.5 if softmax_scale is None else softmax_scale
    cache, page_size, page_stride = _cache_bytes(k_cache)
    cache_x, page_size_x, page_stride_x = _cache_bytes(extra_k_cache)
    out = torch.empty(batch, s_q, heads, 512, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(batch, s_q, heads, dtype=torch.float32, device=q.device)
    idx, idx_x = indices, extra_indices_in_kvcache
    rows, head_blocks = batch * s_q, triton.cdiv(heads, 64)
    args = (s_q, heads, idx.shape[2], idx_x.shape[2], page_size, page_stride, page_size_x, page_stride_x)
    strides = (q.stride(0), q.stride(1), q.stride(2), idx.stride(0), idx.stride(1), idx_x.stride(0), idx_x.stride(1))
    scale = float(softmax_scale) * 1.4426950408889634
    if pipelined:
        assert heads <= 64, "the pipelined kernel: one head block"
        assert k_cache.stride(0) % 16 == 0 and extra_k_cache.stride(0) % 16 == 0, "16-byte aligned rows (cp.async)"
        assert k_cache.data_ptr() % 16 == 0 and extra_k_cache.data_ptr() % 16 == 0, "16-byte aligned caches"
        _gluon_decode_async_kernel[(rows,)](
            q, cache, idx, cache_x, idx_x, attn_sink, out, lse, *args, scale, *strides,
            BLOCK_H=64, BLOCK_N=64, HAS_SINK=attn_sink is not None, INT_DEQUANT=int_dequant, num_warps=8,
        )  # fmt: skip
        return out, lse.permute(0, 2, 1)
    from sparsemla.kernels import device as dev
    from sparsemla.kernels.sparse_decode.triton import (
        _sparse_decode_combine_kernel,
        choose_num_splits,
        combine_blocks,
    )

    tiles = triton.cdiv(idx.shape[2], 64) + triton.cdiv(idx_x.shape[2], 64)
    splits = choose_num_splits(rows, head_blocks, tiles, dev.launch_info(q.device).num_sms, "auto")
    if splits > 1:
        o_part = torch.empty(rows, splits, heads, 512, dtype=torch.bfloat16, device=q.device)
        lse_part = torch.empty(rows, splits, heads, dtype=torch.float32, device=q.device)
    else:
        o_part, lse_part = out, lse  # unused
    _gluon_decode_kernel[(rows, head_blocks, splits)](
        q, cache, idx, cache_x, idx_x, attn_sink, out, lse, o_part, lse_part, *args, splits, scale, *strides,
        BLOCK_H=64, BLOCK_N=64, HAS_SINK=attn_sink is not None, INT_DEQUANT=int_dequant, SINGLE=splits == 1,
        num_warps=8,
    )  # fmt: skip
    if splits > 1:
        block_s, block_hc, block_d = combine_blocks(splits, heads)
        _sparse_decode_combine_kernel[(rows, triton.cdiv(heads, block_hc), triton.cdiv(512, block_d))](
            o_part, lse_part, attn_sink if attn_sink is not None else lse, out, lse, heads, heads, splits,
            DV=512, BLOCK_S=block_s, BLOCK_H=block_hc, BLOCK_D=block_d, HAS_SINK=attn_sink is not None, num_warps=4,
        )  # fmt: skip
    return out, lse.permute(0, 2, 1)


def _inputs(rows: int, heads: int, device: str, fill: bool = True) -> dict:
    from benchmarks.decode import Shape, make_inputs

    kw = make_inputs(Shape(rows, heads, 128, 512), seed=0, device=device, fill=fill)
    return {k: kw[k] for k in ("q", "k_cache", "indices", "extra_k_cache", "extra_indices_in_kvcache", "attn_sink")} | {
        "softmax_scale": kw["softmax_scale"]
    }


@app.command()
def aot(rows: int = 1024, heads: int = 64) -> None:
    """Here (no GPU): compile for sm_90 with this Triton; shared memory, registers, spills, loop op counts."""
    from anatomy_lib import loop_body

    from sparsemla.kernels import aot as A
    from sparsemla.kernels import device as dev

    info = dev.target("sm_90")
    got, sink = {}, []
    with A.compile_only("sm_90", info, "gluon", sink), A.watch_launches(lambda n, k: got.setdefault(n, k),
                                                                        compile_only=True):  # fmt: skip
        kw = _inputs(rows, heads, "cpu", fill=False)
        for variant in variants_for(heads)[1:]:
            got.clear()
            sink.clear()
            _launch(variant, kw)
            name = next(iter(got))
            res = next(r for r in sink if r.kernel == name)
            body = loop_body(A._cubin_tool(got[name].asm["cubin"], "-sass"))
            ops = Counter(re.sub(r"^@!?U?P\w+\s+", "", op).split()[0] for op in body)
            print(f"{variant}: shared {res.shared} registers {res.registers} spilled {res.spilled} loop {len(body)}")
            print("  " + " ".join(f"{o}:{n}" for o, n in ops.most_common(40)))


VARIANTS = ("base", "package", "package_ids")
SHAPES = "8x64,64x64,128x64,1024x64,8192x64,8x128,64x128,128x128"  # rows x heads (8 x 128: splits and head blocks)


def variants_for(heads: int) -> tuple[str, ...]:
    """The variants a shape runs: the pipelined kernel has no head blocks (H <= 64)."""
    return tuple(v for v in VARIANTS if heads <= 64 or "_async" not in v)


def _launch(variant: str, kw: dict) -> torch.Tensor:
    """out of one call: ``base`` = the package's launcher with its Triton tile (its choices for this GPU, the Gluon
    tile off), ``package`` = the launcher's default (on sm_90 from 8 programs: gluon_sm90, this prototype's
    ``gluon_int`` in the package), ``package_pfN``: it with N tiles of L2 prefetch, ``package_lift`` with the lift, ``package_ids`` with its ids one iteration ahead, ``gluon*`` = this file's
    kernels."""
    if variant.startswith("gluon"):  # _async: cp.async pipeline; _int: the integer e4m3 path
        return gluon_decode(**kw, pipelined="_async" in variant, int_dequant=variant.endswith("_int"))[0]
    from dataclasses import replace

    from sparsemla.kernels import device as dev
    from sparsemla.kernels.sparse_decode import triton as T

    if variant == "package":
        return T.sparse_decode_fwd(**kw, head_dim_v=512)[0]
    batch, s_q, heads, _ = kw["q"].shape
    cfg = T.choose_config(dev.launch_info(kw["q"].device), heads, batch * s_q)
    if variant.startswith("package_pf"):  # the package's tile with this many tiles of L2 prefetch
        return T.sparse_decode_fwd(**kw, head_dim_v=512, config=replace(cfg, l2_prefetch=int(variant[-1])))[0]
    if variant == "package_lift":  # the package's tile with the integer dequant's lift
        return T.sparse_decode_fwd(**kw, head_dim_v=512, config=replace(cfg, q_lift=True))[0]
    if variant == "package_ids":  # the package's Gluon tile with its slot ids loaded one iteration ahead
        return T.sparse_decode_fwd(**kw, head_dim_v=512, config=replace(cfg, ids_ahead=cfg.gluon))[0]
    cfg = replace(cfg, gluon=False)
    return T.sparse_decode_fwd(**kw, head_dim_v=512, config=cfg)[0]


@app.command()
def build(out: Path = Path(".gpu-cubins/gluon"), shapes: str = SHAPES) -> None:
    """Here (no GPU): the launcher's and this kernel's launches at SHAPES (rows x heads) compiled by this Triton into
    OUT (benchmarks/prod_cubins.py, native path), for `bench` on the GPU machine."""
    from benchmarks import prod_cubins

    def workload() -> None:
        for rows, heads in (map(int, s.split("x")) for s in shapes.split(",")):
            kw = _inputs(rows, heads, "cpu", fill=False)
            for variant in variants_for(heads):
                _launch(variant, kw)

    import triton

    added = prod_cubins.build(workload, out, "native")
    print(f"Triton {triton.__version__}: {len(added)} cubins added to {out}")


@app.command()
def bench(cubins: Path = Path(".gpu-cubins/gluon"), shapes: str = SHAPES,
          out: Path = Path("gluon_decode.json"), git_sha: str = "unknown") -> None:  # fmt: skip
    """GPU: both kernels from CUBINS (Triton 3.8) replayed, CUDA-graph median (2 input sets rotated), out's relative
    error against the fp32 reference; JSON to OUT."""
    import json

    import triton
    from triton.testing import do_bench

    from benchmarks import prod_cubins
    from benchmarks.decode import Shape, graphed, make_inputs
    from sparsemla.kernels.sparse_decode.reference import sparse_decode_reference

    rows_out: list[dict] = []
    with prod_cubins.Replayer(cubins) as counts:
        for rows, heads in (map(int, s.split("x")) for s in shapes.split(",")):
            sets = []
            for i in range(2):
                kw = make_inputs(Shape(rows, heads, 128, 512), seed=100 * rows + i)
                sets.append({k: kw[k] for k in ("q", "k_cache", "indices", "extra_k_cache",
                                                "extra_indices_in_kvcache", "attn_sink", "softmax_scale")})  # fmt: skip
            # the fp32 reference up to 1024 rows (it materialises the gathered rows in fp32), else the launcher
            want = sparse_decode_reference(**sets[0], head_dim_v=512)[0].float() if rows <= 1024 else None
            for variant in variants_for(heads):
                row = dict(rows=rows, H=heads, variant=variant)
                try:
                    got = _launch(variant, sets[0]).float()
                    want = got if want is None else want  # the launcher's own output (its row comes first)
                    runs = [graphed(lambda kw=kw, v=variant: _launch(v, kw)) for kw in sets]
                    st = {"i": 0}

                    def step(runs=runs, st=st) -> None:
                        st["i"] += 1
                        runs[st["i"] % 2]()

                    us = do_bench(step, warmup=10, rep=50, return_mode="median") * 1e3
                    row.update(us=round(us, 2), err=float((got - want).norm() / want.norm()))
                except Exception as exc:  # noqa: BLE001 - a failing variant is a finding
                    row["error"] = (str(exc).splitlines() or [repr(exc)])[-1][:300]
                rows_out.append(row)
                print(json.dumps(row), flush=True)
            if rows <= 1024:  # -1 entries (a short main row, every other extra row empty): out and lse vs reference
                kw = dict(sets[0])
                kw["indices"] = kw["indices"].clone()
                kw["indices"][:, :, 100:] = -1
                kw["extra_indices_in_kvcache"] = kw["extra_indices_in_kvcache"].clone()
                kw["extra_indices_in_kvcache"][::2] = -1
                row = dict(rows=rows, H=heads, variant="gluon", case="masked")
                try:
                    want_o, want_l = sparse_decode_reference(**kw, head_dim_v=512)
                    got_o, got_l = gluon_decode(**kw)
                    fin = torch.isfinite(want_l)
                    row.update(err=float((got_o.float() - want_o.float()).norm() / want_o.float().norm()),
                               lse_max_abs=float((got_l - want_l)[fin].abs().max()),
                               lse_inf_match=bool(torch.equal(torch.isneginf(got_l), torch.isneginf(want_l))))  # fmt: skip
                except Exception as exc:  # noqa: BLE001
                    row["error"] = (str(exc).splitlines() or [repr(exc)])[-1][:300]
                rows_out.append(row)
                print(json.dumps(row), flush=True)
    doc = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, git_sha=git_sha,
               cubins=str(cubins), replayed=counts, rows=rows_out)  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    app()
