"""Exploratory (not in the package; measured once and concluded: it loses 1.3-2.5x, see the end): the V4 decode for the mma.sync targets (sm_80, 86, 89,
120) as a warp-specialized Gluon kernel, the design of sm_90's ``sparse_decode/gluon_ws_sm90.py`` on ``mma_v2``.

Why: the sm_89 code path's prefill rows (1024 / 8192 rows, H = 64) run about 1.5x the wgmma path's since that one
overlaps its gather with its dots (README, thirty-first session). On sm_86/89/120 one 100 KB program fills an SM,
so nothing overlaps a program's gather but another SM's work. Here:

* a 32-head x 32-token tile: q [32, 512] + two tile buffers [32, 512] bf16 = 96 KB, plus the scores' layout
  conversion and the reductions' scratch, within 101,376 B;
* a producer warpgroup (4 warps) gathers and dequantizes tile i + 1 (the package's ``_gather_store_tile``: the
  integer e4m3 path, paging by shifts) behind Ampere mbarriers ``full`` / ``empty`` (count 1: Gluon's arrive is a
  barrier across the arriving partition, then one thread's arrive);
* eight consumer warps (the default partition, ``warps_per_cta = [2, 4]``; 4: ``[2, 2]``): S = q K^T by ``mma_v2`` over eight
  64-column chunks (operands loaded from shared memory per chunk, so q does not stay in registers), the online
  softmax, P converted to the A operand (through 2 KB of the compiler's shared scratch), O [32, 512] += P V by
  ``mma_v2``; the buffer is released once both operands are loaded;
* no register split (``setmaxnreg`` is sm_90a's; ``gluon_ampere_ws_probe.py``): 12 warps at 168 registers each.

Triton 3.6 (the GPU machine's) cannot compile warp specialization for these targets, so on the H200 this can only
run from Triton 3.8 cubins (``build`` here, ``bench`` there, in the sm89 code path: ``TRITON_OVERRIDE_ARCH=sm89``).

    PYTHONPATH=src:. .venv/bin/python results/bench/explore/gluon_mma_ws_decode.py aot --rows 1,1024  # AOT facts
    PYTHONPATH=src:. .venv/bin/python results/bench/explore/gluon_mma_ws_decode.py build  # .gpu-cubins/mma_ws/sm89
    run(command="SHA=<sha> bash results/bench/explore/gpu_t38.sh mmaws", carry=[".gpu-cubins/mma_ws", ".gpu"])

Session 31, ahead of time with Triton 3.8 (H = 64, top-k 128 + 512): it compiles for sm_80 / 86 / 89 / 120 within
the budget (100,388 B; sm_120 99,364 B). Eight consumer warps: 168 registers, nothing spilled on sm_80 / 86 / 89,
48 B on sm_120. Four: 255 registers, 120 B spilled (sm_120 152 B; the output's accumulator alone is 128 registers a
thread, and without ``setmaxnreg`` the producer's warps get as many).

Session 32, H100, sm89 code path, Triton 3.8 cubins, CUDA-graph replay, at the H100's blocks per SM
(``gluon_mma_ws_decode-sm89-h100-9b1a16d.json``; errors against the fp32 reference 1.0e-3 - 1.9e-3 for every
variant): the package's launcher against four / eight consumer warps, µs: 1 row 12.8 / 16.0 / 16.7; 64 rows
50.6 / 80.2 / 88.6; 128 rows 77.0 / 153 / 167; 1024 rows 528 / 1,188 / 1,300; 8192 rows 4,115 / 8,867 / 9,862; H =
128, 64 rows 74.3 / 157 / 172. Concluded: no variant enters the package. Not profiled; what differs from the
package's kernel: this 32 x 32 tile loads q from shared memory again for every 64-column chunk of both dots and hands
over 32 tokens at a time, where the package runs 32 x 64 tiles in two halves (``DecodeConfig.sub_tiles``).
"""

from __future__ import annotations

from pathlib import Path

import torch
import triton
import typer
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import mbarrier, mma_v2

from sparsemla.kernels.paging import page_shift
from sparsemla.kernels.sparse_decode import triton as T
from sparsemla.kernels.sparse_decode.gluon_sm90 import (
    LN2,
    LOG2E,
    _gather_store_tile,
    _index_rows,
    _program_coords,
    _split_range,
    _tile_ids,
)

app = typer.Typer(add_completion=False)

BLOCK_H = 32
BLOCK_N = 32
CONSUMER_WARPS = 8  # 4: 255 registers, 120-152 B spilled; 8: 168 registers (12 warps share the SM), 0-48 B
PRODUCER_WARPS = gl.constexpr(4)


@gluon.jit
def _mma_produce(k_bufs, full, empty, cache, cache_x, idx, idx_x, length, length_x,
                 S, TOPK, TOPK_X, page_size, page_stride, page_size_x, page_stride_x, num_splits,
                 stride_ib, stride_is, stride_xb, stride_xs,
                 BLOCK_N: gl.constexpr, INT_DEQUANT: gl.constexpr, HAS_LEN: gl.constexpr, HAS_EXTRA: gl.constexpr,
                 HAS_LEN_X: gl.constexpr, PAGE_SHIFT: gl.constexpr, PAGE_SHIFT_X: gl.constexpr,
                 HEADS_FASTEST: gl.constexpr):  # fmt: skip
    """The producer warpgroup: this split's tile j into buffer j % 2 once ``empty`` says the consumers loaded it."""
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [PRODUCER_WARPS, 1], [1, 0])  # [BLOCK_N, 64], 16-byte runs
    _, i_b, i_s, _, i_sp = _program_coords(S, HEADS_FASTEST)
    n_main, n_x, t_main, t_lo, t_hi = _split_range(length, length_x, i_b, i_sp, num_splits, TOPK, TOPK_X, BLOCK_N,
                                                   HAS_LEN, HAS_EXTRA, HAS_LEN_X)  # fmt: skip
    p_idx, p_idx_x = _index_rows(idx, idx_x, i_b, i_s, stride_ib, stride_is, stride_xb, stride_xs)
    o_n = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, ld))
    o_d = gl.arange(0, 64, layout=gl.SliceLayout(0, ld))
    for i_t in range(t_lo, t_hi):
        j = i_t - t_lo
        buf = j % 2
        b_idx = _tile_ids(p_idx, p_idx_x, n_main, n_x, t_main, i_t, t_hi, o_n, BLOCK_N)  # [BLOCK_N] slot ids
        in_main = i_t < t_main
        p_cache = gl.where(in_main, cache, cache_x)
        mbarrier.wait(empty.index(buf), ((j // 2) & 1) ^ 1)  # fresh barriers pass: tiles 0 and 1 go at once
        _gather_store_tile(p_cache, b_idx, in_main, page_size, page_stride, page_size_x, page_stride_x,
                           k_bufs.index(buf), o_d, INT_DEQUANT, False, PAGE_SHIFT, PAGE_SHIFT_X)  # fmt: skip
        mbarrier.arrive(full.index(buf))  # the partition's stores, then one release; the consumers' wait acquires


@gluon.jit
def _mma_consume(q_smem, k_bufs, full, empty, idx, idx_x, length, length_x, sink, out, lse, o_part, lse_part,
                 S, H, H_OUT, TOPK, TOPK_X, num_splits, qk_scale, stride_ib, stride_is, stride_xb, stride_xs,
                 DV: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, HAS_LEN: gl.constexpr,
                 HAS_EXTRA: gl.constexpr, HAS_LEN_X: gl.constexpr, HAS_SINK: gl.constexpr, SINGLE: gl.constexpr,
                 HEADS_FASTEST: gl.constexpr, num_warps: gl.constexpr):  # fmt: skip
    """The consumer warps: QK over eight 64-column chunks, the online softmax, PV with P in registers."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[2, 0], warps_per_cta=[2, num_warps // 2],
                                                  instr_shape=[16, 8])  # fmt: skip
    a_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=8)
    b_l: gl.constexpr = gl.DotOperandLayout(operand_index=1, parent=mma, k_width=8)
    i_r, i_b, i_s, i_hb, i_sp = _program_coords(S, HEADS_FASTEST)
    n_main, n_x, t_main, t_lo, t_hi = _split_range(length, length_x, i_b, i_sp, num_splits, TOPK, TOPK_X, BLOCK_N,
                                                   HAS_LEN, HAS_EXTRA, HAS_LEN_X)  # fmt: skip
    p_idx, p_idx_x = _index_rows(idx, idx_x, i_b, i_s, stride_ib, stride_is, stride_xb, stride_xs)
    o_ns = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(0, mma))  # S's columns
    acc_lo = gl.zeros([BLOCK_H, 256], gl.float32, mma)  # output columns 0-255
    acc_hi = gl.zeros([BLOCK_H, 256], gl.float32, mma)  # 256-511: V loaded half at a time (registers)
    m_i = gl.full([BLOCK_H], float("-inf"), gl.float32, gl.SliceLayout(1, mma))
    l_i = gl.zeros([BLOCK_H], gl.float32, gl.SliceLayout(1, mma))
    for i_t in range(t_lo, t_hi):
        j = i_t - t_lo
        buf = j % 2
        b_ids = _tile_ids(p_idx, p_idx_x, n_main, n_x, t_main, i_t, t_hi, o_ns, BLOCK_N)  # -1: masked
        k_tile = k_bufs.index(buf)
        mbarrier.wait(full.index(buf), (j // 2) & 1)
        b_s = gl.zeros([BLOCK_H, BLOCK_N], gl.float32, mma)
        for c in gl.static_range(8):  # [BLOCK_H, 64] x [64, BLOCK_N] per chunk
            b_s = mma_v2(q_smem.slice(c * 64, 64, dim=1).load(a_l),
                         k_tile.slice(c * 64, 64, dim=1).permute((1, 0)).load(b_l), b_s)  # fmt: skip
        b_s = gl.where((b_ids >= 0)[None, :], b_s * qk_scale, float("-inf"))
        m_new = gl.maximum(m_i, gl.max(b_s, 1))
        m_use = gl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = gl.exp2(m_i - m_use)
        b_p = gl.exp2(b_s - m_use[:, None])
        l_i = l_i * alpha + gl.sum(b_p, 1)
        m_i = m_new
        b_pa = gl.convert_layout(b_p.to(gl.bfloat16), a_l)  # [BLOCK_H, BLOCK_N]: P as the A operand, in registers
        acc_lo = mma_v2(b_pa, k_tile.slice(0, 256, dim=1).load(b_l), acc_lo * alpha[:, None])  # [BLOCK_H, 256]
        acc_hi = mma_v2(b_pa, k_tile.slice(256, 256, dim=1).load(b_l), acc_hi * alpha[:, None])
        mbarrier.arrive(empty.index(buf))  # every operand of this tile was loaded: the producer may refill it
    _store_halves(acc_lo, acc_hi, m_i, l_i, sink, out, lse, o_part, lse_part, i_r, i_hb, i_sp, H, H_OUT, num_splits,
                  DV, BLOCK_H, HAS_SINK, SINGLE)  # fmt: skip


@gluon.jit
def _store_halves(acc_lo, acc_hi, m_i, l_i, sink, out, lse, o_part, lse_part, i_r, i_hb, i_sp, H, H_OUT, num_splits,
                  DV: gl.constexpr, BLOCK_H: gl.constexpr, HAS_SINK: gl.constexpr, SINGLE: gl.constexpr):  # fmt: skip
    """``gluon_sm90._store_output`` for an output held as two [BLOCK_H, 256] halves."""
    rows_l: gl.constexpr = m_i.type.layout
    o_h = i_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=rows_l)
    m_h = o_h < H
    lse2 = gl.where(l_i > 0.0, m_i + gl.log2(l_i), float("-inf"))
    inv_l = gl.where(l_i > 0.0, 1.0 / l_i, 0.0)
    o_c = gl.arange(0, 256, layout=gl.SliceLayout(0, acc_lo.type.layout))
    if SINGLE:
        if HAS_SINK:
            b_sink = gl.load(sink + o_h, mask=m_h, other=float("-inf")) * LOG2E
            inv_l = gl.where(l_i > 0.0, inv_l / (1.0 + gl.exp2(b_sink - lse2)), 0.0)
        gl.store(lse + i_r.to(gl.int64) * H_OUT + o_h, lse2 * LN2, mask=m_h)
        p_o = out + i_r.to(gl.int64) * H_OUT * DV + o_h.to(gl.int64)[:, None] * DV + o_c[None, :]
    else:
        i_part = i_r.to(gl.int64) * num_splits + i_sp
        gl.store(lse_part + i_part * H + o_h, lse2, mask=m_h)
        p_o = o_part + (i_part * H + o_h.to(gl.int64))[:, None] * 512 + o_c[None, :]
    gl.store(p_o, (acc_lo * inv_l[:, None]).to(p_o.dtype.element_ty), mask=m_h[:, None] & (o_c < DV)[None, :])
    gl.store(p_o + 256, (acc_hi * inv_l[:, None]).to(p_o.dtype.element_ty),
             mask=m_h[:, None] & (o_c + 256 < DV)[None, :])  # fmt: skip


@gluon.jit
def _mma_ws_decode_kernel(
    q, cache, idx, length, cache_x, idx_x, length_x, sink,
    out, lse, o_part, lse_part,
    S, H, H_OUT, TOPK, TOPK_X, page_size, page_stride, page_size_x, page_stride_x, num_splits, qk_scale,
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_ib, stride_is, stride_xb, stride_xs,
    DV: gl.constexpr, BLOCK_H: gl.constexpr, BLOCK_N: gl.constexpr, INT_DEQUANT: gl.constexpr,
    HAS_LEN: gl.constexpr, HAS_EXTRA: gl.constexpr, HAS_LEN_X: gl.constexpr, HAS_SINK: gl.constexpr,
    SINGLE: gl.constexpr, PAGE_SHIFT: gl.constexpr, PAGE_SHIFT_X: gl.constexpr, HEADS_FASTEST: gl.constexpr,
    num_warps: gl.constexpr,
):  # fmt: skip
    """Grid and contract of the package's decode kernels (``decode_grid``; 32-head blocks), no lift or prefetch."""
    gl.static_assert(num_warps == 4 or num_warps == 8, "four or eight consumer warps")
    ld: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [num_warps, 1], [1, 0])
    sl: gl.constexpr = gl.SwizzledSharedLayout(8, 1, 8, order=[1, 0])  # ldmatrix-friendly, 16-byte vectors
    _, i_b, i_s, i_hb, _ = _program_coords(S, HEADS_FASTEST)
    o_hl = i_hb * BLOCK_H + gl.arange(0, BLOCK_H, layout=gl.SliceLayout(1, ld))
    o_c = gl.arange(0, 512, layout=gl.SliceLayout(0, ld))
    p_q = q + i_b.to(gl.int64) * stride_qb + i_s.to(gl.int64) * stride_qs + o_hl.to(gl.int64)[:, None] * stride_qh
    b_q = gl.load(p_q + o_c[None, :] * stride_qd, mask=(o_hl < H)[:, None], other=0.0)  # [BLOCK_H, 512] bf16
    q_smem = gl.allocate_shared_memory(gl.bfloat16, [BLOCK_H, 512], sl, b_q)
    k_bufs = gl.allocate_shared_memory(gl.bfloat16, [2, BLOCK_N, 512], sl)
    full = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [2, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(2):
        # count 1: Gluon's Ampere arrive is one elected thread after a barrier across its partition (bar.sync, then
        # one mbarrier.arrive), not one arrival per thread
        mbarrier.init(full.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    gl.barrier()  # q's stores and the barriers' init before either partition uses them
    gl.warp_specialize(
        [
            (_mma_consume, (q_smem, k_bufs, full, empty, idx, idx_x, length, length_x, sink, out, lse, o_part,
                            lse_part, S, H, H_OUT, TOPK, TOPK_X, num_splits, qk_scale, stride_ib, stride_is,
                            stride_xb, stride_xs, DV, BLOCK_H, BLOCK_N, HAS_LEN, HAS_EXTRA, HAS_LEN_X, HAS_SINK,
                            SINGLE, HEADS_FASTEST, num_warps)),
            (_mma_produce, (k_bufs, full, empty, cache, cache_x, idx, idx_x, length, length_x, S, TOPK, TOPK_X,
                            page_size, page_stride, page_size_x, page_stride_x, num_splits, stride_ib, stride_is,
                            stride_xb, stride_xs, BLOCK_N, INT_DEQUANT, HAS_LEN, HAS_EXTRA, HAS_LEN_X, PAGE_SHIFT,
                            PAGE_SHIFT_X, HEADS_FASTEST)),
        ],
        [PRODUCER_WARPS],
    )  # fmt: skip


def mma_ws_decode(q, k_cache, indices, topk_length=None, attn_sink=None, softmax_scale=None, extra_k_cache=None,  # noqa: ANN001, ANN201
                  extra_indices_in_kvcache=None, extra_topk_length=None, slots: int = 142, head_dim_v: int = 512,
                  consumer_warps: int = CONSUMER_WARPS):  # fmt: skip
    """(out [B, s_q, H, DV] bf16, lse [B, H, s_q]) of the package launcher's contract (``slots``: programs of one
    wave, one a SM: 142 for an L40S); the package's combine kernel merges split partials (fp32). An explore launcher:
    no checks (indices contiguous along top-k assumed), no padded heads."""
    batch, s_q, heads, _ = q.shape
    cache, page_size, page_stride = T._cache_bytes(k_cache, "k_cache")
    has_extra = extra_k_cache is not None and extra_indices_in_kvcache is not None
    if has_extra:
        cache_x, page_size_x, page_stride_x = T._cache_bytes(extra_k_cache, "extra_k_cache")
        idx_x = extra_indices_in_kvcache
    else:
        cache_x, page_size_x, page_stride_x, idx_x, extra_topk_length = cache, 1, 0, indices, None
    rows, head_blocks = batch * s_q, triton.cdiv(heads, BLOCK_H)
    max_tiles = triton.cdiv(indices.shape[2], BLOCK_N) + (triton.cdiv(idx_x.shape[2], BLOCK_N) if has_extra else 0)
    splits = T.choose_num_splits(rows, head_blocks, max_tiles, slots)
    out = torch.empty(batch, s_q, heads, head_dim_v, dtype=torch.bfloat16, device=q.device)
    lse = torch.empty(batch, s_q, heads, dtype=torch.float32, device=q.device)
    o_part = torch.empty(rows, splits, heads, 512, dtype=torch.float32, device=q.device) if splits > 1 else out
    lse_part = torch.empty(rows, splits, heads, dtype=torch.float32, device=q.device) if splits > 1 else lse
    grid, heads_fastest = T.decode_grid(rows, head_blocks, splits, True)
    dummy = indices
    scale = (512**-0.5 if softmax_scale is None else softmax_scale) * T.LOG2E
    _mma_ws_decode_kernel[grid](
        q, cache, indices, topk_length if topk_length is not None else dummy,
        cache_x, idx_x, extra_topk_length if extra_topk_length is not None else dummy,
        attn_sink if attn_sink is not None else dummy, out, lse, o_part, lse_part,
        s_q, heads, heads, indices.shape[2], idx_x.shape[2] if has_extra else 0, page_size, page_stride, page_size_x,
        page_stride_x, splits, float(scale), q.stride(0), q.stride(1), q.stride(2), q.stride(3),
        indices.stride(0), indices.stride(1), idx_x.stride(0), idx_x.stride(1),
        DV=head_dim_v, BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, INT_DEQUANT=True, HAS_LEN=topk_length is not None,
        HAS_EXTRA=has_extra, HAS_LEN_X=extra_topk_length is not None, HAS_SINK=attn_sink is not None,
        SINGLE=splits == 1, PAGE_SHIFT=page_shift(page_size),
        PAGE_SHIFT_X=page_shift(page_size_x if has_extra else page_size), HEADS_FASTEST=heads_fastest,
        num_warps=consumer_warps,
    )  # fmt: skip
    if splits > 1:
        block_s, block_hc, block_d = T.combine_blocks(splits, heads)
        T._sparse_decode_combine_kernel[(rows, triton.cdiv(heads, block_hc), triton.cdiv(head_dim_v, block_d))](
            o_part, lse_part, attn_sink if attn_sink is not None else dummy, out, lse, heads, heads, splits,
            DV=head_dim_v, BLOCK_S=block_s, BLOCK_H=block_hc, BLOCK_D=block_d, HAS_SINK=attn_sink is not None,
            num_warps=4,
        )  # fmt: skip
    return out, lse.permute(0, 2, 1)


@app.command()
def aot(rows: str = "1,64,1024", heads: int = 64) -> None:
    """Here (no GPU): compile for sm_80, 86, 89 and 120 with this Triton at ROWS x HEADS (top-k 128 + 512); shared
    memory, registers, spills."""
    from benchmarks.decode import Shape, make_inputs
    from sparsemla.kernels import aot as A
    from sparsemla.kernels import device as dev

    for target in ("sm_80", "sm_86", "sm_89", "sm_120"):
        info = dev.target(target)
        for n in (int(r) for r in rows.split(",")):
            kw = make_inputs(Shape(n, heads, 128, 512), seed=0, device="cpu", fill=False)
            for warps in (4, 8):
                sink: list = []
                with A.compile_only(target, info, "mma_ws", sink):
                    mma_ws_decode(**{k: kw[k] for k in KEYS}, slots=info.num_sms, consumer_warps=warps)
                for r in sink:
                    print(f"{target} rows {n} consumer warps {warps}: {r.kernel} shared {r.shared} registers "
                          f"{r.registers} spilled {r.spilled} {'ok' if r.ok else r.problem()}")  # fmt: skip

SHAPES = "1x64,64x64,128x64,1024x64,8192x64,64x128"  # rows x heads
KEYS = ("q", "k_cache", "indices", "extra_k_cache", "extra_indices_in_kvcache", "attn_sink", "softmax_scale")


def _inputs(rows: int, heads: int, device: str, fill: bool = True, seed: int = 0) -> dict:
    from benchmarks.decode import Shape, make_inputs

    kw = make_inputs(Shape(rows, heads, 128, 512), seed=seed, device=device, fill=fill)
    return {k: kw[k] for k in KEYS}


VARIANTS = ("package", "mma_ws4", "mma_ws8")


def _launch(variant: str, kw: dict, slots: int) -> torch.Tensor:
    """out of one call: ``package`` = the launcher (the sm89 path's tiles), ``mma_wsN`` = this file's kernel with N
    consumer warps."""
    if variant == "package":
        return T.sparse_decode_fwd(**kw, head_dim_v=512)[0]
    return mma_ws_decode(**kw, slots=slots, consumer_warps=int(variant[6:]))[0]


@app.command()
def build(out: Path = Path(".gpu-cubins/mma_ws"), shapes: str = SHAPES, slots: int = 132) -> None:
    """Here (no GPU): both variants' launches at SHAPES in the sm89 code path, Triton 3.8 cubins into OUT/sm89
    (``slots``: this kernel's programs of one wave; the H200's and H100's 132 SMs)."""
    from benchmarks import prod_cubins

    def workload() -> None:
        for rows, heads in (map(int, s.split("x")) for s in shapes.split(",")):
            kw = _inputs(rows, heads, "cpu", fill=False)
            for variant in VARIANTS:
                _launch(variant, kw, slots)

    added = prod_cubins.build(workload, prod_cubins.path_dir(out, "sm89"), "sm89")
    print(f"Triton {triton.__version__}: {len(added)} cubins added to {out}/sm89")


@app.command()
def bench(cubins: Path = Path(".gpu-cubins/mma_ws"), shapes: str = SHAPES, slots: int = 132,
          out: Path = Path("gluon_mma_ws_decode.json"), git_sha: str = "unknown") -> None:  # fmt: skip
    """GPU, sm89 code path (TRITON_OVERRIDE_ARCH=sm89): both variants from CUBINS (Triton 3.8) replayed; error
    against the fp32 reference (<= 1024 rows) or the package's output; CUDA-graph median (2 input sets rotated)."""
    import json

    from triton.testing import do_bench

    from benchmarks import prod_cubins
    from benchmarks.decode import graphed
    from sparsemla.kernels.sparse_decode.reference import sparse_decode_reference

    rows_out: list[dict] = []
    with prod_cubins.Replayer(prod_cubins.path_dir(cubins, "sm89")) as counts:
        for rows, heads in (map(int, s.split("x")) for s in shapes.split(",")):
            sets = [_inputs(rows, heads, "cuda", seed=100 * rows + i) for i in range(2)]
            want = sparse_decode_reference(**sets[0], head_dim_v=512)[0].float() if rows <= 1024 else None
            for variant in VARIANTS:
                row = dict(rows=rows, H=heads, variant=variant)
                try:
                    got = _launch(variant, sets[0], slots).float()
                    ref = want if want is not None else _launch("package", sets[0], slots).float()
                    runs = [graphed(lambda kw=kw, v=variant: _launch(v, kw, slots)) for kw in sets]
                    st = {"i": 0}

                    def step(runs=runs, st=st) -> None:
                        st["i"] += 1
                        runs[st["i"] % 2]()

                    us = do_bench(step, warmup=10, rep=50, return_mode="median") * 1e3
                    row.update(us=round(us, 2), err=float((got - ref).norm() / ref.norm()),
                               nan=bool(torch.isnan(got).any()))  # fmt: skip
                except Exception as exc:  # noqa: BLE001 - a failing variant is a finding
                    row["error"] = (str(exc).splitlines() or [repr(exc)])[-1][:300]
                rows_out.append(row)
                print(json.dumps(row), flush=True)
    doc = dict(gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__, git_sha=git_sha,
               code_path="sm89", cubins=str(cubins), replayed=counts, rows=rows_out)  # fmt: skip
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    app()
