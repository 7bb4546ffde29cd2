"""Head-batched tensor-core Triton kernel for DeepSeek-V3.2 sparse-MLA decode (FlashMLA's V3.2 KV formats).

Same family as the V4 kernel (:mod:`sparsemla.kernels.sparse_decode.triton`): one program = (query row, head block,
split); each gathered token row is loaded (and for fp8 dequantized) ONCE per program and shared by its ``BLOCK_H``
heads; online softmax in base 2 with fp32 accumulation; split-K over the top-k list with an LSE-merge kernel; a
configuration chosen from :class:`~sparsemla.kernels.device.DeviceInfo` and the shapes only (CUDA-graph safe, no host
sync, deterministic). The KV layout is a constexpr (``KV_FP8``); byte layouts in :mod:`sparsemla.kernels.layouts`:

* ``fp8_656``: a row is 512 e4m3 NoPE bytes, 4 fp32 scales (one per 128 values) and 64 bf16 RoPE values. The e4m3
  bytes are read as uint8 and turned into bf16 with integer instructions (:func:`~sparsemla.kernels.dequant.
  e4m3_bits_to_bf16`, exact), multiplied by the tile's fp32 scale in fp32 and rounded once to bf16 -- the same
  numbers sglang's ``dequantize_k_cache`` produces. No e4m3 type is used, so sm_80/86 compile it. In f16
  (``V32Config.f16``, :func:`v32_f16`: by default from 16 tiles a program) the tile, q's NoPE and P are f16 instead:
  e4m3 -> f16 exactly (:func:`~sparsemla.kernels.dequant.e4m3_bits_to_f16`), times the scale rounded to f16, the
  product rounded once in f16.
* ``bf16_576``: a row is 576 bf16 values.

Per tile of ``BLOCK_N`` tokens: ``S = Q_nope K_nope^T + Q_rope K_rope^T`` ([BLOCK_H, 512] x [512, BLOCK_N] plus a
64-deep dot) and ``acc += P V`` with V = K_nope ([BLOCK_N, 512]), optionally with the 512 NoPE dims in 2 or 4 chunks
(``V32Config.nope_chunks``). Rows with no valid entry get out 0 and lse +inf (FlashMLA's convention). The Triton
path never imports the fp32 reference (``reference.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from sparsemla.kernels import device as dev
from sparsemla.kernels.dequant import (
    TWO_POW_8,
    TWO_POW_120,
    TWO_POW_120_LESS_LIFT,
    TWO_POW_LIFT,
    e4m3_bits_to_bf16,
    e4m3_bits_to_f16,
    opaque_bf16,
    opaque_f16,
)
from sparsemla.kernels.layouts import V32_DIM, V32_FP8_BYTES, V32_NOPE_DIM, v32_row_width
from sparsemla.kernels.paging import page_shift, page_split
from sparsemla.kernels.prefetch import check_prefetch, prefetch_ahead, prefetch_rows_l2
from sparsemla.kernels.sparse_decode import gluon_v32_sm90, gluon_ws_v32_sm90
from sparsemla.kernels.sparse_decode.triton import (
    _lazy_softmax,
    _rescaled,
    choose_num_splits,
    combine_blocks,
    decode_grid,
    grid_row_and_program,
    q_lift_default,
)

LOG2E = 1.4426950408889634
SCALE_OFF_F32 = tl.constexpr(512 // 4)  # the 4 fp32 scales start at byte 512 of an fp8 row: 128 fp32 units
ROPE_OFF_BF16 = tl.constexpr(528 // 2)  # the bf16 RoPE starts at byte 528 of an fp8 row: 264 bf16 units
ROW_BYTES_FP8 = tl.constexpr(V32_FP8_BYTES)  # 656
ROW_BYTES_BF16 = tl.constexpr(2 * V32_DIM)  # 1,152


@dataclass(frozen=True)
class V32Config:
    """Launch shape of the V3.2 decode kernel.

    block_h / block_n: heads per program and tokens per tile; num_warps / num_stages: Triton launch options;
    partial_bf16: split partials stored as bf16 (half the partial traffic) instead of fp32; int_dequant: e4m3 -> bf16
    with integer ops (every target; the only path where Triton has no e4m3 type, sm_80/86) instead of the fp8
    conversion instructions (sm_89+).

    nope_chunks (1, 2, 4): the 512 NoPE dims of q, the K tile and the accumulator are split into that many chunks of
    512 / nope_chunks, each with its own QK and PV dot and its own accumulator (same arithmetic, same row loads, the
    same bytes gathered). Each dot then holds a 1 / nope_chunks share of the operands: mma.sync lowers q's
    [block_h, 512] A operand to one ldmatrix'ed value per warp (the 8 warps split the 512 output columns, so every
    warp needs all of q) and rebuilds the dequantized K straight in each dot's register layout, and ptxas spills when
    it cannot interleave that with the MMAs; on wgmma (operands in shared memory) what shrinks is presumably the
    dequantization in flight next to the [block_h, 512] fp32 accumulator. This is what makes the 64-head tile fit
    (Triton 3.8 ahead-of-time, B=64 H=128: 0 B spilled on sm_90 at 1-3 stages and on 64-token tiles, <= 168 B on
    sm_80/86/89/120, where nope_chunks=1 spills up to 480 B). Not for 64-head tiles on sm_100 (tcgen05): Triton 3.8
    compiles them to a trap there (:func:`check_v32_config` refuses them).

    stage_k (fp8_656 only; no effect on bf16_576): the dequantized K chunk passes through a select on its row mask
    (value-preserving: masked rows are 0 already) that Triton 3.8's dot-operand hoisting does not move a layout
    conversion across, so each chunk is dequantized once into shared memory that both dots read, instead of twice
    straight into the two dots' register layouts (mma.sync; wgmma/tcgen05 read K from shared memory anyway). Costs
    shared memory on mma.sync: 1024 + 1024 / nope_chunks B per token instead of the uint8 tile's 512. It is what makes
    the 4-warp 32-head tile fit (32x32-w4-s2 with nope_chunks=4: <= 112 B on every target, from 160-384 B); on the
    8-warp 64-head mma.sync tile it spills more (264-400 B), so it is a separate field.

    opaque_k (fp8_656 only; chosen for every fp8 mma.sync tile): each dequantized K chunk passes through
    :func:`~sparsemla.kernels.dequant.opaque_bf16`, so Triton lays the mma.sync operands out for bf16 instead of for
    the uint8 bytes the chunk came from (what the V4 decode does by default, ``DecodeConfig.opaque_tile``). Ahead of
    time (Triton 3.8, sm_89, B = 64): loop instructions 2,625 -> 1,991 at H = 128 (32x32-w4-s2-c4-stage_k) and
    2,631 -> 1,445 at H = 16 (16x32-w4-s3-c4), where the dequant ran three times; shared memory 98,816 -> 92,672 and
    61,440 -> 94,208 B (the bf16 chunk is staged instead of the bytes). It replaces ``stage_k`` (same staging, and
    the chunk reaches both dots in bf16's layout); times in docs/performance.md.

    lazy_rescale: the online softmax's reference maximum moves only when some head's maximum passes it by more than
    :data:`~sparsemla.kernels.sparse_decode.triton.RESCALE_SLACK`, so the tiles in between skip the accumulators'
    rescale (as ``DecodeConfig.lazy_rescale``). Off until timed.

    q_lift (fp8_656 with int_dequant): the integer path's 2^-120 stays in the dequantized K, whose fp32 scale multiply
    carries 2^(120 - 8) instead, q's NoPE is scaled by 2^8 once per program and the output by 2^8 at the end
    (:data:`~sparsemla.kernels.dequant.LIFT_LOG2`): the same bits for scales below 2^16, one bf16 multiply per
    gathered value fewer (None, the default: the V4 decode's rule,
    :func:`~sparsemla.kernels.sparse_decode.triton.q_lift_default`).

    l2_prefetch (0: off): each iteration prefetches into L2 the rows of the tile that many tiles beyond the last one
    the software pipeline copies (tile i + num_stages - 1 + l2_prefetch), one address every ``prefetch_stride`` bytes
    of a row (:func:`~sparsemla.kernels.prefetch.prefetch_rows_l2`); the same results. Off until timed.

    heads_fastest: a row's head blocks are adjacent programs (the V4 decode's ``DecodeConfig.heads_fastest``,
    :func:`~sparsemla.kernels.sparse_decode.triton.decode_grid`), so the later ones read the row's tokens from L2
    once the grid is more than one wave. Off until timed.

    gluon (sm_90, fp8_656; the 64 x 64 tile, 8 warps, 1 stage, without chunks, staging, lift, L2 prefetch or lazy
    rescale): the tile written in Gluon (:mod:`~sparsemla.kernels.sparse_decode.gluon_v32_sm90`), whose two
    warpgroups split the scores' tokens instead of both computing all of them. gluon_prefetch (with gluon): its gather
    one tile ahead through cp.async (results/bench/explore/gluon_decode_v32_pkg*.json); :func:`choose_v32_config`
    takes gluon with gluon_ws instead (below).
    f16 (fp8_656; either tile): q's NoPE (each head times the power of two that puts its largest value in
    [2^14, 2^15): exact, undone in that head's softmax scale; its RoPE times the same, in bf16), the dequantized tile
    and P in f16 instead of bf16. e4m3 -> f16 is exact: one conversion a pair (int_dequant: the integer bits, the
    value times 2^-8, :func:`~sparsemla.kernels.dequant.e4m3_bits_to_f16`, and the scale taken times 2^8); the scale
    is rounded to f16 and the product once in f16, one packed multiply a pair, where bf16 needs the fp32 multiply and
    a rounding. f16 keeps 3 more mantissa bits, so K values must be below its 65,504 in magnitude; scales under 2^-14
    (2^-22 with int_dequant) lose bits as f16 subnormals. The Gluon tile (sm_90, which has the e4m3 type) always
    converts with the instructions in f16, whatever int_dequant says. None (the default): :func:`v32_f16`'s rule --
    the Gluon tile, and the Triton mma.sync tiles from :data:`F16_MIN_TILES` tiles a program, unless q_lift is set.
    Not with q_lift=True (f16 needs no lift).

    gluon_ws (with gluon, in f16, without gluon_prefetch): the Gluon tile warp-specialized
    (:mod:`~sparsemla.kernels.sparse_decode.gluon_ws_v32_sm90`): a producer warpgroup gathers and dequantizes the
    next tile into the second of two buffers while the two consumer warpgroups multiply this one; the same bits.
    :func:`choose_v32_config` takes it on sm_90 from :data:`GLUON_MIN_PROGRAMS` 64-head programs a split."""

    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    partial_bf16: bool = False
    int_dequant: bool = True
    nope_chunks: int = 1
    stage_k: bool = False
    opaque_k: bool = False
    lazy_rescale: bool = False
    q_lift: bool | None = None
    l2_prefetch: int = 0
    prefetch_stride: int = 128
    heads_fastest: bool = False
    gluon: bool = False
    gluon_prefetch: bool = False
    f16: bool | None = None
    gluon_ws: bool = False


# V32Config.f16 by default (v32_f16): the Gluon tile (H100, 3.8 cubins, results/bench/explore/
# gluon_decode_v32_f16-native-h100-74ae5a4.json, _f16late-*-46c55df: B = 64 / 128 at H = 128 137.5 -> 134.9 and
# 263.9 -> 260.7 us, H = 64 B = 128 135.7 -> 134.7; B = 8 36.4 -> 36.8; error against the fp32 reference 6.0e-3 ->
# 2.3e-3) and the Triton mma.sync tiles from F16_MIN_TILES tiles a program (results/bench/explore/
# v32_configs_f16_*-h100-b2cdd06.json: the sm_89 path's 32 x 32 tile at H = 128 B = 8 / 64 / 128, 16 / 64 / 64
# tiles a program, 52.6 -> 50.0, 311.2 -> 282.4, 609.4 -> 553.2 us; its 16 x 32 tile at H = 16 B = 64 / 128 73.3 ->
# 72.6, 131.9 -> 129.1; at 1 - 2 tiles a program the per-head q scaling costs more than it saves: B = 1 H = 128
# 18.1 -> 19.5, H = 16 12.6 -> 14.0). Not on Triton's 64-head wgmma tile (sm_90 B = 1 / 4, 1 - 2 tiles: 18.5 ->
# 20.9, 27.8 -> 30.2; larger launches there take the Gluon tile). 4 - 8 tiles a program were not timed.
F16_MIN_TILES = 16


def v32_f16(cfg: V32Config, info: dev.DeviceInfo, kv_format: str, tiles_per_program: int) -> bool:
    """Whether ``cfg`` runs in f16 (``V32Config.f16``) on ``info``: fp8_656 only; its own ``f16`` where set; else the
    Gluon tile, and the Triton tiles other than the 64-head wgmma / tcgen05 ones from :data:`F16_MIN_TILES` tiles a
    program (never under the interpreter, nor with an explicit ``q_lift=True``, by default)."""
    if kv_format != "fp8_656":
        return False
    if cfg.f16 is not None:
        return cfg.f16
    if cfg.q_lift:  # an explicit lift is the integer bf16 path's
        return False
    if cfg.gluon:
        return True
    if info is dev.INTERPRETER:
        return False
    wide = cfg.block_h >= 64 and info.capability[0] in (9, 10)
    return not wide and tiles_per_program >= F16_MIN_TILES


def v32_q_lift(cfg: V32Config, info: dev.DeviceInfo, kv_format: str, tiles_per_program: int) -> bool:
    """Whether ``cfg`` lifts the integer dequant (``V32Config.q_lift``) on ``info``: fp8_656 with int_dequant and not
    in f16 (:func:`v32_f16`), where asked, else by the V4 decode's rule
    (:func:`~sparsemla.kernels.sparse_decode.triton.q_lift_default`)."""
    if kv_format != "fp8_656" or not cfg.int_dequant or v32_f16(cfg, info, kv_format, tiles_per_program):
        return False
    return q_lift_default(cfg, info, tiles_per_program) if cfg.q_lift is None else cfg.q_lift


def shared_bytes_v32(cfg: V32Config, kv_format: str, info: dev.DeviceInfo | None = None) -> int:
    """Shared memory of the main kernel with ``cfg`` on ``info`` (None: the most any target needs): q staged as
    [block_h, 576] bf16, plus per token of the tile what the MMA path stages, plus one raw row per token and extra
    pipeline stage. Per token, by the MMA a tile lowers to (Triton 3.8):

    * mma.sync (every tile under 64 heads; 64-head tiles on sm_80/86/89/120): 512 / nope_chunks B for fp8_656 (the
      uint8 chunk's layout conversion; Triton rebuilds the bf16 K in registers), 1024 + 1024 / nope_chunks for
      bf16_576 (2 KB unchunked: one copy per dot's swizzle; measured on 64-head tiles, 16/32-head ones need less);
      fp8 with ``stage_k``: one bf16 K for both dots plus a chunk-sized second copy, 1024 + 1024 / nope_chunks
      (+ 128 B of RoPE staging unchunked).
    * wgmma (sm_90) and tcgen05 (sm_100), 64-head tiles: the bf16 NoPE + RoPE tile, 1152 B; tcgen05 with bf16_576 and
      more than one stage keeps every stage's raw rows plus a 2-KB operand copy, and its barriers take < 1 KB.

    Never below ``metadata.shared`` for the tiles measured ahead of time, chosen ones included, and equal for most
    (tests/test_sparse_decode_v32.py); it over-counts 16/32-head bf16_576 tiles, which stage less. The Gluon tiles
    (``gluon``): their own figures (:data:`~sparsemla.kernels.sparse_decode.gluon_v32_sm90.SHARED_BYTES` and
    ``PREFETCH_SHARED_BYTES``; ``gluon_ws``: :data:`~sparsemla.kernels.sparse_decode.gluon_ws_v32_sm90.SHARED_BYTES`,
    229,924 B)."""
    if cfg.gluon_ws:
        return gluon_ws_v32_sm90.SHARED_BYTES
    if cfg.gluon:
        return gluon_v32_sm90.PREFETCH_SHARED_BYTES if cfg.gluon_prefetch else gluon_v32_sm90.SHARED_BYTES
    fp8 = kv_format == "fp8_656"
    row = V32_FP8_BYTES if fp8 else 2 * V32_DIM
    pipeline = (cfg.num_stages - 1) * row
    if fp8 and (cfg.stage_k or cfg.opaque_k):  # opaque_k: the bf16 chunk staged, at most what stage_k stages
        mma_sync = 1024 + 1024 // cfg.nope_chunks + (128 if cfg.nope_chunks == 1 else 0)
    elif fp8:
        mma_sync = 512 // cfg.nope_chunks
    else:
        mma_sync = 1024 + 1024 // cfg.nope_chunks
    per_token = {"mma.sync": mma_sync + pipeline}
    if cfg.block_h >= 64:  # 64-row tiles: wgmma on sm_90, tcgen05 on sm_100 (mma.sync elsewhere)
        per_token["wgmma"] = 2 * V32_DIM + pipeline
        per_token["tcgen05"] = 2 * V32_DIM + pipeline + 1024 // cfg.block_n
        if not fp8 and cfg.num_stages > 1:
            per_token["tcgen05"] = 2048 + cfg.num_stages * row + 1024 // cfg.block_n
    if info is None:
        token = max(per_token.values())
    elif cfg.block_h >= 64 and info.capability[0] == 9:
        token = per_token["wgmma"]
    elif cfg.block_h >= 64 and info.capability[0] == 10:
        token = per_token["tcgen05"]
    else:
        token = per_token["mma.sync"]
    return cfg.block_h * V32_DIM * 2 + cfg.block_n * token


def check_v32_config(cfg: V32Config, info: dev.DeviceInfo, kv_format: str | None = None) -> None:
    """Raise ValueError when ``cfg`` cannot run on ``info`` (with ``kv_format`` where given; the launcher calls it for
    every config, chosen or not)."""
    if cfg.nope_chunks not in (1, 2, 4):
        raise ValueError(f"nope_chunks must be 1, 2 or 4 (whole 128-wide fp8 scale tiles), got {cfg.nope_chunks}")
    check_prefetch(cfg.l2_prefetch, cfg.prefetch_stride)
    if (cfg.gluon_prefetch or cfg.gluon_ws) and not cfg.gluon:
        raise ValueError("gluon_prefetch and gluon_ws are options of the Gluon tile (gluon=True)")
    if cfg.gluon_ws and (cfg.gluon_prefetch or cfg.f16 is False):
        raise ValueError("gluon_ws is the f16 tile with its own pipeline: not with gluon_prefetch or f16=False")
    if cfg.f16 and cfg.q_lift:
        raise ValueError("f16 takes no q_lift (the f16 tile's scale multiply is one already)")
    if cfg.f16 and kv_format not in (None, "fp8_656"):
        raise ValueError(f"f16 dequantizes the fp8_656 cache; {kv_format} is bf16 already")
    if cfg.gluon:
        shape = (cfg.block_h, cfg.block_n, cfg.num_warps, cfg.num_stages, cfg.nope_chunks)
        extras = cfg.stage_k or cfg.opaque_k or cfg.lazy_rescale or cfg.q_lift or cfg.l2_prefetch or cfg.heads_fastest
        if shape != (gluon_v32_sm90.BLOCK_H, gluon_v32_sm90.BLOCK_N, gluon_v32_sm90.NUM_WARPS, 1, 1) or extras:
            raise ValueError("gluon is the 64 x 64 tile with 8 warps and one stage, without nope_chunks, stage_k, "
                             f"opaque_k, lazy_rescale, q_lift, l2_prefetch or heads_fastest; got {cfg}")  # fmt: skip
        if info is dev.INTERPRETER or info.capability != (9, 0):
            raise ValueError(f"V32Config.gluon is the sm_90 wgmma tile; this launch is for {info.name or info}")
        if kv_format not in (None, "fp8_656"):
            raise ValueError(f"V32Config.gluon reads the fp8_656 cache, not {kv_format}")
        if not gluon_v32_sm90.available():
            raise ValueError(f"V32Config.gluon needs Triton >= 3.6's Gluon; this is {triton.__version__}")
    if info is dev.INTERPRETER:
        return
    if not cfg.int_dequant and not info.has_fp8:
        raise ValueError(f"sm_{info.arch} has no e4m3 type: int_dequant=False cannot compile there")
    if info.capability[0] == 10 and cfg.block_h >= 64 and cfg.nope_chunks > 1:
        # 64-row tiles become tcgen05 MMAs with tensor-memory accumulators there; with the accumulator split in
        # chunks Triton 3.8 emits a kernel that is a single trap (ahead-of-time compile: REG 4, no MMA), most likely
        # its tensor-memory allocation running past the 512 columns. The unsplit [64, 512] accumulator compiles.
        raise ValueError(f"nope_chunks={cfg.nope_chunks} with {cfg.block_h}-head blocks compiles to a trap on "
                         f"sm_{info.arch} (Triton 3.8, tcgen05): use nope_chunks=1 or <= 32 heads")  # fmt: skip


# 64-head programs (rows x head blocks) from which sm_90 takes the Gluon tile: at 8 (B = 8, H = 64) the Triton
# tile's 3-stage pipeline won (29.3 vs 32.4 us), at 16 (B = 8, H = 128) the Gluon tile (39.2 vs 41.3 us; H100)
GLUON_MIN_PROGRAMS = 16
# ... always in its warp-specialized form (V32Config.gluon_ws). H100, 3.8 cubins, graph replay, against the
# prefetching f16 tile: H = 128 B = 32 / 64 / 128 (64 / 128 / 256 programs) 80.4 -> 77.7, 134.9 -> 127.9, 260.3 ->
# 248.8 us, H = 64 B = 128 135.4 -> 131.2 (results/bench/explore/gluon_decode_v32_ws2pf-native-h100-afbc653.json);
# below 64 programs, with the producer at 136 registers, H = 128 B = 8 / 16 / 24 (16 / 32 / 48 programs) 37.1 ->
# 35.7, 51.0 -> 47.9, 77.0 -> 70.9 us (gluon_decode_v32_ws_few-native-h100-c3edfba.json)


def choose_v32_config(
    info: dev.DeviceInfo, num_heads: int, rows: int = 1, kv_format: str = "fp8_656", aligned: bool = True
) -> V32Config:
    """The launch configuration for ``num_heads`` heads and ``rows`` query rows (B * s_q) on ``info`` (``aligned``:
    the fp8_656 cache's pages and slots 16-byte aligned), from the H200 sweeps of benchmarks/explore_v32_configs.py
    (results/bench/explore/v32_configs*.json; both code paths) and the Gluon tile's H100 runs
    (results/bench/explore/gluon_decode_v32_pkg*.json):

    * sm_90, fp8_656, H > 16, aligned, >= 16 64-head programs (rows x head blocks): the Gluon tile with the e4m3
      conversion instructions, warp-specialized (``gluon``, ``gluon_ws``, ``int_dequant=False``; in f16 by
      :func:`v32_f16`; 229,924 B, one program per SM): 4-8 % faster than its synchronous form with the gather one tile
      ahead (``gluon_prefetch``) at 16 to 256 programs. That form took 22-27 % off the Triton tile at H = 128 and
      B = 32..128 and 17-27 % at H = 64 and B = 32..128; below 16 programs (B = 1, 64-head B = 8) the Triton tile's
      deeper pipeline won against it.
    * sm_90 otherwise: 64 heads x 64 tokens, 8 warps, NoPE in 4 chunks (wgmma), 3 stages for fp8_656 (231,424 B of
      232,448), 2 for bf16_576; bf16_576 with <= 16 heads from 4 rows on (fewer leave most SMs idle with 32 tiles per
      row): the 48 masked rows cost less than mma.sync's 16-head tile. fp8_656 with <= 16 heads takes the 16-head
      mma.sync tile below instead, whose K chunks go through the opaque move (``opaque_k``).
    * H <= 16 elsewhere: one 16-head program per row; 1 row: 16 tokens, 8 warps; more: 16x32, 4 warps, 4 chunks,
      3 stages (bf16_576 on the 101,376-B targets: 2); fp8_656 with ``opaque_k`` (101,376 B at 3 stages).
    * H > 16 elsewhere, mma.sync (64-head tiles only lower to wgmma/tcgen05, and tcgen05 traps with chunks): 32-head
      blocks, 4 warps, 4 chunks: fp8_656 32x32 with 2 stages and ``opaque_k`` (98,816 B: fits 101,376); bf16_576 32x32
      with 3 stages where that fits (sm_80, sm_100), else 1 stage.

    Every one compiles ahead of time for its targets with <= 72 B spilled per thread (sm_100/120 fp8 in f16, s_q 2;
    Triton 3.8; docs/portability.md).
    Interpreter: small tiles (fp32 dots)."""
    if info is dev.INTERPRETER:
        return V32Config(max(16, min(64, triton.next_power_of_2(num_heads))), 16, 4, 1)
    fp8 = kv_format == "fp8_656"
    if (
        info.capability == (9, 0)
        and fp8
        and aligned
        and num_heads > 16
        and rows * triton.cdiv(num_heads, gluon_v32_sm90.BLOCK_H) >= GLUON_MIN_PROGRAMS
        and gluon_v32_sm90.available()
    ):
        return V32Config(64, 64, 8, 1, partial_bf16=True, int_dequant=False, gluon=True, gluon_ws=True)
    if info.capability[0] == 9 and (num_heads > 16 or (rows >= 4 and not fp8)):
        return V32Config(64, 64, 8, 3 if fp8 else 2, partial_bf16=True, nope_chunks=4)
    if num_heads <= 16:
        if rows <= 1:
            return V32Config(16, 16, 8, 1, partial_bf16=True)
        deep = V32Config(16, 32, 4, 3, partial_bf16=True, nope_chunks=4, opaque_k=fp8)
        return deep if shared_bytes_v32(deep, kv_format, info) <= info.smem_per_block else replace(deep, num_stages=2)
    if fp8:
        return V32Config(32, 32, 4, 2, partial_bf16=True, nope_chunks=4, opaque_k=True)
    deep = V32Config(32, 32, 4, 3, partial_bf16=True, nope_chunks=4)
    return (
        deep
        if shared_bytes_v32(deep, kv_format, info) <= info.smem_per_block
        else V32Config(32, 32, 4, 1, True, nope_chunks=4)
    )


# --------------------------------------------------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------------------------------------------------
@triton.jit
def _v32_split_range(length, i_b, i_sp, num_splits, TOPK, BLOCK_N: tl.constexpr, HAS_LEN: tl.constexpr):
    """Valid length of row ``i_b``'s list (its leftmost ``topk_length`` entries) and this split's tiles [t_lo, t_hi)."""
    n_valid = TOPK
    if HAS_LEN:
        n_valid = tl.minimum(tl.maximum(tl.load(length + i_b), 0), TOPK)
    tiles = (n_valid + BLOCK_N - 1) // BLOCK_N
    per = (tiles + num_splits - 1) // num_splits
    t_lo = i_sp * per
    return n_valid, t_lo, tl.minimum(t_lo + per, tiles)


@triton.jit
def _load_v32_nope(
    kv, o_tok, m_n, C0: tl.constexpr, W: tl.constexpr, BLOCK_N: tl.constexpr,
    KV_FP8: tl.constexpr, INT_DEQUANT: tl.constexpr, DOT_F32: tl.constexpr, STAGE_K: tl.constexpr,
    OPAQUE_K: tl.constexpr = False, LIFT: tl.constexpr = False, F16: tl.constexpr = False,
):  # fmt: skip
    """NoPE columns [C0, C0 + W) of the tile's rows, [BLOCK_N, W] bf16 (fp32 under DOT_F32); masked rows are 0.
    LIFT (fp8 with INT_DEQUANT): times 2^-LIFT_LOG2 (:data:`~sparsemla.kernels.dequant.LIFT_LOG2`). F16 (fp8): f16,
    e4m3 -> f16 exact times the scale rounded to f16, the product rounded once in f16 (DOT_F32: those numbers in
    fp32).

    KV_FP8: ``kv`` is the uint8 cache, ``o_tok`` [BLOCK_N] the rows' byte offsets; NoPE = e4m3 * scale[tile] computed
    in fp32 and rounded once (C0 and W multiples of 128: whole scale tiles). Else ``kv`` is the bf16 cache and
    ``o_tok`` the rows' element offsets."""
    if KV_FP8:
        NT: tl.constexpr = W // 128  # scale tiles in the chunk
        o_c = tl.arange(0, NT)
        o_d = tl.arange(0, 128)
        o_k = o_tok[:, None, None] + (C0 + o_c * 128)[None, :, None] + o_d[None, None, :]
        p_sc = kv.to(tl.pointer_type(tl.float32), bitcast=True)
        o_sc = o_tok // 4 + SCALE_OFF_F32 + C0 // 128
        b_sc = tl.load(p_sc + o_sc[:, None] + o_c[None, :], mask=m_n[:, None], other=0.0)  # [BLOCK_N, NT] fp32
        if DOT_F32:
            p_k8 = kv.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
            b_k8 = tl.load(p_k8 + o_k, mask=m_n[:, None, None], other=0.0)  # [BLOCK_N, NT, 128] fp8
            if F16:  # the f16 tile's numbers (the product rounded in f16), in fp32
                b_k = (b_k8.to(tl.float32).to(tl.float16) * b_sc.to(tl.float16)[:, :, None]).to(tl.float32)
            else:
                b_k = b_k8.to(tl.float32) * b_sc[:, :, None]
        elif F16:
            if INT_DEQUANT:  # e4m3 * 2^-8 from the bits, times the scale * 2^8 (exact): one rounding, in f16
                b_k8 = tl.load(kv + o_k, mask=m_n[:, None, None], other=0)  # [BLOCK_N, NT, 128] uint8 (e4m3 bits)
                b_k = e4m3_bits_to_f16(b_k8) * (b_sc * TWO_POW_8).to(tl.float16)[:, :, None]
            else:
                p_k8 = kv.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
                b_kh = tl.load(p_k8 + o_k, mask=m_n[:, None, None], other=0.0).to(tl.float16)  # [BLOCK_N, NT, 128]
                b_k = b_kh * b_sc.to(tl.float16)[:, :, None]
        else:
            tl.static_assert(INT_DEQUANT or not LIFT, "LIFT folds the integer path's 2^-120")
            if INT_DEQUANT:  # raw bytes: no fp8 type at all, so sm_80/86 compile this path
                b_k8 = tl.load(kv + o_k, mask=m_n[:, None, None], other=0)  # [BLOCK_N, NT, 128] uint8 (e4m3 bits)
                b_kb = e4m3_bits_to_bf16(b_k8)  # e4m3 * 2^-120, exact
                if LIFT:  # (e4m3 * 2^-120) * (scale * 2^(120 - LIFT_LOG2)) below: one multiply, rounded once
                    b_sc = b_sc * TWO_POW_120_LESS_LIFT  # [BLOCK_N, NT] scale * 2^112 (exact for scales below 2^16)
                else:
                    b_kb = b_kb * tl.full([1, 1, 1], TWO_POW_120, tl.bfloat16)  # the e4m3 value, exact in bf16
            else:
                p_k8 = kv.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
                b_kb = tl.load(p_k8 + o_k, mask=m_n[:, None, None], other=0.0).to(tl.bfloat16)  # [BLOCK_N, NT, 128]
            b_k = (b_kb.to(tl.float32) * b_sc[:, :, None]).to(tl.bfloat16)
        b_k = tl.reshape(b_k, [BLOCK_N, W])
        if OPAQUE_K:
            if F16:
                b_k = opaque_f16(b_k)
            else:
                b_k = opaque_bf16(b_k)
        if STAGE_K:
            b_k = tl.where(m_n[:, None], b_k, 0.0)
    else:
        o_d = tl.arange(0, W)
        b_k = tl.load(kv + o_tok[:, None] + C0 + o_d[None, :], mask=m_n[:, None], other=0.0)  # [BLOCK_N, W] bf16
        if DOT_F32:
            b_k = b_k.to(tl.float32)
    return b_k


@triton.jit
def _load_v32_rope(kv, o_tok, m_n, KV_FP8: tl.constexpr, DOT_F32: tl.constexpr):
    """The tile's RoPE values, [BLOCK_N, 64] bf16 (fp32 under DOT_F32); masked rows are 0."""
    o_r = tl.arange(0, 64)
    if KV_FP8:
        p_rope = kv.to(tl.pointer_type(tl.bfloat16), bitcast=True)
        o_rope = o_tok // 2 + ROPE_OFF_BF16
        b_kr = tl.load(p_rope + o_rope[:, None] + o_r[None, :], mask=m_n[:, None], other=0.0)  # [BLOCK_N, 64]
    else:
        b_kr = tl.load(kv + o_tok[:, None] + 512 + o_r[None, :], mask=m_n[:, None], other=0.0)  # [BLOCK_N, 64]
    if DOT_F32:
        b_kr = b_kr.to(tl.float32)
    return b_kr


@triton.jit
def _row_offsets(b_idx, num_slots, page_size, stride_kb, stride_kt, PAGE_SHIFT: tl.constexpr):
    """(valid [BLOCK_N], int64 offsets of the rows in the cache's units) of slot ids ``b_idx``; an invalid id (< 0 or
    past the cache) gets slot 0's offset."""
    m_n = (b_idx >= 0) & (b_idx < num_slots)
    b_slot = tl.where(m_n, b_idx, 0)
    b_page, b_off = page_split(b_slot, page_size, PAGE_SHIFT)
    return m_n, b_page.to(tl.int64) * stride_kb + b_off.to(tl.int64) * stride_kt


@triton.jit
def _prefetch_v32_rows(kv, b_idx, num_slots, page_size, stride_kb, stride_kt, KV_FP8: tl.constexpr,
                       STRIDE: tl.constexpr, PAGE_SHIFT: tl.constexpr):  # fmt: skip
    """L2 prefetch of the cache rows of slot ids ``b_idx`` [BLOCK_N] (invalid ids skipped): 656 bytes a row for
    fp8_656 (``kv`` uint8, strides in bytes), 1,152 for bf16_576 (``kv`` bf16, strides in elements)."""
    m_n, o_row = _row_offsets(b_idx, num_slots, page_size, stride_kb, stride_kt, PAGE_SHIFT)
    if KV_FP8:
        prefetch_rows_l2(kv, o_row, m_n, ROW_BYTES_FP8, STRIDE)
    else:
        prefetch_rows_l2(kv.to(tl.pointer_type(tl.uint8), bitcast=True), o_row * 2, m_n, ROW_BYTES_BF16, STRIDE)


@triton.jit
def _load_q_chunk(p_q, o_d, m_h, stride_qd, C0: tl.constexpr, DOT_F32: tl.constexpr, LIFT: tl.constexpr = False):
    """q columns C0 + o_d of the program's heads, [BLOCK_H, W] bf16 (fp32 under DOT_F32); LIFT: times 2^LIFT_LOG2."""
    if C0 == 0:
        b_q = tl.load(p_q + o_d[None, :] * stride_qd, mask=m_h[:, None], other=0.0)  # [BLOCK_H, W]
    else:
        b_q = tl.load(p_q + (C0 + o_d)[None, :] * stride_qd, mask=m_h[:, None], other=0.0)  # [BLOCK_H, W]
    if DOT_F32:
        b_q = b_q.to(tl.float32)
    if LIFT:
        b_q = b_q * tl.full([1, 1], TWO_POW_LIFT, tl.bfloat16)  # exact for |q| < 2^119
    return b_q


@triton.jit
def _q_f16(b_q, two_e, DOT_F32: tl.constexpr):
    """q chunk [BLOCK_H, W] times ``two_e`` [BLOCK_H, 1] (powers of two) in f16 (DOT_F32: those values in fp32)."""
    b_q = (b_q.to(tl.float32) * two_e).to(tl.float16)
    if DOT_F32:
        b_q = b_q.to(tl.float32)
    return b_q


@triton.jit
def _store_o_chunk(p_o, acc, inv_l, m_h, o_d, C0: tl.constexpr, DV: tl.constexpr):
    """out columns C0 + o_d (those below DV) of the program's heads: acc [BLOCK_H, W] / l; ``p_o`` [BLOCK_H, W]
    points at columns o_d."""
    m_o = m_h[:, None] & (C0 + o_d < DV)[None, :]
    tl.store(p_o + C0, (acc * inv_l[:, None]).to(p_o.dtype.element_ty), mask=m_o)


@triton.jit
def _sparse_decode_v32_kernel(
    q, kv, idx, length, out, lse, o_part, lse_part,
    S, H, TOPK, page_size, stride_kb, stride_kt, num_slots, num_splits, qk_scale,
    stride_qb, stride_qs, stride_qh, stride_qd, stride_ib, stride_is,
    DV: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, NOPE_CHUNKS: tl.constexpr, KV_FP8: tl.constexpr,
    INT_DEQUANT: tl.constexpr, STAGE_K: tl.constexpr, HAS_LEN: tl.constexpr, SINGLE: tl.constexpr,
    OPAQUE_K: tl.constexpr,
    ALIGNED: tl.constexpr, DOT_F32: tl.constexpr, DOT_PREC: tl.constexpr, LAZY_RESCALE: tl.constexpr = False,
    Q_LIFT: tl.constexpr = False, PREFETCH: tl.constexpr = 0, PF_STRIDE: tl.constexpr = 128,
    PAGE_SHIFT: tl.constexpr = -1, HEADS_FASTEST: tl.constexpr = False, F16: tl.constexpr = False,
):  # fmt: skip
    """``out[r, h] = softmax_j(qk_scale * q[r, h] . k[j]) @ v[j, :DV]`` over the valid slots j of row r = b * S + s.

    Grid (B * S, cdiv(H, BLOCK_H), num_splits), the first two axes swapped with HEADS_FASTEST. q [BLOCK_H, 512 +
    64], K tile [BLOCK_N, 512 + 64], acc [BLOCK_H, 512]. SINGLE: write out (bf16) and lse (natural log, +inf when
    empty) directly; else the split's normalised partial [rows, splits, H, DV] and its base-2 LSE (-inf when empty)
    for the combine kernel.

    NOPE_CHUNKS (1, 2, 4): the 512 NoPE dims are W = 512 / NOPE_CHUNKS-wide chunks c -- q_c, K_c, acc_c -- so each
    dot's operands and each accumulator's rescale are a quarter (a half) of the tile: S = sum_c q_c K_c^T + q_r K_r^T,
    acc_c += P K_c. Same arithmetic, same row loads; only how much of the tile one instruction sequence holds.

    PREFETCH > 0: iteration i_t prefetches the rows of tile i_t + PREFETCH into L2 (their ids loaded one iteration
    before; this split's tiles only).

    F16 (``V32Config.f16``): q's NoPE chunks, the dequantized K and P in f16; each head's q times 2^e (its largest
    NoPE value into [2^14, 2^15); the RoPE times the same in bf16), its scores' scale times 2^-e."""
    W: tl.constexpr = 512 // NOPE_CHUNKS
    i_r, i_hb = grid_row_and_program(HEADS_FASTEST)
    i_sp = tl.program_id(2)
    i_b = i_r // S
    i_s = i_r % S

    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    m_h = o_h < H
    o_d = tl.arange(0, W)
    o_e = tl.arange(0, 64)
    p_q = q + i_b.to(tl.int64) * stride_qb + i_s.to(tl.int64) * stride_qs + o_h.to(tl.int64)[:, None] * stride_qh
    b_q0 = _load_q_chunk(p_q, o_d, m_h, stride_qd, 0, DOT_F32, Q_LIFT)  # [BLOCK_H, W] NoPE chunk 0
    if NOPE_CHUNKS >= 2:
        b_q1 = _load_q_chunk(p_q, o_d, m_h, stride_qd, W, DOT_F32, Q_LIFT)
    if NOPE_CHUNKS == 4:
        b_q2 = _load_q_chunk(p_q, o_d, m_h, stride_qd, 2 * W, DOT_F32, Q_LIFT)
        b_q3 = _load_q_chunk(p_q, o_d, m_h, stride_qd, 3 * W, DOT_F32, Q_LIFT)
    b_qr = tl.load(p_q + (512 + o_e)[None, :] * stride_qd, mask=m_h[:, None], other=0.0)  # [BLOCK_H, 64] RoPE
    if DOT_F32:
        b_qr = b_qr.to(tl.float32)
    qk_h = qk_scale  # the scores' scale (F16: [BLOCK_H, 1], each head's)
    if F16:
        q_amax = tl.max(tl.abs(b_q0.to(tl.float32)), 1)  # [BLOCK_H] the head's largest |q| NoPE
        if NOPE_CHUNKS >= 2:
            q_amax = tl.maximum(q_amax, tl.max(tl.abs(b_q1.to(tl.float32)), 1))
        if NOPE_CHUNKS == 4:
            q_amax = tl.maximum(q_amax, tl.maximum(tl.max(tl.abs(b_q2.to(tl.float32)), 1),
                                                   tl.max(tl.abs(b_q3.to(tl.float32)), 1)))  # fmt: skip
        # 2^e with e from that value's fp32 exponent (clamped: all-zero heads): |q| * 2^e in [2^14, 2^15)
        e_q = tl.minimum(tl.maximum(141 - ((q_amax.to(tl.int32, bitcast=True) >> 23) & 0xFF), -126), 126)
        two_e = ((e_q + 127) << 23).to(tl.float32, bitcast=True)[:, None]  # [BLOCK_H, 1]
        qk_h = qk_scale * ((127 - e_q) << 23).to(tl.float32, bitcast=True)[:, None]
        b_q0 = _q_f16(b_q0, two_e, DOT_F32)
        if NOPE_CHUNKS >= 2:
            b_q1 = _q_f16(b_q1, two_e, DOT_F32)
        if NOPE_CHUNKS == 4:
            b_q2 = _q_f16(b_q2, two_e, DOT_F32)
            b_q3 = _q_f16(b_q3, two_e, DOT_F32)
        b_qr = b_qr.to(tl.float32) * two_e  # exact
        if not DOT_F32:
            b_qr = b_qr.to(tl.bfloat16)

    n_valid, t_lo, t_hi = _v32_split_range(length, i_b, i_sp, num_splits, TOPK, BLOCK_N, HAS_LEN)
    acc0 = tl.zeros([BLOCK_H, W], dtype=tl.float32)
    if NOPE_CHUNKS >= 2:
        acc1 = tl.zeros([BLOCK_H, W], dtype=tl.float32)
    if NOPE_CHUNKS == 4:
        acc2 = tl.zeros([BLOCK_H, W], dtype=tl.float32)
        acc3 = tl.zeros([BLOCK_H, W], dtype=tl.float32)
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    p_idx = idx + i_b.to(tl.int64) * stride_ib + i_s.to(tl.int64) * stride_is
    o_n = tl.arange(0, BLOCK_N)
    # the slot ids of the next tile are loaded one iteration ahead (their latency hides behind this tile's math)
    b_idx_next = tl.load(p_idx + t_lo * BLOCK_N + o_n, mask=t_lo * BLOCK_N + o_n < n_valid, other=-1)  # [BLOCK_N]
    if PREFETCH > 0:  # the slot ids of tile t_lo + PREFETCH
        o_pf = (t_lo + PREFETCH) * BLOCK_N + o_n
        b_idx_pf = tl.load(p_idx + o_pf, mask=(o_pf < n_valid) & (t_lo + PREFETCH < t_hi), other=-1)  # [BLOCK_N]
    for i_t in range(t_lo, t_hi):
        b_idx = b_idx_next
        o_next = (i_t + 1) * BLOCK_N + o_n
        b_idx_next = tl.load(p_idx + o_next, mask=o_next < n_valid, other=-1)  # [BLOCK_N]
        if PREFETCH > 0:
            _prefetch_v32_rows(kv, b_idx_pf, num_slots, page_size, stride_kb, stride_kt, KV_FP8, PF_STRIDE, PAGE_SHIFT)
            o_pf = (i_t + 1 + PREFETCH) * BLOCK_N + o_n
            b_idx_pf = tl.load(p_idx + o_pf, mask=(o_pf < n_valid) & (i_t + 1 + PREFETCH < t_hi), other=-1)
        m_n, o_tok = _row_offsets(b_idx, num_slots, page_size, stride_kb, stride_kt, PAGE_SHIFT)
        if ALIGNED:  # rows start 16-byte aligned: 16 bytes (fp8) or 8 bf16 values
            o_tok = tl.multiple_of(o_tok, 16 if KV_FP8 else 8)
        # [BLOCK_N, W] NoPE chunks (also V), [BLOCK_N, 64] RoPE
        b_k0 = _load_v32_nope(
            kv, o_tok, m_n, 0, W, BLOCK_N, KV_FP8, INT_DEQUANT, DOT_F32, STAGE_K, OPAQUE_K, Q_LIFT, F16
        )
        if NOPE_CHUNKS == 1:  # the whole row before the first dot: the chosen configs compile to the same kernel
            b_kr = _load_v32_rope(kv, o_tok, m_n, KV_FP8, DOT_F32)
        b_s = tl.dot(b_q0, tl.trans(b_k0), input_precision=DOT_PREC)  # [BLOCK_H, BLOCK_N]
        if NOPE_CHUNKS >= 2:
            b_k1 = _load_v32_nope(
                kv, o_tok, m_n, W, W, BLOCK_N, KV_FP8, INT_DEQUANT, DOT_F32, STAGE_K, OPAQUE_K, Q_LIFT, F16
            )
            b_s = tl.dot(b_q1, tl.trans(b_k1), b_s, input_precision=DOT_PREC)
        if NOPE_CHUNKS == 4:
            b_k2 = _load_v32_nope(
                kv, o_tok, m_n, 2 * W, W, BLOCK_N, KV_FP8, INT_DEQUANT, DOT_F32, STAGE_K, OPAQUE_K, Q_LIFT, F16
            )
            b_s = tl.dot(b_q2, tl.trans(b_k2), b_s, input_precision=DOT_PREC)
            b_k3 = _load_v32_nope(
                kv, o_tok, m_n, 3 * W, W, BLOCK_N, KV_FP8, INT_DEQUANT, DOT_F32, STAGE_K, OPAQUE_K, Q_LIFT, F16
            )
            b_s = tl.dot(b_q3, tl.trans(b_k3), b_s, input_precision=DOT_PREC)
        if NOPE_CHUNKS > 1:  # chunk by chunk: each chunk's load is followed by its dot, the RoPE last
            b_kr = _load_v32_rope(kv, o_tok, m_n, KV_FP8, DOT_F32)
        b_s = tl.dot(b_qr, tl.trans(b_kr), b_s, input_precision=DOT_PREC)  # [BLOCK_H, BLOCK_N]
        b_s = tl.where(m_n[None, :], b_s * qk_h, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(b_s, 1))
        if LAZY_RESCALE:
            b_p, m_i, l_i, alpha, moved = _lazy_softmax(b_s, m_new, m_i, l_i)
            if moved:  # the dots then take the accumulators as they are (_rescaled)
                acc0 = acc0 * alpha[:, None]
                if NOPE_CHUNKS >= 2:
                    acc1 = acc1 * alpha[:, None]
                if NOPE_CHUNKS == 4:
                    acc2 = acc2 * alpha[:, None]
                    acc3 = acc3 * alpha[:, None]
        else:
            m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # heads with nothing valid yet stay at zero weight
            alpha = tl.math.exp2(m_i - m_use)
            b_p = tl.math.exp2(b_s - m_use[:, None])
            l_i = l_i * alpha + tl.sum(b_p, 1)
            m_i = m_new
        if F16 and DOT_F32:
            b_pd = b_p.to(tl.float16).to(tl.float32)
        elif DOT_F32:
            b_pd = b_p
        elif F16:
            b_pd = b_p.to(tl.float16)
        else:
            b_pd = b_p.to(tl.bfloat16)
        acc0 = tl.dot(b_pd, b_k0, _rescaled(acc0, alpha, LAZY_RESCALE), input_precision=DOT_PREC)  # [BLOCK_H, W]
        if NOPE_CHUNKS >= 2:
            acc1 = tl.dot(b_pd, b_k1, _rescaled(acc1, alpha, LAZY_RESCALE), input_precision=DOT_PREC)
        if NOPE_CHUNKS == 4:
            acc2 = tl.dot(b_pd, b_k2, _rescaled(acc2, alpha, LAZY_RESCALE), input_precision=DOT_PREC)
            acc3 = tl.dot(b_pd, b_k3, _rescaled(acc3, alpha, LAZY_RESCALE), input_precision=DOT_PREC)

    lse2 = tl.where(l_i > 0.0, m_i + tl.math.log2(l_i), float("-inf"))
    inv_l = tl.where(l_i > 0.0, 1.0 / l_i, 0.0)
    if Q_LIFT:
        inv_l = inv_l * TWO_POW_LIFT  # PV over K * 2^-LIFT_LOG2: back to scale (exact)
    m_o = m_h[:, None] & (o_d < DV)[None, :]  # chunk 0's columns
    if SINGLE:
        p_o = out + (i_r.to(tl.int64) * H + o_h[:, None]) * DV + o_d[None, :]  # [BLOCK_H, W], chunk 0's columns
        b_lse = tl.where(l_i > 0.0, lse2 * 0.6931471805599453, float("inf"))
        tl.store(lse + (i_b.to(tl.int64) * H + o_h) * S + i_s, b_lse, mask=m_h)  # lse [B, H, S]
    else:
        i_part = i_r.to(tl.int64) * num_splits + i_sp
        p_o = o_part + (i_part * H + o_h[:, None]) * DV + o_d[None, :]
        tl.store(lse_part + i_part * H + o_h, lse2, mask=m_h)
    tl.store(p_o, (acc0 * inv_l[:, None]).to(p_o.dtype.element_ty), mask=m_o)
    if NOPE_CHUNKS >= 2:
        _store_o_chunk(p_o, acc1, inv_l, m_h, o_d, W, DV)
    if NOPE_CHUNKS == 4:
        _store_o_chunk(p_o, acc2, inv_l, m_h, o_d, 2 * W, DV)
        _store_o_chunk(p_o, acc3, inv_l, m_h, o_d, 3 * W, DV)


@triton.jit
def _sparse_decode_v32_combine_kernel(
    o_part, lse_part, out, lse, S, H, num_splits,
    DV: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    """LSE-merge of the splits: grid (B * S, cdiv(H, BLOCK_H), cdiv(DV, BLOCK_D)); every split's partial in one
    [BLOCK_S, BLOCK_H, BLOCK_D] tile. Heads no split saw get out 0 and lse +inf."""
    i_r = tl.program_id(0)
    i_hb = tl.program_id(1)
    i_db = tl.program_id(2)
    o_sp = tl.arange(0, BLOCK_S)
    o_h = i_hb * BLOCK_H + tl.arange(0, BLOCK_H)
    o_d = i_db * BLOCK_D + tl.arange(0, BLOCK_D)
    m_h = o_h < H
    m_d = o_d < DV
    m_sh = (o_sp < num_splits)[:, None] & m_h[None, :]
    o_sh = (i_r.to(tl.int64) * num_splits + o_sp[:, None]) * H + o_h[None, :]  # [BLOCK_S, BLOCK_H]
    b_lse = tl.load(lse_part + o_sh, mask=m_sh, other=float("-inf"))  # [BLOCK_S, BLOCK_H] base 2
    m_max = tl.max(b_lse, 0)
    m_use = tl.where(m_max == float("-inf"), 0.0, m_max)
    b_w = tl.math.exp2(b_lse - m_use[None, :])  # [BLOCK_S, BLOCK_H]; 0 for empty splits
    b_tot = tl.sum(b_w, 0)
    p_o = o_part + o_sh[:, :, None] * DV + o_d[None, None, :]
    b_o = tl.load(p_o, mask=m_sh[:, :, None] & m_d[None, None, :], other=0.0)  # [BLOCK_S, BLOCK_H, BLOCK_D]
    b_acc = tl.sum(b_w[:, :, None] * b_o.to(tl.float32), 0)  # [BLOCK_H, BLOCK_D]
    b_scale = tl.where(b_tot > 0.0, 1.0 / b_tot, 0.0)
    p_out = out + (i_r.to(tl.int64) * H + o_h[:, None]) * DV + o_d[None, :]
    tl.store(p_out, (b_acc * b_scale[:, None]).to(out.dtype.element_ty), mask=m_h[:, None] & m_d[None, :])
    if i_db == 0:
        b_lse_out = tl.where(b_tot > 0.0, (m_use + tl.math.log2(b_tot)) * 0.6931471805599453, float("inf"))
        i_b = i_r // S
        i_s = i_r % S
        tl.store(lse + (i_b.to(tl.int64) * H + o_h) * S + i_s, b_lse_out, mask=m_h)  # lse [B, H, S]


# --------------------------------------------------------------------------------------------------------------------
# launcher
# --------------------------------------------------------------------------------------------------------------------
def _is_interpreted() -> bool:
    """True when this module's kernels were defined for Triton's CPU interpreter."""
    return dev.defined_interpreted(_sparse_decode_v32_kernel)


def _cache_operand(kv_cache: torch.Tensor, kv_format: str) -> tuple[torch.Tensor, bool]:
    """(what the kernel addresses: a uint8 view for fp8_656, the bf16 cache for bf16_576; rows 16-byte aligned)."""
    width = v32_row_width(kv_format)
    if kv_cache.dim() != 4 or kv_cache.shape[2] != 1 or kv_cache.shape[3] != width:
        raise ValueError(f"kv_cache must be [num_blocks, page_size, 1, {width}] for {kv_format}, got "
                         f"{list(kv_cache.shape)}")  # fmt: skip
    if kv_cache.stride(3) != 1:
        raise ValueError(f"kv_cache must be contiguous along its last dim, got strides {kv_cache.stride()}")
    strides = (kv_cache.stride(0), kv_cache.stride(1))
    if kv_format == "fp8_656":
        if kv_cache.element_size() != 1:
            raise ValueError(f"an fp8_656 kv_cache holds bytes (uint8/int8/float8_e4m3fn), got {kv_cache.dtype}")
        if any(s % 4 for s in strides) or kv_cache.data_ptr() % 4:
            raise ValueError(f"fp8_656 rows must start 4-byte aligned (fp32 scales), got strides {strides}")
        raw = kv_cache if kv_cache.dtype == torch.uint8 else kv_cache.view(torch.uint8)
        return raw, all(s % 16 == 0 for s in strides) and kv_cache.data_ptr() % 16 == 0
    if kv_cache.dtype != torch.bfloat16:
        raise ValueError(f"a bf16_576 kv_cache must be bf16, got {kv_cache.dtype}")
    return kv_cache, all(s % 8 == 0 for s in strides) and kv_cache.data_ptr() % 16 == 0


def sparse_decode_v32_fwd(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    *,
    kv_format: str,
    d_v: int = V32_NOPE_DIM,
    topk_length: torch.Tensor | None = None,
    num_splits: int | str = "auto",
    config: V32Config | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the V3.2 decode kernel(s): ``(out [B, s_q, H, d_v] bf16, lse [B, H, s_q] fp32 contiguous)``.

    Arguments as :func:`sparsemla.kernels.sparse_decode.api.sparse_decode_v32`; ``num_splits``: "auto" or a positive
    int (clamped to the tile count); ``config``: override the chosen :class:`V32Config`. Under Triton's CPU
    interpreter the dots run in fp32 with small tiles."""
    interpret = dev.check_interpreting(_is_interpreted())
    if q.dim() != 4 or q.shape[-1] != V32_DIM or q.dtype != torch.bfloat16:
        raise ValueError(f"q must be [B, s_q, H, {V32_DIM}] bf16, got {list(q.shape)} {q.dtype}")
    batch, s_q, heads, _ = q.shape
    if indices.dim() != 3 or tuple(indices.shape[:2]) != (batch, s_q) or indices.dtype != torch.int32:
        raise ValueError(f"indices must be [B={batch}, s_q={s_q}, topk] int32, got {list(indices.shape)} "
                         f"{indices.dtype}")  # fmt: skip
    if indices.shape[2] and indices.stride(2) != 1:
        raise ValueError("indices must be contiguous along topk")
    if topk_length is not None and (
        topk_length.dim() != 1 or topk_length.shape[0] != batch or topk_length.dtype not in (torch.int32, torch.int64)
    ):
        raise ValueError(f"topk_length must be [B={batch}] int32, got {list(topk_length.shape)} {topk_length.dtype}")
    if not 0 < d_v <= V32_NOPE_DIM:
        raise ValueError(f"d_v must be in 1..{V32_NOPE_DIM}, got {d_v}")
    kv, aligned = _cache_operand(kv_cache, kv_format)

    info = dev.launch_info(q.device)
    cfg = config or choose_v32_config(info, heads, batch * s_q, kv_format, aligned)
    check_v32_config(cfg, info, kv_format)
    if cfg.gluon and not aligned:
        raise ValueError("V32Config.gluon needs the fp8_656 cache's pages and slots 16-byte aligned")
    rows, topk = batch * s_q, indices.shape[2]
    head_blocks = triton.cdiv(heads, cfg.block_h)
    # programs one SM holds at once: registers bound it (8 warps x ~200-255 registers per thread fill an SM's 64K)
    resident = max(
        1, min(info.smem_per_sm // shared_bytes_v32(cfg, kv_format, info), 65_536 // (cfg.num_warps * 32 * 192))
    )
    splits = choose_num_splits(rows, head_blocks, triton.cdiv(topk, cfg.block_n), info.num_sms * resident, num_splits)

    # The interpreter truncates fp32 -> bf16 stores (Triton 3.8); there the kernel writes fp32 and torch rounds.
    out = torch.empty(batch, s_q, heads, d_v, dtype=torch.float32 if interpret else torch.bfloat16, device=q.device)
    lse = torch.empty(batch, heads, s_q, dtype=torch.float32, device=q.device)
    if splits > 1:
        part_dtype = torch.bfloat16 if cfg.partial_bf16 and not interpret else torch.float32
        o_part = torch.empty(rows, splits, heads, d_v, dtype=part_dtype, device=q.device)
        lse_part = torch.empty(rows, splits, heads, dtype=torch.float32, device=q.device)
    else:
        o_part, lse_part = out, lse  # unused
    tiles_per_program = triton.cdiv(triton.cdiv(topk, cfg.block_n), splits)
    f16 = v32_f16(cfg, info, kv_format, tiles_per_program)
    if cfg.gluon_ws:
        gluon_ws_v32_sm90.sparse_decode_v32_sm90_ws_fwd(
            q, kv, indices, topk_length, out, lse, o_part, lse_part, page_size=kv_cache.shape[1],
            stride_kb=kv_cache.stride(0), stride_kt=kv_cache.stride(1), num_slots=kv_cache.shape[0] * kv_cache.shape[1],
            splits=splits, qk_scale=float(sm_scale) * LOG2E, d_v=d_v,
        )  # fmt: skip
    elif cfg.gluon:
        gluon_v32_sm90.sparse_decode_v32_sm90_fwd(
            q, kv, indices, topk_length, out, lse, o_part, lse_part, page_size=kv_cache.shape[1],
            stride_kb=kv_cache.stride(0), stride_kt=kv_cache.stride(1), num_slots=kv_cache.shape[0] * kv_cache.shape[1],
            splits=splits, qk_scale=float(sm_scale) * LOG2E, d_v=d_v, int_dequant=cfg.int_dequant,
            prefetch=cfg.gluon_prefetch, f16=f16,
        )  # fmt: skip
    else:
        grid, heads_fastest = decode_grid(rows, head_blocks, splits, cfg.heads_fastest)
        _sparse_decode_v32_kernel[grid](
            q, kv, indices, topk_length if topk_length is not None else indices, out, lse, o_part, lse_part,
            s_q, heads, topk, kv_cache.shape[1], kv_cache.stride(0), kv_cache.stride(1),
            kv_cache.shape[0] * kv_cache.shape[1], splits, float(sm_scale) * LOG2E,
            q.stride(0), q.stride(1), q.stride(2), q.stride(3), indices.stride(0), indices.stride(1),
            DV=d_v, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, NOPE_CHUNKS=cfg.nope_chunks,
            KV_FP8=kv_format == "fp8_656",
            INT_DEQUANT=cfg.int_dequant and not interpret, STAGE_K=cfg.stage_k, HAS_LEN=topk_length is not None,
            OPAQUE_K=cfg.opaque_k and not interpret, LAZY_RESCALE=cfg.lazy_rescale,
            Q_LIFT=v32_q_lift(cfg, info, kv_format, tiles_per_program) and not interpret,
            SINGLE=splits == 1,
            PREFETCH=prefetch_ahead(cfg.l2_prefetch, cfg.num_stages, interpret),
            PF_STRIDE=cfg.prefetch_stride,
            PAGE_SHIFT=page_shift(kv_cache.shape[1]), HEADS_FASTEST=heads_fastest, F16=f16,
            ALIGNED=aligned, DOT_F32=interpret, DOT_PREC="ieee" if interpret else "tf32",
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
    if splits > 1:
        block_s, block_hc, block_d = combine_blocks(splits, heads)
        _sparse_decode_v32_combine_kernel[(rows, triton.cdiv(heads, block_hc), triton.cdiv(d_v, block_d))](
            o_part, lse_part, out, lse, s_q, heads, splits,
            DV=d_v, BLOCK_S=block_s, BLOCK_H=block_hc, BLOCK_D=block_d, num_warps=4,
        )  # fmt: skip
    return out.to(torch.bfloat16), lse


def flops_and_bytes_v32(batch: int, s_q: int, heads: int, topk: int, kv_format: str) -> tuple[float, float]:
    """(FLOPs, minimum HBM bytes) of one call: QK over 576 + PV over 512 (FlashMLA's count); KV rows read once per
    query row, indices, q, out."""
    row = V32_FP8_BYTES if kv_format == "fp8_656" else 2 * V32_DIM
    n = batch * s_q
    flops = 2.0 * n * heads * topk * (V32_DIM + V32_NOPE_DIM)
    nbytes = n * topk * (row + 4) + n * heads * (V32_DIM * 2 + V32_NOPE_DIM * 2 + 4)
    return flops, float(nbytes)


__all__ = [
    "V32Config",
    "check_v32_config",
    "choose_v32_config",
    "flops_and_bytes_v32",
    "shared_bytes_v32",
    "sparse_decode_v32_fwd",
]
