"""Exploratory (not in the package): the V3.2 decode's 64-head wgmma tile (fp8_656 cache) in Gluon, so that the two
warpgroups split the scores' tokens instead of both computing the whole score tile (README.md, twenty-ninth session:
plain Triton gives the chained score dots ``warpsPerCTA = [8, 1]``). Issue #17: H = 128 at 1.9-2.2x FlashMLA.

One program per (query row, 64-head block, split), 64-token tiles, 8 warps, one stage; split-K over the index row
with the package's LSE-merge kernel; rows with no valid entry get out 0 and lse +inf (FlashMLA's convention, as the
package's kernel). Per tile:

* gather the tile's 512 e4m3 NoPE bytes (4 chunks of 128, each times its fp32 scale, in fp32, rounded once to bf16
  -- the package's numbers) and its 64 bf16 RoPE values into shared memory;
* S = q_nope K_nope^T + q_rope K_rope^T by two ``warpgroup_mma`` with ``warps_per_cta = [4, 2]``;
* online softmax; P (bf16) through shared memory; O [64, 512] += P K_nope with ``warps_per_cta = [4, 2]``.

Session 33: the 2-CTA cluster form for H = 128 (``_gluon_v32_cluster_kernel``, variants ``gluon_cl*``): one program
is a cluster of two CTAs (``num_ctas=2``; Triton 3.8's Gluon layouts with ``cga_layout`` put heads 0..63 on one CTA
and 64..127 on the other), each CTA gathers and dequantizes half of every tile's tokens, and the halves are
exchanged through distributed shared memory, so a tile is dequantized once per row instead of once per 64 heads (the
idea of FlashMLA's "crossover", flashmla_sm90_notes.md, here with loads from the peer instead of its stores). What
Triton 3.8 lowers (ahead of time, sm_90): ``gl.convert_layout`` from a cluster-split to a cluster-broadcast layout
goes through a 4 KB scratch in rounds, two cluster barriers a round (``gluon_clc``: 16 a tile, each a GPU-scope
fence: MEMBAR.ALL.GPU + CCTL.IVALL in SASS); a load of a cluster-split shared buffer into a broadcast layout is
``ld.shared::cluster`` with no barrier of its own, so ``gluon_cl`` stores its half into one of two split buffers,
takes ONE cluster barrier a tile and copies all rows into its own tile buffer (221,696 B of shared memory, 239
registers, 991 loop instructions against the synchronous tile's 1,202). ``gluon_clp`` also loads the next tile's
raw rows a tile ahead (255 registers, 56 B spilled). The cubin replay launches clusters (``cuLaunchKernelEx``).
Measured on an H100 (README, session 33): correct, and slower than the synchronous tile (B = 64: 207.1 / 218.5 /
533.7 us for cl / clp / clc against 174.6); without the exchange (timing only) 161.5: the synchronous loop is
latency-bound, so the exchange must be asynchronous (a warp-specialized pipeline) to pay. Concluded in this form.

    PYTHONPATH=src:. .venv/bin/python results/bench/explore/gluon_decode_v32.py aot     # here: Triton 3.8, sm_90
    PYTHONPATH=src:. .venv/bin/python results/bench/explore/gluon_decode_v32.py build   # here: .gpu-cubins/gluon_v32
    run(command="SHA=<sha> bash results/bench/explore/gpu_t38.sh gluon32", carry=[".gpu-cubins/gluon_v32", ".gpu"])
"""

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
    fence_async_shared,
    mbarrier,
    warpgroup_mma,
    warpgroup_mma_wait,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gluon_decode import _e4m3_bits_to_bf16, _softmax_pv  # noqa: E402 - the V4 prototype's Gluon helpers

_barrier = getattr(gl, "barrier", None) or gl.thread_barrier  # Triton 3.8's name; 3.6 (the GPU machine): thread_barrier

app = typer.Typer(add_completion=False)

SCALE_OFF_F32: gl.constexpr = gl.constexpr(512 // 4)  # the 4 fp32 scales start at byte 512 of a 656-byte row
ROPE_OFF: gl.constexpr = gl.constexpr(528)  # the 64 bf16 RoPE values start at byte 528
LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)
TWO_POW_120_F: gl.constexpr = gl.constexpr(2.0**120)


@gluon.jit
def _v32_rows(b_idx, num_slots, page_size, stride_kb, stride_kt):
    """(valid [N], byte offsets [N] int64) of slot ids ``b_idx``; invalid (< 0 or >= num_slots): slot 0's row."""
    m_n = (b_idx >= 0) & (b_idx < num_slots)
    b_slot = gl.where(m_n, b_idx, 0)
    return m_n, (b_slot // page_size).to(gl.int64) * stride_kb + (b_slot % page_size).to(gl.int64) * stride_kt


@gluon.jit
def _v32_gather_store_tile(kv, b_idx, b_idr, num_slots, page_size, stride_kb, stride_kt, k_smem, kr_smem, o_d, o_r,
                           INT_DEQUANT: gl.constexpr):  # fmt: skip
    """Rows of slot ids ``b_idx`` / ``b_idr`` [N] (the same ids in the NoPE chunks' and the RoPE's row layouts;
    invalid: < 0 or >= num_slots -> zeros) of the fp8_656 cache (uint8 ``kv``) into ``k_smem`` [N, 512] bf16 (NoPE x
    scale, 128 columns at a time) and ``kr_smem`` [N, 64] bf16 (RoPE). ``o_d`` [128] / ``o_r`` [64]: the columns."""
    m_n, o_tok = _v32_rows(b_idx, num_slots, page_size, stride_kb, stride_kt)
    p_sc = kv.to(gl.pointer_type(gl.float32), bitcast=True)
    for c in gl.static_range(4):
        b_u = gl.load(kv + (o_tok + c * 128)[:, None] + o_d[None, :], mask=m_n[:, None], other=0)  # [N, 128] e4m3
        b_sc = gl.load(p_sc + o_tok // 4 + SCALE_OFF_F32 + c, mask=m_n, other=0.0)  # [N] fp32
        if INT_DEQUANT:
            two_120 = gl.full([1, 1], TWO_POW_120_F, gl.bfloat16, b_u.type.layout)
            b_k = (_e4m3_bits_to_bf16(b_u) * two_120).to(gl.float32)  # the e4m3 value, exact
        else:
            b_k = b_u.to(gl.float8e4nv, bitcast=True).to(gl.float32)
        k_smem.slice(c * 128, 128, dim=1).store((b_k * b_sc[:, None]).to(gl.bfloat16))  # rounded once
    m_r, o_tr = _v32_rows(b_idr, num_slots, page_size, stride_kb, stride_kt)
    p_rope = (kv + ROPE_OFF).to(gl.pointer_type(gl.bfloat16), bitcast=True)
    b_r = gl.load(p_rope + (o_tr // 2)[:, None] + o_r[None, :], mask=m_r[:, None], other=0.0)  # [N, 64] bf16
    kr_smem.store(b_r)


@gluon.jit
def _v32_epilogue(acc, m_i, l_i, h0, out, lse, o_part, lse_part, i_r, i_b, i_s, i_sp, S, H, num_splits,
                  BLOCK_H: gl.constexpr, s_layout: gl.constexpr, o_layout: gl.constexpr,
                  SINGLE: gl.constexpr):  # fmt: skip
    """Heads ``h0 .. h0 + BLOCK_H`` of a program's result: SINGLE: out [B, S, H, 512] bf16 and lse [B, H, S] (natural
    log, +inf when empty); else the split's normalised partial o_part [rows, splits, H, 512] and base-2 lse_part (-inf
    when empty) for the package's combine kernel. ``acc`` [BLOCK_H, 512] (``o_layout``), ``m_i`` / ``l_i`` [BLOCK_H]
    (the scores' rows, ``s_layout``)."""
    o_hs = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, s_layout))
    m_hs = o_hs < H
    lse2 = gl.where(l_i > 0.0, m_i + gl.log2(l_i), float("-inf"))
    inv_l = gl.where(l_i > 0.0, 1.0 / l_i, 0.0)
    b_o = acc * gl.convert_layout(inv_l, gl.SliceLayout(1, o_layout))[:, None]
    o_ho = h0 + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, o_layout))
    o_co = gl.arange(0, 512, layout=gl.SliceLayout(0, o_layout))
    if SINGLE:
        p_o = out + (i_r.to(gl.int64) * H + o_ho.to(gl.int64))[:, None] * 512 + o_co[None, :]
        b_lse = gl.where(l_i > 0.0, lse2 * 0.6931471805599453, float("inf"))
        gl.store(lse + (i_b.to(gl.int64) * H + o_hs) * S + i_s, b_lse, mask=m_hs)  # lse [B, H, S]
    else:
        i_part = i_r.to(gl.int64) * num_splits + i_sp
        p_o = o_part + (i_part * H + o_ho.to(gl.int64))[:, None] * 512 + o_co[None, :]
        gl.store(lse_part + i_part * H + o_hs, lse2, mask=m_hs)
    gl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=(o_ho < H)[:, None])


@gluon.jit
def _gluon_v32_kernel(
    q, kv, idx, out, lse, o_part, lse_part,
    S, H, TOPK, page_size, stride_kb, stride_kt, num_slots, num_splits, qk_scale,
    stride_qb, stride_qs, stride_qh, stride_ib, stride_is,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, SINGLE: gl.constexpr, INT_DEQUANT: gl.constexpr,
    num_warps: gl.constexpr,
):  # fmt: skip
    """Grid (B * S, cdiv(H, BLOCK_H), num_splits). SINGLE: out [B, S, H, 512] bf16 and lse [B, H, S] (natural log,
    +inf when empty); else the split's normalised partial o_part [rows, splits, H, 512] and base-2 lse_part (-inf
    when empty) for the package's combine kernel."""
    gl.static_assert(num_warps == 8, "two warpgroups")
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])  # q rows, 16-byte runs
    ck: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])  # [N, 128] NoPE chunks
    cr: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])  # [N, 64] RoPE
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, 256, 16])  # fmt: skip
    q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, 512], gl.bfloat16)
    qr_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, 64], gl.bfloat16)
    k_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 512], gl.bfloat16)
    kr_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 64], gl.bfloat16)
    p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], gl.bfloat16)

    i_r = gl.program_id(0)
    i_hb = gl.program_id(1)
    i_sp = gl.program_id(2)
    i_b = i_r // S
    i_s = i_r % S
    o_hl = i_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ld))
    o_c = gl.arange(0, 512, layout=gl.SliceLayout(0, ld))
    p_q = q + i_b.to(gl.int64) * stride_qb + i_s.to(gl.int64) * stride_qs + o_hl.to(gl.int64)[:, None] * stride_qh
    b_q = gl.load(p_q + o_c[None, :], mask=(o_hl < H)[:, None], other=0.0)  # [BLOCK_H, 512] NoPE
    o_e = gl.arange(0, 64, layout=gl.SliceLayout(0, ld))
    b_qr = gl.load(p_q + 512 + o_e[None, :], mask=(o_hl < H)[:, None], other=0.0)  # [BLOCK_H, 64] RoPE
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, 512], q_sl, b_q)
    qr_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, 64], qr_sl, b_qr)
    k_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, 512], k_sl)
    kr_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, 64], kr_sl)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, BLOCK_N], p_sl)

    tiles = gl.cdiv(TOPK, BLOCK_N)
    per = gl.cdiv(tiles, num_splits)
    t_lo = i_sp * per
    t_hi = gl.minimum(t_lo + per, tiles)
    acc = gl.zeros([BLOCK_H, 512], gl.float32, o_layout)
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, s_layout))
    o_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ck))
    o_d = gl.arange(0, 128, layout=gl.SliceLayout(0, ck))
    o_nr = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, cr))
    o_r = gl.arange(0, 64, layout=gl.SliceLayout(0, cr))
    o_ns = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    p_idx = idx + i_b.to(gl.int64) * stride_ib + i_s.to(gl.int64) * stride_is
    for i_t in range(t_lo, t_hi):
        t0 = i_t * BLOCK_N
        b_idx = gl.load(p_idx + t0 + o_n, mask=t0 + o_n < TOPK, other=-1)  # [N] slot ids (chunk rows)
        b_idr = gl.load(p_idx + t0 + o_nr, mask=t0 + o_nr < TOPK, other=-1)  # the same (RoPE rows)
        b_ids = gl.load(p_idx + t0 + o_ns, mask=t0 + o_ns < TOPK, other=-1)  # the same (S columns)
        _barrier()  # every warpgroup's PV of the last tile is done before the tile is replaced
        _v32_gather_store_tile(kv, b_idx, b_idr, num_slots, page_size, stride_kb, stride_kt, k_smem, kr_smem, o_d,
                               o_r, INT_DEQUANT)  # fmt: skip
        fence_async_shared()
        _barrier()
        b_s = warpgroup_mma(q_smem, k_smem.permute((1, 0)), gl.zeros([BLOCK_H, BLOCK_N], gl.float32, s_layout),
                            use_acc=False, is_async=True)  # fmt: skip
        b_s = warpgroup_mma(qr_smem, kr_smem.permute((1, 0)), b_s, is_async=True)
        b_s = warpgroup_mma_wait(num_outstanding=0, deps=(b_s,))  # [BLOCK_H, BLOCK_N]: each warpgroup 32 tokens
        m_s = (b_ids >= 0) & (b_ids < num_slots)
        acc, m_i, l_i = _softmax_pv(b_s, m_s, qk_scale, m_i, l_i, acc, p_smem, k_smem, o_layout)

    _v32_epilogue(acc, m_i, l_i, i_hb * BLOCK_H, out, lse, o_part, lse_part, i_r, i_b, i_s, i_sp, S, H, num_splits,
                  BLOCK_H, s_layout, o_layout, SINGLE)


# The 2-CTA cluster form (issue #17 at H = 128; README, session 33). Layout bases of the cluster's CTA bit:
SPLIT0 = gl.constexpr([[1, 0]])  # the second CTA holds the second half of dim 0 (heads; tokens of a gathered chunk)
BCAST = gl.constexpr([[0, 0]])  # both CTAs hold the whole tensor


@gluon.jit
def _cl_gather_store_tile(kv, b_idx, b_idr, num_slots, page_size, stride_kb, stride_kt, k_smem, kr_smem, o_d, o_r,
                          ck_b: gl.constexpr, INT_DEQUANT: gl.constexpr):  # fmt: skip
    """The cluster form of :func:`_v32_gather_store_tile`: ``b_idx`` [N] is split over the cluster's two CTAs, so each
    gathers and dequantizes half of the tile's tokens; ``gl.convert_layout`` to ``ck_b`` (both CTAs hold all N rows)
    exchanges the halves through distributed shared memory (``ld.shared::cluster``), and each CTA stores the whole
    dequantized tile into its own ``k_smem`` [N, 512]. The RoPE rows (``b_idr``, bf16, nothing to dequantize) are
    loaded whole by both CTAs."""
    m_n, o_tok = _v32_rows(b_idx, num_slots, page_size, stride_kb, stride_kt)
    p_sc = kv.to(gl.pointer_type(gl.float32), bitcast=True)
    for c in gl.static_range(4):
        b_u = gl.load(kv + (o_tok + c * 128)[:, None] + o_d[None, :], mask=m_n[:, None], other=0)  # [N, 128] half
        b_sc = gl.load(p_sc + o_tok // 4 + SCALE_OFF_F32 + c, mask=m_n, other=0.0)  # [N] fp32 (this CTA's half)
        if INT_DEQUANT:
            two_120 = gl.full([1, 1], TWO_POW_120_F, gl.bfloat16, b_u.type.layout)
            b_k = (_e4m3_bits_to_bf16(b_u) * two_120).to(gl.float32)
        else:
            b_k = b_u.to(gl.float8e4nv, bitcast=True).to(gl.float32)
        b_kc = (b_k * b_sc[:, None]).to(gl.bfloat16)  # [N, 128]: this CTA's rows
        k_smem.slice(c * 128, 128, dim=1).store(gl.convert_layout(b_kc, ck_b))  # [N, 128]: all rows
    m_r, o_tr = _v32_rows(b_idr, num_slots, page_size, stride_kb, stride_kt)
    p_rope = (kv + ROPE_OFF).to(gl.pointer_type(gl.bfloat16), bitcast=True)
    b_r = gl.load(p_rope + (o_tr // 2)[:, None] + o_r[None, :], mask=m_r[:, None], other=0.0)  # [N, 64] bf16
    kr_smem.store(b_r)


@gluon.jit
def _cl_gather_store_tile_buf(kv, b_idx, b_idr, num_slots, page_size, stride_kb, stride_kt, k_half, k_smem, kr_smem,
                              o_d, o_r, ck_b: gl.constexpr, INT_DEQUANT: gl.constexpr,
                              DIAG: gl.constexpr = 0):  # fmt: skip
    """:func:`_cl_gather_store_tile` with ONE cluster barrier a tile instead of the layout conversion's four a chunk:
    each CTA stores its dequantized half of the tokens into ``k_half`` (a [N, 512] buffer split over the cluster:
    this CTA's rows in its own shared memory), a cluster barrier (release / acquire), then each CTA reads all N rows
    (the peer's through ``ld.shared::cluster``) into its own ``k_smem``. ``k_half`` alternates between two buffers
    (the caller), so the next barrier also says the peer has read this one before it is written again."""
    m_n, o_tok = _v32_rows(b_idx, num_slots, page_size, stride_kb, stride_kt)
    p_sc = kv.to(gl.pointer_type(gl.float32), bitcast=True)
    for c in gl.static_range(4):
        b_u = gl.load(kv + (o_tok + c * 128)[:, None] + o_d[None, :], mask=m_n[:, None], other=0)  # [N, 128] half
        b_sc = gl.load(p_sc + o_tok // 4 + SCALE_OFF_F32 + c, mask=m_n, other=0.0)  # [N] fp32 (this CTA's half)
        if INT_DEQUANT:
            two_120 = gl.full([1, 1], TWO_POW_120_F, gl.bfloat16, b_u.type.layout)
            b_k = (_e4m3_bits_to_bf16(b_u) * two_120).to(gl.float32)
        else:
            b_k = b_u.to(gl.float8e4nv, bitcast=True).to(gl.float32)
        k_half.slice(c * 128, 128, dim=1).store((b_k * b_sc[:, None]).to(gl.bfloat16))  # this CTA's rows
    m_r, o_tr = _v32_rows(b_idr, num_slots, page_size, stride_kb, stride_kt)
    p_rope = (kv + ROPE_OFF).to(gl.pointer_type(gl.bfloat16), bitcast=True)
    b_r = gl.load(p_rope + (o_tr // 2)[:, None] + o_r[None, :], mask=m_r[:, None], other=0.0)  # [N, 64] bf16
    kr_smem.store(b_r)
    if DIAG == 0:  # (DIAG, timing only, wrong outputs: 1 = without the barrier, 2 = without barrier and exchange)
        gl.barrier(cluster=True)  # both CTAs' halves are in
    if DIAG < 2:
        for c in gl.static_range(4):
            k_smem.slice(c * 128, 128, dim=1).store(k_half.slice(c * 128, 128, dim=1).load(ck_b))  # [N, 128]: all


@gluon.jit
def _cl_load_raw(kv, p_idx, t0, TOPK, o_n, o_d, o_nr, o_r, num_slots, page_size, stride_kb, stride_kt):
    """The raw rows of the tile at index-row position ``t0`` (``PREFETCH``: loaded a tile ahead): this CTA's half of
    the tokens' four [N, 128] e4m3 chunks (uint8) and four [N] fp32 scales, and all N tokens' [N, 64] bf16 RoPE rows
    (invalid ids: zeros). Returns (u0, u1, u2, u3, s0, s1, s2, s3, rope)."""
    b_idx = gl.load(p_idx + t0 + o_n, mask=t0 + o_n < TOPK, other=-1)  # [N] this CTA's half
    m_n, o_tok = _v32_rows(b_idx, num_slots, page_size, stride_kb, stride_kt)
    p_sc = kv.to(gl.pointer_type(gl.float32), bitcast=True)
    u0 = gl.load(kv + o_tok[:, None] + o_d[None, :], mask=m_n[:, None], other=0)
    u1 = gl.load(kv + (o_tok + 128)[:, None] + o_d[None, :], mask=m_n[:, None], other=0)
    u2 = gl.load(kv + (o_tok + 256)[:, None] + o_d[None, :], mask=m_n[:, None], other=0)
    u3 = gl.load(kv + (o_tok + 384)[:, None] + o_d[None, :], mask=m_n[:, None], other=0)
    s0 = gl.load(p_sc + o_tok // 4 + SCALE_OFF_F32, mask=m_n, other=0.0)
    s1 = gl.load(p_sc + o_tok // 4 + SCALE_OFF_F32 + 1, mask=m_n, other=0.0)
    s2 = gl.load(p_sc + o_tok // 4 + SCALE_OFF_F32 + 2, mask=m_n, other=0.0)
    s3 = gl.load(p_sc + o_tok // 4 + SCALE_OFF_F32 + 3, mask=m_n, other=0.0)
    b_idr = gl.load(p_idx + t0 + o_nr, mask=t0 + o_nr < TOPK, other=-1)  # [N] all
    m_r, o_tr = _v32_rows(b_idr, num_slots, page_size, stride_kb, stride_kt)
    p_rope = (kv + ROPE_OFF).to(gl.pointer_type(gl.bfloat16), bitcast=True)
    rope = gl.load(p_rope + (o_tr // 2)[:, None] + o_r[None, :], mask=m_r[:, None], other=0.0)
    return u0, u1, u2, u3, s0, s1, s2, s3, rope


@gluon.jit
def _cl_dequant_chunk(b_u, b_sc, INT_DEQUANT: gl.constexpr):
    """[N, 128] e4m3 bytes times their [N] fp32 scales -> bf16 (rounded once, as the package)."""
    if INT_DEQUANT:
        two_120 = gl.full([1, 1], TWO_POW_120_F, gl.bfloat16, b_u.type.layout)
        b_k = (_e4m3_bits_to_bf16(b_u) * two_120).to(gl.float32)
    else:
        b_k = b_u.to(gl.float8e4nv, bitcast=True).to(gl.float32)
    return (b_k * b_sc[:, None]).to(gl.bfloat16)


@gluon.jit
def _cl_store_raw_tile(u0, u1, u2, u3, s0, s1, s2, s3, rope, k_half, k_smem, kr_smem, ck_b: gl.constexpr,
                       INT_DEQUANT: gl.constexpr):  # fmt: skip
    """:func:`_cl_gather_store_tile_buf` from rows already loaded (:func:`_cl_load_raw`)."""
    k_half.slice(0, 128, dim=1).store(_cl_dequant_chunk(u0, s0, INT_DEQUANT))
    k_half.slice(128, 128, dim=1).store(_cl_dequant_chunk(u1, s1, INT_DEQUANT))
    k_half.slice(256, 128, dim=1).store(_cl_dequant_chunk(u2, s2, INT_DEQUANT))
    k_half.slice(384, 128, dim=1).store(_cl_dequant_chunk(u3, s3, INT_DEQUANT))
    kr_smem.store(rope)
    gl.barrier(cluster=True)  # both CTAs' halves are in
    for c in gl.static_range(4):
        k_smem.slice(c * 128, 128, dim=1).store(k_half.slice(c * 128, 128, dim=1).load(ck_b))  # [N, 128]: all rows


@gluon.jit
def _gluon_v32_cluster_kernel(
    q, kv, idx, out, lse, o_part, lse_part,
    S, H, TOPK, page_size, stride_kb, stride_kt, num_slots, num_splits, qk_scale,
    stride_qb, stride_qs, stride_qh, stride_ib, stride_is,
    BLOCK_N: gl.constexpr, SINGLE: gl.constexpr, INT_DEQUANT: gl.constexpr, EXCHANGE_BUF: gl.constexpr,
    PREFETCH: gl.constexpr, num_warps: gl.constexpr, DIAG: gl.constexpr = 0,
):  # fmt: skip
    """:func:`_gluon_v32_kernel` for H = 128 as ONE program of a 2-CTA cluster (``num_ctas=2``): tensors are the
    cluster's, and the layouts put heads 0..63 on the first CTA and 64..127 on the second (``SPLIT0``), so each CTA
    runs the 64-head tile of the synchronous kernel; the gathered tile is dequantized once per cluster instead of once
    per CTA (:func:`_cl_gather_store_tile`; EXCHANGE_BUF: :func:`_cl_gather_store_tile_buf`; PREFETCH, with
    EXCHANGE_BUF: the next tile's raw rows are loaded into registers before this tile is dequantized and multiplied,
    so their latency hides behind it). Grid (B * S, 1, num_splits) clusters."""
    gl.static_assert(num_warps == 8, "two warpgroups a CTA")
    BLOCK_H: gl.constexpr = 128
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0], cga_layout=SPLIT0)  # q rows
    ck: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0], cga_layout=SPLIT0)  # half the tokens
    ck_b: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0], cga_layout=BCAST)  # all of them
    cr: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0], cga_layout=BCAST)  # [N, 64] RoPE
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16],
                                                       cga_layout=SPLIT0)  # fmt: skip
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, 256, 16], cga_layout=SPLIT0)  # fmt: skip
    q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, 512], gl.bfloat16, cga_layout=SPLIT0)
    qr_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, 64], gl.bfloat16, cga_layout=SPLIT0)
    k_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 512], gl.bfloat16, cga_layout=BCAST)
    kr_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 64], gl.bfloat16, cga_layout=BCAST)
    p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], gl.bfloat16, cga_layout=SPLIT0)

    i_r = gl.program_id(0)
    i_sp = gl.program_id(2)
    i_b = i_r // S
    i_s = i_r % S
    o_hl = gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ld))
    o_c = gl.arange(0, 512, layout=gl.SliceLayout(0, ld))
    p_q = q + i_b.to(gl.int64) * stride_qb + i_s.to(gl.int64) * stride_qs + o_hl.to(gl.int64)[:, None] * stride_qh
    b_q = gl.load(p_q + o_c[None, :], mask=(o_hl < H)[:, None], other=0.0)  # [BLOCK_H, 512] NoPE
    o_e = gl.arange(0, 64, layout=gl.SliceLayout(0, ld))
    b_qr = gl.load(p_q + 512 + o_e[None, :], mask=(o_hl < H)[:, None], other=0.0)  # [BLOCK_H, 64] RoPE
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, 512], q_sl, b_q)
    qr_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, 64], qr_sl, b_qr)
    k_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, 512], k_sl)
    kr_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, 64], kr_sl)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, BLOCK_N], p_sl)
    if EXCHANGE_BUF:  # two [N, 512] buffers, each split over the cluster (32 KB a CTA each)
        kh_sl: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, [1, 0], cga_layout=SPLIT0)
        kh0 = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, 512], kh_sl)
        kh1 = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, 512], kh_sl)

    tiles = gl.cdiv(TOPK, BLOCK_N)
    per = gl.cdiv(tiles, num_splits)
    t_lo = i_sp * per
    t_hi = gl.minimum(t_lo + per, tiles)
    acc = gl.zeros([BLOCK_H, 512], gl.float32, o_layout)
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, s_layout))
    o_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ck))
    o_d = gl.arange(0, 128, layout=gl.SliceLayout(0, ck))
    o_nr = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, cr))
    o_r = gl.arange(0, 64, layout=gl.SliceLayout(0, cr))
    o_ns = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    p_idx = idx + i_b.to(gl.int64) * stride_ib + i_s.to(gl.int64) * stride_is
    gl.static_assert(EXCHANGE_BUF or not PREFETCH, "PREFETCH goes with EXCHANGE_BUF")
    if PREFETCH:
        u0, u1, u2, u3, s0, s1, s2, s3, rope = _cl_load_raw(kv, p_idx, t_lo * BLOCK_N, TOPK, o_n, o_d, o_nr, o_r,
                                                            num_slots, page_size, stride_kb, stride_kt)  # fmt: skip
    for i_t in range(t_lo, t_hi):
        t0 = i_t * BLOCK_N
        b_ids = gl.load(p_idx + t0 + o_ns, mask=t0 + o_ns < TOPK, other=-1)  # [N] slot ids, all (S columns)
        if PREFETCH:  # this tile's rows (loaded last iteration) and the next tile's, issued now
            c0, c1, c2, c3, d0, d1, d2, d3, cr0 = u0, u1, u2, u3, s0, s1, s2, s3, rope
            u0, u1, u2, u3, s0, s1, s2, s3, rope = _cl_load_raw(kv, p_idx, t0 + BLOCK_N, TOPK, o_n, o_d, o_nr, o_r,
                                                                num_slots, page_size, stride_kb, stride_kt)  # fmt: skip
            _barrier()  # every warpgroup's PV of the last tile is done before the tile is replaced
            if i_t % 2 == 0:
                _cl_store_raw_tile(c0, c1, c2, c3, d0, d1, d2, d3, cr0, kh0, k_smem, kr_smem, ck_b, INT_DEQUANT)
            else:
                _cl_store_raw_tile(c0, c1, c2, c3, d0, d1, d2, d3, cr0, kh1, k_smem, kr_smem, ck_b, INT_DEQUANT)
        else:
            b_idx = gl.load(p_idx + t0 + o_n, mask=t0 + o_n < TOPK, other=-1)  # [N] slot ids (this CTA's half)
            b_idr = gl.load(p_idx + t0 + o_nr, mask=t0 + o_nr < TOPK, other=-1)  # the same, all (RoPE rows)
            _barrier()  # every warpgroup's PV of the last tile is done before the tile is replaced
        if PREFETCH:
            pass
        elif EXCHANGE_BUF:  # (a memdesc index of a cluster-split 3D buffer does not compile: two buffers)
            if i_t % 2 == 0:
                _cl_gather_store_tile_buf(kv, b_idx, b_idr, num_slots, page_size, stride_kb, stride_kt, kh0, k_smem,
                                          kr_smem, o_d, o_r, ck_b, INT_DEQUANT, DIAG)  # fmt: skip
            else:
                _cl_gather_store_tile_buf(kv, b_idx, b_idr, num_slots, page_size, stride_kb, stride_kt, kh1, k_smem,
                                          kr_smem, o_d, o_r, ck_b, INT_DEQUANT, DIAG)  # fmt: skip
        else:
            _cl_gather_store_tile(kv, b_idx, b_idr, num_slots, page_size, stride_kb, stride_kt, k_smem, kr_smem, o_d,
                                  o_r, ck_b, INT_DEQUANT)  # fmt: skip
        fence_async_shared()
        _barrier()
        b_s = warpgroup_mma(q_smem, k_smem.permute((1, 0)), gl.zeros([BLOCK_H, BLOCK_N], gl.float32, s_layout),
                            use_acc=False, is_async=True)  # fmt: skip
        b_s = warpgroup_mma(qr_smem, kr_smem.permute((1, 0)), b_s, is_async=True)
        b_s = warpgroup_mma_wait(num_outstanding=0, deps=(b_s,))  # [BLOCK_H, BLOCK_N]
        m_s = (b_ids >= 0) & (b_ids < num_slots)
        acc, m_i, l_i = _softmax_pv(b_s, m_s, qk_scale, m_i, l_i, acc, p_smem, k_smem, o_layout)
    if EXCHANGE_BUF:
        gl.barrier(cluster=True)  # no CTA leaves while its peer may still read its half of the last tile

    _v32_epilogue(acc, m_i, l_i, 0, out, lse, o_part, lse_part, i_r, i_b, i_s, i_sp, S, H, num_splits, BLOCK_H,
                  s_layout, o_layout, SINGLE)


PRODUCER_WARPS: gl.constexpr = gl.constexpr(4)
WS_MAXNREG = 168  # 12 warps x 32 threads x 168 = 64,512 of the SM's 65,536 registers


@gluon.jit
def _v32_ws_produce(k_bufs, kr_bufs, full, empty, kv, idx, S, TOPK, page_size, stride_kb, stride_kt, num_slots,
                    num_splits, stride_ib, stride_is, BLOCK_N: gl.constexpr, INT_DEQUANT: gl.constexpr):  # fmt: skip
    """The producer warpgroup: tile i of this split (NoPE x scale and RoPE) into buffer i % 2 once the consumers
    released it, then ``full[i % 2]``."""
    ck: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [PRODUCER_WARPS, 1], [1, 0])  # [N, 128] NoPE chunks
    cr: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [PRODUCER_WARPS, 1], [1, 0])  # [N, 64] RoPE
    i_r = gl.program_id(0)
    i_sp = gl.program_id(2)
    i_b = i_r // S
    i_s = i_r % S
    tiles = gl.cdiv(TOPK, BLOCK_N)
    per = gl.cdiv(tiles, num_splits)
    t_lo = i_sp * per
    t_hi = gl.minimum(t_lo + per, tiles)
    o_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ck))
    o_d = gl.arange(0, 128, layout=gl.SliceLayout(0, ck))
    o_nr = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, cr))
    o_r = gl.arange(0, 64, layout=gl.SliceLayout(0, cr))
    p_idx = idx + i_b.to(gl.int64) * stride_ib + i_s.to(gl.int64) * stride_is
    for i_t in range(t_lo, t_hi):
        j = i_t - t_lo
        buf = j % 2
        phase = (j // 2) & 1
        t0 = i_t * BLOCK_N
        b_idx = gl.load(p_idx + t0 + o_n, mask=t0 + o_n < TOPK, other=-1)  # [N] slot ids (chunk rows)
        b_idr = gl.load(p_idx + t0 + o_nr, mask=t0 + o_nr < TOPK, other=-1)  # the same (RoPE rows)
        mbarrier.wait(empty.index(buf), phase ^ 1)  # fresh barriers count as released
        _v32_gather_store_tile(kv, b_idx, b_idr, num_slots, page_size, stride_kb, stride_kt, k_bufs.index(buf),
                               kr_bufs.index(buf), o_d, o_r, INT_DEQUANT)  # fmt: skip
        fence_async_shared()
        _barrier()  # every producer warp stored its part
        mbarrier.arrive(full.index(buf), count=1)


@gluon.jit
def _v32_ws_consume(q_smem, qr_smem, k_bufs, kr_bufs, p_smem, full, empty, idx, out, lse, o_part, lse_part,
                    S, H, TOPK, num_slots, num_splits, qk_scale, stride_ib, stride_is, BLOCK_H: gl.constexpr,
                    BLOCK_N: gl.constexpr, SINGLE: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
    """The two consumer warpgroups: the synchronous kernel's dots and softmax on buffer i % 2, then its output."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2], instr_shape=[16, 32, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, 256, 16])  # fmt: skip
    i_r = gl.program_id(0)
    i_hb = gl.program_id(1)
    i_sp = gl.program_id(2)
    i_b = i_r // S
    i_s = i_r % S
    tiles = gl.cdiv(TOPK, BLOCK_N)
    per = gl.cdiv(tiles, num_splits)
    t_lo = i_sp * per
    t_hi = gl.minimum(t_lo + per, tiles)
    acc = gl.zeros([BLOCK_H, 512], gl.float32, o_layout)
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, s_layout))
    o_ns = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    p_idx = idx + i_b.to(gl.int64) * stride_ib + i_s.to(gl.int64) * stride_is
    for i_t in range(t_lo, t_hi):
        j = i_t - t_lo
        buf = j % 2
        phase = (j // 2) & 1
        t0 = i_t * BLOCK_N
        b_ids = gl.load(p_idx + t0 + o_ns, mask=t0 + o_ns < TOPK, other=-1)  # the slot ids (S columns)
        k_tile = k_bufs.index(buf)
        mbarrier.wait(full.index(buf), phase)
        b_s = warpgroup_mma(q_smem, k_tile.permute((1, 0)), gl.zeros([BLOCK_H, BLOCK_N], gl.float32, s_layout),
                            use_acc=False, is_async=True)  # fmt: skip
        b_s = warpgroup_mma(qr_smem, kr_bufs.index(buf).permute((1, 0)), b_s, is_async=True)
        b_s = warpgroup_mma_wait(num_outstanding=0, deps=(b_s,))
        m_s = (b_ids >= 0) & (b_ids < num_slots)
        b_s = gl.where(m_s[None, :], b_s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(b_s, 1))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        b_p = gl.exp2(b_s - m_use[:, None])
        l_i = l_i * alpha + gl.sum(b_p, 1)
        m_i = m_new
        _barrier()  # both warpgroups' PV of the last tile are done before P is replaced
        p_smem.store(b_p.to(gl.bfloat16))
        fence_async_shared()
        _barrier()
        alpha_o = gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))
        acc = warpgroup_mma(p_smem, k_tile, acc * alpha_o[:, None], is_async=True)
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        _barrier()  # both warpgroups' dots on this buffer are done
        mbarrier.arrive(empty.index(buf), count=1)

    _v32_epilogue(acc, m_i, l_i, i_hb * BLOCK_H, out, lse, o_part, lse_part, i_r, i_b, i_s, i_sp, S, H, num_splits,
                  BLOCK_H, s_layout, o_layout, SINGLE)


@gluon.jit
def _gluon_v32_ws_kernel(
    q, kv, idx, out, lse, o_part, lse_part,
    S, H, TOPK, page_size, stride_kb, stride_kt, num_slots, num_splits, qk_scale,
    stride_qb, stride_qs, stride_qh, stride_ib, stride_is,
    BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, SINGLE: gl.constexpr, INT_DEQUANT: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    """``_gluon_v32_kernel`` warp-specialized: a producer warpgroup gathers tile i + 1 into the second of two tile
    buffers while the two consumer warpgroups multiply tile i (q + qr + 2 x (tile + RoPE) + P = 229,376 B)."""
    gl.static_assert(num_warps == 8, "two consumer warpgroups")
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, 512], gl.bfloat16)
    qr_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, 64], gl.bfloat16)
    k_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 512], gl.bfloat16)
    kr_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 64], gl.bfloat16)
    p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], gl.bfloat16)
    i_r = gl.program_id(0)
    i_hb = gl.program_id(1)
    i_b = i_r // S
    i_s = i_r % S
    o_hl = i_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ld))
    o_c = gl.arange(0, 512, layout=gl.SliceLayout(0, ld))
    p_q = q + i_b.to(gl.int64) * stride_qb + i_s.to(gl.int64) * stride_qs + o_hl.to(gl.int64)[:, None] * stride_qh
    b_q = gl.load(p_q + o_c[None, :], mask=(o_hl < H)[:, None], other=0.0)  # [BLOCK_H, 512] NoPE
    o_e = gl.arange(0, 64, layout=gl.SliceLayout(0, ld))
    b_qr = gl.load(p_q + 512 + o_e[None, :], mask=(o_hl < H)[:, None], other=0.0)  # [BLOCK_H, 64] RoPE
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, 512], q_sl, b_q)
    qr_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, 64], qr_sl, b_qr)
    k_bufs = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, 512], k_sl)
    kr_bufs = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, 64], kr_sl)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, BLOCK_N], p_sl)
    full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    fence_async_shared()
    gl.warp_specialize(
        [
            (_v32_ws_consume, (q_smem, qr_smem, k_bufs, kr_bufs, p_smem, full, empty, idx, out, lse, o_part, lse_part,
                               S, H, TOPK, num_slots, num_splits, qk_scale, stride_ib, stride_is, BLOCK_H, BLOCK_N,
                               SINGLE, num_warps)),
            (_v32_ws_produce, (k_bufs, kr_bufs, full, empty, kv, idx, S, TOPK, page_size, stride_kb, stride_kt,
                               num_slots, num_splits, stride_ib, stride_is, BLOCK_N, INT_DEQUANT)),
        ],
        [PRODUCER_WARPS],
        [PRODUCER_REGS],
    )  # fmt: skip


# Session 36's warp-specialized f16 prototype (ws2_<producer registers>_<maxnreg>[_pf][_diag1]: the producer idle
# for timing) stands at afbc653; it became the package's gluon_ws_v32_sm90 (variant pkg_gluon_ws).


def gluon_decode_v32(q, kv_cache, indices, sm_scale, *, kv_format="fp8_656", int_dequant=True,  # noqa: ANN001
                     num_splits="auto", ws_regs=None, cluster=None, diag=0):  # noqa: ANN001
    """(out [B, S, H, 512] bf16, lse [B, H, S] fp32) of fp8_656 decode over full index rows (-1 / out-of-range
    entries masked), the package's split rule and combine kernel."""
    from sparsemla.kernels import device as dev
    from sparsemla.kernels.sparse_decode.triton import choose_num_splits, combine_blocks
    from sparsemla.kernels.sparse_decode.triton_v32 import _sparse_decode_v32_combine_kernel

    assert kv_format == "fp8_656" and kv_cache.dtype == torch.uint8 and kv_cache.stride(3) == 1
    assert kv_cache.stride(0) % 16 == 0 and kv_cache.stride(1) % 16 == 0 and kv_cache.data_ptr() % 16 == 0
    assert q.dtype == torch.bfloat16 and q.shape[3] == 576 and q.stride(3) == 1
    assert indices.dtype == torch.int32 and indices.stride(2) == 1
    batch, s_q, heads, _ = q.shape
    rows, topk = batch * s_q, indices.shape[2]
    head_blocks = triton.cdiv(heads, 64)
    info = dev.launch_info(q.device)
    splits = choose_num_splits(rows, head_blocks, triton.cdiv(topk, 64), info.num_sms, num_splits)
    out = torch.empty(batch, s_q, heads, 512, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(batch, heads, s_q, dtype=torch.float32, device=q.device)
    if splits > 1:
        o_part = torch.empty(rows, splits, heads, 512, dtype=torch.bfloat16, device=q.device)
        lse_part = torch.empty(rows, splits, heads, dtype=torch.float32, device=q.device)
    else:
        o_part, lse_part = out, lse
    args = (q, kv_cache, indices, out, lse, o_part, lse_part,
            s_q, heads, topk, kv_cache.shape[1], kv_cache.stride(0), kv_cache.stride(1),
            kv_cache.shape[0] * kv_cache.shape[1], splits, float(sm_scale) * 1.4426950408889634,
            q.stride(0), q.stride(1), q.stride(2), indices.stride(0), indices.stride(1))  # fmt: skip
    if cluster:  # H = 128 as one 2-CTA cluster a (row, split): head_blocks counts CTAs for the split rule
        assert heads == 128, "the cluster form is the 128-head tile"
        _gluon_v32_cluster_kernel[(rows, 1, splits)](
            *args, BLOCK_N=64, SINGLE=splits == 1, INT_DEQUANT=int_dequant, EXCHANGE_BUF=cluster in ("buf", "prefetch"),
            PREFETCH=cluster == "prefetch", num_warps=8, num_ctas=2, DIAG=diag,
        )  # fmt: skip
    elif ws_regs:  # warp-specialized: ws_regs registers a producer thread
        _gluon_v32_ws_kernel[(rows, head_blocks, splits)](
            *args, BLOCK_H=64, BLOCK_N=64, SINGLE=splits == 1, INT_DEQUANT=int_dequant, PRODUCER_REGS=ws_regs,
            num_warps=8, maxnreg=WS_MAXNREG,
        )  # fmt: skip
    else:
        _gluon_v32_kernel[(rows, head_blocks, splits)](
            *args, BLOCK_H=64, BLOCK_N=64, SINGLE=splits == 1, INT_DEQUANT=int_dequant, num_warps=8,
        )  # fmt: skip
    if splits > 1:
        block_s, block_hc, block_d = combine_blocks(splits, heads)
        _sparse_decode_v32_combine_kernel[(rows, triton.cdiv(heads, block_hc), triton.cdiv(512, block_d))](
            o_part, lse_part, out, lse, s_q, heads, splits,
            DV=512, BLOCK_S=block_s, BLOCK_H=block_hc, BLOCK_D=block_d, num_warps=4,
        )  # fmt: skip
    return out, lse


# (gluon_ws104 / 120 / 136, the warp-specialized tile, lost at every shape at f271023 and are no longer timed)
VARIANTS = ("base", "gluon_int", "gluon", "gluon_clc", "gluon_cl", "gluon_cl_int", "gluon_clp", "gluon_clp_int",
            "pkg_gluon", "pkg_gluon_cvt", "pkg_gluon_pf", "pkg_gluon_pf_cvt", "pkg_gluon_pf_cvt_div",
            "pkg_gluon_pf_f16", "pkg_gluon_ws", "pkg_gluon_ws_r120", "pkg_gluon_ws_r128",
            "pkg_gluon_ws_r136", "pkg_gluon_ws_r144", "pkg_gluon_ws_r168")
DIAG_VARIANTS = ("diag_nobar", "diag_noexch")  # built, timed only when asked (--variants): their outputs are wrong
SHAPES = "8x128,32x128,64x128,128x128"


def _inputs(batch: int, heads: int, device: str, fill: bool = True, seed: int = 0) -> dict:
    from benchmarks.decode_v32 import Shape, make_inputs

    kw = make_inputs(Shape(batch, 1, heads, 2048, "fp8_656", 8192), seed=seed, device=device, fill=fill)
    return {k: kw[k] for k in ("q", "kv_cache", "indices", "sm_scale", "kv_format")}


_FLASHMLA: dict[tuple, tuple] = {}  # (id(q), id(indices)) -> FlashMLA's call on them (schedule once, untimed)


def _flashmla(kw: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of FlashMLA's sparse fp8 decode on ``kw``, called as sglang's flashmla_kv backend calls it
    (benchmarks/decode_v32.py's ``flashmla``; ``bench`` primes the call of every input set before timing)."""
    key = (id(kw["q"]), id(kw["indices"]))
    if key not in _FLASHMLA:
        from benchmarks.decode import load_flash_mla
        from benchmarks.decode_v32 import flashmla_decode_call

        flash_mla, why = load_flash_mla(kw["q"].device)
        if flash_mla is None:
            raise RuntimeError(why)
        _FLASHMLA[key] = flashmla_decode_call(flash_mla, {**kw, "ctx": 8192})
    run, unpack = _FLASHMLA[key]
    return unpack(run())


def _launch(variant: str, kw: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse) of one call: ``base`` = the package's launcher (its choices), ``gluon[_int]`` = this kernel,
    ``gluon_wsNN`` = it warp-specialized with NN registers a producer thread, ``gluon_cl[_int]`` = its 2-CTA cluster
    form (H = 128; ``gluon_clc``: the halves exchanged by a layout conversion; ``gluon_clp``: the next tile's rows
    loaded a tile ahead)."""
    if variant == "flashmla":  # FlashMLA in the same run (GPU only; not built)
        return _flashmla(kw)
    if variant.startswith("pkg_gluon"):  # the package's Gluon tile (V32Config.gluon[_prefetch]), its launcher
        from sparsemla.kernels.sparse_decode import gluon_v32_sm90
        from sparsemla.kernels.sparse_decode.triton_v32 import V32Config, sparse_decode_v32_fwd

        cfg = V32Config(64, 64, 8, 1, True, int_dequant="_cvt" not in variant, gluon=True,
                        gluon_prefetch="_pf" in variant, f16="_f16" in variant or "_ws" in variant,
                        gluon_ws="_ws" in variant)  # fmt: skip
        # (session 35's A/B variants _ids3 / _eager / _rowsfirst / _diag1-6 patched module switches that stand at
        # 0c7fe3a, _pair / _pairpf at 8752ecb, _rowpairs at f36067e; session 36's _late at 46c55df;
        # results/bench/explore/README.md)
        from sparsemla.kernels.sparse_decode import gluon_ws_v32_sm90 as ws

        # (session 37's _pipe: the producer software-pipelined by chunk, slower; it stands at b13d0f4)
        shift, regs = gluon_v32_sm90.page_shift, (ws.PRODUCER_REGS, ws.MAXNREG)
        # pkg_gluon_ws_r<producer registers>_m<maxnreg> (session 37: 136 won and is the default since d85a1be;
        # _r136 is pkg_gluon_ws now, _r152 the one before)
        for opt in variant.split("_"):
            if opt[:1] in "rm" and opt[1:].isdigit():
                setattr(ws, "PRODUCER_REGS" if opt[0] == "r" else "MAXNREG", int(opt[1:]))
        if variant.endswith("_div"):  # slot ids split by division, as before the page shift (session 34's A/B)
            gluon_v32_sm90.page_shift = lambda page_size: -1
        try:
            return sparse_decode_v32_fwd(kw["q"], kw["kv_cache"], kw["indices"], kw["sm_scale"],
                                         kv_format=kw["kv_format"], d_v=512, config=cfg)  # fmt: skip
        finally:
            gluon_v32_sm90.page_shift = shift
            ws.PRODUCER_REGS, ws.MAXNREG = regs
    if variant in ("diag_nobar", "diag_noexch"):  # timing only (wrong outputs): gluon_cl without its barrier / exchange
        return gluon_decode_v32(**kw, int_dequant=False, cluster="buf", diag=1 if variant == "diag_nobar" else 2)
    if variant.startswith("gluon_cl"):  # the 2-CTA cluster form (H = 128): clc = the layout conversion's exchange
        return gluon_decode_v32(**kw, int_dequant=variant.endswith("_int"),
                                cluster={"gluon_clc": "convert", "gluon_clp": "prefetch"}.get(variant[:9], "buf"))
    if variant.startswith("gluon_ws"):  # warp-specialized, the e4m3 conversions (the faster dequant here)
        return gluon_decode_v32(**kw, int_dequant=False, ws_regs=int(variant[len("gluon_ws"):]))
    if variant.startswith("gluon"):
        return gluon_decode_v32(**kw, int_dequant=variant.endswith("_int"))
    from sparsemla.kernels.sparse_decode.triton_v32 import sparse_decode_v32_fwd

    return sparse_decode_v32_fwd(kw["q"], kw["kv_cache"], kw["indices"], kw["sm_scale"], kv_format=kw["kv_format"],
                                 d_v=512)  # fmt: skip


@app.command()
def aot(batch: int = 64, heads: int = 128) -> None:
    """Here (no GPU): compile for sm_90 with this Triton; shared memory, registers, spills, loop op counts."""
    from anatomy_lib import loop_body

    from sparsemla.kernels import aot as A
    from sparsemla.kernels import device as dev

    info = dev.target("sm_90")
    got, sink = {}, []
    with A.compile_only("sm_90", info, "gluon_v32", sink), A.watch_launches(lambda n, k: got.setdefault(n, k),
                                                                            compile_only=True):  # fmt: skip
        kw = _inputs(batch, heads, "cpu", fill=False)
        for variant in VARIANTS:
            got.clear()
            sink.clear()
            _launch(variant, kw)
            name = next(n for n in got if "combine" not in n)
            res = next(r for r in sink if r.kernel == name)
            body = loop_body(A._cubin_tool(got[name].asm["cubin"], "-sass"))
            ops = Counter(re.sub(r"^@!?U?P\w+\s+", "", op).split()[0] for op in body)
            print(f"{variant}: shared {res.shared} registers {res.registers} spilled {res.spilled} loop {len(body)}")
            print("  " + " ".join(f"{o}:{n}" for o, n in ops.most_common(40)))


@app.command()
def build(out: Path = Path(".gpu-cubins/gluon_v32"), shapes: str = SHAPES,
          variants: str = ",".join(VARIANTS + DIAG_VARIANTS)) -> None:  # fmt: skip
    """Here (no GPU): the launcher's and this kernel's launches at SHAPES (batch x heads) compiled by this Triton
    into OUT (benchmarks/prod_cubins.py, native path), for `bench` on the GPU machine. The cluster forms only at
    H = 128 (their tile is the 128-head pair)."""
    from benchmarks import prod_cubins

    def workload() -> None:
        for batch, heads in (map(int, s.split("x")) for s in shapes.split(",")):
            kw = _inputs(batch, heads, "cpu", fill=False)
            for variant in variants.split(","):
                if variant != "flashmla" and (heads == 128 or not variant.startswith(("gluon_cl", "diag_"))):
                    _launch(variant, kw)

    added = prod_cubins.build(workload, out, "native")
    print(f"Triton {triton.__version__}: {len(added)} cubins added to {out}")


@app.command()
def bench(cubins: Path = Path(".gpu-cubins/gluon_v32"), shapes: str = SHAPES, out: Path = Path("gluon_v32.json"),
          git_sha: str = "unknown", variants: str = ",".join(VARIANTS)) -> None:  # fmt: skip
    """GPU: the launcher and this kernel from CUBINS (Triton 3.8) replayed, CUDA-graph median (2 input sets
    rotated); out's relative error and lse's largest difference against the fp32 reference; JSON to OUT."""
    import json

    from triton.testing import do_bench

    from benchmarks import prod_cubins
    from benchmarks.decode import graphed
    from sparsemla.kernels.sparse_decode.reference import sparse_decode_v32_reference

    rows_out: list[dict] = []
    with prod_cubins.Replayer(cubins) as counts:
        for batch, heads in (map(int, s.split("x")) for s in shapes.split(",")):
            sets = [_inputs(batch, heads, "cuda", seed=100 * batch + i) for i in range(2)]
            if "flashmla" in variants.split(","):  # its schedule metadata outside the graphs
                for kw in sets:
                    try:
                        _flashmla(kw)
                    except Exception as exc:  # noqa: BLE001 - reported per row below
                        print(f"flashmla: {exc}", flush=True)
            kw0 = sets[0]
            want_o, want_l = sparse_decode_v32_reference(kw0["q"], kw0["kv_cache"], kw0["indices"], kw0["sm_scale"],
                                                         kv_format=kw0["kv_format"], d_v=512)  # fmt: skip
            sync = None  # the first of `gluon` / `pkg_gluon_ws`'s out (the warp-specialized ones must equal it)
            for variant in variants.split(","):
                row = dict(B=batch, H=heads, topk=2048, kv_format="fp8_656", variant=variant)
                try:
                    got_o, got_l = _launch(variant, kw0)
                    fin = torch.isfinite(want_l)
                    row.update(err=float((got_o.float() - want_o.float()).norm() / want_o.float().norm()),
                               lse_max_abs=float((got_l - want_l)[fin].abs().max()))  # fmt: skip
                    sync = got_o if variant in ("gluon", "pkg_gluon_ws") and sync is None else sync
                    if variant.startswith(("gluon_ws", "pkg_gluon")) and sync is not None:
                        row["equal_to_gluon"] = bool(torch.equal(got_o, sync))  # the same bits as the Gluon tile
                    runs = [graphed(lambda kw=kw, v=variant: _launch(v, kw)) for kw in sets]
                    st = {"i": 0}

                    def step(runs=runs, st=st) -> None:
                        st["i"] += 1
                        runs[st["i"] % 2]()

                    row["us"] = round(do_bench(step, warmup=10, rep=50, return_mode="median") * 1e3, 2)
                except Exception as exc:  # noqa: BLE001 - a failing variant is a finding
                    row["error"] = (str(exc).splitlines() or [repr(exc)])[-1][:300]
                rows_out.append(row)
                print(json.dumps(row), flush=True)
            # masked: ~10 % -1 entries, ~5 % past the cache, request 0's rows all -1 (out 0, lse +inf)
            kw = dict(kw0)
            ids = kw["indices"].clone()
            noise = torch.rand(ids.shape, device=ids.device, generator=torch.Generator(ids.device).manual_seed(7))
            ids[noise < 0.10] = -1
            ids[(noise >= 0.10) & (noise < 0.15)] = kw["kv_cache"].shape[0] * kw["kv_cache"].shape[1] + 5
            ids[0] = -1
            kw["indices"] = ids
            want_o, want_l = sparse_decode_v32_reference(kw["q"], kw["kv_cache"], ids, kw["sm_scale"],
                                                         kv_format=kw["kv_format"], d_v=512)  # fmt: skip
            for variant in variants.split(","):
                if variant == "flashmla":  # (the masked ids include ids past the cache, which sglang never passes it)
                    continue
                row = dict(B=batch, H=heads, topk=2048, kv_format="fp8_656", variant=variant, case="masked")
                try:
                    got_o, got_l = _launch(variant, kw)
                    fin = torch.isfinite(want_l)
                    row.update(err=float((got_o.float() - want_o.float()).norm() / want_o.float().norm()),
                               lse_max_abs=float((got_l - want_l)[fin].abs().max()),
                               lse_inf_match=bool(torch.equal(torch.isinf(got_l), torch.isinf(want_l))),
                               empty_rows_zero=bool((got_o[0] == 0).all()))  # fmt: skip
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
