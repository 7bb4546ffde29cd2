"""The V3.2 sparse decode's 64 x 64 wgmma tile for sm_90 (Hopper) and the fp8_656 cache, written in Gluon.

Why: plain Triton gives the chained score dot all warps along M, so with 64 heads (one warpgroup's M) and 8 warps
both warpgroups compute the whole 64 x 64 score tile (the V4 tile's reason too:
:mod:`~sparsemla.kernels.sparse_decode.gluon_sm90`). Here the layouts are explicit:

* the tile's 64 rows are gathered and dequantized into ONE NVMMA-swizzled shared buffer [64, 512] that both dots
  read: four 128-wide chunks of e4m3 NoPE bytes, each times its fp32 scale, and the 64 bf16 RoPE values into a second
  buffer [64, 64]. F16 (``V32Config.f16``, chosen): the tile, q's NoPE and P in f16 -- e4m3 -> f16 is exact
  and one conversion a pair, the scale is rounded to f16 and the product once in f16 (one packed multiply a pair);
  each head's q NoPE is scaled by the power of two that puts its largest value in [2^14, 2^15) (exact; its RoPE by
  the same, its softmax scale by the inverse). Else bf16: the product in fp32, rounded once to bf16 (the numbers of
  the Triton tile and of sglang's ``dequantize_k_cache``). f16 keeps 3 more mantissa bits (H100, B = 64, H = 128:
  relative error 2.3e-3 against 6.0e-3, FlashMLA's 11.6e-3) and needs K values below 65,504 in magnitude;
  ahead of time (Triton 3.8, sm_90, B = 64, H = 128) 753 loop instructions a thread against bf16's 1,001;
* S [64 heads, 64 tokens] = q_nope K^T + q_rope K_rope^T by ``warpgroup_mma`` with ``warps_per_cta = [4, 2]``: each
  warpgroup 32 tokens;
* online softmax in base 2, each warpgroup's running sums kept for its own 32 tokens (added once, at the end); P
  (the tile's type) through shared memory; O [64, 512] += P K_nope by ``warpgroup_mma`` with ``warps_per_cta =
  [4, 2]``: each warpgroup 256 output columns.

PREFETCH: the next tile's raw rows (512 e4m3 bytes, 4 fp32 scales and 64 bf16 RoPE values a row: 41 KB a tile) are
copied with cp.async into staging buffers right after this tile's rows were dequantized out of them, so their latency
hides behind this tile's MMAs; the dequant then reads shared memory (the explore prototype's timing-only diagnostics
found the synchronous tile bound by each tile's serial latency; results/bench/explore/README.md, session 33). The
three copies give a thread the same rows, so a row's offset is computed once a tile.

Same contract as :func:`sparsemla.kernels.sparse_decode.triton_v32.sparse_decode_v32_fwd`'s main kernel: one program
per (row, 64-head block, split), ``topk_length``, -1 / out-of-range ids, ``d_v`` <= 512, rows with no valid entry
out 0 and lse +inf, split partials merged by the package's combine kernel. sm_90 only; chosen by ``V32Config.gluon``
(:func:`~sparsemla.kernels.sparse_decode.triton_v32.choose_v32_config` takes it with PREFETCH, the e4m3
conversions and F16 from 16 to 63 64-head programs; from 64 on its warp-specialized form,
:mod:`~sparsemla.kernels.sparse_decode.gluon_ws_v32_sm90`). Triton 3.6 and 3.8 both compile it (3.6, the GPU
machine's JIT, puts a few more CTA barriers between the dequantized chunks' stores: time it from 3.8 cubins).

Shared memory: q [64, 512 + 64] + the tile [64, 512 + 64] + P [64, 64], 2 bytes each = 155,648 B plus the reductions'
scratch (ahead of time, Triton 3.8: 156,160 B); PREFETCH adds 41,984 B of staging (198,144 B). One program per SM.
"""

from __future__ import annotations

import types

import torch
import triton

from sparsemla.kernels import device as dev
from sparsemla.kernels.paging import page_shift
from sparsemla.kernels.sparse_decode import gluon_sm90

try:  # Gluon's Hopper API (Triton >= 3.6); without it the package's Triton tile runs
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.ampere import async_copy as _async_copy
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

    # cp.async from per-thread pointers, under one name for both Tritons (3.8: async_load, 3.6, the GPU machine's:
    # async_copy_global_to_shared). A module, because kernels reach builtins through module attributes only.
    cp_async = types.ModuleType("cp_async")
    cp_async.load = getattr(_async_copy, "async_load", None) or _async_copy.async_copy_global_to_shared
    cp_async.commit_group = _async_copy.commit_group
    cp_async.wait_group = _async_copy.wait_group
    _HAVE_GLUON = True
except (ImportError, AttributeError):  # pragma: no cover - older Triton (or neither cp.async name)
    _HAVE_GLUON = False

BLOCK_H = 64  # heads per program: one warpgroup's M
BLOCK_N = 64  # tokens per tile: each warpgroup scores 32 of them
NUM_WARPS = 8  # two warpgroups
# q + the tile (NoPE and RoPE) + P, bf16, plus the reductions' scratch (ahead of time, Triton 3.8: 156,160 B)
SHARED_BYTES = (BLOCK_H + BLOCK_N) * 576 * 2 + BLOCK_H * BLOCK_N * 2 + 512
# + the staging of PREFETCH: NoPE bytes [64, 512] uint8, scales [64, 4] fp32, RoPE [64, 64] bf16 (198,144 B)
PREFETCH_SHARED_BYTES = SHARED_BYTES + BLOCK_N * (512 + 4 * 4 + 64 * 2)


def available() -> bool:
    """Whether this Triton can build the tile: Gluon's Hopper API in 3.6 (the GPU machine's GPU tests) or newer (3.8,
    production's: the ahead-of-time compile test)."""
    return _HAVE_GLUON and gluon_sm90.available()


if _HAVE_GLUON:
    from sparsemla.kernels.sparse_decode.gluon_sm90 import LN2, _barrier, _e4m3_bits_to_bf16, _page_split, _softmax_pv

    SCALE_OFF_F32: gl.constexpr = gl.constexpr(512 // 4)  # the 4 fp32 scales start at byte 512 of a 656-byte row
    ROPE_OFF: gl.constexpr = gl.constexpr(528)  # the 64 bf16 RoPE values start at byte 528
    TWO_POW_120_F: gl.constexpr = gl.constexpr(2.0**120)

    @gluon.jit
    def _rows(b_idx, num_slots, page_size, stride_kb, stride_kt, PAGE_SHIFT: gl.constexpr):
        """(valid [N], byte offsets [N] int64) of slot ids ``b_idx``; invalid (< 0 or >= num_slots): slot 0's row.
        PAGE_SHIFT: :func:`~sparsemla.kernels.paging.page_shift` of ``page_size`` (the V4 tile's split, one cache)."""
        m_n = (b_idx >= 0) & (b_idx < num_slots)
        b_page, b_off = _page_split(gl.where(m_n, b_idx, 0), True, page_size, page_size, PAGE_SHIFT, PAGE_SHIFT)
        return m_n, b_page.to(gl.int64) * stride_kb + b_off.to(gl.int64) * stride_kt

    @gluon.jit
    def _dequant_chunk(b_u, b_sc, INT_DEQUANT: gl.constexpr, F16: gl.constexpr):
        """[N, 128] e4m3 bytes (uint8) times their [N] fp32 scales -> bf16, rounded once: the integer bit path
        (INT_DEQUANT, exact) or the e4m3 conversion instructions. F16: -> f16, the value converted exactly by the
        conversion instructions (one a pair; INT_DEQUANT does not apply) times the scale rounded to f16, the product
        rounded once in f16 (one packed multiply a pair)."""
        if F16:
            b_k = b_u.to(gl.float8e4nv, bitcast=True).to(gl.float16) * b_sc.to(gl.float16)[:, None]
        else:
            if INT_DEQUANT:
                two_120 = gl.full([1, 1], TWO_POW_120_F, gl.bfloat16, b_u.type.layout)
                b_k = (_e4m3_bits_to_bf16(b_u) * two_120).to(gl.float32)
            else:
                b_k = b_u.to(gl.float8e4nv, bitcast=True).to(gl.float32)
            b_k = (b_k * b_sc[:, None]).to(gl.bfloat16)
        return b_k

    @gluon.jit
    def _gather_store_tile(kv, b_idx, b_idr, num_slots, page_size, stride_kb, stride_kt, k_smem, kr_smem, o_d, o_r,
                           INT_DEQUANT: gl.constexpr, PAGE_SHIFT: gl.constexpr, F16: gl.constexpr):  # fmt: skip
        """Rows of slot ids ``b_idx`` / ``b_idr`` [N] (the same ids in the NoPE chunks' and the RoPE's layouts;
        invalid -> zeros) of the uint8 cache ``kv`` into ``k_smem`` [N, 512] (bf16, F16: f16; 128 columns at a time)
        and ``kr_smem`` [N, 64] bf16. ``o_d`` [128] / ``o_r`` [64]: the columns."""
        m_n, o_tok = _rows(b_idx, num_slots, page_size, stride_kb, stride_kt, PAGE_SHIFT)
        p_sc = kv.to(gl.pointer_type(gl.float32), bitcast=True)
        for c in gl.static_range(4):
            b_u = gl.load(kv + (o_tok + c * 128)[:, None] + o_d[None, :], mask=m_n[:, None], other=0)  # [N, 128]
            b_sc = gl.load(p_sc + (o_tok >> 2) + SCALE_OFF_F32 + c, mask=m_n, other=0.0)  # [N] fp32
            k_smem.slice(c * 128, 128, dim=1).store(_dequant_chunk(b_u, b_sc, INT_DEQUANT, F16))
        m_r, o_tr = _rows(b_idr, num_slots, page_size, stride_kb, stride_kt, PAGE_SHIFT)
        p_rope = (kv + ROPE_OFF).to(gl.pointer_type(gl.bfloat16), bitcast=True)
        kr_smem.store(gl.load(p_rope + (o_tr >> 1)[:, None] + o_r[None, :], mask=m_r[:, None], other=0.0))

    @gluon.jit
    def _issue_rows(kv, num_slots, page_size, stride_kb, stride_kt, raw_smem, sc_smem, rope_smem, b_ids, o_pd, o_sn,
                    o_sc, o_rn, o_rd, PAGE_SHIFT: gl.constexpr):  # fmt: skip
        """cp.async of a tile's raw rows (slot ids ``b_ids`` [N]; invalid ids copy zeros, cp.async's source size 0)
        into the staging buffers, one group: ``raw_smem`` [N, 512] uint8 (e4m3 NoPE; ``o_pd`` its columns),
        ``sc_smem`` [N, 4] fp32 (``o_sc``), ``rope_smem`` [N, 64] bf16 (``o_rd``). The three copy layouts give a
        thread the same rows (``o_sn`` / ``o_rn``: aranges in the scales' / RoPE's row layouts, equivalent to
        ``b_ids``' layout), so each row's offset is computed once and only relabelled."""
        m_p, o_tp = _rows(b_ids, num_slots, page_size, stride_kb, stride_kt, PAGE_SHIFT)
        cp_async.load(raw_smem, kv + o_tp[:, None] + o_pd[None, :], mask=m_p[:, None])
        m_s = gl.convert_layout(m_p, o_sn.type.layout)
        o_ts = gl.convert_layout(o_tp, o_sn.type.layout)
        p_sc = kv.to(gl.pointer_type(gl.float32), bitcast=True)
        cp_async.load(sc_smem, p_sc + ((o_ts >> 2) + SCALE_OFF_F32)[:, None] + o_sc[None, :], mask=m_s[:, None])
        m_r = gl.convert_layout(m_p, o_rn.type.layout)
        o_tr = gl.convert_layout(o_tp, o_rn.type.layout)
        p_rope = (kv + ROPE_OFF).to(gl.pointer_type(gl.bfloat16), bitcast=True)
        cp_async.load(rope_smem, p_rope + (o_tr >> 1)[:, None] + o_rd[None, :], mask=m_r[:, None])
        cp_async.commit_group()

    @gluon.jit
    def _load_q(q, i_b, i_s, i_hb, H, stride_qb, stride_qs, stride_qh, stride_qd, ld: gl.constexpr):
        """q's [64, 512] NoPE and [64, 64] RoPE (bf16, ``ld``'s layout) of the program's 64 heads; heads past H 0."""
        o_hl = i_hb * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, ld))
        o_c = gl.arange(0, 512, layout=gl.SliceLayout(0, ld))
        o_e = gl.arange(0, 64, layout=gl.SliceLayout(0, ld))
        p_q = q + i_b.to(gl.int64) * stride_qb + i_s.to(gl.int64) * stride_qs + o_hl.to(gl.int64)[:, None] * stride_qh
        b_q = gl.load(p_q + o_c[None, :] * stride_qd, mask=(o_hl < H)[:, None], other=0.0)  # [64, 512] NoPE
        b_qr = gl.load(p_q + (512 + o_e)[None, :] * stride_qd, mask=(o_hl < H)[:, None], other=0.0)  # [64, 64] RoPE
        return b_q, b_qr

    @gluon.jit
    def _q_f16(b_q, b_qr, qk_scale, s_layout: gl.constexpr):
        """The f16 tile's q: each head's NoPE times 2^e into f16 (its largest |value| into [2^14, 2^15); e from that
        value's fp32 exponent, clamped: all-zero heads), exact where f16 is normal; its RoPE (bf16, the RoPE MMA's
        operand) times the same 2^e, exact. So the head's scores come out times 2^e and its softmax scale is
        ``qk_scale`` times 2^-e: returns (NoPE f16, RoPE bf16, the scales [64, 1] in ``s_layout``'s rows)."""
        q_amax = gl.max(gl.abs(b_q.to(gl.float32)), 1)  # [64]
        e_q = gl.minimum(gl.maximum(141 - ((q_amax.to(gl.int32, bitcast=True) >> 23) & 0xFF), -126), 126)
        two_e = ((e_q + 127) << 23).to(gl.float32, bitcast=True)[:, None]
        qk_row = qk_scale * ((127 - e_q) << 23).to(gl.float32, bitcast=True)
        qk_h = gl.convert_layout(qk_row, gl.SliceLayout(1, s_layout))[:, None]
        return (b_q.to(gl.float32) * two_e).to(gl.float16), (b_qr.to(gl.float32) * two_e).to(gl.bfloat16), qk_h

    @gluon.jit
    def _split_tiles(length, i_b, i_sp, num_splits, TOPK, HAS_LEN: gl.constexpr):
        """(n_valid, t_lo, t_hi), int32: the row's leftmost ``topk_length`` entries count (int32 or int64 lengths;
        the warp-specialized tile's tile counter indexes its buffers, which takes int32); this split's 64-token
        tiles."""
        n_valid = TOPK
        if HAS_LEN:
            n_valid = gl.minimum(gl.maximum(gl.load(length + i_b), 0), TOPK).to(gl.int32)
        tiles = gl.cdiv(n_valid, 64)
        per = gl.cdiv(tiles, num_splits)
        t_lo = i_sp * per
        return n_valid, t_lo, gl.minimum(t_lo + per, tiles)

    @gluon.jit
    def _scores(q_smem, qr_smem, k_tile, kr_tile, s_layout: gl.constexpr):
        """S [64 heads, 64 tokens] = q_nope K^T + q_rope K_rope^T (``s_layout``: each warpgroup 32 tokens)."""
        b_s = warpgroup_mma(q_smem, k_tile.permute((1, 0)), gl.zeros([64, 64], gl.float32, s_layout), use_acc=False,
                            is_async=True)  # fmt: skip
        b_s = warpgroup_mma(qr_smem, kr_tile.permute((1, 0)), b_s, is_async=True)
        return warpgroup_mma_wait(num_outstanding=0, deps=(b_s,))

    @gluon.jit
    def _sparse_decode_v32_sm90_kernel(
        q, kv, idx, length, out, lse, o_part, lse_part,
        S, H, TOPK, page_size, stride_kb, stride_kt, num_slots, num_splits, qk_scale,
        stride_qb, stride_qs, stride_qh, stride_qd, stride_ib, stride_is,
        DV: gl.constexpr, HAS_LEN: gl.constexpr, SINGLE: gl.constexpr, INT_DEQUANT: gl.constexpr,
        PREFETCH: gl.constexpr, PAGE_SHIFT: gl.constexpr, F16: gl.constexpr, num_warps: gl.constexpr,
    ):  # fmt: skip
        """Grid (B * S, cdiv(H, 64), num_splits). SINGLE: out [B, S, H, DV] bf16 and lse [B, H, S] (natural log,
        +inf when empty); else the split's normalised partial o_part [rows, splits, H, DV] and base-2 lse_part (-inf
        when empty) for the combine kernel."""
        gl.static_assert(num_warps == 8, "two warpgroups")
        BLOCK_H: gl.constexpr = 64
        BLOCK_N: gl.constexpr = 64
        ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])  # q rows, 16-byte runs
        ck: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [num_warps, 1], [1, 0])  # [N, 128] NoPE chunks
        cr: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])  # [N, 64] RoPE
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, 32, 16])  # fmt: skip
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, 256, 16])  # fmt: skip
        KT: gl.constexpr = gl.float16 if F16 else gl.bfloat16  # q NoPE, the dequantized tile and P
        q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, 512], KT)
        qr_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, 64], gl.bfloat16)
        k_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 512], KT)
        kr_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 64], gl.bfloat16)
        p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], KT)

        i_r = gl.program_id(0)
        i_hb = gl.program_id(1)
        i_sp = gl.program_id(2)
        i_b = i_r // S
        i_s = i_r % S
        b_q, b_qr = _load_q(q, i_b, i_s, i_hb, H, stride_qb, stride_qs, stride_qh, stride_qd, ld)
        if F16:  # (the per-head scale replaces the scalar where it was applied)
            b_q, b_qr, qk_scale = _q_f16(b_q, b_qr, qk_scale, s_layout)
        q_smem = gl.allocate_shared_memory(KT, [BLOCK_H, 512], q_sl, b_q)
        qr_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, 64], qr_sl, b_qr)
        k_smem = gl.allocate_shared_memory(KT, [BLOCK_N, 512], k_sl)
        kr_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, 64], kr_sl)
        p_smem = gl.allocate_shared_memory(KT, [BLOCK_H, BLOCK_N], p_sl)

        n_valid, t_lo, t_hi = _split_tiles(length, i_b, i_sp, num_splits, TOPK, HAS_LEN)
        acc = gl.zeros([BLOCK_H, 512], gl.float32, o_layout)
        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
        # [BLOCK_H, 2] running sums, one column a warpgroup (its 32 score columns; _softmax_pv's WG_SUMS)
        l_w = gl.sum(gl.reshape(gl.zeros([BLOCK_H, BLOCK_N], gl.float32, s_layout), [BLOCK_H, 2, BLOCK_N // 2]), 2)
        o_ns = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
        o_nr = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, cr))
        o_r = gl.arange(0, 64, layout=gl.SliceLayout(0, cr))
        p_idx = idx + i_b.to(gl.int64) * stride_ib + i_s.to(gl.int64) * stride_is
        if PREFETCH:
            # the same two adjacent rows a thread in all three copies (one row offset each); a warp copies 4 whole
            # 128-byte lines an instruction
            cp_raw: gl.constexpr = gl.BlockedLayout([2, 16], [4, 8], [num_warps, 1], [1, 0])  # 16 B a copy
            cp_sc: gl.constexpr = gl.BlockedLayout([2, 1], [4, 8], [num_warps, 1], [1, 0])  # 4 B (4 lanes masked)
            cp_ro: gl.constexpr = gl.BlockedLayout([2, 8], [4, 8], [num_warps, 1], [1, 0])  # 16 B a copy
            st_sl: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])  # staging: plain rows
            raw_smem = gl.allocate_shared_memory(gl.uint8, [BLOCK_N, 512], st_sl)
            sc_smem = gl.allocate_shared_memory(gl.float32, [BLOCK_N, 4], st_sl)
            rope_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, 64], st_sl)
            o_pn = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, cp_raw))
            o_pd = gl.arange(0, 512, layout=gl.SliceLayout(0, cp_raw))
            o_sn = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, cp_sc))
            o_sc = gl.arange(0, 4, layout=gl.SliceLayout(0, cp_sc))
            o_c4 = gl.arange(0, 4, layout=gl.SliceLayout(0, ck))
            o_rn = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, cp_ro))
            o_rd = gl.arange(0, 64, layout=gl.SliceLayout(0, cp_ro))
            t0 = t_lo * BLOCK_N
            if t_lo < t_hi:  # the first tile's copies (no copy is ever in flight when the program leaves)
                _issue_rows(kv, num_slots, page_size, stride_kb, stride_kt, raw_smem, sc_smem, rope_smem,
                            gl.load(p_idx + t0 + o_pn, mask=t0 + o_pn < n_valid, other=-1), o_pd, o_sn, o_sc, o_rn,
                            o_rd, PAGE_SHIFT)  # fmt: skip
        else:
            o_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ck))
            o_d = gl.arange(0, 128, layout=gl.SliceLayout(0, ck))
        for i_t in range(t_lo, t_hi):
            t0 = i_t * BLOCK_N
            b_ids = gl.load(p_idx + t0 + o_ns, mask=t0 + o_ns < n_valid, other=-1)  # [N] this tile's ids (S columns)
            if PREFETCH:
                t1 = t0 + BLOCK_N  # the next tile (none past this split's end)
                more = i_t + 1 < t_hi
                n_pn = gl.load(p_idx + t1 + o_pn, mask=(t1 + o_pn < n_valid) & more, other=-1)
                cp_async.wait_group(0)  # this thread's copies of this tile are in
                _barrier()  # ... every thread's; and both warpgroups' PV of the last tile is done (k_smem is free)
                b_sc = sc_smem.load(ck)  # [N, 4] fp32 scales of each thread's rows
                for c in gl.static_range(4):
                    # [N] chunk c's scales (-0.0 elsewhere: x + -0.0 is x exactly, signed zeros included)
                    b_scc = gl.sum(gl.where(o_c4[None, :] == c, b_sc, -0.0), 1)
                    b_u = raw_smem.slice(c * 128, 128, dim=1).load(ck)  # [N, 128] e4m3 bytes
                    k_smem.slice(c * 128, 128, dim=1).store(_dequant_chunk(b_u, b_scc, INT_DEQUANT, F16))
                kr_smem.store(rope_smem.load(cr))
                fence_async_shared()  # this thread's tile stores, visible to the MMAs (async proxy) ...
                _barrier()  # ... for every thread; and the staging is read before the next copies overwrite it
                if more:  # (a split's last tile copies nothing)
                    _issue_rows(kv, num_slots, page_size, stride_kb, stride_kt, raw_smem, sc_smem, rope_smem, n_pn,
                                o_pd, o_sn, o_sc, o_rn, o_rd, PAGE_SHIFT)  # fmt: skip
            else:
                b_idx = gl.load(p_idx + t0 + o_n, mask=t0 + o_n < n_valid, other=-1)  # [N] ids (chunk rows)
                b_idr = gl.load(p_idx + t0 + o_nr, mask=t0 + o_nr < n_valid, other=-1)  # the same (RoPE rows)
                _barrier()  # both warpgroups' PV of the last tile is done before the tile is replaced
                _gather_store_tile(kv, b_idx, b_idr, num_slots, page_size, stride_kb, stride_kt, k_smem, kr_smem,
                                   o_d, o_r, INT_DEQUANT, PAGE_SHIFT, F16)  # fmt: skip
                fence_async_shared()
                _barrier()
            b_s = _scores(q_smem, qr_smem, k_smem, kr_smem, s_layout)  # [BLOCK_H, BLOCK_N]
            b_ids = gl.where(b_ids < num_slots, b_ids, -1)  # past the cache: invalid too (the V4 step masks < 0)
            acc, m_i, l_w = _softmax_pv(b_s, b_ids, qk_scale, m_i, l_w, acc, p_smem, k_smem, False, True, F16)
        _epilogue(acc, m_i, l_w, out, lse, o_part, lse_part, i_r, i_b, i_s, i_hb, i_sp, S, H, num_splits, DV, SINGLE)

    @gluon.jit
    def _epilogue(acc, m_i, l_w, out, lse, o_part, lse_part, i_r, i_b, i_s, i_hb, i_sp, S, H, num_splits,
                  DV: gl.constexpr, SINGLE: gl.constexpr):  # fmt: skip
        """The program's result from the running state (acc [64, 512] fp32, m_i [64] base-2 maximum, l_w [64, 2]
        the warpgroups' sums): SINGLE out [B, S, H, DV] bf16 and lse [B, H, S] (natural log, +inf when empty), else
        the split's normalised partial o_part [rows, splits, H, DV] and base-2 lse_part (-inf when empty)."""
        BH: gl.constexpr = m_i.shape[0]
        l_i = gl.convert_layout(gl.sum(l_w, 1), m_i.type.layout)  # [BH] both warpgroups' columns
        o_hs = i_hb * BH + gl.arange(0, BH, layout=m_i.type.layout)
        m_hs = o_hs < H
        lse2 = gl.where(l_i > 0.0, m_i + gl.log2(l_i), float("-inf"))
        inv_l = gl.where(l_i > 0.0, 1.0 / l_i, 0.0)
        o_rows: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
        b_o = acc * gl.convert_layout(inv_l, o_rows)[:, None]
        o_ho = i_hb * BH + gl.arange(0, BH, layout=o_rows)
        o_co = gl.arange(0, 512, layout=gl.SliceLayout(0, acc.type.layout))
        if SINGLE:
            p_o = out + (i_r.to(gl.int64) * H + o_ho.to(gl.int64))[:, None] * DV + o_co[None, :]
            b_lse = gl.where(l_i > 0.0, lse2 * LN2, float("inf"))
            gl.store(lse + (i_b.to(gl.int64) * H + o_hs) * S + i_s, b_lse, mask=m_hs)  # lse [B, H, S]
        else:
            i_part = i_r.to(gl.int64) * num_splits + i_sp
            p_o = o_part + (i_part * H + o_ho.to(gl.int64))[:, None] * DV + o_co[None, :]
            gl.store(lse_part + i_part * H + o_hs, lse2, mask=m_hs)
        gl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=(o_ho < H)[:, None] & (o_co < DV)[None, :])


def sparse_decode_v32_sm90_fwd(
    q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, length: torch.Tensor | None, out: torch.Tensor,
    lse: torch.Tensor, o_part: torch.Tensor, lse_part: torch.Tensor, *, page_size: int, stride_kb: int,
    stride_kt: int, num_slots: int, splits: int, qk_scale: float, d_v: int, int_dequant: bool, prefetch: bool,
    f16: bool = False,
) -> None:  # fmt: skip
    """Launch the tile: q [B, s_q, H, 576] bf16; kv the fp8_656 cache as uint8 (``page_size`` slots a page, byte
    strides ``stride_kb`` a page / ``stride_kt`` a slot, 16-byte aligned); indices [B, s_q, topk] int32 (contiguous
    along topk); length [B] or None; out / lse / o_part / lse_part as the Triton tile's (``splits`` > 1: partials);
    ``qk_scale`` in base 2 (sm_scale x log2 e)."""
    if not available():
        raise dev.UnsupportedDevice(f"the V3.2 Gluon tile needs Triton >= 3.6's Gluon; this is {triton.__version__}")
    batch, s_q, heads, _ = q.shape
    rows = batch * s_q
    _sparse_decode_v32_sm90_kernel[(rows, triton.cdiv(heads, BLOCK_H), splits)](
        q, kv, indices, length if length is not None else indices, out, lse, o_part, lse_part,
        s_q, heads, indices.shape[2], page_size, stride_kb, stride_kt, num_slots, splits, qk_scale,
        q.stride(0), q.stride(1), q.stride(2), q.stride(3), indices.stride(0), indices.stride(1),
        DV=d_v, HAS_LEN=length is not None, SINGLE=splits == 1, INT_DEQUANT=int_dequant, PREFETCH=prefetch,
        PAGE_SHIFT=page_shift(page_size), F16=f16, num_warps=NUM_WARPS,
    )  # fmt: skip


__all__ = ["BLOCK_H", "BLOCK_N", "NUM_WARPS", "PREFETCH_SHARED_BYTES", "SHARED_BYTES", "available",
           "sparse_decode_v32_sm90_fwd"]  # fmt: skip
