"""sm_90's Gluon V4 decode tile (:mod:`~sparsemla.kernels.sparse_decode.gluon_sm90`) warp-specialized: gathering
and dequantizing a tile overlaps the dots of the one before.

Why: the synchronous tile gathers a tile, then scores it, runs the softmax and multiplies P V, in turn, and one
139,776 B program fills an SM, so nothing on the SM overlaps its gather. Here a producer warpgroup (4 warps) gathers
and dequantizes tile i + 1 into the second of two tile buffers while the two consumer warpgroups (the default
partition, 8 warps) run tile i's dots and softmax exactly as the synchronous tile does, on the same dequantized bf16
values: the outputs are the synchronous tile's bit for bit.

* shared memory: q [64, 512] + 2 x the tile [64, 512] + P [64, 64], bf16 = 204,800 B, plus four mbarriers and the
  reductions' scratch (ahead of time, Triton 3.8: 205,348 B), one program per SM as the synchronous tile;
* mbarriers ``full[s]`` (the producer's tile is in buffer s: arrived once its warps stored and fenced) and
  ``empty[s]`` (both consumer warpgroups' dots on buffer s are done: the producer waits before overwriting it);
* registers: 12 warps share the SM's 64K: ``maxnreg`` :data:`MAXNREG` a thread at launch, the producer
  :data:`PRODUCER_REGS`, the consumers what is left (``setmaxnreg``).

Chosen by ``DecodeConfig.warp_specialize`` (default: from 4 tiles a program, ``warp_specialize_default``); the same
contract, options (L2 prefetch by the producer, the lift, ids_ahead) and grid as the synchronous tile.
"""

from __future__ import annotations

import torch

from sparsemla.kernels.sparse_decode import gluon_sm90 as sync_tile

BLOCK_H = sync_tile.BLOCK_H
BLOCK_N = sync_tile.BLOCK_N
NUM_WARPS = sync_tile.NUM_WARPS  # the consumers: two warpgroups
PRODUCER_WARPS = 4  # one warpgroup
# 12 warps x 32 threads x 168 = 64,512 of the SM's 65,536 registers. The producer's 120: no spill with Triton 3.8
# (88: slower, 136: the same; results/bench/explore/gluon_ws_decode-native-h100-f271023.json), 8 B with Triton 3.6.
MAXNREG = 168
PRODUCER_REGS = 120
# q + two tiles + P, bf16, the reductions' scratch and four 8-byte mbarriers (ahead of time, Triton 3.8: 205,348 B)
SHARED_BYTES = (BLOCK_H + 2 * BLOCK_N) * 512 * 2 + BLOCK_H * BLOCK_N * 2 + 512 + 64

if sync_tile._HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        fence_async_shared,
        mbarrier,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    from sparsemla.kernels.sparse_decode.gluon_sm90 import (
        _barrier,
        _gather_store_tile,
        _index_rows,
        _prefetch_offsets,
        _prefetch_rows,
        _program_coords,
        _q_to_smem,
        _softmax_pv,
        _split_range,
        _store_output,
        _tile_ids,
    )

    @gluon.jit
    def _ws_produce(
        k_bufs, full, empty, cache, cache_x, idx, idx_x, length, length_x,
        S, TOPK, TOPK_X, page_size, page_stride, page_size_x, page_stride_x, num_splits,
        stride_ib, stride_is, stride_xb, stride_xs,
        BLOCK_N: gl.constexpr, INT_DEQUANT: gl.constexpr, Q_LIFT: gl.constexpr, HAS_LEN: gl.constexpr,
        HAS_EXTRA: gl.constexpr, HAS_LEN_X: gl.constexpr, PAGE_SHIFT: gl.constexpr, PAGE_SHIFT_X: gl.constexpr,
        HEADS_FASTEST: gl.constexpr, PREFETCH: gl.constexpr, PF_STRIDE: gl.constexpr, IDS_AHEAD: gl.constexpr,
        PRODUCER_WARPS: gl.constexpr,
    ):  # fmt: skip
        """The producer warpgroup: this split's tile j into buffer j % 2 once the consumers released it (``empty``),
        then ``full[j % 2]``. PREFETCH > 0: first the rows of the tile PREFETCH past it into L2. IDS_AHEAD: the next
        tile's slot ids are loaded before this tile's gather (the same bits)."""
        ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [PRODUCER_WARPS, 1], [1, 0])  # [BLOCK_N, 64], 16 B runs
        _, i_b, i_s, _, i_sp = _program_coords(S, HEADS_FASTEST)
        n_main, n_x, t_main, t_lo, t_hi = _split_range(length, length_x, i_b, i_sp, num_splits, TOPK, TOPK_X, BLOCK_N,
                                                       HAS_LEN, HAS_EXTRA, HAS_LEN_X)  # fmt: skip
        p_idx, p_idx_x = _index_rows(idx, idx_x, i_b, i_s, stride_ib, stride_is, stride_xb, stride_xs)
        o_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld))  # the gather's rows
        o_d = gl.arange(0, 64, layout=gl.SliceLayout(0, ld))  # a chunk's columns
        o_b, m_b, o_np = _prefetch_offsets(PF_STRIDE, BLOCK_N, PRODUCER_WARPS)
        if IDS_AHEAD:
            b_idx_n = _tile_ids(p_idx, p_idx_x, n_main, n_x, t_main, t_lo, t_hi, o_n, BLOCK_N)
        for i_t in range(t_lo, t_hi):
            j = i_t - t_lo
            buf = j % 2
            if PREFETCH > 0:
                b_pf = _tile_ids(p_idx, p_idx_x, n_main, n_x, t_main, i_t + PREFETCH, t_hi, o_np, BLOCK_N)
                _prefetch_rows(cache, cache_x, b_pf, i_t + PREFETCH < t_main, page_size, page_stride, page_size_x,
                               page_stride_x, o_b, m_b, PAGE_SHIFT, PAGE_SHIFT_X)  # fmt: skip
            if IDS_AHEAD:
                b_idx = b_idx_n
                b_idx_n = _tile_ids(p_idx, p_idx_x, n_main, n_x, t_main, i_t + 1, t_hi, o_n, BLOCK_N)
            else:
                b_idx = _tile_ids(p_idx, p_idx_x, n_main, n_x, t_main, i_t, t_hi, o_n, BLOCK_N)  # [BLOCK_N] slot ids
            in_main = i_t < t_main
            p_cache = gl.where(in_main, cache, cache_x)
            # fresh barriers count as released: tiles 0 and 1 go without waiting (phase ^ 1 of a new barrier passes)
            mbarrier.wait(empty.index(buf), ((j // 2) & 1) ^ 1)
            _gather_store_tile(p_cache, b_idx, in_main, page_size, page_stride, page_size_x, page_stride_x,
                               k_bufs.index(buf), o_d, INT_DEQUANT, Q_LIFT, PAGE_SHIFT, PAGE_SHIFT_X)  # fmt: skip
            fence_async_shared()  # the generic stores before the consumers' wgmma (async proxy) reads them
            _barrier()  # every producer warp stored its part
            mbarrier.arrive(full.index(buf), count=1)

    @gluon.jit
    def _ws_consume(
        q_smem, k_bufs, p_smem, full, empty, idx, idx_x, length, length_x, sink, out, lse, o_part, lse_part,
        S, H, H_OUT, TOPK, TOPK_X, num_splits, qk_scale, stride_ib, stride_is, stride_xb, stride_xs,
        DV: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, HAS_LEN: gl.constexpr,
        HAS_EXTRA: gl.constexpr, HAS_LEN_X: gl.constexpr, HAS_SINK: gl.constexpr, SINGLE: gl.constexpr,
        HEADS_FASTEST: gl.constexpr, Q_LIFT: gl.constexpr, IDS_AHEAD: gl.constexpr, num_warps: gl.constexpr,
    ):  # fmt: skip
        """The two consumer warpgroups: the synchronous tile's loop body on buffer j % 2 once ``full`` says it is in,
        ``empty`` once both warpgroups' dots on it are done; then the output as the synchronous tile writes it."""
        s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, 32, 16])  # fmt: skip
        o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                           instr_shape=[16, 256, 16])  # fmt: skip
        i_r, i_b, i_s, i_hb, i_sp = _program_coords(S, HEADS_FASTEST)
        n_main, n_x, t_main, t_lo, t_hi = _split_range(length, length_x, i_b, i_sp, num_splits, TOPK, TOPK_X, BLOCK_N,
                                                       HAS_LEN, HAS_EXTRA, HAS_LEN_X)  # fmt: skip
        p_idx, p_idx_x = _index_rows(idx, idx_x, i_b, i_s, stride_ib, stride_is, stride_xb, stride_xs)
        o_ns = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))  # S's columns
        acc = gl.zeros([BLOCK_H, 512], gl.float32, o_layout)
        m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
        l_i = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, s_layout))
        if IDS_AHEAD:
            b_ids_n = _tile_ids(p_idx, p_idx_x, n_main, n_x, t_main, t_lo, t_hi, o_ns, BLOCK_N)
        for i_t in range(t_lo, t_hi):
            j = i_t - t_lo
            buf = j % 2
            if IDS_AHEAD:
                b_ids = b_ids_n
                b_ids_n = _tile_ids(p_idx, p_idx_x, n_main, n_x, t_main, i_t + 1, t_hi, o_ns, BLOCK_N)
            else:
                b_ids = _tile_ids(p_idx, p_idx_x, n_main, n_x, t_main, i_t, t_hi, o_ns, BLOCK_N)  # -1: masked
            k_tile = k_bufs.index(buf)
            mbarrier.wait(full.index(buf), (j // 2) & 1)
            b_s = warpgroup_mma(q_smem, k_tile.permute((1, 0)), gl.zeros([BLOCK_H, BLOCK_N], gl.float32, s_layout),
                                use_acc=False, is_async=True)  # fmt: skip
            b_s = warpgroup_mma_wait(num_outstanding=0, deps=(b_s,))  # [BLOCK_H, BLOCK_N]: each warpgroup 32 tokens

            # no barrier since the last tile's PV (each warpgroup waited for its own): P_IN_USE
            acc, m_i, l_i = _softmax_pv(b_s, b_ids, qk_scale, m_i, l_i, acc, p_smem, k_tile, True)
            _barrier()  # both warpgroups' dots on this buffer are done
            mbarrier.arrive(empty.index(buf), count=1)
        _store_output(acc, m_i, l_i, sink, out, lse, o_part, lse_part, i_r, i_hb, i_sp, H, H_OUT, num_splits, DV,
                      BLOCK_H, HAS_SINK, SINGLE, Q_LIFT)  # fmt: skip

    @gluon.jit
    def _sparse_decode_sm90_ws_kernel(
        q, cache, idx, length, cache_x, idx_x, length_x, sink,
        out, lse, o_part, lse_part,
        S, H, H_OUT, TOPK, TOPK_X, page_size, page_stride, page_size_x, page_stride_x, num_splits, qk_scale,
        stride_qb, stride_qs, stride_qh, stride_qd,
        stride_ib, stride_is, stride_xb, stride_xs,
        DV: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, INT_DEQUANT: gl.constexpr,
        HAS_LEN: gl.constexpr, HAS_EXTRA: gl.constexpr, HAS_LEN_X: gl.constexpr, HAS_SINK: gl.constexpr,
        SINGLE: gl.constexpr, PAGE_SHIFT: gl.constexpr, PAGE_SHIFT_X: gl.constexpr, HEADS_FASTEST: gl.constexpr,
        PREFETCH: gl.constexpr, PF_STRIDE: gl.constexpr, Q_LIFT: gl.constexpr, IDS_AHEAD: gl.constexpr,
        PRODUCER_WARPS: gl.constexpr, PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr,
    ):  # fmt: skip
        """The synchronous tile's grid and contract (``gluon_sm90._sparse_decode_sm90_kernel``), split into a
        producer warpgroup and two consumer warpgroups (``num_warps`` = 8, the default partition)."""
        gl.static_assert(num_warps == 8, "two consumer warpgroups")
        gl.static_assert(BLOCK_H == 64 and BLOCK_N == 64, "the 64 x 64 tile")
        k_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 512], gl.bfloat16)
        p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], gl.bfloat16)
        _, i_b, i_s, i_hb, _ = _program_coords(S, HEADS_FASTEST)
        q_smem = _q_to_smem(q, i_b, i_s, i_hb, H, stride_qb, stride_qs, stride_qh, stride_qd, BLOCK_H, Q_LIFT,
                            num_warps)  # fmt: skip
        k_bufs = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, 512], k_sl)
        p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, BLOCK_N], p_sl)
        full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(2):
            mbarrier.init(full.index(i), count=1)
            mbarrier.init(empty.index(i), count=1)
        fence_async_shared()  # q's stores and the barriers' init before any partition uses them
        gl.warp_specialize(
            [
                (_ws_consume, (q_smem, k_bufs, p_smem, full, empty, idx, idx_x, length, length_x, sink, out, lse,
                               o_part, lse_part, S, H, H_OUT, TOPK, TOPK_X, num_splits, qk_scale, stride_ib,
                               stride_is, stride_xb, stride_xs, DV, BLOCK_H, BLOCK_N, HAS_LEN, HAS_EXTRA, HAS_LEN_X,
                               HAS_SINK, SINGLE, HEADS_FASTEST, Q_LIFT, IDS_AHEAD, num_warps)),
                (_ws_produce, (k_bufs, full, empty, cache, cache_x, idx, idx_x, length, length_x, S, TOPK, TOPK_X,
                               page_size, page_stride, page_size_x, page_stride_x, num_splits, stride_ib, stride_is,
                               stride_xb, stride_xs, BLOCK_N, INT_DEQUANT, Q_LIFT, HAS_LEN, HAS_EXTRA, HAS_LEN_X,
                               PAGE_SHIFT, PAGE_SHIFT_X, HEADS_FASTEST, PREFETCH, PF_STRIDE, IDS_AHEAD,
                               PRODUCER_WARPS)),
            ],
            [PRODUCER_WARPS],
            [PRODUCER_REGS],
        )  # fmt: skip


def sparse_decode_sm90_ws_fwd(
    q: torch.Tensor, cache: torch.Tensor, indices: torch.Tensor, topk_length: torch.Tensor | None,
    cache_x: torch.Tensor, idx_x: torch.Tensor, extra_topk_length: torch.Tensor | None,
    attn_sink: torch.Tensor | None, out: torch.Tensor, lse: torch.Tensor, o_part: torch.Tensor,
    lse_part: torch.Tensor, *, heads: int, page: tuple[int, int, int, int], splits: int, qk_scale: float,
    has_extra: bool, grid: tuple[int, int, int], heads_fastest: bool, int_dequant: bool,
    page_shifts: tuple[int, int], prefetch: int = 0, prefetch_stride: int = 128, q_lift: bool = False,
    ids_ahead: bool = False,
) -> None:  # fmt: skip
    """Launch the warp-specialized tile: the arguments, shapes and dtypes of
    :func:`~sparsemla.kernels.sparse_decode.gluon_sm90.sparse_decode_sm90_fwd` (q [B, s_q, H_OUT, 512] bf16, uint8
    V4 page views, indices [B, s_q, topk] int32, out [B, s_q, H_OUT, DV] bf16, lse [B, s_q, H_OUT] fp32, partials
    [rows, splits, heads, 512] / [rows, splits, heads] when ``splits`` > 1), the same results bit for bit."""
    if not sync_tile._HAVE_GLUON:
        raise RuntimeError("DecodeConfig.warp_specialize needs Triton's Gluon (triton.experimental.gluon, >= 3.6)")
    args, constexprs = sync_tile.launch_arguments(
        q, cache, indices, topk_length, cache_x, idx_x, extra_topk_length, attn_sink, out, lse, o_part, lse_part,
        heads=heads, page=page, splits=splits, qk_scale=qk_scale, has_extra=has_extra, heads_fastest=heads_fastest,
        int_dequant=int_dequant, page_shifts=page_shifts, prefetch=prefetch, prefetch_stride=prefetch_stride,
        q_lift=q_lift, ids_ahead=ids_ahead,
    )  # fmt: skip
    _sparse_decode_sm90_ws_kernel[grid](*args, **constexprs, PRODUCER_WARPS=PRODUCER_WARPS, PRODUCER_REGS=PRODUCER_REGS,
                                        num_warps=NUM_WARPS, maxnreg=MAXNREG)  # fmt: skip


__all__ = ["MAXNREG", "PRODUCER_REGS", "SHARED_BYTES", "sparse_decode_sm90_ws_fwd"]
