"""Exploratory: the V4 decode tile with its 512 dims split over the warps (``NW`` chunks of ``512 / NW`` dims, one
per warp through a batched dot) instead of the tokens and output columns.

Why: on mma.sync targets a 4-warp 32 x 32 tile lays its warps as [1, 4] over (heads, tokens) for QK^T, so every warp
needs all of q [32, 512] as its A operand and reads it from shared memory on every tile (``ldmatrix``), where each
q fragment feeds a single HMMA (8 tokens per warp). With the 512 dims split over the warps, warp w computes the
partial scores of its 128 dims for all heads and tokens (each q fragment then feeds BLOCK_N / 8 HMMAs) and owns the
same 128 columns of the output for PV, so it reads only its quarter of q and of the tile; the partial scores are
summed over the warps (shared memory, [NW, BLOCK_H, BLOCK_N] fp32) and P goes to every warp, as now.

Same contract as ``_sparse_decode_kernel`` with ``DV_SPLIT = 1`` (the production kernel's jit helpers are reused).
CPU only here: ``--check`` runs it in the interpreter against the production kernel; ``--aot`` compiles both for
mma.sync targets with the installed Triton and compares one tile iteration of their loops (instructions, shared
loads, HMMAs; ``decode_loop_anatomy.py``'s counter). Timing is for the GPU machine (``--bench``).

    TRITON_INTERPRET=1 .venv/bin/python results/bench/explore/warp_split_decode.py --check
    .venv/bin/python results/bench/explore/warp_split_decode.py --aot --arch sm_89 --out F.json
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections import Counter
from dataclasses import replace
from datetime import date
from pathlib import Path

import torch
import triton
import triton.language as tl

from sparsemla.kernels import device as dev
from sparsemla.kernels.dequant import TWO_POW_120, e4m3_bits_to_bf16, opaque_bf16
from sparsemla.kernels.sparse_decode import triton as T
from sparsemla.kernels.sparse_decode.triton import (
    DATA_ROW,
    DATA_ROW_BF16,
    ROPE_OFFSET,
    SCALE_ROW,
    _load_kv_tile,
    _load_tile_idx,
    _sink_scale,
    _split_tiles,
)


@triton.jit
def _load_kv_chunks(
    p_cache, o_tok, o_rope, o_scale, m_n, BLOCK_N: tl.constexpr, ALIGNED: tl.constexpr, DOT_F32: tl.constexpr,
    INT_DEQUANT: tl.constexpr,
):  # fmt: skip
    """``_load_kv_tile``'s chunks-first tile (all 8 chunks) returned as [8, BLOCK_N, 64] instead of being permuted and
    flattened to [BLOCK_N, 512]: chunk c = dims 64c..64c+63 (0..6 fp8 NoPE times 2^(ue8m0 - 127), 7 bf16 RoPE)."""
    o_c = tl.arange(0, 8)
    o_d = tl.arange(0, 64)
    o_k = o_tok[None, :, None] + (o_c * 64)[:, None, None] + o_d[None, None, :]
    m_nope = m_n[None, :, None] & (o_c < 7)[:, None, None]
    if INT_DEQUANT:
        b_k8 = tl.load(p_cache + o_k, mask=m_nope, other=0)  # [8, BLOCK_N, 64] uint8 (e4m3 bits)
    else:
        p_k8 = p_cache.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
        b_k8 = tl.load(p_k8 + o_k, mask=m_nope, other=0.0)
    if ALIGNED:
        p_w = p_cache.to(tl.pointer_type(tl.int64), bitcast=True)
        b_w = tl.load(p_w + tl.multiple_of(o_scale, 8) // 8, mask=m_n, other=0)  # [BLOCK_N] 8 scale bytes
        b_e = ((b_w[None, :] >> (o_c * 8).to(tl.int64)[:, None]) & 255).to(tl.float32)  # [8, BLOCK_N]
        b_e = tl.where((o_c < 7)[:, None] & m_n[None, :], b_e, 127.0)
    else:
        b_e = tl.load(p_cache + o_scale[None, :] + o_c[:, None], mask=(o_c < 7)[:, None] & m_n[None, :], other=127)
        b_e = b_e.to(tl.float32)
    b_sc = tl.math.exp2(b_e - 127.0)
    if DOT_F32:
        b_k = b_k8.to(tl.float32) * b_sc[:, :, None]
    elif INT_DEQUANT:
        two_120 = tl.full([1, 1, 1], TWO_POW_120, tl.bfloat16)
        b_k = (e4m3_bits_to_bf16(b_k8) * two_120) * b_sc.to(tl.bfloat16)[:, :, None]
    else:
        b_k = b_k8.to(tl.bfloat16) * b_sc.to(tl.bfloat16)[:, :, None]
    p_rope = (p_cache + ROPE_OFFSET).to(tl.pointer_type(tl.bfloat16), bitcast=True)
    o_r = o_rope[None, :, None] + (o_c * 0)[:, None, None] + o_d[None, None, :]
    b_r = tl.load(p_rope + o_r, mask=m_n[None, :, None] & (o_c == 7)[:, None, None], other=0.0)  # chunk 7
    if DOT_F32:
        return b_k + b_r.to(tl.float32)
    return b_k + b_r


@triton.jit
def _ws_decode_kernel(
    q, cache, idx, length, cache_x, idx_x, length_x, sink,
    out, lse, o_part, lse_part,
    S, H, H_OUT, TOPK, TOPK_X, page_size, page_stride, page_size_x, page_stride_x, num_splits, qk_scale,
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_ib, stride_is, stride_xb, stride_xs,
    DV: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, NW: tl.constexpr, INT_DEQUANT: tl.constexpr,
    HAS_LEN: tl.constexpr, HAS_EXTRA: tl.constexpr, HAS_LEN_X: tl.constexpr, HAS_SINK: tl.constexpr,
    SINGLE: tl.constexpr, ALIGNED: tl.constexpr, DOT_F32: tl.constexpr, DOT_PREC: tl.constexpr,
    CHUNKS_FIRST: tl.constexpr, OPAQUE_TILE: tl.constexpr, SCORES_T: tl.constexpr = False,
):  # fmt: skip
    """SCORES_T: the scores computed transposed (S^T = K q^T, the tile as the A operand, q^T loop-invariant), so the
    tile is read untransposed by both dots (one shared copy) and only the small P is transposed.

    q as [NW, BLOCK_H, DW] (DW = 512 / NW), the gathered tile as [NW, BLOCK_N, DW], acc [NW, BLOCK_H, DW]: the
    batched dots put one chunk per warp (Triton lays a rank-3 mma.sync dot's warps over the batch axis)."""
    DW: tl.constexpr = 512 // NW
    i_r = tl.program_id(0)
    i_hb = tl.program_id(1)
    i_sp = tl.program_id(2)
    i_b = i_r // S
    i_s = i_r % S

    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < H
    o_w = tl.arange(0, NW)
    o_dw = tl.arange(0, DW)
    o_col = o_w[:, None, None] * DW + o_dw[None, None, :]  # [NW, 1, DW] output / q column of (chunk, dim)
    p_q = q + i_b.to(tl.int64) * stride_qb + i_s.to(tl.int64) * stride_qs + o_h.to(tl.int64)[None, :, None] * stride_qh
    b_q = tl.load(p_q + o_col * stride_qd, mask=m_h[None, :, None], other=0.0)  # [NW, BLOCK_H, DW]
    if DOT_F32:
        b_q = b_q.to(tl.float32)
    if SCORES_T:
        b_qt = tl.permute(b_q, (0, 2, 1))  # [NW, DW, BLOCK_H]

    n_main, n_x, t_main, t_lo, t_hi = _split_tiles(
        length, length_x, i_b, i_sp, num_splits, TOPK, TOPK_X, BLOCK_N, HAS_LEN, HAS_LEN_X, HAS_EXTRA
    )
    acc = tl.zeros([NW, BLOCK_H, DW], dtype=tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    p_idx = idx + i_b.to(tl.int64) * stride_ib + i_s.to(tl.int64) * stride_is
    p_idx_x = idx_x + i_b.to(tl.int64) * stride_xb + i_s.to(tl.int64) * stride_xs
    o_n = tl.arange(0, BLOCK_N)
    b_idx_next = _load_tile_idx(p_idx, p_idx_x, n_main, n_x, t_main, t_lo, o_n, BLOCK_N)
    for i_t in range(t_lo, t_hi):
        in_main = i_t < t_main
        p_cache = tl.where(in_main, cache, cache_x)
        psz = tl.where(in_main, page_size, page_size_x)
        pst = tl.where(in_main, page_stride, page_stride_x)
        b_idx = b_idx_next
        b_idx_next = _load_tile_idx(p_idx, p_idx_x, n_main, n_x, t_main, i_t + 1, o_n, BLOCK_N)
        m_n = b_idx >= 0
        b_slot = tl.where(m_n, b_idx, 0)
        b_page = (b_slot // psz).to(tl.int64)
        b_off = (b_slot % psz).to(tl.int64)
        o_tok = b_page * pst + b_off * DATA_ROW
        o_rope = b_page * (pst // 2) + b_off * DATA_ROW_BF16
        o_scale = b_page * pst + psz * DATA_ROW + b_off * SCALE_ROW
        if ALIGNED:
            o_tok = tl.multiple_of(o_tok, 16)
            o_rope = tl.multiple_of(o_rope, 8)
        if NW == 8:  # the loader's own chunks are the batch axis
            b_k3 = _load_kv_chunks(p_cache, o_tok, o_rope, o_scale, m_n, BLOCK_N, ALIGNED, DOT_F32, INT_DEQUANT)
        else:
            b_k = _load_kv_tile(
                p_cache, o_tok, o_rope, o_scale, m_n, BLOCK_N, 0, 8, ALIGNED, DOT_F32, INT_DEQUANT, CHUNKS_FIRST
            )  # [BLOCK_N, 512]
            b_k3 = tl.permute(tl.reshape(b_k, [BLOCK_N, NW, DW]), (1, 0, 2))  # [NW, BLOCK_N, DW]
        if OPAQUE_TILE:
            b_k3 = opaque_bf16(b_k3)
        if SCORES_T:
            b_st3 = tl.dot(b_k3, b_qt, input_precision=DOT_PREC)  # [NW, BLOCK_N, BLOCK_H]
            b_s = tl.trans(tl.sum(b_st3, 0))  # [BLOCK_H, BLOCK_N]
        else:
            b_s3 = tl.dot(b_q, tl.permute(b_k3, (0, 2, 1)), input_precision=DOT_PREC)  # [NW, BLOCK_H, BLOCK_N]
            b_s = tl.sum(b_s3, 0)  # [BLOCK_H, BLOCK_N] scores over all 512 dims
        b_s = tl.where(m_n[None, :], b_s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(b_s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.math.exp2(m_i - m_use)
        b_p = tl.math.exp2(b_s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(b_p, 1)
        m_i = m_new
        if DOT_F32:
            b_pd = b_p
        else:
            b_pd = b_p.to(tl.bfloat16)
        b_p3 = tl.broadcast_to(b_pd[None, :, :], [NW, BLOCK_H, BLOCK_N])
        acc = tl.dot(b_p3, b_k3, acc * alpha[None, :, None], input_precision=DOT_PREC)  # [NW, BLOCK_H, DW]

    lse2 = tl.where(l_i > 0.0, m_i + tl.math.log2(l_i), float("-inf"))
    inv_l = tl.where(l_i > 0.0, 1.0 / l_i, 0.0)
    if SINGLE:
        if HAS_SINK:
            inv_l = _sink_scale(inv_l, lse2, sink, o_h, m_h, l_i > 0.0)
        p_o = out + i_r.to(tl.int64) * H_OUT * DV + o_h.to(tl.int64)[None, :, None] * DV + o_col
        tl.store(lse + i_r.to(tl.int64) * H_OUT + o_h, lse2 * 0.6931471805599453, mask=m_h)
    else:
        p_o = o_part + (i_r.to(tl.int64) * num_splits + i_sp) * H * 512 + o_h.to(tl.int64)[None, :, None] * 512 + o_col
        tl.store(lse_part + (i_r.to(tl.int64) * num_splits + i_sp) * H + o_h, lse2, mask=m_h)
    b_o = acc * inv_l[None, :, None]
    tl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=m_h[None, :, None] & (o_col < DV))


def ws_decode_fwd(q, k_cache, indices, topk_length=None, attn_sink=None, extra_k_cache=None,  # noqa: ANN001, ANN201
                  extra_indices_in_kvcache=None, extra_topk_length=None, *, config=None, nw=4,
                  num_splits="auto", scores_t=False, warps=None, head_dim_v=512, softmax_scale=None):  # fmt: skip
    """``sparse_decode_fwd``'s launch with the warp-split kernel (head_dim_v 512, no padded heads): ``config`` or
    the launcher's own tile and split count for this GPU, with ``warps`` warps (None: ``nw``)."""
    interpret = dev.interpreting()
    batch, s_q, heads, dim = q.shape
    assert head_dim_v == 512, "the exploratory kernel writes all 512 columns"
    cache, page_size, page_stride = T._cache_bytes(k_cache, "k_cache")
    cache_x, page_size_x, page_stride_x = T._cache_bytes(extra_k_cache, "extra_k_cache")
    idx_x = extra_indices_in_kvcache
    info = dev.launch_info(q.device)
    cfg = config or T.choose_config(info, heads, batch * s_q)
    cfg = replace(cfg, num_warps=warps or nw)
    topk, topk_x = indices.shape[2], idx_x.shape[2]
    rows = batch * s_q
    head_blocks = triton.cdiv(heads, cfg.block_h)
    max_tiles = triton.cdiv(topk, cfg.block_n) + triton.cdiv(topk_x, cfg.block_n)
    slots = info.num_sms * T.resident_programs(cfg, info)
    splits = T.choose_num_splits(rows, head_blocks, max_tiles, slots, num_splits)
    aligned = all(t.data_ptr() % 16 == 0 for t in (cache, cache_x)) and page_stride % 16 == 0
    aligned = aligned and page_stride_x % 16 == 0
    out_dtype = torch.float32 if interpret else torch.bfloat16
    out = torch.empty(batch, s_q, heads, 512, dtype=out_dtype, device=q.device)
    lse = torch.empty(batch, s_q, heads, dtype=torch.float32, device=q.device)
    part_dtype = torch.bfloat16 if cfg.partial_bf16 and not interpret else torch.float32
    if splits > 1:
        o_part = torch.empty(rows, splits, heads, 512, dtype=part_dtype, device=q.device)
        lse_part = torch.empty(rows, splits, heads, dtype=torch.float32, device=q.device)
    else:
        o_part, lse_part = out, lse
    dummy = indices
    chunks_first = T.tile_chunks_first() if cfg.chunks_first is None else cfg.chunks_first
    _ws_decode_kernel[(rows, head_blocks, splits)](
        q, cache, indices, topk_length if topk_length is not None else dummy,
        cache_x, idx_x, extra_topk_length if extra_topk_length is not None else dummy,
        attn_sink if attn_sink is not None else dummy,
        out, lse, o_part, lse_part,
        s_q, heads, heads, topk, topk_x, page_size, page_stride, page_size_x, page_stride_x, splits,
        (softmax_scale or dim**-0.5) * T.LOG2E,
        q.stride(0), q.stride(1), q.stride(2), q.stride(3),
        indices.stride(0), indices.stride(1), idx_x.stride(0), idx_x.stride(1),
        DV=512, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, NW=nw, INT_DEQUANT=cfg.int_dequant and not interpret,
        HAS_LEN=topk_length is not None, HAS_EXTRA=True, HAS_LEN_X=extra_topk_length is not None,
        HAS_SINK=attn_sink is not None, SINGLE=splits == 1, ALIGNED=aligned, DOT_F32=interpret,
        DOT_PREC="ieee" if interpret else "tf32", CHUNKS_FIRST=chunks_first,
        OPAQUE_TILE=T.opaque_tile(cfg, info) and not interpret, SCORES_T=scores_t,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if splits > 1:
        block_s, block_hc, block_d = T.combine_blocks(splits, heads)
        T._sparse_decode_combine_kernel[(rows, triton.cdiv(heads, block_hc), triton.cdiv(512, block_d))](
            o_part, lse_part, attn_sink if attn_sink is not None else dummy, out, lse, heads, heads, splits,
            DV=512, BLOCK_S=block_s, BLOCK_H=block_hc, BLOCK_D=block_d, HAS_SINK=attn_sink is not None, num_warps=4,
        )  # fmt: skip
    return out.to(torch.bfloat16), lse.permute(0, 2, 1)


def variant_options(variant: str) -> tuple[int, int | None, bool]:
    """``ws<N>[w<W>][t]`` -> (N chunks, W warps or None for N, scores transposed)."""
    m = re.fullmatch(r"ws(\d+)(?:w(\d+))?(t?)", variant)
    if not m:
        raise SystemExit(f"variant {variant!r}: expected ws<N>[w<W>][t]")
    return int(m.group(1)), int(m.group(2)) if m.group(2) else None, bool(m.group(3))


def _inputs(batch: int, heads: int, extra_topk: int, device: str = "cpu", seed: int = 0) -> dict:
    from sparsemla.kernels.layouts import random_slots, random_v4_cache

    g = torch.Generator().manual_seed(seed)
    main = random_v4_cache(4, 64, generator=g)
    extra = random_v4_cache(max(1, extra_topk // 64), 64, generator=g)
    q = torch.randn(batch, 1, heads, 512, generator=g).to(torch.bfloat16)
    idx = random_slots(batch, 128, main.num_slots, generator=g)
    idx_x = random_slots(batch, extra_topk, extra.num_slots, generator=g)
    lens = torch.randint(0, 129, (batch,), generator=g, dtype=torch.int32)
    lens_x = torch.randint(0, extra_topk + 1, (batch,), generator=g, dtype=torch.int32)
    t = dict(q=q, k_cache=main.k_cache, indices=idx, topk_length=lens, attn_sink=torch.randn(heads, generator=g),
             extra_k_cache=extra.k_cache, extra_indices_in_kvcache=idx_x, extra_topk_length=lens_x)  # fmt: skip
    return {k: v.to(device) for k, v in t.items()}


def check() -> int:
    """Interpreter: the warp-split kernel against the production kernel (both fp32 dots there)."""
    bad = 0
    for batch, heads, nw, splits, st in [(2, 16, 4, 1, False), (3, 32, 4, 3, True), (2, 8, 2, 2, False),
                                         (1, 64, 8, 1, False), (2, 16, 8, 2, True)]:  # fmt: skip
        t = _inputs(batch, heads, 256, seed=batch * heads)
        cfg = T.DecodeConfig(max(16, min(64, heads)), 16, nw, 1)
        ref_o, ref_l = T.sparse_decode_fwd(**t, config=cfg, num_splits=splits)
        got_o, got_l = ws_decode_fwd(**t, config=cfg, nw=nw, num_splits=splits, scores_t=st)
        err_o = (got_o.float() - ref_o.float()).abs().max().item()
        fin = torch.isfinite(ref_l)
        err_l = (got_l[fin] - ref_l[fin]).abs().max().item() if fin.any() else 0.0
        same_inf = torch.equal(torch.isfinite(got_l), fin)
        ok = err_o <= 2e-2 and err_l <= 1e-4 and same_inf
        bad += not ok
        print(f"B={batch} H={heads} NW={nw} splits={splits} scores_t={st}: max |out| err {err_o:.2e}, lse {err_l:.2e}, "
              f"inf pattern {'same' if same_inf else 'DIFFERS'} -> {'ok' if ok else 'FAIL'}")  # fmt: skip
    return 1 if bad else 0


OPS = ("LDS", "LDSM", "STS", "HMMA", "LDG", "BAR", "LDL", "STL", "SHFL", "MUFU", "IMAD", "MOV")


def _loop_ops(sass: str) -> Counter:
    sys.path.insert(0, str(Path(__file__).parent))
    from anatomy_lib import loop_body

    return Counter(op.split(".")[0] for op in loop_body(sass))


def aot_compare(archs: list[str], shapes: list[tuple[int, int]], nws: list[str]) -> list[dict]:
    """Both kernels compiled for each mma.sync target at the launcher's tile, one tile iteration's SASS counted."""
    from sparsemla.kernels import aot

    rows = []
    for arch in archs:
        info = dev.TARGETS[arch]
        for batch, heads in shapes:
            cfg = T.choose_config(info, heads, batch)
            for variant in ["base", *nws]:
                got: dict = {}
                sink: list = []
                t = _inputs(batch, heads, 2048)
                try:
                    with aot.compile_only(arch, info, f"B{batch}H{heads}", sink), \
                            aot.watch_launches(lambda n, k, got=got: got.setdefault(n, k)):  # fmt: skip
                        if variant in ("base", "lazy", "nolift", "lift"):
                            lift = {"nolift": False, "lift": True}.get(variant, cfg.q_lift)
                            T.sparse_decode_fwd(**t, config=replace(cfg, lazy_rescale=variant == "lazy", q_lift=lift))
                        else:
                            nw, warps, st = variant_options(variant)
                            ws_decode_fwd(**t, config=cfg, nw=nw, scores_t=st, warps=warps)
                except Exception as exc:  # noqa: BLE001 - a variant Triton cannot compile is a finding
                    print(f"{arch} B={batch} H={heads} {variant}: {type(exc).__name__}: {str(exc)[:300]}")
                    continue
                name = "_sparse_decode_kernel" if variant in ("base", "lazy", "nolift", "lift") else "_ws_decode_kernel"
                k = got[name]
                res = next(r for r in sink if r.kernel == name)
                ops = _loop_ops(aot._cubin_tool(k.asm["cubin"], "-sass"))
                mma = re.findall(r"#mma\d* = #ttg\.nvidia_mma<\{versionMajor = (\d), versionMinor = \d, "
                                 r"warpsPerCTA = \[([\d, ]+)\]", k.asm["ttgir"])  # fmt: skip
                row = dict(arch=arch, B=batch, H=heads, variant=variant,
                           config=f"{cfg.block_h}x{cfg.block_n} w{k.metadata.num_warps}", shared=res.shared,
                           registers=res.registers, spilled=res.spilled, loop_instructions=sum(ops.values()),
                           loop_ops={o: ops.get(o, 0) for o in OPS}, mma=[f"v{v} [{w}]" for v, w in mma])  # fmt: skip
                rows.append(row)
                print(f"{arch} B={batch:<4} H={heads:<3} {variant:<4} {row['config']:<12} smem {row['shared']:>6} reg "
                      f"{row['registers']:>3} spill {row['spilled']:>3} | loop {row['loop_instructions']:>5}: "
                      + " ".join(f"{o} {n}" for o, n in row["loop_ops"].items() if n) + f" | {row['mma']}")  # fmt: skip
    return rows


def launch(variant: str, kw: dict) -> torch.Tensor:
    """One decode call: ``base`` = the launcher's kernel and choices, else the warp-split kernel on the launcher's tile
    and split count (both from the GPU facts in force: ``device.assume`` under occupancy matching)."""
    if variant == "base":
        return T.sparse_decode_fwd(**kw)[0]
    pf = re.fullmatch(r"pf(\d+)(?:s(\d+))?", variant)  # pf<N>[s<S>]: l2_prefetch N tiles ahead, every S bytes
    if variant in ("lazy", "nolift", "lift", "sub2", "sub2j", "h64sub2", "hfast", "w8") or pf:  # the launcher's kernel,
        q = kw["q"]  # fields changed
        cfg = T.choose_config(dev.launch_info(q.device), q.shape[2], q.shape[0] * q.shape[1])
        if variant == "hfast":  # the launcher's config, a row's head blocks adjacent in the grid (heads_fastest)
            return T.sparse_decode_fwd(**kw, config=replace(cfg, heads_fastest=True))[0]
        if variant == "sub2":  # the launcher's heads per program, 64-token tiles as two half tiles (sub_tiles)
            return T.sparse_decode_fwd(**kw, config=replace(cfg, block_n=64, sub_tiles=2))[0]
        if variant == "sub2j":  # the half tiles with one row-max and one row-sum reduction over both halves
            return T.sparse_decode_fwd(**kw, config=replace(cfg, block_n=64, sub_tiles=2, sub_joint_reduce=True))[0]
        if variant == "w8":  # the launcher's tile with 8 warps (32 x 64 half tiles on sm_89: no spill, 178 registers)
            return T.sparse_decode_fwd(**kw, config=replace(cfg, num_warps=8))[0]
        if variant == "h64sub2":  # 64 heads x 32 tokens in two half tiles, 8 warps (100,352 B: one gather per 64 heads)
            cfg = replace(cfg, block_h=64, block_n=32, num_warps=8, sub_tiles=2)
            return T.sparse_decode_fwd(**kw, config=cfg)[0]
        if pf:
            cfg = replace(cfg, l2_prefetch=int(pf.group(1)), prefetch_stride=int(pf.group(2) or 128))
        else:
            cfg = replace(cfg, lazy_rescale=True) if variant == "lazy" else replace(cfg, q_lift=variant == "lift")
        return T.sparse_decode_fwd(**kw, config=cfg)[0]
    nw, warps, st = variant_options(variant)
    return ws_decode_fwd(**kw, nw=nw, scores_t=st, warps=warps)[0]


def build_cubins(out_dir: Path, path: str, shapes: list[tuple[int, int]], variants: list[str],
                 occupancy_of: str | None) -> None:  # fmt: skip
    """Here (no GPU, this Triton): every launch of ``bench`` in ``path`` compiled into ``out_dir``
    (benchmarks/prod_cubins.py), also the ones made with ``occupancy_of``'s facts on the GPU machine's SMs."""
    from benchmarks import prod_cubins
    from benchmarks.decode import Shape, make_inputs

    def workload() -> None:
        for batch, heads in shapes:
            kw = make_inputs(Shape(batch, heads, 128, 512), 0, "cpu", fill=False)
            for variant in ["base", *variants]:
                launch(variant, kw)
                if occupancy_of:
                    sms = prod_cubins.path_info(path)[0].num_sms
                    with dev.assume(prod_cubins.occupancy_facts(dev.target(occupancy_of), sms)):
                        launch(variant, kw)

    added = prod_cubins.build(workload, out_dir, path)
    print(f"Triton {triton.__version__}: {len(added)} cubins added to {out_dir}")


def bench(path: str, shapes: list[tuple[int, int]], variants: list[str], out: str, git_sha: str,
          cubins: str | None, occupancy_of: str | None, only_t38: bool = False) -> None:  # fmt: skip
    """GPU, one code path per process: the launcher's kernel (``base``) against the warp-split variants on the same
    tile, CUDA-graph replay median (2 input sets rotated, L2 flushed by do_bench) per compile: ``t36`` this machine's
    Triton (JIT), ``t38`` / ``t38occ`` the cubins of ``cubins`` (Triton 3.8), the latter at ``occupancy_of``'s blocks
    per SM and with its facts (tile and split count). out's relative error against the fp32 reference (B <= 8) or
    the base kernel of the same compile."""
    import contextlib
    import subprocess

    from triton.testing import do_bench

    from benchmarks import prod_cubins
    from benchmarks.decode import Shape, graphed, make_inputs
    from sparsemla.kernels.sparse_decode.reference import sparse_decode_reference

    modes: list[tuple[str, object]] = [("t36", contextlib.nullcontext)]
    replayers = []
    if cubins:
        replayer = prod_cubins.Replayer(Path(cubins))
        replayers.append(replayer)
        modes.append(("t38", lambda: replayer))
        if occupancy_of:
            target = dev.target(occupancy_of)
            occ = prod_cubins.Replayer(Path(cubins), occupancy_of=target)
            replayers.append(occ)
            facts = prod_cubins.occupancy_facts(target, prod_cubins.physical_gpu(torch.device("cuda")).num_sms)

            @contextlib.contextmanager
            def matched():  # noqa: ANN202
                with dev.assume(facts), occ:
                    yield

            modes.append(("t38occ", matched))
        if only_t38:  # production's compiler only (the GPU machine's JIT compiles are most of a run's time)
            modes = modes[1:]
    smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                         text=True).stdout.strip()  # fmt: skip
    rows: list[dict] = []
    for batch, heads in shapes:
        sets = [make_inputs(Shape(batch, heads, 128, 512), seed=100 * batch + i) for i in range(2)]
        ref = sparse_decode_reference(**sets[0])[0].float() if batch <= 8 else None
        for mode, ctx in modes:
            base_out = None
            for variant in ["base", *variants]:
                row = dict(path=path, B=batch, H=heads, variant=variant, mode=mode)
                try:

                    def call(kw: dict, ctx=ctx, variant=variant) -> torch.Tensor:
                        with ctx():
                            return launch(variant, kw)

                    got = call(sets[0]).float()
                    base_out = got if base_out is None else base_out
                    want = ref if ref is not None else base_out
                    runs = [graphed(lambda kw=kw, call=call: call(kw)) for kw in sets]
                    st = {"i": 0}

                    def step(runs=runs, st=st) -> None:
                        st["i"] += 1
                        runs[st["i"] % 2]()

                    us = do_bench(step, warmup=10, rep=50, return_mode="median") * 1e3
                    row.update(us=round(us, 2), err=float((got - want).norm() / want.norm()),
                               err_vs="reference" if ref is not None else "base")  # fmt: skip
                except Exception as exc:  # noqa: BLE001 - a variant that fails is a finding
                    row["error"] = (str(exc).splitlines() or [repr(exc)])[-1][:200]
                rows.append(row)
                print(json.dumps(row), flush=True)
                doc = dict(gpu=torch.cuda.get_device_name(), driver=smi, torch=torch.__version__,
                           triton=triton.__version__, git_sha=git_sha, path=path, cubins=cubins,
                           occupancy_of=occupancy_of, replayed=[r.counts for r in replayers],
                           occupancy=[r.occupancy for r in replayers if r.occupancy_of], rows=rows)  # fmt: skip
                Path(out).write_text(json.dumps(doc, indent=1))
        del sets
        torch.cuda.empty_cache()


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--check", action="store_true")
    p.add_argument("--aot", action="store_true")
    p.add_argument("--arch", action="append")
    p.add_argument("--shapes", default="64x64,64x8,128x64")
    p.add_argument("--variants", default="ws4", help="wsN (N chunks, N warps) or wsNwW (N chunks, W warps), ...")
    p.add_argument("--bench", choices=["native", "sm89"], help="GPU: time in this code path (sm89: under "
                   "TRITON_OVERRIDE_ARCH=sm89, set by the caller)")  # fmt: skip
    p.add_argument("--git-sha", default="")
    p.add_argument("--build-cubins", help="here, no GPU: compile --bench's launches in --path into DIR (Triton 3.8)")
    p.add_argument("--path", default="sm89", choices=["native", "sm89"])
    p.add_argument("--cubins", help="GPU: also time the cubins of DIR (t38), and with --occupancy-of (t38occ)")
    p.add_argument("--occupancy-of", help="e.g. sm_89: that GPU's blocks per SM, tiles and split counts")
    p.add_argument("--only-t38", action="store_true", help="with --cubins: skip the GPU machine's own Triton")
    p.add_argument("--out")
    a = p.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    if a.build_cubins:
        build_cubins(Path(a.build_cubins), a.path, shapes, a.variants.split(","), a.occupancy_of)
        return 0
    if a.bench:
        bench(a.bench, shapes, a.variants.split(","), a.out, a.git_sha, a.cubins, a.occupancy_of, a.only_t38)
        return 0
    if a.check:
        return check()
    if a.aot:
        rows = aot_compare(a.arch or ["sm_89"], shapes, a.variants.split(","))
        if a.out:
            meta = dict(triton=triton.__version__, date=date.today().isoformat(), what=__doc__.split("\n\n")[0])
            Path(a.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
