"""Head-batched tensor-core Triton kernels for DeepSeek-V4 sparse-MLA decode (V4 page-split fp8 KV cache).

One program = (query row, head block, split). A program walks its share of the concatenated candidate list
(main cache ++ extra cache) in tiles of ``BLOCK_N`` tokens; each token row is gathered and dequantized ONCE per
program and shared by all ``BLOCK_H`` heads, with an online softmax in base 2 and fp32 accumulation. Two kernel bodies:

* ``wide`` (default): the dequantized row is ONE [BLOCK_N, 512] bf16 tile (7 fp8 NoPE chunks of 64, each times its
  ue8m0 scale, exact in bf16 because it is a power of two, + the bf16 RoPE chunk), so a tile costs two dots: a
  512-deep QK^T and a 512-wide PV into one [BLOCK_H, 512] accumulator. Both caches share one loop (the cache, page
  geometry and index row are scalars selected per tile); the slot ids of the next tile are loaded one tile ahead. On
  sm_90 (8 warps, 64 heads x 64 tokens) it compiles to wgmma chains at 255 registers with ~90 bytes of spill per
  thread; ncu on the H200 (B=64): one 8-warp program per SM, ~8 µs per tile with the gather + dequant (~55 %) and
  the two dots (~45 %) back to back. ``dv_split=2`` runs each 256-column half of the output in its own program (the
  scores are computed by both), which doubles the programs of a small grid.
* ``chunked`` (the first version): 8 chunks of 64 columns, 16 dots per tile and one loop per cache; at 64 heads it
  spills ~100 values per thread (kept for comparison: ``DecodeConfig(kernel="chunked")``).

Split-K: the host picks the split count from shapes only (``SPARSEMLA_SPLIT_K`` overrides it) so the grid fills the
SMs at small batch and is 1 when ``rows x head blocks`` already does; inside the kernel each split takes an equal
share of the *valid* tiles (from ``topk_length`` / ``extra_topk_length``), so short rows cost little. With one split
the kernel writes the final output (sink applied) directly; otherwise it writes partials (output normalised per split,
fp32 or bf16 per ``DecodeConfig.partial_bf16``, + fp32 base-2 LSE) that ``_sparse_decode_combine_kernel`` merges.
No host sync, no data-dependent allocation: the launch is CUDA-graph safe, and results are deterministic (no
atomics; fixed reduction order).

The Triton path never imports the fp32 reference; semantics are those documented in ``reference.py``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sparsemla.kernels.layouts import V4_BYTES_PER_TOKEN, V4_DATA_BYTES, V4_DIM, V4_SCALE_BYTES

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@dataclass(frozen=True)
class DecodeConfig:
    """Launch shape of the main kernel.

    block_h / block_n: heads per program and tokens per tile; num_warps / num_stages: Triton launch options;
    kernel: ``"wide"`` (the 512-wide row as one tile, two dots per tile) or ``"chunked"`` (8 chunks of 64, 16 dots);
    dv_split: 1, or 2 = each program owns one 256-column half of the output (wide kernel only: twice the programs, each
    with half the accumulator, both halves recompute the scores); partial_bf16: split partials stored as bf16 instead of
    fp32 (half the partial traffic; measured relative error of out 2.7e-3 instead of 1.6e-3 against the fp32 reference,
    where the bf16 output's own rounding is ~1e-3); int_dequant: fp8 -> bf16 with integer ops (``_e4m3_bits_to_bf16``,
    bit-identical) instead of the fp8 -> f16 -> bf16 conversion instructions (wide kernel only)."""

    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    kernel: str = "wide"
    dv_split: int = 1
    partial_bf16: bool = False
    int_dequant: bool = False

    def __post_init__(self) -> None:
        if self.kernel not in ("wide", "chunked"):
            raise ValueError(f"unknown decode kernel {self.kernel!r} (wide or chunked)")
        if self.dv_split not in (1, 2) or (self.dv_split == 2 and self.kernel != "wide"):
            raise ValueError(f"dv_split must be 1 or 2 (2 only with the wide kernel), got {self.dv_split}")


def default_config(num_heads: int, rows: int = 1, interpret: bool = False) -> DecodeConfig:
    """Wide kernel. H <= 16: one 16-head program per row (4 warps, mma.sync: wgmma needs 64 rows per warpgroup);
    H > 16: 64-head blocks (wgmma; H = 17..63 padded, H > 64 in several blocks).

    Offline sm_90 compile (Triton 3.6): a 32-head block at 4 warps spills 45 values, so 17..32 heads pad to 64.
    H200 sweeps (2026-11-29, H=64, 128 + 512 indices, CUDA-graph replay; exploratory scripts and their JSON in
    results/bench/explore/, the reported numbers come from the benchmark): a tile costs a near-fixed latency (~8 µs
    for 64 tokens at one program per SM: gather, dequant, QK, softmax and PV run back to back), so a busy grid
    (``rows x head blocks >= 8``) wants 64-token tiles (B=8..128: 27 / 56 / 62 / 79 µs vs 29 / 57 / 69 / 101 with
    32-token tiles). With splits, the fp32 partials cost as much as the attention at B=32..64 (B=32: 56 -> 44 µs,
    B=64: 62 -> 50 µs with bf16 partials; B=8: 27 vs 29, kept fp32). Small grids want many short splits: B=1 with
    16-token tiles in 256-column halves and bf16 partials 14.9 µs (64 heads x 512 columns: 17.4 µs). The integer
    e4m3 -> bf16 dequant (``int_dequant``) is 2-9 % faster at every B and H measured (B=64: 46.3 vs 50.4 µs; B=128:
    74.2 vs 79.8). Tried and dropped: ``.cg`` row loads (no change), a split merge fused into the last program of each
    row (B=64: 56 vs 50 µs with bf16 partials; one program merging 10+ splits is far slower), halves at B >= 8
    (slower: the duplicated QK)."""
    if interpret:
        return DecodeConfig(block_h=max(16, min(64, triton.next_power_of_2(num_heads))), block_n=16, num_warps=4,
                            num_stages=1)  # fmt: skip
    if num_heads <= 16:
        return DecodeConfig(block_h=16, block_n=32, num_warps=4, num_stages=2, int_dequant=True)
    busy = rows * triton.cdiv(num_heads, 64)
    if busy >= 8:
        return DecodeConfig(
            block_h=64, block_n=64, num_warps=8, num_stages=1, partial_bf16=busy >= 16, int_dequant=True
        )
    return DecodeConfig(
        block_h=64, block_n=16, num_warps=4, num_stages=2, dv_split=2, partial_bf16=True, int_dequant=True
    )


@functools.lru_cache(maxsize=16)
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_num_splits(rows: int, head_blocks: int, max_tiles: int, num_sms: int, override: int | str = "auto") -> int:
    """Split count from shapes only (CUDA-graph safe): about one wave of programs, never more splits than tiles."""
    if max_tiles <= 0:
        return 1
    if override != "auto":
        return max(1, min(int(override), max_tiles))
    base = max(1, rows * head_blocks)
    want = max(1, min(max_tiles, num_sms // base))
    per = -(-max_tiles // want)  # tiles per split; then drop the splits that would get no tile
    return -(-max_tiles // per)


# --------------------------------------------------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------------------------------------------------
@triton.jit
def _load_q_chunk(p_q, o_h, m_h, stride_qd, C: tl.constexpr, DOT_F32: tl.constexpr):
    """Query chunk ``C`` (columns C*64 .. C*64+63) of the head block: [BLOCK_H, 64]."""
    o_d = C * 64 + tl.arange(0, 64)
    b_q = tl.load(p_q + o_h[:, None] + o_d[None, :] * stride_qd, mask=m_h[:, None], other=0.0)  # [BLOCK_H, 64]
    if DOT_F32:
        b_q = b_q.to(tl.float32)
    return b_q


@triton.jit
def _load_k_chunk(p_cache, o_tok, o_scale, m_n, C: tl.constexpr, DOT_F32: tl.constexpr):
    """Dequantized NoPE chunk ``C`` of the tile's token rows: fp8 * 2^(ue8m0 - 127) -> [BLOCK_N, 64] (exact in bf16)."""
    o_k = o_tok[:, None] + (C * 64 + tl.arange(0, 64))[None, :]
    p_k8 = p_cache.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
    b_k8 = tl.load(p_k8 + o_k, mask=m_n[:, None], other=0.0)  # [BLOCK_N, 64] fp8
    b_e = tl.load(p_cache + o_scale + C, mask=m_n, other=127).to(tl.float32)  # [BLOCK_N] ue8m0 byte
    b_s = tl.math.exp2(b_e - 127.0)
    if DOT_F32:
        return b_k8.to(tl.float32) * b_s[:, None]
    return b_k8.to(tl.bfloat16) * b_s.to(tl.bfloat16)[:, None]


@triton.jit
def _attend_tiles(
    acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, m_i, l_i,
    q0, q1, q2, q3, q4, q5, q6, q7,
    p_cache, p_idx, length, page_size, page_stride, tile_lo, tile_hi, qk_scale,
    BLOCK_N: tl.constexpr, ALIGNED: tl.constexpr, DOT_F32: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """Online-softmax attention of the head block over tiles [tile_lo, tile_hi) of one cache.

    acc0..acc7: [BLOCK_H, 64] fp32 unnormalised output chunks; m_i, l_i: [BLOCK_H] running base-2 max and sum."""
    o_n = tl.arange(0, BLOCK_N)
    o_d = tl.arange(0, 64)
    for i_t in range(tile_lo, tile_hi):
        o_pos = i_t * BLOCK_N + o_n
        b_idx = tl.load(p_idx + o_pos, mask=o_pos < length, other=-1)  # [BLOCK_N] slot ids
        m_n = b_idx >= 0
        b_slot = tl.where(m_n, b_idx, 0)
        b_page = (b_slot // page_size).to(tl.int64)
        b_off = (b_slot % page_size).to(tl.int64)
        o_tok = b_page * page_stride + b_off * 576  # byte offset of the token's 576-byte data row
        o_rope = b_page * (page_stride // 2) + b_off * 288  # the same row in bf16 units (page_stride is even)
        o_scale = b_page * page_stride + page_size * 576 + b_off * 8  # its 8 scale bytes
        if ALIGNED:
            o_tok = tl.multiple_of(o_tok, 16)
            o_rope = tl.multiple_of(o_rope, 8)
        # RoPE chunk: bf16 at bytes 448..575 of the data row.
        p_rope = (p_cache + 448).to(tl.pointer_type(tl.bfloat16), bitcast=True)
        o_r = o_rope[:, None] + o_d[None, :]
        k7 = tl.load(p_rope + o_r, mask=m_n[:, None], other=0.0)  # [BLOCK_N, 64] bf16
        if DOT_F32:
            k7 = k7.to(tl.float32)
        k0 = _load_k_chunk(p_cache, o_tok, o_scale, m_n, 0, DOT_F32)
        k1 = _load_k_chunk(p_cache, o_tok, o_scale, m_n, 1, DOT_F32)
        k2 = _load_k_chunk(p_cache, o_tok, o_scale, m_n, 2, DOT_F32)
        k3 = _load_k_chunk(p_cache, o_tok, o_scale, m_n, 3, DOT_F32)
        k4 = _load_k_chunk(p_cache, o_tok, o_scale, m_n, 4, DOT_F32)
        k5 = _load_k_chunk(p_cache, o_tok, o_scale, m_n, 5, DOT_F32)
        k6 = _load_k_chunk(p_cache, o_tok, o_scale, m_n, 6, DOT_F32)
        # scores [BLOCK_H, BLOCK_N] = q . k over the 8 chunks
        b_s = tl.dot(q7, tl.trans(k7), input_precision=DOT_PREC)
        b_s = tl.dot(q0, tl.trans(k0), b_s, input_precision=DOT_PREC)
        b_s = tl.dot(q1, tl.trans(k1), b_s, input_precision=DOT_PREC)
        b_s = tl.dot(q2, tl.trans(k2), b_s, input_precision=DOT_PREC)
        b_s = tl.dot(q3, tl.trans(k3), b_s, input_precision=DOT_PREC)
        b_s = tl.dot(q4, tl.trans(k4), b_s, input_precision=DOT_PREC)
        b_s = tl.dot(q5, tl.trans(k5), b_s, input_precision=DOT_PREC)
        b_s = tl.dot(q6, tl.trans(k6), b_s, input_precision=DOT_PREC)
        b_s = tl.where(m_n[None, :], b_s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(b_s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing valid yet stay at zero weight
        alpha = tl.math.exp2(m_i - m_use)
        b_p = tl.math.exp2(b_s - m_use[:, None])  # [BLOCK_H, BLOCK_N]
        l_i = l_i * alpha + tl.sum(b_p, 1)
        m_i = m_new
        if DOT_F32:
            b_pd = b_p
        else:
            b_pd = b_p.to(tl.bfloat16)
        acc0 = tl.dot(b_pd, k0, acc0 * alpha[:, None], input_precision=DOT_PREC)
        acc1 = tl.dot(b_pd, k1, acc1 * alpha[:, None], input_precision=DOT_PREC)
        acc2 = tl.dot(b_pd, k2, acc2 * alpha[:, None], input_precision=DOT_PREC)
        acc3 = tl.dot(b_pd, k3, acc3 * alpha[:, None], input_precision=DOT_PREC)
        acc4 = tl.dot(b_pd, k4, acc4 * alpha[:, None], input_precision=DOT_PREC)
        acc5 = tl.dot(b_pd, k5, acc5 * alpha[:, None], input_precision=DOT_PREC)
        acc6 = tl.dot(b_pd, k6, acc6 * alpha[:, None], input_precision=DOT_PREC)
        acc7 = tl.dot(b_pd, k7, acc7 * alpha[:, None], input_precision=DOT_PREC)
    return acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, m_i, l_i


@triton.jit
def _sink_scale(scale, lse2, sink, o_h, m_h, valid):
    """``scale`` times exp(lse - logaddexp(lse, sink)) per head (lse2 base 2): sink +inf -> 0, -inf -> unchanged; heads
    with nothing ``valid`` get 0 (no inf - inf)."""
    b_sink = tl.load(sink + o_h, mask=m_h, other=float("-inf")) * 1.4426950408889634
    return tl.where(valid, scale / (1.0 + tl.math.exp2(b_sink - lse2)), 0.0)


@triton.jit
def _split_tiles(
    length, length_x, i_b, i_sp, num_splits,
    TOPK: tl.constexpr, TOPK_X: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LEN: tl.constexpr, HAS_LEN_X: tl.constexpr, HAS_EXTRA: tl.constexpr,
):  # fmt: skip
    """Valid lengths of both candidate lists (only the leftmost `length` entries count) and this split's share
    ``[t_lo, t_hi)`` of the concatenated tile list (main tiles first, then extra tiles from ``t_main``)."""
    n_main = TOPK
    if HAS_LEN:
        n_main = tl.minimum(tl.maximum(tl.load(length + i_b), 0), TOPK)
    t_main = (n_main + BLOCK_N - 1) // BLOCK_N
    t_all = t_main
    n_x = TOPK_X
    if HAS_EXTRA:
        if HAS_LEN_X:
            n_x = tl.minimum(tl.maximum(tl.load(length_x + i_b), 0), TOPK_X)
        t_all = t_main + (n_x + BLOCK_N - 1) // BLOCK_N
    per = (t_all + num_splits - 1) // num_splits
    t_lo = i_sp * per
    t_hi = tl.minimum(t_lo + per, t_all)
    return n_main, n_x, t_main, t_lo, t_hi


@triton.jit
def _store_chunk(p_o, o_h, m_h, acc, scale, C: tl.constexpr, DV: tl.constexpr):
    """Store output chunk ``C`` scaled per head: [BLOCK_H, 64] -> columns C*64.. (only those < DV)."""
    if C * 64 < DV:
        o_d = C * 64 + tl.arange(0, 64)
        b_o = acc * scale[:, None]
        m_o = m_h[:, None] & (o_d < DV)[None, :]
        tl.store(p_o + o_h[:, None] + o_d[None, :], b_o.to(p_o.dtype.element_ty), mask=m_o)


@triton.jit
def _sparse_decode_kernel(
    q, cache, idx, length, cache_x, idx_x, length_x, sink,
    out, lse, o_part, lse_part,
    S, H, TOPK, TOPK_X, page_size, page_stride, page_size_x, page_stride_x, num_splits, qk_scale,
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_ib, stride_is, stride_xb, stride_xs,
    DV: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr,
    HAS_LEN: tl.constexpr, HAS_EXTRA: tl.constexpr, HAS_LEN_X: tl.constexpr, HAS_SINK: tl.constexpr,
    SINGLE: tl.constexpr, ALIGNED: tl.constexpr, DOT_F32: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """Grid (B * S, cdiv(H, BLOCK_H), num_splits). out [B, S, H, DV] bf16 and lse [B, S, H] (natural log, no sink)
    when SINGLE; else o_part [B*S, num_splits, H, 512] fp32 (per-split normalised) and lse_part [B*S, num_splits, H]
    (base 2)."""
    i_r = tl.program_id(0)
    i_hb = tl.program_id(1)
    i_sp = tl.program_id(2)
    i_b = i_r // S
    i_s = i_r % S

    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < H
    p_q = q + i_b.to(tl.int64) * stride_qb + i_s.to(tl.int64) * stride_qs
    o_qh = o_h.to(tl.int64) * stride_qh
    q0 = _load_q_chunk(p_q, o_qh, m_h, stride_qd, 0, DOT_F32)
    q1 = _load_q_chunk(p_q, o_qh, m_h, stride_qd, 1, DOT_F32)
    q2 = _load_q_chunk(p_q, o_qh, m_h, stride_qd, 2, DOT_F32)
    q3 = _load_q_chunk(p_q, o_qh, m_h, stride_qd, 3, DOT_F32)
    q4 = _load_q_chunk(p_q, o_qh, m_h, stride_qd, 4, DOT_F32)
    q5 = _load_q_chunk(p_q, o_qh, m_h, stride_qd, 5, DOT_F32)
    q6 = _load_q_chunk(p_q, o_qh, m_h, stride_qd, 6, DOT_F32)
    q7 = _load_q_chunk(p_q, o_qh, m_h, stride_qd, 7, DOT_F32)

    # valid lengths (only the leftmost `length` entries count) -> this split's share of the valid tiles
    n_main, n_x, t_main, t_lo, t_hi = _split_tiles(
        length, length_x, i_b, i_sp, num_splits, TOPK, TOPK_X, BLOCK_N, HAS_LEN, HAS_LEN_X, HAS_EXTRA
    )

    acc0 = tl.zeros([BLOCK_H, 64], dtype=tl.float32)
    acc1 = tl.zeros([BLOCK_H, 64], dtype=tl.float32)
    acc2 = tl.zeros([BLOCK_H, 64], dtype=tl.float32)
    acc3 = tl.zeros([BLOCK_H, 64], dtype=tl.float32)
    acc4 = tl.zeros([BLOCK_H, 64], dtype=tl.float32)
    acc5 = tl.zeros([BLOCK_H, 64], dtype=tl.float32)
    acc6 = tl.zeros([BLOCK_H, 64], dtype=tl.float32)
    acc7 = tl.zeros([BLOCK_H, 64], dtype=tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)

    p_idx = idx + i_b.to(tl.int64) * stride_ib + i_s.to(tl.int64) * stride_is
    acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, m_i, l_i = _attend_tiles(
        acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, m_i, l_i,
        q0, q1, q2, q3, q4, q5, q6, q7,
        cache, p_idx, n_main, page_size, page_stride, t_lo, tl.minimum(t_hi, t_main), qk_scale,
        BLOCK_N, ALIGNED, DOT_F32, DOT_PREC,
    )  # fmt: skip
    if HAS_EXTRA:
        p_idx_x = idx_x + i_b.to(tl.int64) * stride_xb + i_s.to(tl.int64) * stride_xs
        acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, m_i, l_i = _attend_tiles(
            acc0, acc1, acc2, acc3, acc4, acc5, acc6, acc7, m_i, l_i,
            q0, q1, q2, q3, q4, q5, q6, q7,
            cache_x, p_idx_x, n_x, page_size_x, page_stride_x,
            tl.maximum(t_lo, t_main) - t_main, t_hi - t_main, qk_scale,
            BLOCK_N, ALIGNED, DOT_F32, DOT_PREC,
        )  # fmt: skip

    lse2 = tl.where(l_i > 0.0, m_i + tl.math.log2(l_i), float("-inf"))  # [BLOCK_H] base-2 LSE of the valid scores
    inv_l = tl.where(l_i > 0.0, 1.0 / l_i, 0.0)
    if SINGLE:
        if HAS_SINK:
            inv_l = _sink_scale(inv_l, lse2, sink, o_h, m_h, l_i > 0.0)
        p_o = out + i_r.to(tl.int64) * H * DV
        o_oh = o_h.to(tl.int64) * DV
        tl.store(lse + i_r.to(tl.int64) * H + o_h, lse2 * 0.6931471805599453, mask=m_h)
    else:
        p_o = o_part + (i_r.to(tl.int64) * num_splits + i_sp) * H * 512
        o_oh = o_h.to(tl.int64) * 512
        tl.store(lse_part + (i_r.to(tl.int64) * num_splits + i_sp) * H + o_h, lse2, mask=m_h)
    _store_chunk(p_o, o_oh, m_h, acc0, inv_l, 0, DV)
    _store_chunk(p_o, o_oh, m_h, acc1, inv_l, 1, DV)
    _store_chunk(p_o, o_oh, m_h, acc2, inv_l, 2, DV)
    _store_chunk(p_o, o_oh, m_h, acc3, inv_l, 3, DV)
    _store_chunk(p_o, o_oh, m_h, acc4, inv_l, 4, DV)
    _store_chunk(p_o, o_oh, m_h, acc5, inv_l, 5, DV)
    _store_chunk(p_o, o_oh, m_h, acc6, inv_l, 6, DV)
    _store_chunk(p_o, o_oh, m_h, acc7, inv_l, 7, DV)


@triton.jit
def _e4m3_bits_to_bf16(x):
    """uint8 e4m3 bytes -> bf16 equal to the e4m3 value times 2^-120, exactly (subnormals included: both formats put
    the exponent field right below the sign, so moving the 7 exponent/mantissa bits up by 4 and the sign up by 8
    rescales every value by 2^(127 - 7)). Integer ops only (PRMT/SHL/AND/OR, full rate), instead of the fp8 -> f16 ->
    bf16 conversion pair that runs on the 16-per-clock conversion unit. Four bytes per asm block."""
    return tl.inline_asm_elementwise(
        asm="""{
        .reg .b32 t0, t1, m0, m1, s0, s1;
        prmt.b32 t0, $2, 0, 0x4140;
        prmt.b32 t1, $2, 0, 0x4342;
        shl.b32 t0, t0, 4;
        shl.b32 t1, t1, 4;
        and.b32 m0, t0, 0x07F007F0;
        and.b32 m1, t1, 0x07F007F0;
        and.b32 s0, t0, 0x08000800;
        and.b32 s1, t1, 0x08000800;
        shl.b32 s0, s0, 4;
        shl.b32 s1, s1, 4;
        or.b32 $0, m0, s0;
        or.b32 $1, m1, s1;
        }""",
        constraints="=r,=r,r",
        args=[x],
        dtype=tl.bfloat16,
        is_pure=True,
        pack=4,
    )


@triton.jit
def _load_kv_tile(
    p_cache, o_tok, o_rope, o_scale, m_n,
    BLOCK_N: tl.constexpr, C0: tl.constexpr, NC: tl.constexpr, ALIGNED: tl.constexpr, DOT_F32: tl.constexpr,
    INT_DEQUANT: tl.constexpr = False,
):  # fmt: skip
    """Chunks ``C0 .. C0+NC-1`` of the tile's token rows dequantized to [BLOCK_N, NC*64]: chunks 0..6 = fp8 NoPE *
    2^(ue8m0 - 127) (exact in bf16), chunk 7 = bf16 RoPE. Built as [BLOCK_N, NC, 64] so the per-64 scale is a
    [BLOCK_N, NC] tensor, then flattened. (C0, NC) = (0, 8) is the whole 512-wide row; (0, 4) / (4, 4) its halves.

    ALIGNED: the 8 scale bytes of a token are read as ONE 8-byte word (a [BLOCK_N] int64 load, which Triton can
    software-pipeline with cp.async like the row itself) and split with shifts; else byte loads."""
    o_c = C0 + tl.arange(0, NC)
    o_d = tl.arange(0, 64)
    p_k8 = p_cache.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
    o_k = o_tok[:, None, None] + (o_c * 64)[None, :, None] + o_d[None, None, :]
    if C0 + NC == 8:
        m_nope = m_n[:, None, None] & (o_c < 7)[None, :, None]
    else:
        m_nope = m_n[:, None, None] & (o_c >= 0)[None, :, None]
    b_k8 = tl.load(p_k8 + o_k, mask=m_nope, other=0.0)  # [BLOCK_N, NC, 64] fp8
    if ALIGNED:
        p_w = p_cache.to(tl.pointer_type(tl.int64), bitcast=True)
        b_w = tl.load(p_w + tl.multiple_of(o_scale, 8) // 8, mask=m_n, other=0)  # [BLOCK_N] 8 scale bytes, LE
        b_e = ((b_w[:, None] >> (o_c * 8)[None, :].to(tl.int64)) & 255).to(tl.float32)  # [BLOCK_N, NC]
        b_e = tl.where((o_c < 7)[None, :] & m_n[:, None], b_e, 127.0)
    else:
        m_e = m_n[:, None] & (o_c < 7)[None, :]
        b_e = tl.load(p_cache + o_scale[:, None] + o_c[None, :], mask=m_e, other=127).to(tl.float32)  # [BLOCK_N, NC]
    b_sc = tl.math.exp2(b_e - 127.0)
    if DOT_F32:
        b_k = b_k8.to(tl.float32) * b_sc[:, :, None]
    elif INT_DEQUANT:
        b_kb = _e4m3_bits_to_bf16(b_k8.to(tl.uint8, bitcast=True))  # [BLOCK_N, NC, 64] = e4m3 * 2^-120
        two_120 = tl.full([1, 1, 1], 1.329227995784916e36, tl.bfloat16)  # 2^120, exact in bf16
        b_k = (b_kb * two_120) * b_sc.to(tl.bfloat16)[:, :, None]  # the e4m3 value, then times its scale
    else:
        b_k = b_k8.to(tl.bfloat16) * b_sc.to(tl.bfloat16)[:, :, None]
    if C0 + NC == 8:  # the RoPE chunk is in this range: bf16 at bytes 448..575 of the data row
        p_rope = (p_cache + 448).to(tl.pointer_type(tl.bfloat16), bitcast=True)
        o_r = o_rope[:, None, None] + (o_c * 0)[None, :, None] + o_d[None, None, :]
        m_rope = m_n[:, None, None] & (o_c == 7)[None, :, None]
        b_r = tl.load(p_rope + o_r, mask=m_rope, other=0.0)  # [BLOCK_N, NC, 64] (chunk 7)
        if DOT_F32:
            b_k = b_k + b_r.to(tl.float32)
        else:
            b_k = b_k + b_r
    return tl.reshape(b_k, [BLOCK_N, NC * 64])


@triton.jit
def _load_tile_idx(p_idx, p_idx_x, n_main, n_x, t_main, i_t, o_n, BLOCK_N: tl.constexpr):
    """Slot ids [BLOCK_N] of tile ``i_t`` of the concatenated list (main tiles first); -1 past the valid length."""
    in_main = i_t < t_main
    p_row = tl.where(in_main, p_idx + i_t * BLOCK_N, p_idx_x + (i_t - t_main) * BLOCK_N)
    n_len = tl.where(in_main, n_main - i_t * BLOCK_N, n_x - (i_t - t_main) * BLOCK_N)
    return tl.load(p_row + o_n, mask=o_n < n_len, other=-1)


@triton.jit
def _sparse_decode_wide_kernel(
    q, cache, idx, length, cache_x, idx_x, length_x, sink,
    out, lse, o_part, lse_part,
    S, H, TOPK, TOPK_X, page_size, page_stride, page_size_x, page_stride_x, num_splits, qk_scale,
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_ib, stride_is, stride_xb, stride_xs,
    DV: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, DV_SPLIT: tl.constexpr, INT_DEQUANT: tl.constexpr,
    HAS_LEN: tl.constexpr, HAS_EXTRA: tl.constexpr, HAS_LEN_X: tl.constexpr, HAS_SINK: tl.constexpr,
    SINGLE: tl.constexpr, ALIGNED: tl.constexpr, DOT_F32: tl.constexpr, DOT_PREC: tl.constexpr,
):  # fmt: skip
    """Same contract as ``_sparse_decode_kernel``, with the 512-wide row as ONE tile: q [BLOCK_H, 512], K/V
    [BLOCK_N, 512], acc [BLOCK_H, 512 / DV_SPLIT]. Two dots per tile (K=512 deep QK, N=512 wide PV) instead of 16
    chunk dots, so the tensor cores get long wgmma chains and the accumulator is one tensor.

    Grid (B * S, cdiv(H, BLOCK_H) * DV_SPLIT, num_splits). DV_SPLIT = 2: the program owns one 256-column half of the
    output (V = that half of the gathered row) and computes the full QK itself, so its accumulator is half as big
    (one warpgroup holds it) and the two halves need no merge; both compute the same scores and LSE."""
    i_r = tl.program_id(0)
    i_hb = tl.program_id(1) // DV_SPLIT
    i_dv = tl.program_id(1) % DV_SPLIT
    i_sp = tl.program_id(2)
    i_b = i_r // S
    i_s = i_r % S
    BLOCK_DV: tl.constexpr = 512 // DV_SPLIT

    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < H
    p_q = q + i_b.to(tl.int64) * stride_qb + i_s.to(tl.int64) * stride_qs + o_h.to(tl.int64)[:, None] * stride_qh
    if DV_SPLIT == 1:
        o_d = tl.arange(0, 512)
        b_q = tl.load(p_q + o_d[None, :] * stride_qd, mask=m_h[:, None], other=0.0)  # [BLOCK_H, 512]
        if DOT_F32:
            b_q = b_q.to(tl.float32)
    else:
        o_d = tl.arange(0, 256)
        b_qa = tl.load(p_q + o_d[None, :] * stride_qd, mask=m_h[:, None], other=0.0)  # [BLOCK_H, 256] cols 0..255
        b_qb = tl.load(p_q + (256 + o_d)[None, :] * stride_qd, mask=m_h[:, None], other=0.0)  # cols 256..511
        if DOT_F32:
            b_qa = b_qa.to(tl.float32)
            b_qb = b_qb.to(tl.float32)

    n_main, n_x, t_main, t_lo, t_hi = _split_tiles(
        length, length_x, i_b, i_sp, num_splits, TOPK, TOPK_X, BLOCK_N, HAS_LEN, HAS_LEN_X, HAS_EXTRA
    )

    acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    p_idx = idx + i_b.to(tl.int64) * stride_ib + i_s.to(tl.int64) * stride_is
    p_idx_x = idx_x + i_b.to(tl.int64) * stride_xb + i_s.to(tl.int64) * stride_xs
    o_n = tl.arange(0, BLOCK_N)
    # One loop over this split's tiles of the concatenated list (main ++ extra): the cache, its page geometry and the
    # index row are scalars selected per tile, so both caches share one pipelined loop body.
    # The slot ids of the next tile are loaded one iteration ahead (their latency hides behind this tile's math).
    b_idx_next = _load_tile_idx(p_idx, p_idx_x, n_main, n_x, t_main, t_lo, o_n, BLOCK_N)
    for i_t in range(t_lo, t_hi):
        in_main = i_t < t_main
        p_cache = tl.where(in_main, cache, cache_x)
        psz = tl.where(in_main, page_size, page_size_x)
        pst = tl.where(in_main, page_stride, page_stride_x)
        b_idx = b_idx_next  # [BLOCK_N] slot ids of tile i_t
        b_idx_next = _load_tile_idx(p_idx, p_idx_x, n_main, n_x, t_main, i_t + 1, o_n, BLOCK_N)
        m_n = b_idx >= 0
        b_slot = tl.where(m_n, b_idx, 0)
        b_page = (b_slot // psz).to(tl.int64)
        b_off = (b_slot % psz).to(tl.int64)
        o_tok = b_page * pst + b_off * 576  # byte offset of the token's 576-byte data row
        o_rope = b_page * (pst // 2) + b_off * 288  # the same row in bf16 units (page strides are even)
        o_scale = b_page * pst + psz * 576 + b_off * 8  # its 8 scale bytes
        if ALIGNED:
            o_tok = tl.multiple_of(o_tok, 16)
            o_rope = tl.multiple_of(o_rope, 8)
        if DV_SPLIT == 1:
            b_k = _load_kv_tile(p_cache, o_tok, o_rope, o_scale, m_n, BLOCK_N, 0, 8, ALIGNED, DOT_F32, INT_DEQUANT)
            b_s = tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PREC)  # [BLOCK_H, BLOCK_N]
        else:
            b_ka = _load_kv_tile(p_cache, o_tok, o_rope, o_scale, m_n, BLOCK_N, 0, 4, ALIGNED, DOT_F32, INT_DEQUANT)
            b_kb = _load_kv_tile(p_cache, o_tok, o_rope, o_scale, m_n, BLOCK_N, 4, 4, ALIGNED, DOT_F32, INT_DEQUANT)
            b_s = tl.dot(b_qa, tl.trans(b_ka), input_precision=DOT_PREC)  # [BLOCK_H, BLOCK_N]
            b_s = tl.dot(b_qb, tl.trans(b_kb), b_s, input_precision=DOT_PREC)
            b_k = tl.where(i_dv == 0, b_ka, b_kb)  # V = this program's half of the row: [BLOCK_N, 256]
        b_s = tl.where(m_n[None, :], b_s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(b_s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing valid yet stay at zero weight
        alpha = tl.math.exp2(m_i - m_use)
        b_p = tl.math.exp2(b_s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(b_p, 1)
        m_i = m_new
        if DOT_F32:
            b_pd = b_p
        else:
            b_pd = b_p.to(tl.bfloat16)
        acc = tl.dot(b_pd, b_k, acc * alpha[:, None], input_precision=DOT_PREC)  # [BLOCK_H, BLOCK_DV]

    lse2 = tl.where(l_i > 0.0, m_i + tl.math.log2(l_i), float("-inf"))
    inv_l = tl.where(l_i > 0.0, 1.0 / l_i, 0.0)
    o_v = i_dv * BLOCK_DV + tl.arange(0, BLOCK_DV)  # this program's output columns
    m_lse = m_h & (i_dv == 0)  # every half computes the same LSE; the first one writes it
    if SINGLE:
        if HAS_SINK:
            inv_l = _sink_scale(inv_l, lse2, sink, o_h, m_h, l_i > 0.0)
        p_o = out + i_r.to(tl.int64) * H * DV + o_h.to(tl.int64)[:, None] * DV + o_v[None, :]
        tl.store(lse + i_r.to(tl.int64) * H + o_h, lse2 * 0.6931471805599453, mask=m_lse)
    else:
        p_o = o_part + (i_r.to(tl.int64) * num_splits + i_sp) * H * 512 + o_h.to(tl.int64)[:, None] * 512 + o_v[None, :]
        tl.store(lse_part + (i_r.to(tl.int64) * num_splits + i_sp) * H + o_h, lse2, mask=m_lse)
    b_o = acc * inv_l[:, None]
    tl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=m_h[:, None] & (o_v < DV)[None, :])


@triton.jit
def _sparse_decode_combine_kernel(
    o_part, lse_part, sink, out, lse, H, num_splits,
    DV: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, HAS_SINK: tl.constexpr,
):  # fmt: skip
    """LSE-merge of the splits. Grid (B * S, cdiv(H, BLOCK_H), cdiv(DV, BLOCK_D)); sink applied once here.

    Every split's partial is loaded in one [BLOCK_S, BLOCK_H, BLOCK_D] tile (BLOCK_S = next power of two >= the split
    count), so the loads are all in flight at once instead of one dependent round trip per split."""
    i_r = tl.program_id(0)
    i_hb = tl.program_id(1)
    i_db = tl.program_id(2)
    o_sp = tl.arange(0, BLOCK_S)
    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    o_d = i_db * BLOCK_D + tl.arange(0, BLOCK_D)
    m_sp = o_sp < num_splits
    m_h = o_h < H
    m_d = o_d < DV
    m_sh = m_sp[:, None] & m_h[None, :]
    p_lse = lse_part + i_r.to(tl.int64) * num_splits * H + o_sp[:, None] * H + o_h[None, :]
    b_lse = tl.load(p_lse, mask=m_sh, other=float("-inf"))  # [BLOCK_S, BLOCK_H] base-2 LSE per split
    m_max = tl.max(b_lse, 0)
    m_use = tl.where(m_max == float("-inf"), 0.0, m_max)
    b_w = tl.math.exp2(b_lse - m_use[None, :])  # [BLOCK_S, BLOCK_H]; 0 for empty splits
    b_tot = tl.sum(b_w, 0)
    o_sh = (i_r.to(tl.int64) * num_splits + o_sp[:, None].to(tl.int64)) * H + o_h[None, :]  # [BLOCK_S, BLOCK_H]
    p_o = o_part + o_sh[:, :, None] * 512 + o_d[None, None, :]
    b_o = tl.load(p_o, mask=m_sh[:, :, None] & m_d[None, None, :], other=0.0)  # [BLOCK_S, BLOCK_H, BLOCK_D]
    b_acc = tl.sum(b_w[:, :, None] * b_o.to(tl.float32), 0)  # [BLOCK_H, BLOCK_D]
    lse2 = tl.where(b_tot > 0.0, m_use + tl.math.log2(b_tot), float("-inf"))
    b_scale = tl.where(b_tot > 0.0, 1.0 / b_tot, 0.0)
    if HAS_SINK:
        b_scale = _sink_scale(b_scale, lse2, sink, o_h, m_h, b_tot > 0.0)
    p_out = out + i_r.to(tl.int64) * H * DV + o_h[:, None].to(tl.int64) * DV + o_d[None, :]
    tl.store(p_out, (b_acc * b_scale[:, None]).to(out.dtype.element_ty), mask=m_h[:, None] & m_d[None, :])
    if i_db == 0:
        tl.store(lse + i_r.to(tl.int64) * H + o_h, lse2 * 0.6931471805599453, mask=m_h)


def combine_blocks(splits: int, heads: int) -> tuple[int, int, int]:
    """(BLOCK_S, BLOCK_H, BLOCK_D) of the combine kernel: all splits in one tile of <= 4096 fp32 values (32 registers
    per thread at 4 warps), heads before columns so each program stores whole 64..128-column runs."""
    block_s = triton.next_power_of_2(max(splits, 1))
    block_d = max(16, min(128, 4096 // block_s))
    block_h = max(2, min(16, triton.next_power_of_2(heads), 4096 // (block_s * block_d)))
    return block_s, block_h, block_d


# --------------------------------------------------------------------------------------------------------------------
# launcher
# --------------------------------------------------------------------------------------------------------------------
def _cache_bytes(k_cache: torch.Tensor, name: str) -> tuple[torch.Tensor, int, int]:
    """(uint8 view sharing the cache's storage, page_size, page stride in bytes) of a V4 ``k_cache`` view."""
    if k_cache.dim() != 4 or k_cache.shape[-1] != V4_BYTES_PER_TOKEN or k_cache.element_size() != 1:
        raise ValueError(f"{name} must be a 1-byte V4 view [num_pages, page_size, 1, 584], got {list(k_cache.shape)}")
    page_size, page_stride = k_cache.shape[1], k_cache.stride(0)
    if page_stride % 2 or k_cache.data_ptr() % 2:
        raise ValueError(f"{name} pages must start at even byte addresses (bf16 RoPE), got stride {page_stride}")
    if page_stride < page_size * V4_BYTES_PER_TOKEN:
        raise ValueError(f"{name}.stride(0)={page_stride} is smaller than a page ({page_size} x 584 bytes)")
    raw = k_cache.view(torch.uint8) if k_cache.dtype != torch.uint8 else k_cache
    return raw, page_size, page_stride


def _check_rows(t: torch.Tensor | None, batch: int, name: str) -> torch.Tensor | None:
    if t is None:
        return None
    if t.dim() != 1 or t.shape[0] != batch or t.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"{name} must be [B={batch}] int32, got {list(t.shape)} {t.dtype}")
    return t


def _is_interpreted() -> bool:
    """True when this module's kernels were defined for Triton's CPU interpreter."""
    return type(_sparse_decode_kernel).__name__ == "InterpretedFunction"


def sparse_decode_fwd(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    head_dim_v: int = V4_DIM,
    softmax_scale: float | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices_in_kvcache: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    *,
    num_splits: int | str = "auto",
    config: DecodeConfig | None = None,
    interpret: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the decode kernel(s): ``(out [B, s_q, H, head_dim_v] bf16, lse [B, H, s_q] fp32)``.

    ``lse`` is a permuted view of a [B, s_q, H] buffer (natural log, sink excluded, -inf for rows with no valid
    entry), the orientation sglang's torch path returns. ``num_splits``: "auto" or a positive int (clamped to the
    number of tiles). ``interpret``: the Triton CPU interpreter runs it (dots in fp32, small tiles).
    """
    if interpret != _is_interpreted():
        raise RuntimeError(
            "TRITON_INTERPRET must be set before triton is imported (triton.jit reads it when kernels are defined); "
            f"interpret={interpret} but the kernels were built for the {'interpreter' if not interpret else 'GPU'}"
        )
    batch, s_q, heads, dim = q.shape
    if dim != V4_DIM:
        raise ValueError(f"q must have head dim {V4_DIM}, got {dim}")
    if q.dtype != torch.bfloat16:
        raise ValueError(f"q must be bf16, got {q.dtype}")
    if indices.dim() != 3 or tuple(indices.shape[:2]) != (batch, s_q) or indices.dtype != torch.int32:
        raise ValueError(f"indices must be [B, s_q, topk] int32, got {list(indices.shape)} {indices.dtype}")
    if not 0 < head_dim_v <= V4_DIM:
        raise ValueError(f"head_dim_v must be in 1..{V4_DIM}, got {head_dim_v}")
    cache, page_size, page_stride = _cache_bytes(k_cache, "k_cache")
    topk_length = _check_rows(topk_length, batch, "topk_length")
    has_extra = extra_k_cache is not None and extra_indices_in_kvcache is not None
    if has_extra:
        cache_x, page_size_x, page_stride_x = _cache_bytes(extra_k_cache, "extra_k_cache")
        idx_x = extra_indices_in_kvcache
        if idx_x.dim() != 3 or tuple(idx_x.shape[:2]) != (batch, s_q) or idx_x.dtype != torch.int32:
            raise ValueError(f"extra_indices_in_kvcache must be [B, s_q, topk] int32, got {list(idx_x.shape)}")
        extra_topk_length = _check_rows(extra_topk_length, batch, "extra_topk_length")
    else:
        cache_x, page_size_x, page_stride_x, idx_x, extra_topk_length = cache, 1, 0, indices, None
    if attn_sink is not None and (attn_sink.shape != (heads,) or attn_sink.dtype != torch.float32):
        raise ValueError(f"attn_sink must be [H={heads}] fp32, got {list(attn_sink.shape)} {attn_sink.dtype}")
    if indices.stride(2) != 1 or idx_x.stride(2) != 1:
        raise ValueError("indices must be contiguous along topk")
    if softmax_scale is None:
        softmax_scale = dim**-0.5

    cfg = config or default_config(heads, batch * s_q, interpret)
    topk, topk_x = indices.shape[2], idx_x.shape[2] if has_extra else 0
    rows = batch * s_q
    head_blocks = triton.cdiv(heads, cfg.block_h)
    max_tiles = triton.cdiv(topk, cfg.block_n) + triton.cdiv(topk_x, cfg.block_n)
    sms = 132 if interpret or not q.is_cuda else _num_sms(q.device.index or 0)
    splits = choose_num_splits(rows, head_blocks * cfg.dv_split, max_tiles, sms, num_splits)
    aligned = all(t.data_ptr() % 16 == 0 for t in (cache, cache_x)) and page_stride % 16 == 0
    aligned = aligned and page_stride_x % 16 == 0

    # The interpreter truncates fp32 -> bf16 stores (Triton 3.8); there the kernel writes fp32 and torch rounds.
    out_dtype = torch.float32 if interpret else torch.bfloat16
    out = torch.empty(batch, s_q, heads, head_dim_v, dtype=out_dtype, device=q.device)
    lse = torch.empty(batch, s_q, heads, dtype=torch.float32, device=q.device)
    part_dtype = torch.bfloat16 if cfg.partial_bf16 and not interpret else torch.float32  # fp32 there too, likewise
    if splits > 1:
        o_part = torch.empty(rows, splits, heads, V4_DIM, dtype=part_dtype, device=q.device)
        lse_part = torch.empty(rows, splits, heads, dtype=torch.float32, device=q.device)
    else:
        o_part, lse_part = out, lse  # unused
    dummy = indices  # any tensor for absent optional pointers (never dereferenced: constexpr-guarded)
    grid = (rows, head_blocks * cfg.dv_split, splits)
    # the interpreter cannot run the integer dequant's inline PTX
    wide = {"DV_SPLIT": cfg.dv_split, "INT_DEQUANT": cfg.int_dequant and not interpret} if cfg.kernel == "wide" else {}
    kernel = _sparse_decode_wide_kernel if cfg.kernel == "wide" else _sparse_decode_kernel
    kernel[grid](
        q, cache, indices, topk_length if topk_length is not None else dummy,
        cache_x, idx_x, extra_topk_length if extra_topk_length is not None else dummy,
        attn_sink if attn_sink is not None else dummy,
        out, lse, o_part, lse_part,
        s_q, heads, topk, topk_x, page_size, page_stride, page_size_x, page_stride_x, splits,
        float(softmax_scale) * LOG2E,
        q.stride(0), q.stride(1), q.stride(2), q.stride(3),
        indices.stride(0), indices.stride(1), idx_x.stride(0), idx_x.stride(1),
        DV=head_dim_v, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, **wide,
        HAS_LEN=topk_length is not None, HAS_EXTRA=has_extra, HAS_LEN_X=extra_topk_length is not None,
        HAS_SINK=attn_sink is not None, SINGLE=splits == 1, ALIGNED=aligned, DOT_F32=interpret,
        DOT_PREC="ieee" if interpret else "tf32",
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )  # fmt: skip
    if splits > 1:
        block_s, block_hc, block_d = combine_blocks(splits, heads)
        cgrid = (rows, triton.cdiv(heads, block_hc), triton.cdiv(head_dim_v, block_d))
        _sparse_decode_combine_kernel[cgrid](
            o_part, lse_part, attn_sink if attn_sink is not None else dummy, out, lse, heads, splits,
            DV=head_dim_v, BLOCK_S=block_s, BLOCK_H=block_hc, BLOCK_D=block_d, HAS_SINK=attn_sink is not None,
            num_warps=4,
        )  # fmt: skip
    return out.to(torch.bfloat16), lse.permute(0, 2, 1)


def flops_and_bytes(batch: int, heads: int, topk_total: int) -> tuple[float, float]:
    """(FLOPs, minimum HBM bytes) of one decode call: QK over 512 + PV over 512; KV rows read once (584 B),
    indices, q, out."""
    flops = 2.0 * batch * heads * topk_total * (V4_DIM + V4_DIM)
    nbytes = batch * topk_total * (V4_DATA_BYTES + V4_SCALE_BYTES + 4) + batch * heads * (V4_DIM * 2 * 2 + 4)
    return flops, float(nbytes)


__all__ = ["DecodeConfig", "choose_num_splits", "default_config", "flops_and_bytes", "sparse_decode_fwd"]
