"""Exploratory (not in the package): sm_90's Gluon V4 decode tile (``sparse_decode/gluon_sm90.py``) with warp
specialization, so that gathering and dequantizing a tile overlaps the dots of the one before.

Why: the package's Gluon tile is synchronous. Each of its 139,776 B programs (one an SM) gathers a tile, then scores
it, runs the softmax and multiplies P V, in turn; only another SM's work overlaps its gather. Here one producer
warpgroup (4 warps) gathers and dequantizes tile i + 1 into the second of two tile buffers while the two consumer
warpgroups (the default partition, 8 warps) run tile i's dots and softmax exactly as the synchronous tile does:

* shared memory: q [64, 512] + 2 x the tile [64, 512] + P [64, 64], bf16 = 204,800 B, plus mbarriers and scratch;
* mbarriers ``full[s]`` (the producer's tile s is in; arrive once the producer warps stored and fenced) and
  ``empty[s]`` (both consumer warpgroups' dots on tile s are done; the producer waits before overwriting);
* registers: 12 warps share 64K: ``maxnreg`` 168 a thread at launch, the producer partition ``PRODUCER_REGS``, the
  consumers what is left (setmaxnreg).

The consumers' arithmetic is the synchronous tile's, on the same dequantized bf16 values, so the outputs must equal
the package's Gluon tile bit for bit (``bench`` checks it next to the fp32 reference).

    PYTHONPATH=src:. .venv/bin/python results/bench/explore/gluon_ws_decode.py aot     # here: sm_90 cubin facts
    PYTHONPATH=src:. .venv/bin/python results/bench/explore/gluon_ws_decode.py build   # here: .gpu-cubins/gluon_ws
    run(command="SHA=<sha> bash results/bench/explore/gpu_t38.sh gluonws", carry=[".gpu-cubins/gluon_ws", ".gpu"])
"""

from __future__ import annotations

import contextlib
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

from sparsemla.kernels.sparse_decode import gluon_sm90 as G  # noqa: E402
from sparsemla.kernels.sparse_decode.gluon_sm90 import (  # noqa: E402 - the package tile's Gluon helpers
    LN2,
    LOG2E,
    ROPE_OFFSET,
    TWO_POW_LIFT_F,
    _barrier,
    _gather_store_tile,
    _prefetch_rows,
    _split_range,
    _tile_ids,
)

app = typer.Typer(add_completion=False)

PRODUCER_WARPS = gl.constexpr(4)  # one warpgroup
MAXNREG = 168  # 12 warps x 32 threads x 168 = 64,512 of the SM's 65,536 registers


@gluon.jit
def _row_and_split(S, HEADS_FASTEST: gl.constexpr):
    """(i_b, i_s, i_hb, i_sp) of this program in decode_grid's layout."""
    if HEADS_FASTEST:
        i_r = gl.program_id(1)
        i_hb = gl.program_id(0)
    else:
        i_r = gl.program_id(0)
        i_hb = gl.program_id(1)
    return i_r // S, i_r % S, i_hb, gl.program_id(2)


@gluon.jit
def _ws_produce(k_bufs, full, empty, cache, cache_x, idx, idx_x, length, length_x,
                S, TOPK, TOPK_X, page_size, page_stride, page_size_x, page_stride_x, num_splits,
                stride_ib, stride_is, stride_xb, stride_xs,
                BLOCK_N: gl.constexpr, INT_DEQUANT: gl.constexpr, Q_LIFT: gl.constexpr, HAS_LEN: gl.constexpr,
                HAS_EXTRA: gl.constexpr, HAS_LEN_X: gl.constexpr, PAGE_SHIFT: gl.constexpr,
                PAGE_SHIFT_X: gl.constexpr, HEADS_FASTEST: gl.constexpr, PREFETCH: gl.constexpr,
                PF_STRIDE: gl.constexpr):  # fmt: skip
    """The producer warpgroup: tile i of this split into buffer i % 2 (after the consumers released it), then
    ``full[i % 2]``. PREFETCH > 0: the rows of the tile PREFETCH past the one gathered go into L2 first."""
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [PRODUCER_WARPS, 1], [1, 0])
    pf: gl.constexpr = gl.BlockedLayout([1, 1], [4, 8], [PRODUCER_WARPS, 1], [1, 0])
    i_b, i_s, i_hb, i_sp = _row_and_split(S, HEADS_FASTEST)
    n_main, n_x, t_main, t_lo, t_hi = _split_range(length, length_x, i_b, i_sp, num_splits, TOPK, TOPK_X, BLOCK_N,
                                                   HAS_LEN, HAS_EXTRA, HAS_LEN_X)  # fmt: skip
    p_idx = idx + i_b.to(gl.int64) * stride_ib + i_s.to(gl.int64) * stride_is
    p_idx_x = idx_x + i_b.to(gl.int64) * stride_xb + i_s.to(gl.int64) * stride_xs
    o_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld))
    o_d = gl.arange(0, 64, layout=gl.SliceLayout(0, ld))
    NPF: gl.constexpr = (576 - 1 + PF_STRIDE - 1) // PF_STRIDE + 1
    o_pb = gl.arange(0, triton.next_power_of_2(NPF), layout=gl.SliceLayout(0, pf))
    o_b = gl.minimum(o_pb * PF_STRIDE, 575)
    m_b = o_pb < NPF
    o_np = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, pf))
    for i_t in range(t_lo, t_hi):
        j = i_t - t_lo
        buf = j % 2
        phase = (j // 2) & 1
        if PREFETCH > 0:
            b_pf = _tile_ids(p_idx, p_idx_x, n_main, n_x, t_main, i_t + PREFETCH, t_hi, o_np, BLOCK_N)
            _prefetch_rows(cache, cache_x, b_pf, i_t + PREFETCH < t_main, page_size, page_stride, page_size_x,
                           page_stride_x, o_b, m_b, PAGE_SHIFT, PAGE_SHIFT_X)  # fmt: skip
        b_idx = _tile_ids(p_idx, p_idx_x, n_main, n_x, t_main, i_t, t_hi, o_n, BLOCK_N)  # [BLOCK_N] slot ids
        in_main = i_t < t_main
        p_cache = gl.where(in_main, cache, cache_x)
        mbarrier.wait(empty.index(buf), phase ^ 1)  # fresh barriers count as released: the first two tiles go
        _gather_store_tile(p_cache, b_idx, in_main, page_size, page_stride, page_size_x, page_stride_x,
                           k_bufs.index(buf), o_d, INT_DEQUANT, Q_LIFT, PAGE_SHIFT, PAGE_SHIFT_X)  # fmt: skip
        fence_async_shared()  # the generic stores before the consumers' wgmma (async proxy) reads
        _barrier()  # every producer warp stored its part
        mbarrier.arrive(full.index(buf), count=1)


@gluon.jit
def _ws_consume(q_smem, k_bufs, p_smem, full, empty, idx, idx_x, length, length_x, sink, out, lse, o_part, lse_part,
                S, H, H_OUT, TOPK, TOPK_X, num_splits, qk_scale, stride_ib, stride_is, stride_xb, stride_xs,
                DV: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, HAS_LEN: gl.constexpr,
                HAS_EXTRA: gl.constexpr, HAS_LEN_X: gl.constexpr, HAS_SINK: gl.constexpr, SINGLE: gl.constexpr,
                HEADS_FASTEST: gl.constexpr, Q_LIFT: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
    """The two consumer warpgroups: the synchronous tile's loop body on buffer i % 2 once ``full`` says it is in,
    ``empty`` once both warpgroups' dots on it are done; then the output (as the synchronous tile writes it)."""
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, 32, 16])  # fmt: skip
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 2],
                                                       instr_shape=[16, 256, 16])  # fmt: skip
    i_b, i_s, i_hb, i_sp = _row_and_split(S, HEADS_FASTEST)
    i_r = i_b * S + i_s
    n_main, n_x, t_main, t_lo, t_hi = _split_range(length, length_x, i_b, i_sp, num_splits, TOPK, TOPK_X, BLOCK_N,
                                                   HAS_LEN, HAS_EXTRA, HAS_LEN_X)  # fmt: skip
    p_idx = idx + i_b.to(gl.int64) * stride_ib + i_s.to(gl.int64) * stride_is
    p_idx_x = idx_x + i_b.to(gl.int64) * stride_xb + i_s.to(gl.int64) * stride_xs
    o_ns = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, s_layout))
    acc = gl.zeros([BLOCK_H, 512], gl.float32, o_layout)
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, s_layout))
    l_i = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, s_layout))
    for i_t in range(t_lo, t_hi):
        j = i_t - t_lo
        buf = j % 2
        phase = (j // 2) & 1
        b_ids = _tile_ids(p_idx, p_idx_x, n_main, n_x, t_main, i_t, t_hi, o_ns, BLOCK_N)  # along S's columns
        k_tile = k_bufs.index(buf)
        mbarrier.wait(full.index(buf), phase)
        b_s = warpgroup_mma(q_smem, k_tile.permute((1, 0)), gl.zeros([BLOCK_H, BLOCK_N], gl.float32, s_layout),
                            use_acc=False, is_async=True)  # fmt: skip
        b_s = warpgroup_mma_wait(num_outstanding=0, deps=(b_s,))
        b_s = gl.where((b_ids >= 0)[None, :], b_s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(b_s, 1))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        b_p = gl.exp2(b_s - m_use[:, None])
        l_i = l_i * alpha + gl.sum(b_p, 1)
        m_i = m_new
        _barrier()  # both warpgroups' PV of the last tile (each waited) are done before P is replaced
        p_smem.store(b_p.to(gl.bfloat16))
        fence_async_shared()
        _barrier()  # both halves of P are in
        alpha_o = gl.convert_layout(alpha, gl.SliceLayout(1, o_layout))
        acc = warpgroup_mma(p_smem, k_tile, acc * alpha_o[:, None], is_async=True)  # [BLOCK_H, 512]
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        _barrier()  # both warpgroups' dots on this buffer are done
        mbarrier.arrive(empty.index(buf), count=1)

    o_hs = i_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, s_layout))
    m_hs = o_hs < H
    lse2 = gl.where(l_i > 0.0, m_i + gl.log2(l_i), float("-inf"))
    inv_l = gl.where(l_i > 0.0, 1.0 / l_i, 0.0)
    o_ho = i_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, o_layout))
    o_co = gl.arange(0, 512, layout=gl.SliceLayout(0, o_layout))
    if SINGLE:
        if HAS_SINK:
            b_sink = gl.load(sink + o_hs, mask=m_hs, other=float("-inf")) * LOG2E
            inv_l = gl.where(l_i > 0.0, inv_l / (1.0 + gl.exp2(b_sink - lse2)), 0.0)
        gl.store(lse + i_r.to(gl.int64) * H_OUT + o_hs, lse2 * LN2, mask=m_hs)
        p_o = out + i_r.to(gl.int64) * H_OUT * DV + o_ho.to(gl.int64)[:, None] * DV + o_co[None, :]
    else:
        i_part = i_r.to(gl.int64) * num_splits + i_sp
        gl.store(lse_part + i_part * H + o_hs, lse2, mask=m_hs)
        p_o = o_part + (i_part * H + o_ho.to(gl.int64))[:, None] * 512 + o_co[None, :]
    b_o = acc * gl.convert_layout(inv_l, gl.SliceLayout(1, o_layout))[:, None]
    if Q_LIFT:
        b_o = b_o * gl.where(o_co < ROPE_OFFSET, TWO_POW_LIFT_F, 1.0)[None, :]
    gl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=(o_ho < H)[:, None] & (o_co < DV)[None, :])


@gluon.jit
def _ws_decode_kernel(
    q, cache, idx, length, cache_x, idx_x, length_x, sink,
    out, lse, o_part, lse_part,
    S, H, H_OUT, TOPK, TOPK_X, page_size, page_stride, page_size_x, page_stride_x, num_splits, qk_scale,
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_ib, stride_is, stride_xb, stride_xs,
    DV: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, INT_DEQUANT: gl.constexpr,
    HAS_LEN: gl.constexpr, HAS_EXTRA: gl.constexpr, HAS_LEN_X: gl.constexpr, HAS_SINK: gl.constexpr,
    SINGLE: gl.constexpr, PAGE_SHIFT: gl.constexpr, PAGE_SHIFT_X: gl.constexpr, HEADS_FASTEST: gl.constexpr,
    PREFETCH: gl.constexpr, PF_STRIDE: gl.constexpr, Q_LIFT: gl.constexpr, IDS_AHEAD: gl.constexpr,
    PRODUCER_REGS: gl.constexpr, num_warps: gl.constexpr,
):  # fmt: skip
    """The synchronous Gluon tile's contract and grid (``gluon_sm90._sparse_decode_sm90_kernel``; IDS_AHEAD ignored:
    the producer runs ahead by itself), split into a producer and two consumer warpgroups."""
    gl.static_assert(num_warps == 8, "two consumer warpgroups")
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    q_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, 512], gl.bfloat16)
    k_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, 512], gl.bfloat16)
    p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_H, BLOCK_N], gl.bfloat16)
    i_b, i_s, i_hb, i_sp = _row_and_split(S, HEADS_FASTEST)
    o_hl = i_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ld))
    o_c = gl.arange(0, 512, layout=gl.SliceLayout(0, ld))
    p_q = q + i_b.to(gl.int64) * stride_qb + i_s.to(gl.int64) * stride_qs + o_hl.to(gl.int64)[:, None] * stride_qh
    b_q = gl.load(p_q + o_c[None, :] * stride_qd, mask=(o_hl < H)[:, None], other=0.0)  # [BLOCK_H, 512] bf16
    if Q_LIFT:
        b_q = b_q * gl.where(o_c < ROPE_OFFSET, TWO_POW_LIFT_F, 1.0).to(gl.bfloat16)[None, :]
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, 512], q_sl, b_q)
    k_bufs = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, 512], k_sl)
    p_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, BLOCK_N], p_sl)
    full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    fence_async_shared()  # q's stores before the consumers' wgmma reads it
    gl.warp_specialize(
        [
            (_ws_consume, (q_smem, k_bufs, p_smem, full, empty, idx, idx_x, length, length_x, sink, out, lse,
                           o_part, lse_part, S, H, H_OUT, TOPK, TOPK_X, num_splits, qk_scale, stride_ib, stride_is,
                           stride_xb, stride_xs, DV, BLOCK_H, BLOCK_N, HAS_LEN, HAS_EXTRA, HAS_LEN_X, HAS_SINK,
                           SINGLE, HEADS_FASTEST, Q_LIFT, num_warps)),
            (_ws_produce, (k_bufs, full, empty, cache, cache_x, idx, idx_x, length, length_x, S, TOPK, TOPK_X,
                           page_size, page_stride, page_size_x, page_stride_x, num_splits, stride_ib, stride_is,
                           stride_xb, stride_xs, BLOCK_N, INT_DEQUANT, Q_LIFT, HAS_LEN, HAS_EXTRA, HAS_LEN_X,
                           PAGE_SHIFT, PAGE_SHIFT_X, HEADS_FASTEST, PREFETCH, PF_STRIDE)),
        ],
        [PRODUCER_WARPS],
        [PRODUCER_REGS],
    )  # fmt: skip


def _ws_fwd(producer_regs: int):
    """A stand-in for ``gluon_sm90.sparse_decode_sm90_fwd`` that launches the warp-specialized kernel."""

    def fwd(q, cache, indices, topk_length, cache_x, idx_x, extra_topk_length, attn_sink, out, lse, o_part,  # noqa: ANN001, ANN202
            lse_part, *, heads, page, splits, qk_scale, has_extra, grid, heads_fastest, int_dequant, page_shifts,
            prefetch=0, prefetch_stride=128, q_lift=False, ids_ahead=False):  # fmt: skip
        _, s_q, heads_out, _ = q.shape
        dummy = indices
        _ws_decode_kernel[grid](
            q, cache, indices, topk_length if topk_length is not None else dummy,
            cache_x, idx_x, extra_topk_length if extra_topk_length is not None else dummy,
            attn_sink if attn_sink is not None else dummy,
            out, lse, o_part, lse_part,
            s_q, heads, heads_out, indices.shape[2], idx_x.shape[2] if has_extra else 0, *page, splits, qk_scale,
            q.stride(0), q.stride(1), q.stride(2), q.stride(3),
            indices.stride(0), indices.stride(1), idx_x.stride(0), idx_x.stride(1),
            DV=out.shape[3], BLOCK_H=G.BLOCK_H, BLOCK_N=G.BLOCK_N, INT_DEQUANT=int_dequant,
            HAS_LEN=topk_length is not None, HAS_EXTRA=has_extra, HAS_LEN_X=extra_topk_length is not None,
            HAS_SINK=attn_sink is not None, SINGLE=splits == 1, PAGE_SHIFT=page_shifts[0],
            PAGE_SHIFT_X=page_shifts[1], HEADS_FASTEST=heads_fastest, PREFETCH=prefetch, PF_STRIDE=prefetch_stride,
            Q_LIFT=q_lift and int_dequant, IDS_AHEAD=ids_ahead, PRODUCER_REGS=producer_regs, num_warps=8,
            maxnreg=MAXNREG,
        )  # fmt: skip

    return fwd


@contextlib.contextmanager
def warp_specialized(producer_regs: int = 72):
    """Within the block the package's Gluon tile launches as this file's warp-specialized kernel."""
    real = G.sparse_decode_sm90_fwd
    G.sparse_decode_sm90_fwd = _ws_fwd(producer_regs)
    try:
        yield
    finally:
        G.sparse_decode_sm90_fwd = real


VARIANTS = ("package", "ws88", "ws120", "ws136")
SHAPES = "8x64,64x64,128x64,1024x64,8192x64,8x128,64x128,128x128"  # rows x heads


def _inputs(rows: int, heads: int, device: str, fill: bool = True, seed: int = 0) -> dict:
    from benchmarks.decode import Shape, make_inputs

    kw = make_inputs(Shape(rows, heads, 128, 512), seed=seed, device=device, fill=fill)
    keys = ("q", "k_cache", "indices", "extra_k_cache", "extra_indices_in_kvcache", "attn_sink", "softmax_scale")
    return {k: kw[k] for k in keys}


def _launch(variant: str, kw: dict) -> torch.Tensor:
    """out of one call: ``package`` = the launcher's default (the synchronous Gluon tile from 8 programs on sm_90),
    ``wsNN`` = the same launch warp-specialized with NN registers a producer thread."""
    from sparsemla.kernels.sparse_decode import triton as T

    if variant == "package":
        return T.sparse_decode_fwd(**kw, head_dim_v=512)[0]
    with warp_specialized(int(variant[2:])):
        return T.sparse_decode_fwd(**kw, head_dim_v=512)[0]


@app.command()
def aot(rows: int = 1024, heads: int = 64) -> None:
    """Here (no GPU): compile for sm_90 with this Triton; shared memory, registers, spills, loop op counts."""
    from anatomy_lib import loop_body

    from sparsemla.kernels import aot as A
    from sparsemla.kernels import device as dev

    info = dev.target("sm_90")
    got, sink = {}, []
    with A.compile_only("sm_90", info, "gluon_ws", sink), A.watch_launches(lambda n, k: got.setdefault(n, k),
                                                                           compile_only=True):  # fmt: skip
        kw = _inputs(rows, heads, "cpu", fill=False)
        for variant in VARIANTS:
            got.clear()
            sink.clear()
            _launch(variant, kw)
            name = next(iter(got))
            res = next(r for r in sink if r.kernel == name)
            sass = A._cubin_tool(got[name].asm["cubin"], "-sass")
            body = loop_body(sass)
            ops = Counter(re.sub(r"^@!?U?P\w+\s+", "", op).split()[0] for op in body)
            bars = Counter(m for m in re.findall(r"(BAR\.\w+(?:\.\w+)*\s+[^;]*|SYNCS\.\w+(?:\.\w+)*)", sass))
            print(f"{variant}: {name} shared {res.shared} registers {res.registers} spilled {res.spilled} "
                  f"loop {len(body)}")  # fmt: skip
            print("  " + " ".join(f"{o}:{n}" for o, n in ops.most_common(24)))
            print("  barriers: " + "; ".join(f"{b.strip()} x{n}" for b, n in bars.most_common(12)))


@app.command()
def build(out: Path = Path(".gpu-cubins/gluon_ws"), shapes: str = SHAPES) -> None:
    """Here (no GPU): every variant's launches at SHAPES compiled by this Triton into OUT, for `bench`."""
    from benchmarks import prod_cubins

    def workload() -> None:
        for rows, heads in (map(int, s.split("x")) for s in shapes.split(",")):
            kw = _inputs(rows, heads, "cpu", fill=False)
            for variant in VARIANTS:
                _launch(variant, kw)

    added = prod_cubins.build(workload, out, "native")
    print(f"Triton {triton.__version__}: {len(added)} cubins added to {out}")


@app.command()
def bench(cubins: Path = Path(".gpu-cubins/gluon_ws"), shapes: str = SHAPES,
          out: Path = Path("gluon_ws_decode.json"), git_sha: str = "unknown") -> None:  # fmt: skip
    """GPU: every variant from CUBINS (Triton 3.8) replayed; bit-equality with the package's tile and the error
    against the fp32 reference (<= 1024 rows); CUDA-graph median (2 input sets rotated); JSON to OUT."""
    import json

    from triton.testing import do_bench

    from benchmarks import prod_cubins
    from benchmarks.decode import graphed
    from sparsemla.kernels.sparse_decode.reference import sparse_decode_reference

    rows_out: list[dict] = []
    with prod_cubins.Replayer(cubins) as counts:
        for rows, heads in (map(int, s.split("x")) for s in shapes.split(",")):
            sets = [_inputs(rows, heads, "cuda", seed=100 * rows + i) for i in range(2)]
            want = sparse_decode_reference(**sets[0], head_dim_v=512)[0].float() if rows <= 1024 else None
            base = None
            for variant in VARIANTS:
                row = dict(rows=rows, H=heads, variant=variant)
                try:
                    got = _launch(variant, sets[0])
                    base = got if base is None else base
                    ref = base.float() if want is None else want
                    runs = [graphed(lambda kw=kw, v=variant: _launch(v, kw)) for kw in sets]
                    st = {"i": 0}

                    def step(runs=runs, st=st) -> None:
                        st["i"] += 1
                        runs[st["i"] % 2]()

                    us = do_bench(step, warmup=10, rep=50, return_mode="median") * 1e3
                    row.update(us=round(us, 2), err=float((got.float() - ref).norm() / ref.norm()),
                               equal_to_package=bool(torch.equal(got, base)))  # fmt: skip
                except Exception as exc:  # noqa: BLE001 - a failing variant is a finding
                    row["error"] = (str(exc).splitlines() or [repr(exc)])[-1][:300]
                rows_out.append(row)
                print(json.dumps(row), flush=True)
            if rows <= 1024:  # valid lengths (some 0), -1 entries: every variant bit-equal to the package's tile
                kw = dict(sets[0])
                gen = torch.Generator(device="cuda").manual_seed(rows)
                kw["topk_length"] = torch.randint(0, 129, (rows,), device="cuda", dtype=torch.int32, generator=gen)
                kw["extra_topk_length"] = torch.randint(0, 513, (rows,), device="cuda", dtype=torch.int32,
                                                        generator=gen)  # fmt: skip
                kw["topk_length"][::5] = 0
                kw["indices"] = kw["indices"].clone()
                kw["indices"][:, :, 100:] = -1
                ref = _launch("package", kw)
                for variant in VARIANTS[1:]:
                    row = dict(rows=rows, H=heads, variant=variant, case="lengths")
                    try:
                        row["equal_to_package"] = bool(torch.equal(_launch(variant, kw), ref))
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
