"""Triton lightning indexer for DeepSeek-V4: paged MQA logits over the real lengths, and a fused logits + top-k decode
path (the top-k itself: :mod:`sparsemla.kernels.indexer.topk`).

Semantics are those of :mod:`sparsemla.kernels.indexer.reference` (this module never imports it).

Schedule (why the cost follows the real length, not the page-table width ``cap``)
----------------------------------------------------------------------------------
The logits grid is ``(B, num_splits)`` with ``num_splits`` chosen from ``B`` and the SM count only (never from
``cap`` or the lengths), so a CUDA graph captured for a batch size replays for any lengths. Program ``(b, s)`` reads
``seq_len[b]`` on the device and walks the key blocks ``s, s + num_splits, s + 2 * num_splits, ...`` below
``cdiv(L_b, BLOCK_N)``: a program whose first block is past the length runs zero iterations (no load at all), and no
page-table entry, key or scale past ``L_b`` is ever read. All ``next_n`` query rows of a request share each key load
(one ``[next_n * H, 128] x [128, BLOCK_N]`` dot).

Fused decode path: the logits kernel writes the request's logits into a reused, grow-only workspace (not the
``[rows, max_seq_len]`` output), counts finished programs per request with an acq_rel atomic, and the last program of
each request runs the top-k of its rows while the logits are still in L2 -- one launch, no logits output tensor.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from sparsemla.kernels import device as dev
from sparsemla.kernels.dequant import e4m3_bits_to_bf16_value, opaque_bf16
from sparsemla.kernels.indexer.topk import (
    FUSED_ROW_TILES,
    STREAM_BITS,
    _check_k,
    _topk_block,
    _topk_paths,
    _topk_row,
    indexer_topk_fwd,
    radix_bits,
)
from sparsemla.kernels.layouts import IDX_BYTES_PER_TOKEN, IDX_DIM, IDX_PAGE, IDX_SCALE_OFFSET

PAGE_TOKENS = tl.constexpr(IDX_PAGE)  # tokens per key page
SCALE_OFFSET = tl.constexpr(IDX_SCALE_OFFSET)  # bytes: the page's fp32 scale plane starts here

DOT_FP8, DOT_BF16, DOT_FP32 = 0, 1, 2
# Widest rows the fused launch selects in its tail (one program per row, the row in registers); wider rows take the
# logits launch then the split top-k. H200, B=1, top-512, graph replay: fused 22 us at 4k but 108 us at 16k, where
# the logits alone take 8.8 us (results/bench/explore/topk_breakdown-native-h200-2026-12-02.json).
FUSED_MAX_COLS = FUSED_ROW_TILES[1]


# ---------------------------------------------------------------------------------------------------------------------
# kernels
# ---------------------------------------------------------------------------------------------------------------------
@triton.jit
def _indexer_logits_kernel(
    q_ptr,  # uint8 view of fp8 [B, NEXT_N, H, 128]
    kv_ptr,  # uint8 pages, stride_kv_page bytes apart
    w_ptr,  # fp32 [B * NEXT_N, H]
    lens_ptr,  # int32 [B, 1] or [B, NEXT_N]
    pt_ptr,  # int32 [B, max_pages]
    out_ptr,  # fp32 logits rows (the output, or the fused workspace)
    count_ptr,  # int32 [B] programs finished per request (fused only; left at 0)
    idx_ptr,  # int32 [B * NEXT_N, K] top-k positions (fused only)
    stride_qb,
    stride_qn,
    stride_qh,
    stride_kv_page,
    stride_wr,
    stride_lb,
    stride_ln,
    stride_pt,
    stride_out,
    stride_idx,
    max_seq_len,
    NEXT_N: tl.constexpr,
    H: tl.constexpr,
    D: tl.constexpr,
    PER_ROW_LENS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_MODE: tl.constexpr,
    SWAP_AB: tl.constexpr,
    FUSE_TOPK: tl.constexpr,
    K: tl.constexpr,
    TOPK_BLOCK: tl.constexpr,
    TOPK_ROW_SMALL: tl.constexpr,
    TOPK_ROW_MAX: tl.constexpr,
    TOPK_STREAM: tl.constexpr,
    TOPK_RADIX: tl.constexpr,
    TOPK_STREAM_BITS: tl.constexpr,
    SORT: tl.constexpr,
    OPAQUE_BF16: tl.constexpr = False,
):
    i_b = tl.program_id(0)
    i_s = tl.program_id(1)
    n_s = tl.num_programs(1)
    M: tl.constexpr = NEXT_N * H

    # -- per-row lengths: DeepGEMM-style causal rows unless given per row ---------------------------------------------
    o_r = tl.arange(0, NEXT_N)
    if PER_ROW_LENS:
        lens = tl.load(lens_ptr + i_b * stride_lb + o_r * stride_ln)  # [NEXT_N]
    else:
        lens = tl.load(lens_ptr + i_b * stride_lb) - NEXT_N + 1 + o_r  # [NEXT_N]
    lens = tl.minimum(tl.maximum(lens, 0), max_seq_len)
    longest = tl.max(lens, axis=0)
    n_blocks = tl.cdiv(longest, BLOCK_N)

    o_m = tl.arange(0, M)
    o_d = tl.arange(0, D)
    o_n = tl.arange(0, BLOCK_N)
    rows = i_b.to(tl.int64) * NEXT_N + o_r  # [NEXT_N]
    p_out = out_ptr + rows[:, None] * stride_out  # [NEXT_N, 1]

    if i_s < n_blocks:
        p_q = q_ptr + i_b.to(tl.int64) * stride_qb + (o_m // H) * stride_qn + (o_m % H) * stride_qh
        b_q = tl.load(p_q[:, None] + o_d[None, :])  # [M, D] uint8 (e4m3 bits)
        if DOT_MODE == 0:
            b_q = b_q.to(tl.float8e4nv, bitcast=True)
        elif DOT_MODE == 1:  # no e4m3 type needed (sm_80/86): integer dequant, exact
            b_q = e4m3_bits_to_bf16_value(b_q)
            if OPAQUE_BF16:
                b_q = opaque_bf16(b_q)
        else:
            b_q = b_q.to(tl.float8e4nv, bitcast=True).to(tl.float32)
        b_w = tl.load(w_ptr + (i_b.to(tl.int64) * NEXT_N + o_m // H) * stride_wr + o_m % H)  # [M]
        p_pt = pt_ptr + i_b.to(tl.int64) * stride_pt
        for blk in range(i_s, n_blocks, n_s):
            o_t = blk * BLOCK_N + o_n  # [BLOCK_N] token positions
            m_t = o_t < longest
            page = tl.load(p_pt + o_t // PAGE_TOKENS, mask=m_t, other=0).to(tl.int64)  # [BLOCK_N]
            p_page = kv_ptr + page * stride_kv_page
            p_k = p_page + (o_t % PAGE_TOKENS) * D  # [BLOCK_N]
            b_k = tl.load(p_k[:, None] + o_d[None, :], mask=m_t[:, None], other=0)  # [BLOCK_N, D] uint8
            p_s = (p_page + SCALE_OFFSET + (o_t % PAGE_TOKENS) * 4).to(tl.pointer_type(tl.float32))
            b_sc = tl.load(p_s, mask=m_t, other=0.0)  # [BLOCK_N]
            if DOT_MODE == 0:
                b_k = b_k.to(tl.float8e4nv, bitcast=True)
            elif DOT_MODE == 1:
                b_k = e4m3_bits_to_bf16_value(b_k)
                if OPAQUE_BF16:
                    b_k = opaque_bf16(b_k)
            else:
                b_k = b_k.to(tl.float8e4nv, bitcast=True).to(tl.float32)
            if SWAP_AB:
                # tokens on the MMA's M side: the head sum stays inside a thread quad (no shared-memory reduction)
                b_s = tl.dot(b_k, tl.trans(b_q))  # [BLOCK_N, M] fp32
                b_s = tl.maximum(b_s, 0.0) * b_w[None, :]
                b_l = tl.sum(tl.reshape(b_s, [BLOCK_N, NEXT_N, H]), axis=2) * b_sc[:, None]  # [BLOCK_N, NEXT_N]
                m_out = o_t[:, None] < lens[None, :]
                tl.store(out_ptr + rows[None, :] * stride_out + o_t[:, None], b_l, mask=m_out)
            else:
                b_s = tl.dot(b_q, tl.trans(b_k))  # [M, BLOCK_N] fp32
                b_s = tl.maximum(b_s, 0.0) * b_w[:, None]
                b_l = tl.sum(tl.reshape(b_s, [NEXT_N, H, BLOCK_N]), axis=1) * b_sc[None, :]  # [NEXT_N, BLOCK_N]
                m_out = o_t[None, :] < lens[:, None]
                tl.store(p_out + o_t[None, :], b_l, mask=m_out)

    if FUSE_TOPK:
        # Last program of request b to finish runs its rows' top-k. The barrier orders this CTA's logit stores before
        # the release; the acquire side reads with .cg (L2), so other CTAs' logits are visible.
        tl.debug_barrier()
        done = tl.atomic_add(count_ptr + i_b, 1, sem="acq_rel", scope="gpu")
        if done == n_s - 1:
            tl.debug_barrier()
            for i in tl.static_range(NEXT_N):
                row = i_b.to(tl.int64) * NEXT_N + i
                if PER_ROW_LENS:
                    n_i = tl.load(lens_ptr + i_b * stride_lb + i * stride_ln)
                else:
                    n_i = tl.load(lens_ptr + i_b * stride_lb) - NEXT_N + 1 + i
                n_i = tl.minimum(tl.maximum(n_i, 0), max_seq_len)
                _topk_row(
                    out_ptr + row * stride_out,
                    n_i,
                    idx_ptr + row * stride_idx,
                    idx_ptr,
                    pt_ptr,
                    K,
                    TOPK_BLOCK,
                    TOPK_ROW_SMALL,
                    TOPK_ROW_MAX,
                    TOPK_STREAM,
                    False,
                    True,
                    6,
                    True,
                    SORT,
                    idx_ptr,
                    0,
                    1,
                    1,
                    TOPK_RADIX,
                    TOPK_STREAM_BITS,
                )
            tl.store(count_ptr + i_b, 0)  # ready for the next launch (CUDA-graph replays included)


# ---------------------------------------------------------------------------------------------------------------------
# launchers
# ---------------------------------------------------------------------------------------------------------------------
def _dot_mode(info: dev.DeviceInfo) -> int:
    """fp8 MMAs where the target has an e4m3 type (sm_89+); bf16 MMAs fed by the integer dequant on sm_80/86 (no
    ``tl.float8e4nv`` there); fp32 under the interpreter, whose fp8/bf16 dots are wrong."""
    if info is dev.INTERPRETER:
        return DOT_FP32
    return DOT_FP8 if info.has_fp8 else DOT_BF16


# mma.sync targets from this many requests on: programs per SM of the logits launch (see choose_logits_config)
MMA_SYNC_FEW_SPLITS_FROM = 32
MMA_SYNC_PROGRAMS_PER_SM = 4


def num_splits_for(
    batch: int, num_sms: int, programs_per_sm: int = 8, max_splits: int = 256, at_most: bool = False
) -> int:
    """Programs per request: enough to give every SM ``programs_per_sm`` programs (``at_most``: no more than that,
    rounded down); a function of B only (graph-safe)."""
    want = num_sms * programs_per_sm
    per_request = want // max(batch, 1) if at_most else -(-want // max(batch, 1))
    return max(1, min(max_splits, per_request))


def _check_logits_inputs(q_fp8, kv_cache_fp8, weights, seq_lens, page_table) -> tuple[int, int, int]:
    if q_fp8.dim() != 4 or q_fp8.shape[-1] != IDX_DIM:
        raise ValueError(f"q_fp8 must be [B, next_n, H, {IDX_DIM}], got {list(q_fp8.shape)}")
    batch, next_n, heads, _ = q_fp8.shape
    if next_n not in (1, 2):
        raise ValueError(f"next_n must be 1 or 2, got {next_n}")
    if heads & (heads - 1) or heads < 16:
        raise ValueError(f"heads must be a power of two >= 16, got {heads}")
    if q_fp8.element_size() != 1 or q_fp8.stride(-1) != 1:
        raise ValueError("q_fp8 must be a 1-byte (fp8) tensor with a contiguous last dim")
    if kv_cache_fp8.dim() != 4 or tuple(kv_cache_fp8.shape[1:]) != (IDX_PAGE, 1, IDX_BYTES_PER_TOKEN):
        shape = f"[num_pages, {IDX_PAGE}, 1, {IDX_BYTES_PER_TOKEN}]"
        raise ValueError(f"kv_cache_fp8 must be {shape}, got {list(kv_cache_fp8.shape)}")
    if kv_cache_fp8.element_size() != 1 or kv_cache_fp8.stride(1) != IDX_BYTES_PER_TOKEN or kv_cache_fp8.stride(3) != 1:
        raise ValueError(f"kv_cache_fp8 must be a 1-byte tensor with dense pages (stride(1) == {IDX_BYTES_PER_TOKEN})")
    if weights.shape != (batch * next_n, heads) or weights.dtype != torch.float32 or weights.stride(-1) != 1:
        raise ValueError(f"weights must be fp32 [{batch * next_n}, {heads}] with unit last stride")
    if page_table.dim() != 2 or page_table.shape[0] != batch or page_table.dtype != torch.int32:
        got = f"{page_table.dtype} {list(page_table.shape)}"
        raise ValueError(f"page_table must be int32 [{batch}, max_pages], got {got}")
    if seq_lens.dtype != torch.int32 or seq_lens.numel() not in (batch, batch * next_n):
        got = f"{seq_lens.dtype} {list(seq_lens.shape)}"
        raise ValueError(f"seq_lens must be int32 [B], [B, 1] or [B, next_n], got {got}")
    return batch, next_n, heads


def _lens_2d(seq_lens: torch.Tensor, batch: int, next_n: int) -> tuple[torch.Tensor, bool]:
    lens = seq_lens.reshape(batch, -1)
    per_row = lens.shape[1] == next_n and next_n > 1
    return lens, per_row


def _row_lengths(seq_lens: torch.Tensor, batch: int, next_n: int, max_seq_len: int) -> torch.Tensor:
    """int32 ``[B * next_n]`` logits-row lengths, as the kernel derives them: per row when given, else causal
    (``L - next_n + 1 + i``), clamped to ``[0, max_seq_len]``. Device ops only (graph-safe)."""
    lens, per_row = _lens_2d(seq_lens, batch, next_n)
    if not per_row:
        lens = lens[:, :1] - next_n + 1 + torch.arange(next_n, device=lens.device, dtype=lens.dtype)
    return lens.reshape(-1).clamp(0, max_seq_len).to(torch.int32)


@dataclass(frozen=True)
class LogitsConfig:
    """Launch shape of the logits kernel (also the fused logits + top-k launch).

    block_n: key tokens per tile; swap_ab: tokens on the MMA's M side (the head sum stays inside a thread quad);
    num_splits: programs per request (grid ``(B, num_splits)``); dot_mode: DOT_FP8 / DOT_BF16 / DOT_FP32;
    opaque_bf16 (DOT_BF16 only; off: timed 0-4 % slower, docs/gpus.md): the dequantized q and keys pass through
    :func:`~sparsemla.kernels.dequant.opaque_bf16`, so Triton lays the MMA operands out for bf16 rather than for the
    uint8 bytes they came from (ahead of time, Triton 3.8, sm_80, B = 64, 4k: 1,455 -> 972 loop instructions, but
    51,200 -> 82,944 B of shared memory, over ``support.INDEXER_SHARED_MAX``, because the bf16 keys are staged)."""

    block_n: int
    swap_ab: bool
    num_splits: int
    num_warps: int
    num_stages: int
    dot_mode: int
    opaque_bf16: bool = False


def choose_logits_config(
    info: dev.DeviceInfo, batch: int, next_n: int, heads: int, fuse_topk: bool = False
) -> LogitsConfig:
    """From the device and shapes only (graph-safe). H200 sweep (graph replay, H=64, cap 64k): 5 cp.async stages keep
    more key tiles in flight per program; B=64 at 4k / 16k / 64k: 24.6 / 56.2 / 171 us vs 24.3 / 62.5 / 204 with 3
    (3 and 4 measure the same). One key tile per program at small B: 2 stages (B=1, 4k: 7.7 vs 8.0 us). Every target
    takes the same tiles (43 KB of shared memory at most: within the 101,376 B of sm_86/89/120); sm_80/86 have no
    e4m3 type and run bf16 MMAs on integer-dequantized keys.

    mma.sync targets (sm_80..sm_89, sm_120), from ``MMA_SYNC_FEW_SPLITS_FROM`` rows: at most
    ``MMA_SYNC_PROGRAMS_PER_SM`` longer programs per SM instead of 8, rounded down (a rounded-up count left a worse
    tail of programs; sm_89 code path on the H200, results/bench/explore/README.md). ``swap_ab`` stays on there too:
    with the heads on the M side their sum's order depends on the warp count, so the fused launch (8 warps) and the
    logits launch (4) would select differently among near-tied keys."""
    interp = info is dev.INTERPRETER
    num_warps = 4 if next_n * heads <= 64 else 8
    if fuse_topk:
        num_warps = max(num_warps, 8)  # the tail program sorts k <= 2048 keys
    if not interp and not info.has_wgmma and batch >= MMA_SYNC_FEW_SPLITS_FROM:
        num_splits = num_splits_for(batch, info.num_sms, MMA_SYNC_PROGRAMS_PER_SM, at_most=True)
    else:
        num_splits = num_splits_for(batch, info.num_sms)
    return LogitsConfig(
        block_n=64 if interp else 128,
        swap_ab=not interp,
        num_splits=num_splits,
        num_warps=num_warps,
        num_stages=1 if interp else (2 if batch <= 4 else 5),
        dot_mode=_dot_mode(info),
    )


def _launch_logits(
    q_fp8: torch.Tensor,
    kv_cache_fp8: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    out: torch.Tensor,
    max_seq_len: int,
    *,
    fuse_topk: bool = False,
    counters: torch.Tensor | None = None,
    idx_out: torch.Tensor | None = None,
    k: int = 512,
    row_tiles: tuple[int, int] | None = None,
    sorted: bool = True,
    **overrides: int | bool,
) -> None:
    """``overrides``: fields of :class:`LogitsConfig` to replace (benchmarks and tests)."""
    batch, next_n, heads, _ = q_fp8.shape
    lens, per_row = _lens_2d(seq_lens, batch, next_n)
    cfg = choose_logits_config(dev.launch_info(q_fp8.device), batch, next_n, heads, fuse_topk)
    cfg = replace(cfg, **{key: v for key, v in overrides.items() if v is not None})
    q_u8 = q_fp8.view(torch.uint8)
    kv_u8 = kv_cache_fp8.view(torch.uint8)
    dummy = out if idx_out is None else idx_out
    if fuse_topk:
        row_small, row_max, stream = _topk_paths(k, max_seq_len, row_tiles or FUSED_ROW_TILES)
    else:  # fixed constexprs: the logits-only kernel compiles once for every max_seq_len
        row_small, row_max, stream = 2 * k, 2 * k, False
    _indexer_logits_kernel[(batch, cfg.num_splits)](
        q_u8,
        kv_u8,
        weights,
        lens,
        page_table,
        out,
        counters if counters is not None else page_table,
        dummy,
        q_u8.stride(0),
        q_u8.stride(1),
        q_u8.stride(2),
        kv_u8.stride(0),
        weights.stride(0),
        lens.stride(0),
        lens.stride(1),
        page_table.stride(0),
        out.stride(0),
        dummy.stride(0),
        max_seq_len,
        NEXT_N=next_n,
        H=heads,
        D=IDX_DIM,
        PER_ROW_LENS=per_row,
        BLOCK_N=cfg.block_n,
        DOT_MODE=cfg.dot_mode,
        SWAP_AB=cfg.swap_ab,
        FUSE_TOPK=fuse_topk,
        K=k,
        TOPK_BLOCK=_topk_block(k),
        TOPK_ROW_SMALL=row_small,
        TOPK_ROW_MAX=row_max,
        TOPK_STREAM=stream,
        TOPK_RADIX=radix_bits(k, 0),
        TOPK_STREAM_BITS=STREAM_BITS,
        SORT=sorted,
        OPAQUE_BF16=cfg.opaque_bf16 and cfg.dot_mode == DOT_BF16,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )


def indexer_logits_fwd(
    q_fp8: torch.Tensor,
    kv_cache_fp8: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    max_seq_len: int | None = None,
    clean_logits: bool = False,
    **tuning: int,
) -> torch.Tensor:
    """Logits fp32 ``[B * next_n, max_seq_len]`` (see the module docstring). With ``clean_logits=False`` the positions
    at or past a row's length are left as ``torch.empty`` gave them; with ``True`` they are ``-inf``."""
    batch, next_n, _ = _check_logits_inputs(q_fp8, kv_cache_fp8, weights, seq_lens, page_table)
    if max_seq_len is None:
        max_seq_len = page_table.shape[1] * IDX_PAGE
    if clean_logits:
        out = torch.full((batch * next_n, max_seq_len), float("-inf"), dtype=torch.float32, device=q_fp8.device)
    else:
        out = torch.empty((batch * next_n, max_seq_len), dtype=torch.float32, device=q_fp8.device)
    if batch == 0 or max_seq_len == 0:
        return out
    _launch_logits(q_fp8, kv_cache_fp8, weights, seq_lens, page_table, out, max_seq_len, **tuning)
    return out


# ---------------------------------------------------------------------------------------------------------------------
# fused logits + top-k (decode)
# ---------------------------------------------------------------------------------------------------------------------
class _Workspace:
    """Grow-only per-device buffers for the fused path: the logits scratch and the per-request counters.

    Grown (never shrunk) on the first call of a larger shape; warm up every batch size before CUDA-graph capture so
    no growth happens inside a capture. Counters start at zero and every launch leaves them at zero."""

    def __init__(self) -> None:
        self.logits: dict[torch.device, torch.Tensor] = {}
        self.counters: dict[torch.device, torch.Tensor] = {}

    def get(self, device: torch.device, rows: int, cols: int, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
        buf = self.logits.get(device)
        if buf is None or buf.numel() < rows * cols:
            buf = torch.empty(max(rows * cols, 1), dtype=torch.float32, device=device)
            self.logits[device] = buf
        cnt = self.counters.get(device)
        if cnt is None or cnt.numel() < batch:
            cnt = torch.zeros(max(batch, 1), dtype=torch.int32, device=device)
            self.counters[device] = cnt
        return buf[: rows * cols].view(rows, cols), cnt


_WORKSPACE = _Workspace()


def indexer_logits_topk_fwd(
    q_fp8: torch.Tensor,
    kv_cache_fp8: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    k: int,
    max_seq_len: int | None = None,
    *,
    out: torch.Tensor | None = None,
    sorted: bool = True,
    fuse: bool | None = None,
    **tuning: int | tuple[int, int],
) -> torch.Tensor:
    """Decode path: top-``k`` positions ``[B * next_n, k]`` int32 of the indexer logits (order as in
    :func:`~sparsemla.kernels.indexer.topk.indexer_topk_fwd`, -1 padded); the logits live only in a reused workspace.

    Up to :data:`FUSED_MAX_COLS` positions one launch (the last logits program of a request selects its rows while
    the logits are in L2); wider rows (``fuse`` overrides the choice) take the logits launch then the top-k kernel,
    whose split rows use many SMs per row where the fused tail has one. ``tuning`` goes to the logits launch
    (``row_tiles`` overrides :data:`FUSED_ROW_TILES`)."""
    _check_k(k)
    batch, next_n, _ = _check_logits_inputs(q_fp8, kv_cache_fp8, weights, seq_lens, page_table)
    if max_seq_len is None:
        max_seq_len = page_table.shape[1] * IDX_PAGE
    rows = batch * next_n
    if out is None:
        out = torch.empty((rows, k), dtype=torch.int32, device=q_fp8.device)
    if out.shape != (rows, k) or out.dtype != torch.int32 or out.stride(1) != 1:
        raise ValueError(f"out must be int32 [{rows}, {k}] with unit column stride")
    if batch == 0:
        return out
    if max_seq_len == 0:
        return out.fill_(-1)
    scratch, counters = _WORKSPACE.get(q_fp8.device, rows, max_seq_len, batch)
    if not (max_seq_len <= FUSED_MAX_COLS if fuse is None else fuse):
        tuning.pop("row_tiles", None)
        _launch_logits(q_fp8, kv_cache_fp8, weights, seq_lens, page_table, scratch, max_seq_len, **tuning)
        row_lens = _row_lengths(seq_lens, batch, next_n, max_seq_len)
        return indexer_topk_fwd(scratch, row_lens, k, out=out, sorted=sorted)
    _launch_logits(
        q_fp8,
        kv_cache_fp8,
        weights,
        seq_lens,
        page_table,
        scratch,
        max_seq_len,
        fuse_topk=True,
        counters=counters,
        idx_out=out,
        k=k,
        sorted=sorted,
        **tuning,
    )
    return out


__all__ = [
    "FUSED_MAX_COLS",
    "LogitsConfig",
    "choose_logits_config",
    "indexer_logits_fwd",
    "indexer_logits_topk_fwd",
    "num_splits_for",
]
