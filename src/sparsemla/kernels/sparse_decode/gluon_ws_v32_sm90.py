"""sm_90's Gluon V3.2 decode tile (:mod:`~sparsemla.kernels.sparse_decode.gluon_v32_sm90`, f16) warp-specialized:
gathering and dequantizing a tile overlaps the dots of the one before.

Why: the synchronous tile copies the next tile's raw rows ahead (cp.async) but still dequantizes each tile between
its dots, and one 198,144 B program fills an SM. Here a producer warpgroup (4 warps) gathers tile j's raw rows (all
of its loads issued before it waits for a free buffer), prefetches tile j + 1's rows into L2 (so that tile's loads
hit L2), and dequantizes tile j into the second of two f16 tile buffers while the two consumer warpgroups (the
default partition, 8 warps) run tile j - 1's dots and softmax exactly as the synchronous f16 tile does: the outputs
are its bits.

* shared memory: q [64, 512] f16 + q RoPE [64, 64] bf16 + 2 x (the tile [64, 512] f16 + its RoPE [64, 64] bf16) +
  P [64, 64] f16 = 229,376 B, plus four mbarriers and the reductions' scratch (ahead of time, Triton 3.8: 229,924 B),
  one program per SM;
* mbarriers ``full[s]`` (the producer's tile is in buffer s) and ``empty[s]`` (both consumer warpgroups' dots on
  buffer s are done: the producer waits before overwriting it);
* registers: 12 warps share the SM's 64K: ``maxnreg`` :data:`MAXNREG` a thread at launch, the producer
  :data:`PRODUCER_REGS`, the consumers what is left (``setmaxnreg``).

f16 only (``V32Config.f16``; the e4m3 conversion instructions, which sm_90 has). Chosen by ``V32Config.gluon_ws``
(:func:`~sparsemla.kernels.sparse_decode.triton_v32.choose_v32_config`: wherever sm_90 takes the Gluon tile); the
synchronous tile's contract (``topk_length``, -1 / out-of-range ids, ``d_v``, strided q) and grid.
"""

from __future__ import annotations

import torch
import triton

from sparsemla.kernels import device as dev
from sparsemla.kernels.paging import page_shift
from sparsemla.kernels.sparse_decode import gluon_v32_sm90 as sync_tile

BLOCK_H = sync_tile.BLOCK_H
BLOCK_N = sync_tile.BLOCK_N
NUM_WARPS = sync_tile.NUM_WARPS  # the consumers: two warpgroups
PRODUCER_WARPS = 4  # one warpgroup
# 12 warps x 32 threads x 168 = 64,512 of the SM's 65,536 registers. The producer's 136 (it holds a tile's raw rows)
# leave the consumers 184 (152: 176, 5-6 % slower at B = 64 / 128, H = 128; 168: 19 % slower; H100,
# results/bench/explore/gluon_decode_v32_pipe_regs-native-h100-4020754.json); ahead of time (Triton 3.8) the kernel
# spills 32 B a thread at the package's launches (56 at 152; docs/portability.md)
MAXNREG = 168
PRODUCER_REGS = 136
# q + q RoPE + two tiles with their RoPE + P, 2 bytes each, the reductions' scratch and the mbarriers (ahead of time,
# Triton 3.8: 229,924 B)
SHARED_BYTES = (BLOCK_H + 2 * BLOCK_N) * 576 * 2 + BLOCK_H * BLOCK_N * 2 + 548

if sync_tile._HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
    )

    from sparsemla.kernels.sparse_decode.gluon_sm90 import _barrier, _prefetch_l2, _softmax_pv
    from sparsemla.kernels.sparse_decode.gluon_v32_sm90 import (
        ROPE_OFF,
        SCALE_OFF_F32,
        _dequant_chunk,
        _epilogue,
        _load_q,
        _q_f16,
        _rows,
        _scores,
        _split_tiles,
    )

    @gluon.jit
    def _ws_produce(k_bufs, kr_bufs, full, empty, kv, idx, length, S, TOPK, page_size, stride_kb, stride_kt,
                    num_slots, num_splits, stride_ib, stride_is, HAS_LEN: gl.constexpr, PAGE_SHIFT: gl.constexpr,
                    PW: gl.constexpr):  # fmt: skip
        """The producer warpgroup: this split's tile j into buffer j % 2 (f16 NoPE, bf16 RoPE) once ``empty``
        released it, then ``full[j % 2]``. A tile's loads are issued before the wait, and right after them the next
        tile's rows are prefetched into L2 (every 128 bytes of a 656-byte row and its last byte)."""
        ck: gl.constexpr = gl.BlockedLayout([1, 16], [4, 8], [PW, 1], [1, 0])  # [64, 128] e4m3 bytes, 16 B runs
        cr: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [PW, 1], [1, 0])  # [64, 64] bf16 RoPE, 16 B runs
        pf: gl.constexpr = gl.BlockedLayout([1, 1], [4, 8], [PW, 1], [1, 0])  # [64, 8] prefetch addresses
        i_r = gl.program_id(0)
        i_sp = gl.program_id(2)
        i_b = i_r // S
        i_s = i_r % S
        n_valid, t_lo, t_hi = _split_tiles(length, i_b, i_sp, num_splits, TOPK, HAS_LEN)
        o_n = gl.arange(0, 64, layout=gl.SliceLayout(1, ck))
        o_d = gl.arange(0, 128, layout=gl.SliceLayout(0, ck))
        o_r = gl.arange(0, 64, layout=gl.SliceLayout(0, cr))
        o_np = gl.arange(0, 64, layout=gl.SliceLayout(1, pf))
        o_pb = gl.arange(0, 8, layout=gl.SliceLayout(0, pf))
        o_b = gl.minimum(o_pb * 128, 655)
        p_idx = idx + i_b.to(gl.int64) * stride_ib + i_s.to(gl.int64) * stride_is
        p_sc = kv.to(gl.pointer_type(gl.float32), bitcast=True)
        p_rope = (kv + ROPE_OFF).to(gl.pointer_type(gl.bfloat16), bitcast=True)
        for i_t in range(t_lo, t_hi):
            j = i_t - t_lo
            buf = j % 2
            t0 = i_t * 64
            b_idx = gl.load(p_idx + t0 + o_n, mask=t0 + o_n < n_valid, other=-1)  # [64] slot ids
            m_n, o_tok = _rows(b_idx, num_slots, page_size, stride_kb, stride_kt, PAGE_SHIFT)
            p_row = kv + o_tok[:, None] + o_d[None, :]
            u0 = gl.load(p_row, mask=m_n[:, None], other=0)  # [64, 128] e4m3 bytes of each 128-wide chunk
            u1 = gl.load(p_row + 128, mask=m_n[:, None], other=0)
            u2 = gl.load(p_row + 256, mask=m_n[:, None], other=0)
            u3 = gl.load(p_row + 384, mask=m_n[:, None], other=0)
            o_s = (o_tok >> 2) + SCALE_OFF_F32
            s0 = gl.load(p_sc + o_s, mask=m_n, other=0.0)  # [64] fp32 scales
            s1 = gl.load(p_sc + o_s + 1, mask=m_n, other=0.0)
            s2 = gl.load(p_sc + o_s + 2, mask=m_n, other=0.0)
            s3 = gl.load(p_sc + o_s + 3, mask=m_n, other=0.0)
            m_r = gl.convert_layout(m_n, gl.SliceLayout(1, cr))
            o_tr = gl.convert_layout(o_tok, gl.SliceLayout(1, cr))
            b_r = gl.load(p_rope + (o_tr >> 1)[:, None] + o_r[None, :], mask=m_r[:, None], other=0.0)  # [64, 64]
            t1 = t0 + 64  # the next tile's rows into L2 (none past this split's end)
            b_nx = gl.load(p_idx + t1 + o_np, mask=(t1 + o_np < n_valid) & (i_t + 1 < t_hi), other=-1)
            m_x, o_x = _rows(b_nx, num_slots, page_size, stride_kb, stride_kt, PAGE_SHIFT)
            _prefetch_l2(kv + o_x[:, None] + o_b[None, :], m_x[:, None] & (o_pb < 7)[None, :])
            # fresh barriers count as released: tiles 0 and 1 go without waiting
            mbarrier.wait(empty.index(buf), ((j // 2) & 1) ^ 1)
            k_smem = k_bufs.index(buf)
            k_smem.slice(0, 128, dim=1).store(_dequant_chunk(u0, s0, False, True))
            k_smem.slice(128, 128, dim=1).store(_dequant_chunk(u1, s1, False, True))
            k_smem.slice(256, 128, dim=1).store(_dequant_chunk(u2, s2, False, True))
            k_smem.slice(384, 128, dim=1).store(_dequant_chunk(u3, s3, False, True))
            kr_bufs.index(buf).store(b_r)
            fence_async_shared()  # the generic stores before the consumers' wgmma (async proxy) reads them
            _barrier()  # every producer warp stored its part
            mbarrier.arrive(full.index(buf), count=1)

    @gluon.jit
    def _ws_consume(q_smem, qr_smem, k_bufs, kr_bufs, p_smem, full, empty, q, idx, length, out, lse, o_part,
                    lse_part, S, H, TOPK, num_slots, num_splits, qk_scale, stride_qb, stride_qs, stride_qh,
                    stride_qd, stride_ib, stride_is, DV: gl.constexpr, HAS_LEN: gl.constexpr, SINGLE: gl.constexpr,
                    num_warps: gl.constexpr):  # fmt: skip
        """The two consumer warpgroups: each head's q NoPE times its power of two into f16 (the synchronous tile's
        F16 numbers), then that tile's loop body on buffer j % 2 once ``full`` says it is in, ``empty`` once both
        warpgroups' dots on it are done; then its output."""
        ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])  # q rows, 16-byte runs
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, 32, 16])  # fmt: skip
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, 256, 16])  # fmt: skip
        i_r = gl.program_id(0)
        i_hb = gl.program_id(1)
        i_sp = gl.program_id(2)
        i_b = i_r // S
        i_s = i_r % S
        b_q, b_qr = _load_q(q, i_b, i_s, i_hb, H, stride_qb, stride_qs, stride_qh, stride_qd, ld)
        b_q, b_qr, qk_h = _q_f16(b_q, b_qr, qk_scale, s_layout)  # [64, 1] each head's scale
        q_smem.store(b_q)
        qr_smem.store(b_qr)
        fence_async_shared()  # q's stores before the wgmma (async proxy) reads them
        _barrier()
        n_valid, t_lo, t_hi = _split_tiles(length, i_b, i_sp, num_splits, TOPK, HAS_LEN)
        acc = gl.zeros([64, 512], gl.float32, o_layout)
        m_i = gl.full([64], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
        l_w = gl.sum(gl.reshape(gl.zeros([64, 64], gl.float32, s_layout), [64, 2, 32]), 2)  # each warpgroup's sums
        o_ns = gl.arange(0, 64, layout=gl.SliceLayout(0, s_layout))
        p_idx = idx + i_b.to(gl.int64) * stride_ib + i_s.to(gl.int64) * stride_is
        for i_t in range(t_lo, t_hi):
            j = i_t - t_lo
            buf = j % 2
            t0 = i_t * 64
            b_ids = gl.load(p_idx + t0 + o_ns, mask=t0 + o_ns < n_valid, other=-1)  # [64] the S columns' ids
            k_tile = k_bufs.index(buf)
            mbarrier.wait(full.index(buf), (j // 2) & 1)
            b_s = _scores(q_smem, qr_smem, k_tile, kr_bufs.index(buf), s_layout)  # [64, 64]
            b_ids = gl.where(b_ids < num_slots, b_ids, -1)  # past the cache: invalid too
            # P_IN_USE as the V4 tile passes it (the barrier before ``empty``'s arrive below already orders both
            # warpgroups' last PV before this P store, so it is redundant; kept as measured)
            acc, m_i, l_w = _softmax_pv(b_s, b_ids, qk_h, m_i, l_w, acc, p_smem, k_tile, True, True, True)
            _barrier()  # both warpgroups' dots on this buffer are done
            mbarrier.arrive(empty.index(buf), count=1)
        _epilogue(acc, m_i, l_w, out, lse, o_part, lse_part, i_r, i_b, i_s, i_hb, i_sp, S, H, num_splits, DV, SINGLE)

    @gluon.jit
    def _sparse_decode_v32_sm90_ws_kernel(
        q, kv, idx, length, out, lse, o_part, lse_part,
        S, H, TOPK, page_size, stride_kb, stride_kt, num_slots, num_splits, qk_scale,
        stride_qb, stride_qs, stride_qh, stride_qd, stride_ib, stride_is,
        DV: gl.constexpr, HAS_LEN: gl.constexpr, SINGLE: gl.constexpr, PAGE_SHIFT: gl.constexpr,
        PRODUCER_WARPS: gl.constexpr, PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr,
    ):  # fmt: skip
        """The synchronous tile's grid and contract, split into a producer warpgroup and two consumer warpgroups
        (``num_warps`` = 8, the default partition)."""
        gl.static_assert(num_warps == 8, "two consumer warpgroups")
        q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 512], gl.float16)
        qr_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 64], gl.bfloat16)
        p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, 64], gl.float16)
        q_smem = gl.allocate_shared_memory(gl.float16, [64, 512], q_sl)
        qr_smem = gl.allocate_shared_memory(gl.bfloat16, [64, 64], qr_sl)
        k_bufs = gl.allocate_shared_memory(gl.float16, [2, 64, 512], q_sl)
        kr_bufs = gl.allocate_shared_memory(gl.bfloat16, [2, 64, 64], qr_sl)
        p_smem = gl.allocate_shared_memory(gl.float16, [64, 64], p_sl)
        full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(full.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        fence_async_shared()  # the barriers' init before any partition uses them
        gl.warp_specialize(
            [
                (_ws_consume, (q_smem, qr_smem, k_bufs, kr_bufs, p_smem, full, empty, q, idx, length, out, lse,
                               o_part, lse_part, S, H, TOPK, num_slots, num_splits, qk_scale, stride_qb, stride_qs,
                               stride_qh, stride_qd, stride_ib, stride_is, DV, HAS_LEN, SINGLE, num_warps)),
                (_ws_produce, (k_bufs, kr_bufs, full, empty, kv, idx, length, S, TOPK, page_size, stride_kb,
                               stride_kt, num_slots, num_splits, stride_ib, stride_is, HAS_LEN, PAGE_SHIFT,
                               PRODUCER_WARPS)),
            ],
            [PRODUCER_WARPS],
            [PRODUCER_REGS],
        )  # fmt: skip


def sparse_decode_v32_sm90_ws_fwd(
    q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, length: torch.Tensor | None, out: torch.Tensor,
    lse: torch.Tensor, o_part: torch.Tensor, lse_part: torch.Tensor, *, page_size: int, stride_kb: int,
    stride_kt: int, num_slots: int, splits: int, qk_scale: float, d_v: int,
) -> None:  # fmt: skip
    """Launch the warp-specialized f16 tile: the arguments, shapes and dtypes of
    :func:`~sparsemla.kernels.sparse_decode.gluon_v32_sm90.sparse_decode_v32_sm90_fwd` less its options (always f16
    with the e4m3 conversion instructions; q [B, s_q, H, 576] bf16, the fp8_656 cache as uint8, indices
    [B, s_q, topk] int32): the synchronous f16 tile's results bit for bit."""
    if not sync_tile.available():
        raise dev.UnsupportedDevice(f"the V3.2 Gluon tile needs Triton >= 3.6's Gluon; this is {triton.__version__}")
    batch, s_q, heads, _ = q.shape
    _sparse_decode_v32_sm90_ws_kernel[(batch * s_q, triton.cdiv(heads, BLOCK_H), splits)](
        q, kv, indices, length if length is not None else indices, out, lse, o_part, lse_part,
        s_q, heads, indices.shape[2], page_size, stride_kb, stride_kt, num_slots, splits, qk_scale,
        q.stride(0), q.stride(1), q.stride(2), q.stride(3), indices.stride(0), indices.stride(1),
        DV=d_v, HAS_LEN=length is not None, SINGLE=splits == 1, PAGE_SHIFT=page_shift(page_size),
        PRODUCER_WARPS=PRODUCER_WARPS, PRODUCER_REGS=PRODUCER_REGS, num_warps=NUM_WARPS, maxnreg=MAXNREG,
    )  # fmt: skip


__all__ = ["MAXNREG", "PRODUCER_REGS", "SHARED_BYTES", "sparse_decode_v32_sm90_ws_fwd"]
