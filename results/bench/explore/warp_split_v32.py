"""Exploratory: the DeepSeek-V3.2 decode tile (fp8_656 / bf16_576) with its 512 NoPE dims split over 4 warps (one
128-wide chunk -- one fp8 scale tile -- per warp through a batched dot) and its 64 RoPE dims in 4 chunks of 16 beside
them, the V4 experiment of ``warp_split_decode.py`` on the V3.2 kernel.

The launcher's mma.sync tiles (16 x 32 for <= 16 heads, 32 x 32 above; 4 warps, NoPE in 4 chunk dots) lay the warps
over the tokens for QK^T, so every warp reads all of q (576 dims) from shared memory on every tile; here warp w
computes the partial scores of its 128 + 16 dims for all heads and tokens and owns the same 128 output columns. The
scores are computed transposed (S^T = K q^T: the tile is the A operand of QK and the B operand of PV, untransposed
for both, so one shared copy serves them) and summed over the warps.

    TRITON_INTERPRET=1 .venv/bin/python results/bench/explore/warp_split_v32.py --check
    .venv/bin/python results/bench/explore/warp_split_v32.py --aot --arch sm_89
    .venv/bin/python results/bench/explore/warp_split_v32.py --build-cubins DIR --path sm89   # then --bench on a GPU
"""

from __future__ import annotations

import argparse
import json
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
from sparsemla.kernels.sparse_decode import triton_v32 as V
from sparsemla.kernels.sparse_decode.triton import choose_num_splits, combine_blocks
from sparsemla.kernels.sparse_decode.triton_v32 import ROPE_OFF_BF16, SCALE_OFF_F32, _v32_split_range

NC = tl.constexpr(4)  # NoPE chunks = warps = fp8 scale tiles
CW = tl.constexpr(128)  # NoPE dims per chunk
RW = tl.constexpr(16)  # RoPE dims per chunk


@triton.jit
def _load_ws_tile(kv, o_tok, m_n, KV_FP8: tl.constexpr, INT_DEQUANT: tl.constexpr, DOT_F32: tl.constexpr,
                  OPAQUE_K: tl.constexpr):  # fmt: skip
    """The tile's rows as ([NC, BLOCK_N, CW] NoPE chunks, [NC, BLOCK_N, RW] RoPE chunks); masked rows are 0."""
    o_c = tl.arange(0, NC)
    o_d = tl.arange(0, CW)
    o_e = tl.arange(0, RW)
    m3 = m_n[None, :, None]
    if KV_FP8:
        o_k = o_tok[None, :, None] + (o_c * CW)[:, None, None] + o_d[None, None, :]
        p_sc = kv.to(tl.pointer_type(tl.float32), bitcast=True)
        b_sc = tl.load(p_sc + (o_tok // 4 + SCALE_OFF_F32)[None, :] + o_c[:, None], mask=m_n[None, :], other=0.0)
        if DOT_F32:
            p_k8 = kv.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
            b_k = tl.load(p_k8 + o_k, mask=m3, other=0.0).to(tl.float32) * b_sc[:, :, None]
        else:
            if INT_DEQUANT:
                b_k8 = tl.load(kv + o_k, mask=m3, other=0)  # [NC, BLOCK_N, CW] uint8 (e4m3 bits)
                b_kb = e4m3_bits_to_bf16(b_k8) * tl.full([1, 1, 1], TWO_POW_120, tl.bfloat16)
            else:
                p_k8 = kv.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
                b_kb = tl.load(p_k8 + o_k, mask=m3, other=0.0).to(tl.bfloat16)
            b_k = (b_kb.to(tl.float32) * b_sc[:, :, None]).to(tl.bfloat16)
            if OPAQUE_K:
                b_k = opaque_bf16(b_k)
        p_rope = kv.to(tl.pointer_type(tl.bfloat16), bitcast=True)
        o_r = (o_tok // 2 + ROPE_OFF_BF16)[None, :, None] + (o_c * RW)[:, None, None] + o_e[None, None, :]
        b_kr = tl.load(p_rope + o_r, mask=m3, other=0.0)  # [NC, BLOCK_N, RW]
    else:
        b_k = tl.load(kv + o_tok[None, :, None] + (o_c * CW)[:, None, None] + o_d[None, None, :], mask=m3, other=0.0)
        b_kr = tl.load(kv + o_tok[None, :, None] + 512 + (o_c * RW)[:, None, None] + o_e[None, None, :], mask=m3,
                       other=0.0)  # fmt: skip
    if DOT_F32:
        return b_k.to(tl.float32), b_kr.to(tl.float32)
    return b_k, b_kr


@triton.jit
def _ws_v32_kernel(
    q, kv, idx, length, out, lse, o_part, lse_part,
    S, H, TOPK, page_size, stride_kb, stride_kt, num_slots, num_splits, qk_scale,
    stride_qb, stride_qs, stride_qh, stride_qd, stride_ib, stride_is,
    DV: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, KV_FP8: tl.constexpr,
    INT_DEQUANT: tl.constexpr, HAS_LEN: tl.constexpr, SINGLE: tl.constexpr, OPAQUE_K: tl.constexpr,
    ALIGNED: tl.constexpr, DOT_F32: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """``_sparse_decode_v32_kernel``'s contract with q^T as [NC, CW, BLOCK_H] + [NC, RW, BLOCK_H], the tile as
    [NC, BLOCK_N, CW] + [NC, BLOCK_N, RW] and acc [NC, BLOCK_H, CW]."""
    i_r = tl.program_id(0)
    i_hb = tl.program_id(1)
    i_sp = tl.program_id(2)
    i_b = i_r // S
    i_s = i_r % S
    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < H
    o_c = tl.arange(0, NC)
    o_d = tl.arange(0, CW)
    o_e = tl.arange(0, RW)
    p_q = q + i_b.to(tl.int64) * stride_qb + i_s.to(tl.int64) * stride_qs + o_h.to(tl.int64)[None, None, :] * stride_qh
    o_qn = (o_c * CW)[:, None, None] + o_d[None, :, None]  # [NC, CW, 1] NoPE column of (chunk, dim)
    o_qr = 512 + (o_c * RW)[:, None, None] + o_e[None, :, None]  # [NC, RW, 1] RoPE column
    b_qt = tl.load(p_q + o_qn * stride_qd, mask=m_h[None, None, :], other=0.0)  # [NC, CW, BLOCK_H] q^T
    b_qrt = tl.load(p_q + o_qr * stride_qd, mask=m_h[None, None, :], other=0.0)  # [NC, RW, BLOCK_H]
    if DOT_F32:
        b_qt = b_qt.to(tl.float32)
        b_qrt = b_qrt.to(tl.float32)

    n_valid, t_lo, t_hi = _v32_split_range(length, i_b, i_sp, num_splits, TOPK, BLOCK_N, HAS_LEN)
    acc = tl.zeros([NC, BLOCK_H, CW], dtype=tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    p_idx = idx + i_b.to(tl.int64) * stride_ib + i_s.to(tl.int64) * stride_is
    o_n = tl.arange(0, BLOCK_N)
    b_idx_next = tl.load(p_idx + t_lo * BLOCK_N + o_n, mask=t_lo * BLOCK_N + o_n < n_valid, other=-1)
    for i_t in range(t_lo, t_hi):
        b_idx = b_idx_next
        o_next = (i_t + 1) * BLOCK_N + o_n
        b_idx_next = tl.load(p_idx + o_next, mask=o_next < n_valid, other=-1)
        m_n = (b_idx >= 0) & (b_idx < num_slots)
        b_slot = tl.where(m_n, b_idx, 0)
        o_tok = (b_slot // page_size).to(tl.int64) * stride_kb + (b_slot % page_size).to(tl.int64) * stride_kt
        if ALIGNED:
            o_tok = tl.multiple_of(o_tok, 16 if KV_FP8 else 8)
        b_k, b_kr = _load_ws_tile(kv, o_tok, m_n, KV_FP8, INT_DEQUANT, DOT_F32, OPAQUE_K)
        b_st3 = tl.dot(b_k, b_qt, input_precision=DOT_PREC)  # [NC, BLOCK_N, BLOCK_H] partial S^T per chunk
        b_st3 = tl.dot(b_kr, b_qrt, b_st3, input_precision=DOT_PREC)
        b_s = tl.trans(tl.sum(b_st3, 0))  # [BLOCK_H, BLOCK_N]
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
        b_p3 = tl.broadcast_to(b_pd[None, :, :], [NC, BLOCK_H, BLOCK_N])
        acc = tl.dot(b_p3, b_k, acc * alpha[None, :, None], input_precision=DOT_PREC)  # [NC, BLOCK_H, CW]

    lse2 = tl.where(l_i > 0.0, m_i + tl.math.log2(l_i), float("-inf"))
    inv_l = tl.where(l_i > 0.0, 1.0 / l_i, 0.0)
    o_col = (o_c * CW)[:, None, None] + o_d[None, None, :]  # [NC, 1, CW]
    m_o = m_h[None, :, None] & (o_col < DV)
    if SINGLE:
        p_o = out + (i_r.to(tl.int64) * H + o_h[None, :, None]) * DV + o_col
        b_lse = tl.where(l_i > 0.0, lse2 * 0.6931471805599453, float("inf"))
        tl.store(lse + (i_b.to(tl.int64) * H + o_h) * S + i_s, b_lse, mask=m_h)
    else:
        i_part = i_r.to(tl.int64) * num_splits + i_sp
        p_o = o_part + (i_part * H + o_h[None, :, None]) * DV + o_col
        tl.store(lse_part + i_part * H + o_h, lse2, mask=m_h)
    tl.store(p_o, (acc * inv_l[None, :, None]).to(p_o.dtype.element_ty), mask=m_o)


def ws_v32_fwd(q, kv_cache, indices, sm_scale, *, kv_format, d_v=512, topk_length=None, num_splits="auto",
               config=None):  # noqa: ANN001, ANN201  # fmt: skip
    """``sparse_decode_v32_fwd``'s launch (the launcher's tile and split count, 4 warps) with the warp-split kernel."""
    interpret = dev.interpreting()
    batch, s_q, heads, _ = q.shape
    kv, aligned = V._cache_operand(kv_cache, kv_format)
    info = dev.launch_info(q.device)
    cfg = replace(config or V.choose_v32_config(info, heads, batch * s_q, kv_format), num_warps=4)
    rows, topk = batch * s_q, indices.shape[2]
    head_blocks = triton.cdiv(heads, cfg.block_h)
    resident = max(
        1, min(info.smem_per_sm // V.shared_bytes_v32(cfg, kv_format, info), 65_536 // (cfg.num_warps * 32 * 192))
    )
    splits = choose_num_splits(rows, head_blocks, triton.cdiv(topk, cfg.block_n), info.num_sms * resident, num_splits)
    out = torch.empty(batch, s_q, heads, d_v, dtype=torch.float32 if interpret else torch.bfloat16, device=q.device)
    lse = torch.empty(batch, heads, s_q, dtype=torch.float32, device=q.device)
    if splits > 1:
        part_dtype = torch.bfloat16 if cfg.partial_bf16 and not interpret else torch.float32
        o_part = torch.empty(rows, splits, heads, d_v, dtype=part_dtype, device=q.device)
        lse_part = torch.empty(rows, splits, heads, dtype=torch.float32, device=q.device)
    else:
        o_part, lse_part = out, lse
    _ws_v32_kernel[(rows, head_blocks, splits)](
        q, kv, indices, topk_length if topk_length is not None else indices, out, lse, o_part, lse_part,
        s_q, heads, topk, kv_cache.shape[1], kv_cache.stride(0), kv_cache.stride(1),
        kv_cache.shape[0] * kv_cache.shape[1], splits, float(sm_scale) * V.LOG2E,
        q.stride(0), q.stride(1), q.stride(2), q.stride(3), indices.stride(0), indices.stride(1),
        DV=d_v, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, KV_FP8=kv_format == "fp8_656",
        INT_DEQUANT=cfg.int_dequant and not interpret, HAS_LEN=topk_length is not None, SINGLE=splits == 1,
        OPAQUE_K=kv_format == "fp8_656" and not interpret, ALIGNED=aligned, DOT_F32=interpret,
        DOT_PREC="ieee" if interpret else "tf32", num_warps=4, num_stages=cfg.num_stages,
    )  # fmt: skip
    if splits > 1:
        block_s, block_hc, block_d = combine_blocks(splits, heads)
        V._sparse_decode_v32_combine_kernel[(rows, triton.cdiv(heads, block_hc), triton.cdiv(d_v, block_d))](
            o_part, lse_part, out, lse, s_q, heads, splits,
            DV=d_v, BLOCK_S=block_s, BLOCK_H=block_hc, BLOCK_D=block_d, num_warps=4,
        )  # fmt: skip
    return out.to(torch.bfloat16), lse


def _inputs(fmt: str, batch: int, heads: int, s_q: int, topk: int, seed: int, device: str = "cpu") -> dict:
    from sparsemla.kernels.layouts import V32_PAGE, random_v32_cache

    g = torch.Generator().manual_seed(seed)
    pages = max(2, batch * topk // V32_PAGE)
    cache = random_v32_cache(pages, fmt, generator=g)
    q = torch.randn(batch, s_q, heads, 576, generator=g).to(torch.bfloat16)
    idx = torch.stack([torch.randperm(pages * V32_PAGE, generator=g)[:topk] for _ in range(batch * s_q)])
    idx = idx.view(batch, s_q, topk).to(torch.int32)
    idx[:, :, -3:] = -1  # invalid slots
    lens = torch.randint(0, topk + 1, (batch,), generator=g, dtype=torch.int32)
    t = dict(q=q, kv_cache=cache, indices=idx, sm_scale=576**-0.5, kv_format=fmt, topk_length=lens)
    return {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in t.items()}


def check() -> int:
    """Interpreter: the warp-split kernel against the launcher's kernel (fp32 dots there)."""
    bad = 0
    for fmt, batch, heads, s_q, splits in [
        ("fp8_656", 2, 16, 1, 1),
        ("fp8_656", 3, 32, 2, 3),
        ("bf16_576", 2, 16, 1, 2),
    ]:
        t = _inputs(fmt, batch, heads, s_q, 96, seed=batch * heads)
        cfg = V.V32Config(max(16, min(64, heads)), 16, 4, 1)
        ref_o, ref_l = V.sparse_decode_v32_fwd(**t, config=cfg, num_splits=splits)
        got_o, got_l = ws_v32_fwd(**t, config=cfg, num_splits=splits)
        # relative to the output's scale: the two orders of summation may round a value to neighbouring bf16 numbers
        err_o = ((got_o.float() - ref_o.float()).abs().max() / ref_o.float().abs().max()).item()
        fin = torch.isfinite(ref_l)
        err_l = (got_l[fin] - ref_l[fin]).abs().max().item() if fin.any() else 0.0
        ok = err_o <= 1e-2 and err_l <= 1e-4 and torch.equal(torch.isfinite(got_l), fin)
        bad += not ok
        print(f"{fmt} B={batch} H={heads} s_q={s_q} splits={splits}: max |out| err {err_o:.2e} (of max |out|), "
              f"lse {err_l:.2e} -> {'ok' if ok else 'FAIL'}")  # fmt: skip
    return 1 if bad else 0


def aot_compare(archs: list[str], shapes: list[tuple[str, int, int]]) -> list[dict]:
    """Both kernels compiled for each target at the launcher's tile; one tile iteration's SASS counted per warp."""
    sys.path.insert(0, str(Path(__file__).parent))
    from anatomy_lib import loop_body

    from sparsemla.kernels import aot

    rows = []
    for arch in archs:
        info = dev.TARGETS[arch]
        for fmt, batch, heads in shapes:
            t = _inputs(fmt, batch, heads, 1, 2048, seed=0)
            for variant in ("base", "ws4t"):
                got: dict = {}
                sink: list = []
                name = "_sparse_decode_v32_kernel" if variant == "base" else "_ws_v32_kernel"
                try:
                    with (
                        aot.compile_only(arch, info, "x", sink),
                        aot.watch_launches(lambda n, k, got=got: got.setdefault(n, k)),
                    ):
                        (V.sparse_decode_v32_fwd if variant == "base" else ws_v32_fwd)(**t)
                except Exception as exc:  # noqa: BLE001 - a variant Triton cannot compile is a finding
                    print(f"{arch} {fmt} B={batch} H={heads} {variant}: {type(exc).__name__}: {str(exc)[:300]}")
                    continue
                k = got[name]
                res = next(r for r in sink if r.kernel == name)
                ops = Counter(o.split(".")[0] for o in loop_body(aot._cubin_tool(k.asm["cubin"], "-sass")))
                keep = ("LDS", "LDSM", "STS", "HMMA", "LDG", "BAR", "LDL", "STL", "SHFL", "MUFU")
                row = dict(arch=arch, fmt=fmt, B=batch, H=heads, variant=variant, shared=res.shared,
                           registers=res.registers, spilled=res.spilled, stages=k.metadata.num_stages,
                           loop_instructions=sum(ops.values()), loop_ops={o: ops.get(o, 0) for o in keep})  # fmt: skip
                rows.append(row)
                print(f"{arch} {fmt} B={batch:<3} H={heads:<3} {variant:<5} smem {res.shared:>6} reg {res.registers} "
                      f"spill {res.spilled:>3} | loop {row['loop_instructions']:>5}: "
                      + " ".join(f"{o} {n}" for o, n in row["loop_ops"].items() if n))  # fmt: skip
    return rows


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--check", action="store_true")
    p.add_argument("--aot", action="store_true")
    p.add_argument("--arch", action="append")
    p.add_argument("--shapes", default="fp8_656:64x16,fp8_656:128x16,fp8_656:64x128,bf16_576:64x16")
    p.add_argument("--out")
    a = p.parse_args()
    shapes = []
    for spec in a.shapes.split(","):
        fmt, bh = spec.split(":")
        b, h = (int(x) for x in bh.split("x"))
        shapes.append((fmt, b, h))
    if a.check:
        return check()
    if a.aot:
        rows = aot_compare(a.arch or ["sm_89"], shapes)
        if a.out:
            meta = dict(triton=triton.__version__, date=date.today().isoformat(), what=__doc__.split("\n\n")[0])
            Path(a.out).write_text(json.dumps(dict(meta=meta, rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
