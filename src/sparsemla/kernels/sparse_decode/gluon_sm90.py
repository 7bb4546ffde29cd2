"""The V4 sparse decode's 64 x 64 wgmma tile for sm_90 (Hopper), written in Gluon (``triton.experimental.gluon``).

Why not plain Triton: Triton gives a dot whose result feeds another dot all warps along M (``warpsPerTileV3``). With
64 heads = one warpgroup's M and 8 warps, both warpgroups then compute the whole 64 x 64 score tile (the QK dot is
``warpsPerCTA = [8, 1]``): 1.5x the tile's MMA work. Here the layouts are explicit:

* the tile [64 tokens, 512] is gathered and dequantized (fp8 NoPE x ue8m0 scale by the package's integer e4m3 path,
  bf16 RoPE) one 64-column chunk at a time into ONE NVMMA-swizzled shared buffer that both dots read;
* S [64 heads, 64 tokens] = q K^T by ``warpgroup_mma`` with ``warps_per_cta = [4, 2]``: each warpgroup 32 tokens;
* online softmax in base 2 (row maximum and sum cross the two warpgroups through Gluon's reductions);
* P (bf16) through shared memory, O [64, 512] += P V by ``warpgroup_mma`` with ``warps_per_cta = [4, 2]``: each
  warpgroup 256 output columns.

The launcher's defaults apply as on the Triton tiles: the rows of the next tile prefetched into L2
(``DecodeConfig.l2_prefetch``) and the integer dequant's lift (``q_lift``: q's NoPE times 2^8 once, in shared memory,
one scale multiply per gathered value) from 4 tiles a program; ``ids_ahead`` (off) loads the slot ids one iteration
ahead. From 4 tiles a program the launcher runs this tile warp-specialized instead
(:mod:`~sparsemla.kernels.sparse_decode.gluon_ws_sm90`, which shares the helpers below). Measurements: docs/gpus.md and
docs/performance.md.

Same contract as :func:`sparsemla.kernels.sparse_decode.triton.sparse_decode_fwd`'s main kernel: one program per
(row, 64-head block, split), both caches in one loop (cache, page geometry and index row selected per tile), valid
lengths, -1 ids, the sink, padded heads (``H`` real of ``H_OUT``), ``DV`` <= 512, split partials merged by the
package's combine kernel. sm_90 only (wgmma; sm_100's tensor cores are tcgen05): chosen by
``DecodeConfig.gluon`` (:func:`~sparsemla.kernels.sparse_decode.triton.choose_tiles`). Triton 3.6 and 3.8 both
compile it (3.8 renamed ``thread_barrier`` to ``barrier``); without Gluon (:func:`available`) the Triton tile runs.

Shared memory: q [64, 512] + the tile [64, 512] bf16 + P [64, 64] bf16 = 139,264 B (+ 512 B of reduction scratch;
ahead of time 139,776 B), one program per SM. The Triton path never imports the fp32 reference.
"""

from __future__ import annotations

import torch
import triton

try:  # Gluon's Hopper API (Triton >= 3.6); without it the package's Triton tile runs
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import fence_async_shared, warpgroup_mma, warpgroup_mma_wait

    _HAVE_GLUON = True
except ImportError:  # pragma: no cover - older Triton
    _HAVE_GLUON = False

from sparsemla.kernels import device as dev
from sparsemla.kernels.dequant import E4M3_TO_BF16_PTX
from sparsemla.kernels.dequant import LIFT_LOG2 as DEQUANT_LIFT_LOG2
from sparsemla.kernels.layouts import V4_DATA_BYTES, V4_DIM, V4_NOPE_DIM, V4_SCALE_BYTES
from sparsemla.kernels.prefetch import PREFETCH_L2_PTX

BLOCK_H = 64  # heads per program: one warpgroup's M
BLOCK_N = 64  # tokens per tile: each warpgroup scores 32 of them
NUM_WARPS = 8  # two warpgroups
# q + the tile + P, bf16, plus the reductions' scratch (ahead of time, Triton 3.8: 139,776 B)
SHARED_BYTES = (BLOCK_H + BLOCK_N) * V4_DIM * 2 + BLOCK_H * BLOCK_N * 2 + 512


def available() -> bool:
    """Whether this Triton has Gluon's Hopper API (``warpgroup_mma``) in a version this kernel is built and tested
    with: 3.6 (the GPU machine's GPU tests) or newer (3.8, production's: the ahead-of-time compile test)."""
    return _HAVE_GLUON and dev.triton_at_least(3, 6)


if _HAVE_GLUON:
    # Triton 3.8's name; 3.6 (the GPU machine's) calls it thread_barrier
    _barrier = getattr(gl, "barrier", None) or gl.thread_barrier

    DATA_ROW: gl.constexpr = gl.constexpr(V4_DATA_BYTES)  # 576 bytes: 448 fp8 NoPE, then 64 bf16 RoPE
    ROPE_OFFSET: gl.constexpr = gl.constexpr(V4_NOPE_DIM)  # 448
    SCALE_ROW: gl.constexpr = gl.constexpr(V4_SCALE_BYTES)  # 7 ue8m0 scales + 1 pad, after the page's data rows
    LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)
    LN2: gl.constexpr = gl.constexpr(0.6931471805599453)
    E4M3_PTX: gl.constexpr = gl.constexpr(E4M3_TO_BF16_PTX.value)
    TWO_POW_120_F: gl.constexpr = gl.constexpr(2.0**120)
    PREFETCH_PTX: gl.constexpr = gl.constexpr(PREFETCH_L2_PTX.value)
    LIFT_LOG2: gl.constexpr = gl.constexpr(DEQUANT_LIFT_LOG2.value)  # the lift (DecodeConfig.q_lift)
    TWO_POW_LIFT_F: gl.constexpr = gl.constexpr(2.0**DEQUANT_LIFT_LOG2.value)

    @gluon.jit
    def _e4m3_bits_to_bf16(x):
        """uint8 e4m3 bytes -> bf16 of the value times 2^-120, exactly (the package's PTX, four bytes a block:
        :func:`sparsemla.kernels.dequant.e4m3_bits_to_bf16`)."""
        return gl.inline_asm_elementwise(asm=E4M3_PTX, constraints="=r,=r,r", args=[x], dtype=gl.bfloat16,
                                         is_pure=True, pack=4)  # fmt: skip

    @gluon.jit
    def _dequant_chunk(b_u, b_e, INT_DEQUANT: gl.constexpr, Q_LIFT: gl.constexpr):
        """[N, 64] e4m3 bytes ``b_u`` (uint8) times 2^(``b_e`` - 127) per row ([N] fp32) -> bf16: the integer path
        (times 2^120, exact, then the scale: one multiply by 2^(e - 7) would overflow bf16 from e = 135 on; Q_LIFT:
        one multiply by 2^(e - 7 - LIFT_LOG2), the value times 2^-LIFT_LOG2, exact for e <= 134 + LIFT_LOG2) or the
        fp8 conversion instructions (e4m3 -> f16 -> bf16)."""
        if Q_LIFT:
            return _e4m3_bits_to_bf16(b_u) * gl.exp2(b_e - (7.0 + LIFT_LOG2)).to(gl.bfloat16)[:, None]
        elif INT_DEQUANT:
            two_120 = gl.full([1, 1], TWO_POW_120_F, gl.bfloat16, b_u.type.layout)
            return (_e4m3_bits_to_bf16(b_u) * two_120) * gl.exp2(b_e - 127.0).to(gl.bfloat16)[:, None]
        else:
            b_f = b_u.to(gl.float8e4nv, bitcast=True).to(gl.bfloat16)
            return b_f * gl.exp2(b_e - 127.0).to(gl.bfloat16)[:, None]

    @gluon.jit
    def _page_split(slot, in_main, page_size, page_size_x, PAGE_SHIFT: gl.constexpr, PAGE_SHIFT_X: gl.constexpr):
        """(page, row in page) of slot ids ``slot`` (>= 0) in the main cache (``in_main``, a scalar) or the extra one:
        shifts where the page sizes are powers of two (:mod:`sparsemla.kernels.paging`), else divisions."""
        if PAGE_SHIFT >= 0 and PAGE_SHIFT == PAGE_SHIFT_X:
            return slot >> PAGE_SHIFT, slot & ((1 << PAGE_SHIFT) - 1)
        elif PAGE_SHIFT >= 0 and PAGE_SHIFT_X >= 0:
            shift = gl.where(in_main, PAGE_SHIFT, PAGE_SHIFT_X)
            return slot >> shift, slot & ((1 << shift) - 1)
        else:
            psz = gl.where(in_main, page_size, page_size_x)
            return slot // psz, slot % psz

    @gluon.jit
    def _gather_store_tile(
        p_cache, b_idx, in_main, page_size, page_stride, page_size_x, page_stride_x, k_smem, o_d,
        INT_DEQUANT: gl.constexpr, Q_LIFT: gl.constexpr, PAGE_SHIFT: gl.constexpr, PAGE_SHIFT_X: gl.constexpr,
    ):  # fmt: skip
        """The [BLOCK_N, 512] bf16 rows of slot ids ``b_idx`` [BLOCK_N] (-1: zeros) of the cache at ``p_cache``
        (uint8; the main cache's page geometry where ``in_main``, else the extra one's) into ``k_smem``, one
        64-column chunk at a time (a chunk's values live in registers, not the tile's): chunks 0-6 fp8 NoPE x its
        ue8m0 scale, chunk 7 the bf16 RoPE. ``o_d`` [64]: a chunk's columns, in the layout ``b_idx`` indexes rows of."""
        m_n = b_idx >= 0
        b_slot = gl.where(m_n, b_idx, 0)
        b_page, b_off = _page_split(b_slot, in_main, page_size, page_size_x, PAGE_SHIFT, PAGE_SHIFT_X)
        b_page = b_page.to(gl.int64)
        b_off = b_off.to(gl.int64)
        psz = gl.where(in_main, page_size, page_size_x)
        pst = gl.where(in_main, page_stride, page_stride_x)
        o_tok = b_page * pst + b_off * DATA_ROW  # [BLOCK_N] byte offset of the token's 576-byte data row
        o_scale = b_page * pst + psz * DATA_ROW + b_off * SCALE_ROW  # [BLOCK_N] its 8 scale bytes
        for c in gl.static_range(7):
            b_u = gl.load(p_cache + (o_tok + c * 64)[:, None] + o_d[None, :], mask=m_n[:, None], other=0)  # [N, 64] u8
            b_e = gl.load(p_cache + o_scale + c, mask=m_n, other=127).to(gl.float32)  # [BLOCK_N] ue8m0 exponent
            k_smem.slice(c * 64, 64, dim=1).store(_dequant_chunk(b_u, b_e, INT_DEQUANT, Q_LIFT))
        p_rope = (p_cache + ROPE_OFFSET).to(gl.pointer_type(gl.bfloat16), bitcast=True)
        b_r = gl.load(p_rope + (o_tok // 2)[:, None] + o_d[None, :], mask=m_n[:, None], other=0.0)  # [N, 64] bf16
        k_smem.slice(ROPE_OFFSET, 64, dim=1).store(b_r)

    @gluon.jit
    def _split_range(length, length_x, i_b, i_sp, num_splits, TOPK, TOPK_X, BLOCK_N: gl.constexpr,
                     HAS_LEN: gl.constexpr, HAS_EXTRA: gl.constexpr, HAS_LEN_X: gl.constexpr):  # fmt: skip
        """(n_main, n_x, t_main, t_lo, t_hi): valid lengths of both candidate lists (the leftmost ``length[i_b]``
        entries count) and this split's share [t_lo, t_hi) of the concatenated tiles (main first, extra from t_main):
        the Triton tile's ``_split_tiles``, restated because a Gluon kernel calls Gluon functions."""
        n_main = TOPK
        if HAS_LEN:
            n_main = gl.minimum(gl.maximum(gl.load(length + i_b), 0), TOPK)
        t_main = (n_main + BLOCK_N - 1) // BLOCK_N
        t_all = t_main
        n_x = TOPK_X
        if HAS_EXTRA:
            if HAS_LEN_X:
                n_x = gl.minimum(gl.maximum(gl.load(length_x + i_b), 0), TOPK_X)
            t_all = t_main + (n_x + BLOCK_N - 1) // BLOCK_N
        per = (t_all + num_splits - 1) // num_splits
        t_lo = i_sp * per
        return n_main, n_x, t_main, t_lo, gl.minimum(t_lo + per, t_all)

    @gluon.jit
    def _prefetch_l2(ptrs, mask):
        """Prefetch into L2 the line holding each of ``ptrs`` where ``mask`` (:mod:`sparsemla.kernels.prefetch`; the
        asm's result is unused)."""
        return gl.inline_asm_elementwise(
            asm=PREFETCH_PTX, constraints="=r,l,r", args=[ptrs, mask.to(gl.int32)], dtype=gl.int32, is_pure=False,
            pack=1,
        )  # fmt: skip

    @gluon.jit
    def _tile_ids(p_idx, p_idx_x, n_main, n_x, t_main, i_t, t_hi, o_n, BLOCK_N: gl.constexpr):
        """Slot ids [BLOCK_N] (``o_n``'s layout) of tile ``i_t`` of the concatenated list (main tiles first); -1 past
        the valid length and for a tile that is not one of this split's (>= ``t_hi``)."""
        in_main = i_t < t_main
        t0 = gl.where(in_main, i_t, i_t - t_main) * BLOCK_N
        n_len = gl.where(i_t < t_hi, gl.where(in_main, n_main, n_x), 0)
        p_row = gl.where(in_main, p_idx, p_idx_x)
        return gl.load(p_row + t0 + o_n, mask=t0 + o_n < n_len, other=-1)

    @gluon.jit
    def _prefetch_rows(cache, cache_x, b_idx, in_main, page_size, page_stride, page_size_x, page_stride_x, o_b, m_b,
                       PAGE_SHIFT: gl.constexpr, PAGE_SHIFT_X: gl.constexpr):  # fmt: skip
        """L2 prefetch of the data rows (one address per ``o_b`` [NP] offset where ``m_b``) and scale rows of slot ids
        ``b_idx`` [BLOCK_N] (-1 skipped) in the main cache (``in_main``) or the extra one."""
        m_n = b_idx >= 0
        b_page, b_off = _page_split(gl.where(m_n, b_idx, 0), in_main, page_size, page_size_x, PAGE_SHIFT, PAGE_SHIFT_X)
        b_page = b_page.to(gl.int64)
        b_off = b_off.to(gl.int64)
        psz = gl.where(in_main, page_size, page_size_x)
        pst = gl.where(in_main, page_stride, page_stride_x)
        p_cache = gl.where(in_main, cache, cache_x)
        o_tok = b_page * pst + b_off * DATA_ROW
        o_scale = b_page * pst + psz * DATA_ROW + b_off * SCALE_ROW
        _prefetch_l2(p_cache + o_tok[:, None] + o_b[None, :], m_n[:, None] & m_b[None, :])  # [BLOCK_N, NP]
        _prefetch_l2(p_cache + o_scale, m_n)

    @gluon.jit
    def _index_rows(idx, idx_x, i_b, i_s, stride_ib, stride_is, stride_xb, stride_xs):
        """(p_idx, p_idx_x): the start of this program's index row in the main and the extra list."""
        p_idx = idx + i_b.to(gl.int64) * stride_ib + i_s.to(gl.int64) * stride_is
        return p_idx, idx_x + i_b.to(gl.int64) * stride_xb + i_s.to(gl.int64) * stride_xs

    @gluon.jit
    def _prefetch_offsets(PF_STRIDE: gl.constexpr, BLOCK_N: gl.constexpr, num_warps: gl.constexpr):
        """(o_b [NP] byte offsets in a data row: every PF_STRIDE bytes and its last byte, m_b [NP] which are real,
        o_np [BLOCK_N] the tile's rows) in the [BLOCK_N, NP] layout :func:`_prefetch_rows` takes."""
        pf: gl.constexpr = gl.BlockedLayout([1, 1], [4, 8], [num_warps, 1], [1, 0])  # [BLOCK_N, NP] prefetches
        NPF: gl.constexpr = (DATA_ROW - 1 + PF_STRIDE - 1) // PF_STRIDE + 1  # addresses a data row needs
        o_pb = gl.arange(0, triton.next_power_of_2(NPF), layout=gl.SliceLayout(0, pf))
        o_b = gl.minimum(o_pb * PF_STRIDE, DATA_ROW - 1)
        return o_b, o_pb < NPF, gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, pf))

    @gluon.jit
    def _program_coords(S, HEADS_FASTEST: gl.constexpr):
        """(i_r, i_b, i_s, i_hb, i_sp): this program's row (b * S + s), batch entry, query position, 64-head block and
        split in ``decode_grid``'s layout (HEADS_FASTEST: the first two axes swapped)."""
        if HEADS_FASTEST:
            i_r = gl.program_id(1)
            i_hb = gl.program_id(0)
        else:
            i_r = gl.program_id(0)
            i_hb = gl.program_id(1)
        return i_r, i_r // S, i_r % S, i_hb, gl.program_id(2)

    @gluon.jit
    def _q_to_smem(q, i_b, i_s, i_hb, H, stride_qb, stride_qs, stride_qh, stride_qd, BLOCK_H: gl.constexpr,
                   Q_LIFT: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
        """q [BLOCK_H, 512] bf16 of this program's heads (0 past H; Q_LIFT: NoPE columns times 2^LIFT_LOG2) in a new
        NVMMA-swizzled shared buffer, the QK dot's A operand."""
        ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])  # [rows, 512], 16-byte runs
        q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, 512], gl.bfloat16)
        o_hl = i_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ld))
        o_c = gl.arange(0, 512, layout=gl.SliceLayout(0, ld))
        p_q = q + i_b.to(gl.int64) * stride_qb + i_s.to(gl.int64) * stride_qs + o_hl.to(gl.int64)[:, None] * stride_qh
        b_q = gl.load(p_q + o_c[None, :] * stride_qd, mask=(o_hl < H)[:, None], other=0.0)  # [BLOCK_H, 512] bf16
        if Q_LIFT:
            b_q = b_q * gl.where(o_c < ROPE_OFFSET, TWO_POW_LIFT_F, 1.0).to(gl.bfloat16)[None, :]
        return gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, 512], q_sl, b_q)

    @gluon.jit
    def _softmax_pv(b_s, b_ids, qk_scale, m_i, l_i, acc, p_smem, k_tile, P_IN_USE: gl.constexpr,
                    WG_SUMS: gl.constexpr = False, P_F16: gl.constexpr = False):  # fmt: skip
        """One online-softmax step (base 2) on the scores ``b_s`` [BLOCK_H, BLOCK_N] of slot ids ``b_ids`` (-1:
        masked; heads with nothing valid yet stay at zero weight), then acc [BLOCK_H, 512] = acc * alpha + P V with P
        (bf16) through ``p_smem`` and V = ``k_tile`` [BLOCK_N, 512]: (acc, m_i, l_i). P_IN_USE: the last PV may still
        read P (no barrier since), so both warpgroups meet before it is replaced. WG_SUMS: ``l_i`` is [BLOCK_H, 2],
        each warpgroup's running sum over its own BLOCK_N / 2 score columns (no exchange between the warpgroups a
        tile, which a sum over the whole tile needs; the caller adds the two at the end). P_F16: P in f16 (for an f16
        ``k_tile``), else bf16."""
        b_s = gl.where((b_ids >= 0)[None, :], b_s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(b_s, 1))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        b_p = gl.exp2(b_s - m_use[:, None])
        if WG_SUMS:
            BH: gl.constexpr = b_s.shape[0]
            BN: gl.constexpr = b_s.shape[1]
            p_w = gl.sum(gl.reshape(b_p, [BH, 2, BN // 2]), 2)  # [BH, 2] each warpgroup's columns (its own threads)
            l_i = l_i * gl.convert_layout(alpha, gl.SliceLayout(1, p_w.type.layout))[:, None] + p_w
        else:
            l_i = l_i * alpha + gl.sum(b_p, 1)
        if P_IN_USE:
            _barrier()
        if P_F16:
            p_smem.store(b_p.to(gl.float16))
        else:
            p_smem.store(b_p.to(gl.bfloat16))
        fence_async_shared()
        _barrier()  # both warpgroups' halves of P are in before either PV reads all of it
        alpha_o = gl.convert_layout(alpha, gl.SliceLayout(1, acc.type.layout))
        acc = warpgroup_mma(p_smem, k_tile, acc * alpha_o[:, None], is_async=True)  # [BLOCK_H, 512]
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        return acc, m_new, l_i

    @gluon.jit
    def _store_output(acc, m_i, l_i, sink, out, lse, o_part, lse_part, i_r, i_hb, i_sp, H, H_OUT, num_splits,
                      DV: gl.constexpr, BLOCK_H: gl.constexpr, HAS_SINK: gl.constexpr, SINGLE: gl.constexpr,
                      Q_LIFT: gl.constexpr):  # fmt: skip
        """The program's result from the running sums (``acc`` [BLOCK_H, 512] fp32 in the PV dot's layout, ``m_i`` /
        ``l_i`` [BLOCK_H] base-2 maximum and sum in the score dot's row layout). SINGLE: out [rows, H_OUT, DV] bf16
        and lse [rows, H_OUT] (natural log, sink excluded; the sink scales out); else the split's normalised partial
        o_part [rows, splits, H, 512] and base-2 lse_part (-inf when empty) for the combine kernel."""
        s_rows: gl.constexpr = m_i.type.layout
        o_rows: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
        o_hs = i_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=s_rows)
        m_hs = o_hs < H
        lse2 = gl.where(l_i > 0.0, m_i + gl.log2(l_i), float("-inf"))
        inv_l = gl.where(l_i > 0.0, 1.0 / l_i, 0.0)
        o_ho = i_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=o_rows)
        o_co = gl.arange(0, 512, layout=gl.SliceLayout(0, acc.type.layout))
        if SINGLE:
            if HAS_SINK:  # times exp(lse - logaddexp(lse, sink)): +inf -> 0, -inf -> unchanged; empty heads stay 0
                b_sink = gl.load(sink + o_hs, mask=m_hs, other=float("-inf")) * LOG2E
                inv_l = gl.where(l_i > 0.0, inv_l / (1.0 + gl.exp2(b_sink - lse2)), 0.0)
            gl.store(lse + i_r.to(gl.int64) * H_OUT + o_hs, lse2 * LN2, mask=m_hs)
            p_o = out + i_r.to(gl.int64) * H_OUT * DV + o_ho.to(gl.int64)[:, None] * DV + o_co[None, :]
        else:
            i_part = i_r.to(gl.int64) * num_splits + i_sp
            gl.store(lse_part + i_part * H + o_hs, lse2, mask=m_hs)
            p_o = o_part + (i_part * H + o_ho.to(gl.int64))[:, None] * 512 + o_co[None, :]
        b_o = acc * gl.convert_layout(inv_l, o_rows)[:, None]
        if Q_LIFT:  # PV over NoPE * 2^-LIFT_LOG2: back to scale (exact)
            b_o = b_o * gl.where(o_co < ROPE_OFFSET, TWO_POW_LIFT_F, 1.0)[None, :]
        gl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=(o_ho < H)[:, None] & (o_co < DV)[None, :])

    @gluon.jit
    def _sparse_decode_sm90_kernel(
        q, cache, idx, length, cache_x, idx_x, length_x, sink,
        out, lse, o_part, lse_part,
        S, H, H_OUT, TOPK, TOPK_X, page_size, page_stride, page_size_x, page_stride_x, num_splits, qk_scale,
        stride_qb, stride_qs, stride_qh, stride_qd,
        stride_ib, stride_is, stride_xb, stride_xs,
        DV: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, INT_DEQUANT: gl.constexpr,
        HAS_LEN: gl.constexpr, HAS_EXTRA: gl.constexpr, HAS_LEN_X: gl.constexpr, HAS_SINK: gl.constexpr,
        SINGLE: gl.constexpr, PAGE_SHIFT: gl.constexpr, PAGE_SHIFT_X: gl.constexpr, HEADS_FASTEST: gl.constexpr,
        PREFETCH: gl.constexpr, PF_STRIDE: gl.constexpr, Q_LIFT: gl.constexpr, IDS_AHEAD: gl.constexpr,
        num_warps: gl.constexpr,
    ):  # fmt: skip
        """Grid (B * S, cdiv(H, BLOCK_H), num_splits), or HEADS_FASTEST: the first two axes swapped (a row's head
        blocks side by side; ``decode_grid``). A split owns a contiguous run of the concatenated list's valid tiles.
        SINGLE: out [B*S, H_OUT, DV] bf16 and lse [B*S, H_OUT] (natural log, sink excluded; the sink scales out);
        else the split's normalised partial o_part [rows, splits, H, 512] (bf16 or fp32) and base-2 lse_part (-inf
        when empty) for the combine kernel, which applies the sink. PREFETCH > 0: iteration i_t first prefetches the
        rows of tile i_t + PREFETCH into L2 (one address every PF_STRIDE bytes of a row and its last byte). Q_LIFT
        (with the integer dequant): q's NoPE columns times 2^LIFT_LOG2 once (in shared memory, so nothing stays in
        registers), the tile's NoPE times 2^-LIFT_LOG2 by its one scale multiply, the output's NoPE columns times
        2^LIFT_LOG2 at the end: the same bits (:mod:`sparsemla.kernels.dequant`). IDS_AHEAD: a tile's slot ids (and
        the prefetched tile's) are loaded one iteration before they are used, as the Triton tile does, so their L2
        round trip is off the loop's critical path: the same bits."""
        gl.static_assert(num_warps == 8, "two warpgroups")
        gl.static_assert(BLOCK_H == 64 and BLOCK_N == 64, "the 64 x 64 tile")
        ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])  # [rows, 512 | 64], 16-byte runs
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, 32, 16])  # fmt: skip
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, 256, 16])  # fmt: skip
        k_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 512], gl.bfloat16)
        p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], gl.bfloat16)

        i_r, i_b, i_s, i_hb, i_sp = _program_coords(S, HEADS_FASTEST)
        q_smem = _q_to_smem(q, i_b, i_s, i_hb, H, stride_qb, stride_qs, stride_qh, stride_qd, BLOCK_H, Q_LIFT,
                            num_warps)  # fmt: skip
        k_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_N, 512], k_sl)
        p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, BLOCK_N], p_sl)

        n_main, n_x, t_main, t_lo, t_hi = _split_range(length, length_x, i_b, i_sp, num_splits, TOPK, TOPK_X, BLOCK_N,
                                                       HAS_LEN, HAS_EXTRA, HAS_LEN_X)  # fmt: skip

        acc = gl.zeros([BLOCK_H, 512], gl.float32, o_layout)
        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, s_layout))
        o_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld))  # the gather's rows
        o_d = gl.arange(0, 64, layout=gl.SliceLayout(0, ld))  # a chunk's columns
        o_ns = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))  # S's columns
        p_idx, p_idx_x = _index_rows(idx, idx_x, i_b, i_s, stride_ib, stride_is, stride_xb, stride_xs)
        o_b, m_b, o_np = _prefetch_offsets(PF_STRIDE, BLOCK_N, num_warps)
        if IDS_AHEAD:  # the first tile's ids (and the first prefetched tile's) before the loop
            b_idx_n = _tile_ids(p_idx, p_idx_x, n_main, n_x, t_main, t_lo, t_hi, o_n, BLOCK_N)
            b_ids_n = _tile_ids(p_idx, p_idx_x, n_main, n_x, t_main, t_lo, t_hi, o_ns, BLOCK_N)
            if PREFETCH > 0:
                b_pf_n = _tile_ids(p_idx, p_idx_x, n_main, n_x, t_main, t_lo + PREFETCH, t_hi, o_np, BLOCK_N)
        for i_t in range(t_lo, t_hi):
            if PREFETCH > 0:  # the rows of a tile PREFETCH ahead into L2 while this one is gathered and multiplied
                if IDS_AHEAD:
                    b_pf = b_pf_n
                    b_pf_n = _tile_ids(p_idx, p_idx_x, n_main, n_x, t_main, i_t + 1 + PREFETCH, t_hi, o_np, BLOCK_N)
                else:
                    b_pf = _tile_ids(p_idx, p_idx_x, n_main, n_x, t_main, i_t + PREFETCH, t_hi, o_np, BLOCK_N)
                _prefetch_rows(cache, cache_x, b_pf, i_t + PREFETCH < t_main, page_size, page_stride, page_size_x,
                               page_stride_x, o_b, m_b, PAGE_SHIFT, PAGE_SHIFT_X)  # fmt: skip
            if IDS_AHEAD:  # this tile's ids came one iteration ago; the next tile's load now, used next iteration
                b_idx = b_idx_n
                b_ids = b_ids_n
                b_idx_n = _tile_ids(p_idx, p_idx_x, n_main, n_x, t_main, i_t + 1, t_hi, o_n, BLOCK_N)
                b_ids_n = _tile_ids(p_idx, p_idx_x, n_main, n_x, t_main, i_t + 1, t_hi, o_ns, BLOCK_N)
            else:
                b_idx = _tile_ids(p_idx, p_idx_x, n_main, n_x, t_main, i_t, t_hi, o_n, BLOCK_N)  # [BLOCK_N] slot ids
                b_ids = _tile_ids(p_idx, p_idx_x, n_main, n_x, t_main, i_t, t_hi, o_ns, BLOCK_N)  # along S's columns
            in_main = i_t < t_main
            p_cache = gl.where(in_main, cache, cache_x)
            _barrier()  # every warpgroup's dots of the last tile are done (each waited) before the tile is replaced
            _gather_store_tile(p_cache, b_idx, in_main, page_size, page_stride, page_size_x, page_stride_x, k_smem,
                               o_d, INT_DEQUANT, Q_LIFT, PAGE_SHIFT, PAGE_SHIFT_X)  # fmt: skip
            fence_async_shared()
            _barrier()  # the whole tile is in shared memory before either warpgroup's dot reads it
            b_s = warpgroup_mma(q_smem, k_smem.permute((1, 0)), gl.zeros([BLOCK_H, BLOCK_N], gl.float32, s_layout),
                                use_acc=False, is_async=True)  # fmt: skip
            b_s = warpgroup_mma_wait(num_outstanding=0, deps=(b_s,))  # [BLOCK_H, BLOCK_N]: each warpgroup 32 tokens

            acc, m_i, l_i = _softmax_pv(b_s, b_ids, qk_scale, m_i, l_i, acc, p_smem, k_smem, False)

        _store_output(acc, m_i, l_i, sink, out, lse, o_part, lse_part, i_r, i_hb, i_sp, H, H_OUT, num_splits, DV,
                      BLOCK_H, HAS_SINK, SINGLE, Q_LIFT)  # fmt: skip


def sparse_decode_sm90_fwd(
    q: torch.Tensor, cache: torch.Tensor, indices: torch.Tensor, topk_length: torch.Tensor | None,
    cache_x: torch.Tensor, idx_x: torch.Tensor, extra_topk_length: torch.Tensor | None,
    attn_sink: torch.Tensor | None, out: torch.Tensor, lse: torch.Tensor, o_part: torch.Tensor,
    lse_part: torch.Tensor, *, heads: int, page: tuple[int, int, int, int], splits: int, qk_scale: float,
    has_extra: bool, grid: tuple[int, int, int], heads_fastest: bool, int_dequant: bool,
    page_shifts: tuple[int, int], prefetch: int = 0, prefetch_stride: int = 128, q_lift: bool = False,
    ids_ahead: bool = False,
) -> None:  # fmt: skip
    """Launch the Gluon tile with arguments :func:`~sparsemla.kernels.sparse_decode.triton.sparse_decode_fwd` checked
    and laid out: q [B, s_q, H_OUT, 512] bf16 (any strides), ``cache`` / ``cache_x`` uint8 V4 page views, indices
    [B, s_q, topk] int32 (contiguous along topk), out [B, s_q, H_OUT, DV] bf16, lse [B, s_q, H_OUT] fp32, partials
    [rows, splits, heads, 512] (bf16 or fp32) and [rows, splits, heads] fp32 when ``splits`` > 1; ``heads`` real
    heads of q's H_OUT; ``page`` = (page_size, page_stride, page_size_x, page_stride_x) in slots / bytes; ``grid``
    from ``decode_grid`` with one program per 64-head block; ``prefetch``: tiles ahead prefetched into L2 (0: off),
    one address every ``prefetch_stride`` bytes of a row; ``q_lift`` (with ``int_dequant``): the lift; ``ids_ahead``:
    slot ids loaded one iteration ahead."""
    if not _HAVE_GLUON:
        raise RuntimeError("DecodeConfig.gluon needs Triton's Gluon (triton.experimental.gluon, Triton >= 3.6)")
    args, constexprs = launch_arguments(
        q, cache, indices, topk_length, cache_x, idx_x, extra_topk_length, attn_sink, out, lse, o_part, lse_part,
        heads=heads, page=page, splits=splits, qk_scale=qk_scale, has_extra=has_extra, heads_fastest=heads_fastest,
        int_dequant=int_dequant, page_shifts=page_shifts, prefetch=prefetch, prefetch_stride=prefetch_stride,
        q_lift=q_lift, ids_ahead=ids_ahead,
    )  # fmt: skip
    _sparse_decode_sm90_kernel[grid](*args, **constexprs, num_warps=NUM_WARPS)


def launch_arguments(
    q: torch.Tensor, cache: torch.Tensor, indices: torch.Tensor, topk_length: torch.Tensor | None,
    cache_x: torch.Tensor, idx_x: torch.Tensor, extra_topk_length: torch.Tensor | None,
    attn_sink: torch.Tensor | None, out: torch.Tensor, lse: torch.Tensor, o_part: torch.Tensor,
    lse_part: torch.Tensor, *, heads: int, page: tuple[int, int, int, int], splits: int, qk_scale: float,
    has_extra: bool, heads_fastest: bool, int_dequant: bool, page_shifts: tuple[int, int], prefetch: int,
    prefetch_stride: int, q_lift: bool, ids_ahead: bool,
) -> tuple[list, dict]:  # fmt: skip
    """(positional arguments, constexprs) of both Gluon tiles' kernels (this one and the warp-specialized one) for
    :func:`sparse_decode_sm90_fwd`'s arguments."""
    _, s_q, heads_out, _ = q.shape
    dummy = indices  # any tensor for absent optional pointers (constexpr-guarded)
    args = [
        q, cache, indices, topk_length if topk_length is not None else dummy,
        cache_x, idx_x, extra_topk_length if extra_topk_length is not None else dummy,
        attn_sink if attn_sink is not None else dummy,
        out, lse, o_part, lse_part,
        s_q, heads, heads_out, indices.shape[2], idx_x.shape[2] if has_extra else 0, *page, splits, qk_scale,
        q.stride(0), q.stride(1), q.stride(2), q.stride(3),
        indices.stride(0), indices.stride(1), idx_x.stride(0), idx_x.stride(1),
    ]  # fmt: skip
    constexprs = dict(
        DV=out.shape[3], BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, INT_DEQUANT=int_dequant,
        HAS_LEN=topk_length is not None, HAS_EXTRA=has_extra, HAS_LEN_X=extra_topk_length is not None,
        HAS_SINK=attn_sink is not None, SINGLE=splits == 1, PAGE_SHIFT=page_shifts[0], PAGE_SHIFT_X=page_shifts[1],
        HEADS_FASTEST=heads_fastest, PREFETCH=prefetch, PF_STRIDE=prefetch_stride, Q_LIFT=q_lift and int_dequant,
        IDS_AHEAD=ids_ahead,
    )  # fmt: skip
    return args, constexprs


__all__ = ["BLOCK_H", "BLOCK_N", "NUM_WARPS", "SHARED_BYTES", "available", "launch_arguments", "sparse_decode_sm90_fwd"]
