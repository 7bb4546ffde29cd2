"""Head-batched tensor-core Triton kernel for DeepSeek-V4 sparse-MLA decode (V4 page-split fp8 KV cache).

One program = (query row, head block, split). A program walks its share of the concatenated candidate list
(main cache ++ extra cache) in tiles of ``BLOCK_N`` tokens; each token row is gathered and dequantized ONCE per
program and shared by all ``BLOCK_H`` heads, with an online softmax in base 2 and fp32 accumulation. The dequantized
row is one [BLOCK_N, 512] bf16 tile (7 fp8 NoPE chunks of 64, each times its ue8m0 scale, exact in bf16 because it is
a power of two, + the bf16 RoPE chunk), so a tile costs two dots: a 512-deep QK^T and a 512-wide PV into one
[BLOCK_H, 512] accumulator. Both caches share one loop (the cache, page geometry and index row are scalars selected
per tile); the slot ids of the next tile are loaded one tile ahead. ``dv_split=2`` runs each 256-column half of the
output in its own program (the scores are computed by both), which doubles the programs of a small grid.

Portability: the fp8 bytes are read as uint8 and dequantized with integer instructions
(:func:`sparsemla.kernels.dequant.e4m3_bits_to_bf16`), so no e4m3 type is needed (sm_80/86 have none). The tiles come
from :func:`choose_config` per :class:`~sparsemla.kernels.device.DeviceInfo`: on mma.sync targets (sm_80..sm_89,
sm_120) both dot operands are staged in shared memory, so the Hopper tiles (196,608 B there) do not fit their
101,376 B and smaller ones are chosen.

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

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from sparsemla.kernels import device as dev
from sparsemla.kernels.dequant import LIFT_LOG2, TWO_POW_120, TWO_POW_LIFT, e4m3_bits_to_bf16, opaque_bf16
from sparsemla.kernels.layouts import V4_BYTES_PER_TOKEN, V4_DATA_BYTES, V4_DIM, V4_NOPE_DIM, V4_SCALE_BYTES
from sparsemla.kernels.paging import page_shift, page_split_either
from sparsemla.kernels.prefetch import check_prefetch, prefetch_ahead, prefetch_l2, prefetch_rows_l2
from sparsemla.kernels.sparse_decode import gluon_sm90, gluon_ws_sm90

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
# The V4 page layout as the kernel addresses it (sparsemla.kernels.layouts): a token's data row, the same row in bf16
# units, the RoPE part's byte offset inside it, and the token's scale row.
DATA_ROW = tl.constexpr(V4_DATA_BYTES)  # 576 bytes: fp8 NoPE then bf16 RoPE
DATA_ROW_BF16 = tl.constexpr(V4_DATA_BYTES // 2)  # 288 bf16 units
ROPE_OFFSET = tl.constexpr(V4_NOPE_DIM)  # 448: the bf16 RoPE starts after the fp8 NoPE bytes
SCALE_ROW = tl.constexpr(V4_SCALE_BYTES)  # 8 bytes: 7 ue8m0 scales + 1 pad


@dataclass(frozen=True)
class DecodeConfig:
    """Launch shape of the main kernel.

    block_h / block_n: heads per program and tokens per tile; num_warps / num_stages: Triton launch options;
    dv_split: 1, or 2 = each program owns one 256-column half of the output (twice the programs, each with half the
    accumulator, both halves recompute the scores); partial_bf16: split partials stored as bf16 instead of fp32 (half
    the partial traffic; relative error of out 2.7e-3 instead of 1.6e-3 against the fp32 reference, where the bf16
    output's own rounding is ~1e-3); int_dequant: fp8 -> bf16 with integer ops (bit-identical, and the only path on
    targets without an e4m3 type) instead of the fp8 -> f16 -> bf16 conversion instructions; chunks_first: the
    gathered tile's axis order, a compiler question (None, the default: the compiling Triton's order,
    :func:`tile_chunks_first`, resolved at launch, so a hand-built configuration gets it too); opaque_tile: the
    gathered tile passes through :func:`sparsemla.kernels.dequant.opaque_bf16` before the dots (None, the default:
    where the dots are mma.sync, :func:`opaque_tile_default`); lazy_rescale: the online softmax keeps its reference
    maximum until some head's running maximum passes it by more than :data:`RESCALE_SLACK` (log2 units), so the tiles
    in between skip the [block_h, 512] accumulator's rescale (one multiply per accumulator value and tile; exact up
    to rounding: P stays <= 2 ** RESCALE_SLACK, its bf16 rounding is relative). Off until timed. q_lift (with
    int_dequant): the integer path's 2^-120 is folded into the tile's scale multiply and q's and the output's NoPE
    columns are scaled by 2^8 once per program instead (:data:`~sparsemla.kernels.dequant.LIFT_LOG2`: the same bits
    for scales 2^-111 .. 2^15), one multiply per gathered value instead of two (None, the default:
    :func:`q_lift_default`). l2_prefetch (0: off): each iteration prefetches into L2 the data and scale rows of the tile
    that many tiles beyond the last one the software pipeline copies (tile i + num_stages - 1 + l2_prefetch), one
    address every ``prefetch_stride`` bytes (:mod:`sparsemla.kernels.prefetch`; the same results); None, the default:
    :func:`l2_prefetch_default`. sub_tiles (1 or 2; 2 needs dv_split=1 and no lazy rescale): each tile is gathered,
    scored and multiplied as its even and odd tokens (two half tiles, one online-softmax step), so P is staged in
    shared memory half at a time (the 32 x 64 mma.sync tile: 100,352 B instead of 102,400). sub_joint_reduce (with
    sub_tiles=2; the launcher's choice, :data:`MMA_WIDE_TILE_BUSY`): one row-max and one row-sum reduction over both
    halves instead of one each (ahead of time 1,866 instead of 1,922 loop instructions on sm_89, 8 B more spilled).
    heads_fastest (on by default): the grid's first axis walks a row's head blocks (and V halves) before the next
    row, so the programs that gather the same tokens run side by side and the later ones read them from L2. gluon
    (sm_90 only; 64 x 64 tiles, 8 warps, one stage, no V halves, half tiles or lazy rescale): the
    tile written in Gluon (:mod:`~sparsemla.kernels.sparse_decode.gluon_sm90`), whose two warpgroups split the
    scores' tokens instead of both computing all of them. ids_ahead (with gluon; off until timed): its slot ids loaded
    one iteration ahead, as the Triton tile's are (the same bits). warp_specialize (with gluon): the Gluon tile with a
    producer warpgroup that gathers the next tile into a second buffer while the two warpgroups multiply this one
    (:mod:`~sparsemla.kernels.sparse_decode.gluon_ws_sm90`; the same bits); None, the default:
    :func:`warp_specialize_default`."""

    block_h: int
    block_n: int
    num_warps: int
    num_stages: int
    dv_split: int = 1
    partial_bf16: bool = False
    int_dequant: bool = False
    chunks_first: bool | None = None
    opaque_tile: bool | None = None
    lazy_rescale: bool = False
    q_lift: bool | None = None
    l2_prefetch: int | None = None
    prefetch_stride: int = 128
    sub_tiles: int = 1
    sub_joint_reduce: bool = False
    # on by default: once the grid is more than one wave, a row's head blocks launched far apart re-read its tokens
    # from HBM (the benchmark's rows gather disjoint tokens, 383 MB at 1024 rows). H100, sm_89 path, 3.8 cubins
    # (results/bench/explore/heads_fastest-sm89-h100-6bd2634.json): 1024 rows 593 -> 520 us, 8192 rows 4,544 ->
    # 3,975, H=64 B=256 162 -> 143; at sm_89's blocks per SM 739 -> 703, 5,511 -> 5,357; one wave (B <= 128) the
    # same within 1 %.
    heads_fastest: bool = True
    gluon: bool = False
    ids_ahead: bool = False
    warp_specialize: bool | None = None

    def __post_init__(self) -> None:
        if self.dv_split not in (1, 2):
            raise ValueError(f"dv_split must be 1 or 2, got {self.dv_split}")
        check_prefetch(self.l2_prefetch or 0, self.prefetch_stride)
        if self.sub_tiles not in (1, 2) or (self.sub_tiles == 2 and (self.dv_split != 1 or self.lazy_rescale)):
            raise ValueError(f"sub_tiles must be 1, or 2 with dv_split=1 and no lazy_rescale, got {self.sub_tiles}")
        if self.sub_joint_reduce and self.sub_tiles != 2:
            raise ValueError("sub_joint_reduce needs sub_tiles=2")
        if self.opaque_tile and self.num_stages > 1:
            raise ValueError("opaque_tile needs num_stages=1 (Triton's pipeliner cannot predicate the opaque move)")
        if self.ids_ahead and not self.gluon:
            raise ValueError("ids_ahead is an option of the Gluon tile (gluon=True)")
        if self.warp_specialize and not self.gluon:
            raise ValueError("warp_specialize is an option of the Gluon tile (gluon=True)")
        if self.gluon and (
            (self.block_h, self.block_n, self.num_warps, self.num_stages, self.dv_split, self.sub_tiles)
            != (gluon_sm90.BLOCK_H, gluon_sm90.BLOCK_N, gluon_sm90.NUM_WARPS, 1, 1, 1)
            or self.lazy_rescale
        ):  # fmt: skip
            raise ValueError(
                "gluon is the 64 x 64 tile with 8 warps and one stage, without dv_split, sub_tiles or lazy_rescale; "
                f"got {self}"
            )


# Lazy rescale (DecodeConfig.lazy_rescale): how far (log2 units) a head's running maximum may pass the reference
# maximum before the accumulator is rescaled; P = exp2(s - reference) then stays <= 2 ** 8 = 256 (fp32 sums, bf16 P).
RESCALE_SLACK = tl.constexpr(8.0)

# mma.sync targets, H > 16: from this many programs (rows x 32-head blocks) the 32 x 16 tile, where an SM holds one
# 32 x 32 program only (choose_tiles). sm_89 path on the H200 at sm_89's blocks per SM, 3.8 cubins
# (results/bench/explore/decode_t38_configs_sm89_occupancy-h200.json): H=64 B=128 153.5 -> 143.8 us, B=1024 1112 ->
# 1061, 8192 rows 8605 -> 8242, H=128 B=128 288 -> 262; B=64 (128 programs) 79.0 against 103.4: the 32 x 32 tile.
MMA_SMALL_TILE_BUSY = 256
# mma.sync targets, H > 16: from this many programs per resident 32 x 32 program of an SM, the 32 x 64 tile as two
# half tiles (sub_tiles=2, 100,352 B), where an SM holds as many of those as of 32 x 32 ones (sm_86/89/120: one
# each; an A100 holds two 32 x 32 and one 32 x 64, so it keeps 32 x 32). sm_89 path, 3.8 cubins, H100
# (results/bench/explore/sub_tiles*-sm89-h100-cfaf665.json), at sm_89's blocks per SM: H=64 B=32 41.0 -> 36.7 us,
# B=64 66.8 -> 56.4, B=128 130 -> 109, 1024 rows 970 -> 750, 8192 rows 7,263 -> 5,763, H=128 B=64 129 -> 102; at the
# H100's (two per SM) from 128 programs: B=64 54.3 -> 52.4, B=128 88.0 -> 80.0, 8192 rows 4,926 -> 4,695, H=128 B=64
# 85.7 -> 76.6, but B=32 34.6 -> 36.2 (64 programs); 16-32 programs even (+-5 %), 4 programs lose (13.9 -> 15.7).
# The half tiles reduce their row maximum and sum jointly (sub_joint_reduce), H100, sm_89 path, 3.8 cubins
# (results/bench/explore/h64_sub2-sm89-h100-932c7ab.json), at sm_89's blocks per SM: H=64 B=64 56.1 -> 54.1 us,
# B=128 108.6 -> 104.3, 1024 rows 747 -> 716, 8192 rows 5,711 -> 5,508, H=128 B=64 102.0 -> 97.7; at the H100's:
# 1024 rows 617 -> 595, 8192 rows 4,739 -> 4,451.
MMA_WIDE_TILE_BUSY = 64


# sm_90, H > 16: from this many programs (rows x 64-head blocks) the Gluon tile (DecodeConfig.gluon) instead of the
# Triton one, whose QK dot both warpgroups compute whole. H100, native path, Triton 3.8 cubins, graph replay, two input
# sets rotated (results/bench/explore/gluon_decode-native-h100-8524dae.json, the explore prototype of this kernel):
# H=64 8 rows 26.1 -> 24.0 us, 64 rows 56.3 -> 49.2, 128 rows 84.2 -> 70.3, 1024 rows 566 -> 422, 8192 rows
# 4,520 -> 3,122; H=128 8 rows 29.0 -> 27.6, 64 rows 78.1 -> 65.4, 128 rows 143.6 -> 120.9. Below 8 programs the
# 16-token V halves stay (the Gluon tile has no V halves).
GLUON_SM90_MIN_BUSY = 8

# sm_90, H > 16: the mma.sync tiles of the targets without wgmma (32-head blocks, chosen as there) where rows x 64-head
# blocks fall in one of these ranges (inclusive), instead of the wgmma / Gluon tiles. H100, native path, Triton 3.8
# cubins, graph replay, 128 + 512 indices, the launcher's split counts, same run
# (results/bench/explore/decode_small_mma_native-h100-8951c7b.json, -b.json), us: 1 (H=64 B=1) 13.7 -> 13.2,
# 2 (H=128 B=1) 15.8 -> 14.2, 4 (H=64 B=4) 18.3 -> 17.0, 16 (H=128 B=8; H=64 B=16) 27.9 -> 25.6, 28.5 -> 26.2,
# 32 (H=128 B=16; H=64 B=32) 33.6 -> 32.9, 36.5 -> 33.9. Not at 8, where the Gluon tile starts (H=128 B=4 20.3 against
# 20.9; H=64 B=8 21.6 / 21.7), nor at 64 (H=128 B=32 40.8 / 52.2; H=64 B=64 45.3 / 53.1). Nor where the Gluon tile
# would walk WS_MIN_TILES tiles a program and warp-specialize (_sm90_mma_tile): at 128 + 2048 indices (same machine
# and cubins, decode_small_mma_native-h100-f4b2d33-x2048.json), mma / Gluon us: 16 programs (H=64 B=16) 49.1 / 42.0,
# (H=128 B=8) 48.2 / 38.8, 24 (H=64 B=24) 68.7 / 52.2, 32 (H=64 B=32) 78.6 / 58.6, (H=128 B=16) 77.6 / 51.5. Below
# 8 programs the tile they replace is the wgmma V-halves one, slower at both widths (2048: H=64 B=1 18.2 against
# 18.7 us, B=4 24.7 against 27.1; H=128 B=1 19.8 against 21.1): there the window holds at any width. The widths
# decide, not the live lengths (graph-safe). sglang's ratio-128 layers pass a list of cap / 128 slots with ctx / 128
# live; at 128 + 8192 slots (results/bench/explore/decode_wide_extra_native-h100-9b57743.json), 16-32 programs, the
# window would be faster at 32-256 live (H=64 B=16 18.7 / 25.6 us, B=32 20.9 / 26.9), mixed at 1,024 (34.5 / 36.5,
# 49.2 / 45.7), the Gluon tile far faster at 4,096 (79.6 / 60.0, 142.1 / 87.1; H=128 B=8 77.9 / 52.1): kept on the
# Gluon tile, whose losses are a few us a layer where its gains are tens.
SM90_MMA_BUSY = ((1, 4), (16, 32))


# DecodeConfig.warp_specialize by default: from this many tiles per program. H100, native path, Triton 3.8 cubins,
# graph replay, two input sets rotated, bit-equal outputs (the explore form of this kernel, producer 120 registers:
# results/bench/explore/gluon_ws_decode-native-h100-f271023.json): H=64 64 rows 45.7 -> 44.3 us, 128 rows 61.8 ->
# 57.9, 1024 rows 404 -> 367, 8192 rows 3,036 -> 2,639; H=128 64 rows 59.4 -> 52.1, 128 rows 108.1 -> 95.7. One or two
# tiles a program lose: H=64 8 rows 20.9 -> 22.6, H=128 8 rows 27.8 -> 28.2 (nothing to overlap).
WS_MIN_TILES = 4


def warp_specialize_default(cfg: DecodeConfig, tiles_per_program: int) -> bool:
    """``DecodeConfig.warp_specialize`` when None: the Gluon tile warp-specialized where a program walks at least
    :data:`WS_MIN_TILES` tiles."""
    return cfg.gluon and tiles_per_program >= WS_MIN_TILES


def warp_specialize(cfg: DecodeConfig, tiles_per_program: int) -> bool:
    """Whether ``cfg``'s launch is the warp-specialized Gluon tile: its own ``warp_specialize``, else
    :func:`warp_specialize_default`."""
    if cfg.warp_specialize is None:
        return warp_specialize_default(cfg, tiles_per_program)
    return cfg.warp_specialize


def tile_chunks_first() -> bool:
    """Whether the gathered tile is built chunks-first ([NC, BLOCK_N, 64]) so that the compiling Triton lays its lanes
    over tokens (``_load_kv_tile``): Triton >= 3.8. Read at every launch from ``device.TRITON_VERSION`` (a replay of
    another Triton's cubins sets it to that compiler's)."""
    return dev.triton_at_least(3, 8)


def wgmma_tile(cfg: DecodeConfig, info: dev.DeviceInfo) -> bool:
    """Whether ``cfg``'s dots are wgmma / tcgen05 on ``info`` (64-head blocks on sm_90/100), else mma.sync."""
    return info.has_wgmma and cfg.block_h >= 64


def opaque_tile_default(cfg: DecodeConfig, info: dev.DeviceInfo) -> bool:
    """Whether the gathered tile goes through :func:`~sparsemla.kernels.dequant.opaque_bf16`: where both dots are
    mma.sync (every target below sm_90, and 16-head blocks everywhere). Built from uint8 bytes, the tile otherwise
    gets 8-bit operand runs (kWidth 4): 64-bit shared loads instead of ``ldmatrix``, the tile stored twice and
    register moves before every MMA (docs/performance.md, "One tile of the decode loop per target"). wgmma reads
    both operands from shared memory, so nothing changes there and it stays off; so does a pipelined configuration
    (Triton's pipeliner cannot predicate the move)."""
    return cfg.num_stages == 1 and not wgmma_tile(cfg, info)


def opaque_tile(cfg: DecodeConfig, info: dev.DeviceInfo) -> bool:
    """Whether ``cfg`` on ``info`` moves the tile through the opaque move: its own ``opaque_tile``, else
    :func:`opaque_tile_default`."""
    return opaque_tile_default(cfg, info) if cfg.opaque_tile is None else cfg.opaque_tile


# DecodeConfig / V32Config.q_lift by default: from this many tiles per program. The lift saves one multiply per
# gathered value and tile but costs a multiply per q and output value once per program; sm_89 path on the H200, 3.8
# cubins (results/bench/explore/q_lift-sm89-h200-a3fa148.json): 1 tile a program (B = 1) 12.9 -> 13.5 us, 5 (B = 32, and
# H = 8 at B = 64) 34.9 -> 33.7 and 31.2 -> 28.5, 10 (B = 64) 57.0 -> 55.2.
LIFT_MIN_TILES = 4


def q_lift_default(cfg: DecodeConfig, info: dev.DeviceInfo, tiles_per_program: int) -> bool:
    """Whether the integer dequant is lifted by default (``DecodeConfig.q_lift``, and ``V32Config.q_lift``: ``cfg``
    may be either, both have ``block_h`` and ``int_dequant``): with the integer dequant, where the dots are mma.sync
    and a program walks at least :data:`LIFT_MIN_TILES` tiles; likewise on sm_90's Gluon tile, whose lifted q stays in
    shared memory (H100, results/bench/explore/gluon_decode-native-h100-d306a23.json: 1024 rows 408.7 -> 397.3 us,
    8192 rows 2,988 -> 2,924, H=64 B=128 63.6 -> 61.8, H=128 B=128 109.7 -> 107.9; one tile a program, 8 rows, 21.0
    -> 21.3). On Triton's wgmma tiles (sm_90/100, 64 heads) the lifted q is kept in registers as the QK dot's A
    operand instead of being read from shared memory, and the 64 x 512 tile then spills (Triton 3.8, sm_90: 456 B a
    thread, from 8; the H200 ran 50-70 % slower, q_lift-native-h200-a3fa148.json; V3.2's 64-head tile 80-120 B)."""
    gluon = getattr(cfg, "gluon", False)  # V32Config has no Gluon tile
    return cfg.int_dequant and (gluon or not wgmma_tile(cfg, info)) and tiles_per_program >= LIFT_MIN_TILES


# DecodeConfig.l2_prefetch by default: one tile ahead from this many tiles per program. H200, 3.8 cubins, graph
# replay (results/bench/explore/l2_prefetch-{native,sm89}-h200-1f0fdf4.json): 1 - 3 tiles a program (B = 1, 8) lose
# 0.2 - 0.5 us (+1 .. +4 %); from 5 tiles it wins: native B = 128 H = 64 71.2 -> 63.8 us, 1024 rows 474 -> 430, B = 64
# H = 128 66.9 -> 62.9; sm_89 path at sm_89's blocks per SM B = 64 H = 64 72.7 -> 64.8, B = 128 148 -> 130, 1024
# rows 1,065 -> 962; at the H200's 54.3 -> 53.2 and 91.6 -> 87.1. Not on tiles of fewer than 512 scores (the 16 x 16
# tiles of <= 8 rows with <= 16 heads): not timed with it, and it takes their registers past SMALL_TILE_REGS (sm_89
# 128 -> 159 ahead of time).
PREFETCH_MIN_TILES = 4


def l2_prefetch_default(cfg: DecodeConfig, tiles_per_program: int) -> int:
    """``DecodeConfig.l2_prefetch`` when None: 1 (the rows of the tile after the pipeline's, into L2) where a program
    walks at least :data:`PREFETCH_MIN_TILES` tiles of at least 512 scores, else 0."""
    return 1 if tiles_per_program >= PREFETCH_MIN_TILES and cfg.block_h * cfg.block_n >= 512 else 0


def q_lift(cfg: DecodeConfig, info: dev.DeviceInfo, tiles_per_program: int) -> bool:
    """Whether ``cfg`` on ``info`` lifts the integer dequant: its own ``q_lift`` (with int_dequant), else
    :func:`q_lift_default` (``tiles_per_program``: the launch's tiles over its splits, from shapes)."""
    if cfg.q_lift is None:
        return q_lift_default(cfg, info, tiles_per_program)
    return cfg.q_lift and cfg.int_dequant


def choose_config(info: dev.DeviceInfo, num_heads: int, rows: int = 1, topks: tuple[int, ...] = ()) -> DecodeConfig:
    """The launch configuration for ``num_heads`` query heads and ``rows`` query rows (B * s_q) on ``info`` (tiles:
    :func:`choose_tiles`; axis order for the compiling Triton: :func:`tile_chunks_first`)."""
    return replace(choose_tiles(info, num_heads, rows, topks), chunks_first=tile_chunks_first())


def _sm90_mma_tile(info: dev.DeviceInfo, num_heads: int, rows: int, topks: tuple[int, ...]) -> bool:
    """Whether sm_90 takes the mma.sync targets' tiles: ``rows x 64-head blocks`` in :data:`SM90_MMA_BUSY`, unless
    the tile they replace is the Gluon tile (from :data:`GLUON_SM90_MIN_BUSY` programs) and its launch would
    warp-specialize there (``topks``: the index lists' widths; () = not known: it would not)."""
    busy64 = rows * triton.cdiv(num_heads, 64)
    if info.capability != (9, 0) or not any(lo <= busy64 <= hi for lo, hi in SM90_MMA_BUSY):
        return False
    if busy64 < GLUON_SM90_MIN_BUSY or not gluon_sm90.available():
        return True  # against the wgmma tiles the mma.sync ones were faster at every width measured
    gluon = _gluon_tile(busy64)
    tiles, splits = launch_splits(gluon, info, rows, num_heads, topks)
    return not warp_specialize_default(gluon, triton.cdiv(tiles, splits))


def _gluon_tile(busy: int) -> DecodeConfig:
    """sm_90's Gluon tile for ``busy`` programs of 64 heads (bf16 partials from 16)."""
    return DecodeConfig(64, 64, 8, 1, partial_bf16=busy >= 16, int_dequant=True, gluon=True)


def choose_tiles(info: dev.DeviceInfo, num_heads: int, rows: int = 1, topks: tuple[int, ...] = ()) -> DecodeConfig:
    """The launch configuration for ``num_heads`` query heads and ``rows`` query rows (B * s_q) of ``topks`` indices
    (the widths of the main and extra index lists) on ``info``.

    H <= 16 on every target: one 16-head program per row, mma.sync (wgmma needs 64 rows per warpgroup), 16-token
    tiles (33,280 B through the opaque move) for <= 8 rows, 32 (50,176 B) above, one stage (H=8, sm_89 path on the
    H200: 47 vs 51 µs at B=64 with the two-stage 131 KB tile).

    wgmma targets (sm_90, sm_100; budget 232,448 B), H > 16: 64-head blocks, 64-token tiles once ``rows x head
    blocks >= 8`` (bf16 partials from 16; 32-token tiles on sm_100, where 64 spill; on sm_90 the Gluon tile,
    :data:`GLUON_SM90_MIN_BUSY`), else 16-token tiles in 256-column halves (128 KB / 98 KB of shared memory). On sm_90
    the mma.sync targets' tiles below instead where ``rows x 64-head blocks`` is in :data:`SM90_MMA_BUSY` and the Gluon
    tile would not warp-specialize (:func:`_sm90_mma_tile`).

    mma.sync targets (sm_80, 86, 89, 120; budget 101,376 B, sm_80 166,912 B): both dot operands are staged in shared
    memory, ``(block_h + 2 * block_n) x 1 KB`` (the tile once per dot) where the tile keeps its uint8 operand layout,
    ``(block_h + block_n) x 1 KB`` + P through its opaque move (:func:`opaque_tile_default`, :func:`shared_bytes`), so
    a 64-head x 64-token tile needs 196,608 / 139,264 B. Within the budget,
    H > 16: 32-head blocks, 16-token tiles (49 KB) while ``rows x head blocks <= 2``, 32-token tiles (66 KB) above;
    64-token tiles as two half tiles (``sub_tiles=2``: P staged half at a time, 100,352 B) from
    :data:`MMA_WIDE_TILE_BUSY` programs per resident 32-token program where an SM holds as many of them (sm_86/89/120:
    one each; not an A100); else 16-token tiles again from :data:`MMA_SMALL_TILE_BUSY` programs where an SM holds only
    one 32-token program (an A100 holds two). One pipeline stage: a second one doubles the
    gathered tile's staging buffers and does not fit. Measured in the sm_89 code path on the H200, at its own and at
    sm_89's blocks per SM (``benchmarks/prod_cubins.py``'s occupancy emulation; docs/performance.md).

    Interpreter: small tiles (its dots run in fp32 on the CPU)."""
    if info is dev.INTERPRETER:
        return DecodeConfig(block_h=max(16, min(64, triton.next_power_of_2(num_heads))), block_n=16, num_warps=4,
                            num_stages=1)  # fmt: skip
    if num_heads <= 16:  # 16-row blocks are mma.sync on every target (wgmma needs 64 rows)
        return DecodeConfig(16, 16 if rows <= 8 else 32, 4, 1, partial_bf16=True, int_dequant=True)
    if not info.has_wgmma or _sm90_mma_tile(info, num_heads, rows, topks):
        busy = rows * triton.cdiv(num_heads, 32)
        small = DecodeConfig(32, 16, 4, 1, partial_bf16=True, int_dequant=True)
        big = replace(small, block_n=32)
        wide = replace(small, block_n=64, sub_tiles=2, sub_joint_reduce=True)
        if busy <= 2:
            return small
        per_sm = resident_programs(big, info)
        if resident_programs(wide, info) >= per_sm and busy >= MMA_WIDE_TILE_BUSY * per_sm:
            return wide
        if busy >= MMA_SMALL_TILE_BUSY and per_sm < 2:
            return small
        return big
    busy = rows * triton.cdiv(num_heads, 64)
    if busy >= GLUON_SM90_MIN_BUSY and info.capability == (9, 0) and gluon_sm90.available():
        return _gluon_tile(busy)
    if busy >= 8:
        # sm_100 (tcgen05): the 64-token tile spilled 304 B per thread there (ahead of time), 32 tokens 160 B
        block_n = 32 if info.capability[0] == 10 else 64
        return DecodeConfig(
            block_h=64, block_n=block_n, num_warps=8, num_stages=1, partial_bf16=busy >= 16, int_dequant=True
        )
    return DecodeConfig(
        block_h=64, block_n=16, num_warps=4, num_stages=2, dv_split=2, partial_bf16=True, int_dequant=True
    )


def shared_bytes(cfg: DecodeConfig, info: dev.DeviceInfo) -> int:
    """Shared memory of the main kernel with ``cfg`` on ``info`` (it sizes how many programs an SM holds, hence the
    split count; the ahead-of-time compile reports the exact figure, tests/test_aot.py holds the two together): the
    bf16 tiles the dots read, q [block_h, 512] and the gathered rows [block_n, 512]. Through the opaque move
    (:func:`opaque_tile_default`) the rows are stored once, plus P [block_h, block_n] bf16: exact (16 x 32: 50,176 B,
    32 x 32: 67,584 B). Otherwise an estimate: the rows twice where both dots stage them (mma.sync, unless a program
    owns one half of V), plus ~1.5 KB per token and extra pipeline stage for the raw rows in flight."""
    if cfg.gluon:  # q, the tile (two: warp-specialized; None: the larger, either may launch) and P, bf16, scratch
        return gluon_sm90.SHARED_BYTES if cfg.warp_specialize is False else gluon_ws_sm90.SHARED_BYTES
    wgmma = wgmma_tile(cfg, info)
    opaque = opaque_tile(cfg, info)
    if opaque and not wgmma:  # P staged per sub-tile (one at a time)
        return (cfg.block_h + cfg.block_n) * V4_DIM * 2 + cfg.block_h * (cfg.block_n // cfg.sub_tiles) * 2
    tiles = cfg.block_h + (1 if wgmma or cfg.dv_split == 2 else 2) * cfg.block_n
    return tiles * V4_DIM * 2 + (cfg.num_stages - 1) * cfg.block_n * 1536


# Registers a thread of the opaque mma.sync decode tiles takes, ahead of time (docs/portability.md; tests/test_aot.py
# holds the two together): 16 x 16 tiles 128 (sm_86/89/90; also the sm_89 path's cubins for the H200), 159-162 on sm_80
# (162 lifted, DecodeConfig.q_lift), 130 on sm_100 and 148-149 on sm_120; 4-warp tiles of >= 512 scores 168-238 and
# 8-warp tiles 126-163 everywhere (counted as 255 and 128: two per SM on every target).
SMALL_TILE_REGS = {(8, 0): 162, (10, 0): 130, (12, 0): 149}


def resident_programs(cfg: DecodeConfig, info: dev.DeviceInfo) -> int:
    """Programs of ``cfg`` one SM of ``info`` holds at once (the split count fills ``SMs x this``). Opaque mma.sync
    tiles: by their exact shared memory (:func:`sparsemla.kernels.device.resident_blocks`) and registers
    (:data:`SMALL_TILE_REGS`; 64K per SM on every target), so an sm_86/89/120 SM holds two 16 x 32 programs, an
    H200 two (registers), an A100 three 16 x 16 ones. Other tiles: ``smem_per_sm`` over :func:`shared_bytes`'
    estimate, the split counts they were measured with."""
    shared = shared_bytes(cfg, info)
    opaque = opaque_tile(cfg, info)
    if not opaque or wgmma_tile(cfg, info):
        return max(1, info.smem_per_sm // shared)
    threads = cfg.num_warps * 32
    if cfg.num_warps == 4 and cfg.block_h * cfg.block_n >= 512:
        regs = 255
    else:
        regs = SMALL_TILE_REGS.get(info.capability, 128) if cfg.num_warps == 4 else 128
    return max(1, min(dev.resident_blocks(info, shared, threads), 65_536 // (threads * regs)))


def launch_splits(
    cfg: DecodeConfig, info: dev.DeviceInfo, rows: int, heads: int, topks: tuple[int, ...], override: int | str = "auto"
) -> tuple[int, int]:
    """``(max_tiles, splits)`` of a launch of ``cfg`` on ``info``: the tiles of a row's index lists (widths ``topks``)
    and the split count that spreads them (:func:`choose_num_splits` over the SMs x :func:`resident_programs`)."""
    max_tiles = sum(triton.cdiv(t, cfg.block_n) for t in topks)
    slots = info.num_sms * resident_programs(cfg, info)
    head_blocks = triton.cdiv(heads, cfg.block_h) * cfg.dv_split
    return max_tiles, choose_num_splits(rows, head_blocks, max_tiles, slots, override)


def choose_num_splits(rows: int, head_blocks: int, max_tiles: int, slots: int, override: int | str = "auto") -> int:
    """Split count from shapes only (CUDA-graph safe): about one wave of programs (``slots`` = SMs x programs
    resident per SM), never more splits than tiles."""
    if max_tiles <= 0:
        return 1
    if override != "auto":
        return max(1, min(int(override), max_tiles))
    base = max(1, rows * head_blocks)
    want = max(1, min(max_tiles, slots // base))
    per = -(-max_tiles // want)  # tiles per split; then drop the splits that would get no tile
    return -(-max_tiles // per)


# --------------------------------------------------------------------------------------------------------------------
# kernels
# --------------------------------------------------------------------------------------------------------------------
@triton.jit
def _sink_scale(scale, lse2, sink, o_h, m_h, valid):
    """``scale`` times exp(lse - logaddexp(lse, sink)) per head (lse2 base 2): sink +inf -> 0, -inf -> unchanged; heads
    with nothing ``valid`` get 0 (no inf - inf)."""
    b_sink = tl.load(sink + o_h, mask=m_h, other=float("-inf")) * 1.4426950408889634
    return tl.where(valid, scale / (1.0 + tl.math.exp2(b_sink - lse2)), 0.0)


@triton.jit
def _rescaled(acc, alpha, LAZY_RESCALE: tl.constexpr):
    """``acc`` as the next dot's accumulator: times ``alpha`` per head, or as is when the rescale is lazy (done, when
    needed, before the dots: :func:`_lazy_softmax`)."""
    if LAZY_RESCALE:
        return acc
    return acc * alpha[:, None]


@triton.jit
def _lazy_softmax(b_s, m_new, m_i, l_i):
    """One tile of the online softmax with a lazy reference maximum (``DecodeConfig.lazy_rescale``): ``m_i`` moves to
    the heads' running maximum ``m_new`` only when some head's maximum passed it by more than RESCALE_SLACK, or a head
    saw its first valid entry (-inf + slack < finite); otherwise P is taken against the old reference (<= 2 **
    RESCALE_SLACK). Returns (P [BLOCK_H, BLOCK_N], reference, l, the accumulators' factor, whether they need it);
    the caller rescales its accumulators when it is told to."""
    moved = tl.max((m_new > m_i + RESCALE_SLACK).to(tl.int32), 0) > 0
    grow = tl.math.exp2(m_i - tl.where(m_new == float("-inf"), 0.0, m_new))
    m_ref = tl.where(moved, m_new, m_i)
    l_i = tl.where(moved, l_i * grow, l_i)
    b_p = tl.math.exp2(b_s - tl.where(m_ref == float("-inf"), 0.0, m_ref)[:, None])
    return b_p, m_ref, l_i + tl.sum(b_p, 1), grow, moved


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
def _tok3(x, CHUNKS_FIRST: tl.constexpr):
    """[BLOCK_N] per-token values as the token axis of the 3D tile (axis 1 when chunks come first, else axis 0)."""
    if CHUNKS_FIRST:
        return x[None, :, None]
    else:
        return x[:, None, None]


@triton.jit
def _chunk3(x, CHUNKS_FIRST: tl.constexpr):
    """[NC] per-chunk values as the chunk axis of the 3D tile."""
    if CHUNKS_FIRST:
        return x[:, None, None]
    else:
        return x[None, :, None]


@triton.jit
def _grid2(tok, chunk, CHUNKS_FIRST: tl.constexpr):
    """(tok, chunk) expanded to the tile's 2D (token, chunk) plane in its axis order."""
    if CHUNKS_FIRST:
        return tok[None, :], chunk[:, None]
    else:
        return tok[:, None], chunk[None, :]


@triton.jit
def _load_kv_tile(
    p_cache, o_tok, o_rope, o_scale, m_n,
    BLOCK_N: tl.constexpr, C0: tl.constexpr, NC: tl.constexpr, ALIGNED: tl.constexpr, DOT_F32: tl.constexpr,
    INT_DEQUANT: tl.constexpr = False, CHUNKS_FIRST: tl.constexpr = False, LIFT: tl.constexpr = False,
):  # fmt: skip
    """Chunks ``C0 .. C0+NC-1`` of the tile's token rows dequantized to [BLOCK_N, NC*64]: chunks 0..6 = fp8 NoPE *
    2^(ue8m0 - 127) (exact in bf16), chunk 7 = bf16 RoPE. Built as a 3D [BLOCK_N, NC, 64] tile (``CHUNKS_FIRST``:
    [NC, BLOCK_N, 64], permuted at the end) so the per-64 scale is a 2D (token, chunk) tensor, then flattened. (C0, NC)
    = (0, 8) is the whole 512-wide row; (0, 4) / (4, 4) its halves. LIFT (with INT_DEQUANT): the NoPE chunks come out
    times 2^-LIFT_LOG2 (:data:`~sparsemla.kernels.dequant.LIFT_LOG2`), one multiply per value instead of two.

    Why the axis order is a knob: Triton lays the 3D load's 8 x 4 lanes of a warp over (64 columns, one of the other
    two axes), and the two compilers break that tie oppositely -- 3.6 takes the first axis, 3.8 the middle one. The
    lanes must go over tokens: over chunks, every thread holds eight tokens (eight row addresses, scale words and
    masks) and the RoPE chunk's mask depends on the lane, so its load is issued for every chunk. Triton 3.8 with the
    chunks on the middle axis: 24 instead of 9 128-bit loads and 1,819 instead of 1,376 instructions per tile loop,
    88 B spilled (sm_90, B = 64, H = 64; sm_80/89/120: loops 17-25 % longer, more registers), and the wgmma kernel
    ran 69 instead of 47 us at B = 64 on the H200 (results/bench/explore/decode_t38_configs-*). The launcher picks
    the order for the compiling Triton (:func:`tile_chunks_first`).

    ALIGNED: the 8 scale bytes of a token are read as ONE 8-byte word (a [BLOCK_N] int64 load, which Triton can
    software-pipeline with cp.async like the row itself) and split with shifts; else byte loads."""
    o_c = C0 + tl.arange(0, NC)
    o_d = tl.arange(0, 64)
    o_k = _tok3(o_tok, CHUNKS_FIRST) + _chunk3(o_c * 64, CHUNKS_FIRST) + o_d[None, None, :]
    if C0 + NC == 8:
        m_nope = _tok3(m_n, CHUNKS_FIRST) & _chunk3(o_c < 7, CHUNKS_FIRST)
    else:
        m_nope = _tok3(m_n, CHUNKS_FIRST) & _chunk3(o_c >= 0, CHUNKS_FIRST)
    if INT_DEQUANT:  # raw bytes: no fp8 type at all, so sm_80/86 (which have none) compile this path
        b_k8 = tl.load(p_cache + o_k, mask=m_nope, other=0)  # [BLOCK_N, NC, 64] uint8 (e4m3 bits)
    else:
        p_k8 = p_cache.to(tl.pointer_type(tl.float8e4nv), bitcast=True)
        b_k8 = tl.load(p_k8 + o_k, mask=m_nope, other=0.0)  # [BLOCK_N, NC, 64] fp8
    if ALIGNED:
        p_w = p_cache.to(tl.pointer_type(tl.int64), bitcast=True)
        b_w = tl.load(p_w + tl.multiple_of(o_scale, 8) // 8, mask=m_n, other=0)  # [BLOCK_N] 8 scale bytes, LE
        w2, sh2 = _grid2(b_w, (o_c * 8).to(tl.int64), CHUNKS_FIRST)
        b_e = ((w2 >> sh2) & 255).to(tl.float32)  # [BLOCK_N, NC]
        n2, c2 = _grid2(m_n, o_c < 7, CHUNKS_FIRST)
        b_e = tl.where(c2 & n2, b_e, 127.0)
    else:
        n2, c2 = _grid2(m_n, o_c < 7, CHUNKS_FIRST)
        s2, oc2 = _grid2(o_scale, o_c, CHUNKS_FIRST)
        b_e = tl.load(p_cache + s2 + oc2, mask=n2 & c2, other=127).to(tl.float32)  # [BLOCK_N, NC]
    tl.static_assert(not (DOT_F32 and INT_DEQUANT), "the interpreter runs fp32 dots from fp8 loads, not inline PTX")
    tl.static_assert(INT_DEQUANT or not LIFT, "LIFT folds the integer path's 2^-120")
    if LIFT:  # [BLOCK_N, NC] 2^(ue8m0 - 127 + 120 - LIFT_LOG2): exact in bf16 for ue8m0 <= 134 + LIFT_LOG2
        b_sc = tl.math.exp2(b_e - (7.0 + LIFT_LOG2))
    else:
        b_sc = tl.math.exp2(b_e - 127.0)  # [BLOCK_N, NC] 2^(ue8m0 - 127)
    if DOT_F32:
        b_k = b_k8.to(tl.float32) * b_sc[:, :, None]
    elif LIFT:
        b_k = e4m3_bits_to_bf16(b_k8) * b_sc.to(tl.bfloat16)[:, :, None]  # (e4m3 * 2^-120) * 2^(120 + ...): exact
    elif INT_DEQUANT:
        b_kb = e4m3_bits_to_bf16(b_k8)  # [BLOCK_N, NC, 64] = e4m3 * 2^-120
        two_120 = tl.full([1, 1, 1], TWO_POW_120, tl.bfloat16)  # exact in bf16
        b_k = (b_kb * two_120) * b_sc.to(tl.bfloat16)[:, :, None]  # the e4m3 value, then times its scale
    else:
        b_k = b_k8.to(tl.bfloat16) * b_sc.to(tl.bfloat16)[:, :, None]
    if C0 + NC == 8:  # the RoPE chunk is in this range: bf16 at bytes 448..575 of the data row
        p_rope = (p_cache + ROPE_OFFSET).to(tl.pointer_type(tl.bfloat16), bitcast=True)
        o_r = _tok3(o_rope, CHUNKS_FIRST) + _chunk3(o_c * 0, CHUNKS_FIRST) + o_d[None, None, :]
        m_rope = _tok3(m_n, CHUNKS_FIRST) & _chunk3(o_c == 7, CHUNKS_FIRST)
        b_r = tl.load(p_rope + o_r, mask=m_rope, other=0.0)  # [BLOCK_N, NC, 64] (chunk 7)
        if DOT_F32:
            b_k = b_k + b_r.to(tl.float32)
        else:
            b_k = b_k + b_r
    if CHUNKS_FIRST:
        b_k = tl.permute(b_k, (1, 0, 2))  # [NC, BLOCK_N, 64] -> [BLOCK_N, NC, 64]
    return tl.reshape(b_k, [BLOCK_N, NC * 64])


@triton.jit
def _lift_cols(o_d):
    """[N] fp32 column factors of the lift (:data:`~sparsemla.kernels.dequant.LIFT_LOG2`): 2^LIFT_LOG2 on the NoPE
    columns (< 448), 1 on the RoPE ones."""
    return tl.where(o_d < ROPE_OFFSET, TWO_POW_LIFT, 1.0)


@triton.jit
def _load_tile_idx(p_idx, p_idx_x, n_main, n_x, t_main, i_t, o_n, BLOCK_N: tl.constexpr):
    """Slot ids [BLOCK_N] of tile ``i_t`` of the concatenated list (main tiles first); -1 past the valid length."""
    in_main = i_t < t_main
    p_row = tl.where(in_main, p_idx + i_t * BLOCK_N, p_idx_x + (i_t - t_main) * BLOCK_N)
    n_len = tl.where(in_main, n_main - i_t * BLOCK_N, n_x - (i_t - t_main) * BLOCK_N)
    return tl.load(p_row + o_n, mask=o_n < n_len, other=-1)


@triton.jit
def _token_offsets(b_idx, in_main, page_size, page_stride, page_size_x, page_stride_x, PAGE_SHIFT: tl.constexpr,
                   PAGE_SHIFT_X: tl.constexpr):  # fmt: skip
    """Where the tokens of slot ids ``b_idx`` [BLOCK_N] live in the main cache (``in_main``, a scalar) or the extra
    one: (valid [BLOCK_N], data-row byte offsets, the same rows in bf16 units, scale-row byte offsets) -- int64; an
    invalid id (-1) gets slot 0's offsets."""
    m_n = b_idx >= 0
    b_slot = tl.where(m_n, b_idx, 0)
    b_page, b_off = page_split_either(b_slot, in_main, page_size, page_size_x, PAGE_SHIFT, PAGE_SHIFT_X)
    b_page = b_page.to(tl.int64)
    b_off = b_off.to(tl.int64)
    psz = tl.where(in_main, page_size, page_size_x)
    pst = tl.where(in_main, page_stride, page_stride_x)
    o_tok = b_page * pst + b_off * DATA_ROW  # byte offset of the token's 576-byte data row
    o_rope = b_page * (pst // 2) + b_off * DATA_ROW_BF16  # the same row in bf16 units (page strides are even)
    o_scale = b_page * pst + psz * DATA_ROW + b_off * SCALE_ROW  # its 8 scale bytes
    return m_n, o_tok, o_rope, o_scale


@triton.jit
def _prefetch_v4_rows(cache, cache_x, b_idx, in_main, page_size, page_stride, page_size_x, page_stride_x,
                      STRIDE: tl.constexpr, PAGE_SHIFT: tl.constexpr, PAGE_SHIFT_X: tl.constexpr):  # fmt: skip
    """L2 prefetch of the 576-byte data rows and 8-byte scale rows of slot ids ``b_idx`` [BLOCK_N] (-1 skipped) in
    the main cache (``in_main``, a scalar) or the extra one."""
    m_n, o_tok, _, o_scale = _token_offsets(b_idx, in_main, page_size, page_stride, page_size_x, page_stride_x,
                                            PAGE_SHIFT, PAGE_SHIFT_X)  # fmt: skip
    p_cache = tl.where(in_main, cache, cache_x)
    prefetch_rows_l2(p_cache, o_tok, m_n, DATA_ROW, STRIDE)
    prefetch_l2(p_cache + o_scale, m_n)


@triton.jit
def grid_row_and_program(HEADS_FASTEST: tl.constexpr):
    """(row, program within the row) of this program in :func:`decode_grid`'s layout: the first two grid axes, or
    swapped with HEADS_FASTEST (both stay hardware program ids)."""
    if HEADS_FASTEST:
        i_r = tl.program_id(1)
        i_p = tl.program_id(0)
    else:
        i_r = tl.program_id(0)
        i_p = tl.program_id(1)
    return i_r, i_p


@triton.jit
def _sub_tiles_step(
    acc, m_i, l_i, b_q, b_idx, p_cache, in_main, page_size, page_stride, page_size_x, page_stride_x, qk_scale,
    BLOCK_N: tl.constexpr, ALIGNED: tl.constexpr, DOT_F32: tl.constexpr, DOT_PREC: tl.constexpr,
    INT_DEQUANT: tl.constexpr, CHUNKS_FIRST: tl.constexpr, Q_LIFT: tl.constexpr, OPAQUE_TILE: tl.constexpr,
    PAGE_SHIFT: tl.constexpr, PAGE_SHIFT_X: tl.constexpr, JOINT_REDUCE: tl.constexpr,
):  # fmt: skip
    """One tile of ``BLOCK_N`` tokens as two half tiles (even and odd tokens: the order inside a tile does not matter)
    with one online-softmax step: each half's rows are gathered, scored and multiplied by their own P half, so the
    P staging buffer is half as big. JOINT_REDUCE: the row maximum and sum of both halves in one cross-lane
    reduction each (``DecodeConfig.sub_joint_reduce``)."""
    HALF: tl.constexpr = BLOCK_N // 2
    b_ia, b_ib = tl.split(tl.reshape(b_idx, [HALF, 2]))  # [HALF] even / odd tokens of the tile
    m_a, tok_a, rope_a, sc_a = _token_offsets(b_ia, in_main, page_size, page_stride, page_size_x, page_stride_x,
                                              PAGE_SHIFT, PAGE_SHIFT_X)  # fmt: skip
    m_b, tok_b, rope_b, sc_b = _token_offsets(b_ib, in_main, page_size, page_stride, page_size_x, page_stride_x,
                                              PAGE_SHIFT, PAGE_SHIFT_X)  # fmt: skip
    if ALIGNED:
        tok_a = tl.multiple_of(tok_a, 16)
        tok_b = tl.multiple_of(tok_b, 16)
        rope_a = tl.multiple_of(rope_a, 8)
        rope_b = tl.multiple_of(rope_b, 8)
    b_ka = _load_kv_tile(p_cache, tok_a, rope_a, sc_a, m_a, HALF, 0, 8, ALIGNED, DOT_F32, INT_DEQUANT, CHUNKS_FIRST,
                         Q_LIFT)  # fmt: skip
    b_kb = _load_kv_tile(p_cache, tok_b, rope_b, sc_b, m_b, HALF, 0, 8, ALIGNED, DOT_F32, INT_DEQUANT, CHUNKS_FIRST,
                         Q_LIFT)  # fmt: skip
    if OPAQUE_TILE:
        b_ka = opaque_bf16(b_ka)
        b_kb = opaque_bf16(b_kb)
    b_sa = tl.dot(b_q, tl.trans(b_ka), input_precision=DOT_PREC)  # [BLOCK_H, HALF]
    b_sb = tl.dot(b_q, tl.trans(b_kb), input_precision=DOT_PREC)  # [BLOCK_H, HALF]
    b_sa = tl.where(m_a[None, :], b_sa * qk_scale, float("-inf"))
    b_sb = tl.where(m_b[None, :], b_sb * qk_scale, float("-inf"))
    if JOINT_REDUCE:  # one cross-lane reduction over both halves (elementwise first)
        m_new = tl.maximum(m_i, tl.max(tl.maximum(b_sa, b_sb), 1))
    else:
        m_new = tl.maximum(m_i, tl.maximum(tl.max(b_sa, 1), tl.max(b_sb, 1)))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    alpha = tl.math.exp2(m_i - m_use)
    # each P half is made right before its dot, so its staging buffer is free again when the other one is made
    b_pa = tl.math.exp2(b_sa - m_use[:, None])
    if not JOINT_REDUCE:
        l_i = l_i * alpha + tl.sum(b_pa, 1)
    acc = tl.dot(b_pa.to(b_ka.dtype), b_ka, acc * alpha[:, None], input_precision=DOT_PREC)  # [BLOCK_H, 512]
    b_pb = tl.math.exp2(b_sb - m_use[:, None])
    if JOINT_REDUCE:
        l_i = l_i * alpha + tl.sum(b_pa + b_pb, 1)
    else:
        l_i += tl.sum(b_pb, 1)
    acc = tl.dot(b_pb.to(b_kb.dtype), b_kb, acc, input_precision=DOT_PREC)
    return acc, m_new, l_i


@triton.jit
def _sparse_decode_kernel(
    q, cache, idx, length, cache_x, idx_x, length_x, sink,
    out, lse, o_part, lse_part,
    S, H, H_OUT, TOPK, TOPK_X, page_size, page_stride, page_size_x, page_stride_x, num_splits, qk_scale,
    stride_qb, stride_qs, stride_qh, stride_qd,
    stride_ib, stride_is, stride_xb, stride_xs,
    DV: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, DV_SPLIT: tl.constexpr, INT_DEQUANT: tl.constexpr,
    HAS_LEN: tl.constexpr, HAS_EXTRA: tl.constexpr, HAS_LEN_X: tl.constexpr, HAS_SINK: tl.constexpr,
    SINGLE: tl.constexpr, ALIGNED: tl.constexpr, DOT_F32: tl.constexpr, DOT_PREC: tl.constexpr,
    CHUNKS_FIRST: tl.constexpr, OPAQUE_TILE: tl.constexpr = False, LAZY_RESCALE: tl.constexpr = False,
    Q_LIFT: tl.constexpr = False, PREFETCH: tl.constexpr = 0, PF_STRIDE: tl.constexpr = 128,
    PAGE_SHIFT: tl.constexpr = -1, PAGE_SHIFT_X: tl.constexpr = -1, SUB_TILES: tl.constexpr = 1,
    SUB_JOINT_REDUCE: tl.constexpr = False, HEADS_FASTEST: tl.constexpr = False,
):  # fmt: skip
    """Same contract as ``_sparse_decode_kernel``, with the 512-wide row as ONE tile: q [BLOCK_H, 512], K/V
    [BLOCK_N, 512], acc [BLOCK_H, 512 / DV_SPLIT]. Two dots per tile (K=512 deep QK, N=512 wide PV) instead of 16
    chunk dots, so the tensor cores get long wgmma chains and the accumulator is one tensor.

    Grid (B * S, cdiv(H, BLOCK_H) * DV_SPLIT, num_splits), or HEADS_FASTEST: the first two axes swapped, so a row's
    head blocks are adjacent programs (they gather the same tokens; :func:`decode_grid`). DV_SPLIT = 2: the program owns
    one 256-column half of the output (V = that half of the gathered row) and computes the full QK itself, so its
    accumulator is half as big (one warpgroup holds it) and the two halves need no merge; both compute the same
    scores and LSE.

    PAGE_SHIFT / PAGE_SHIFT_X: log2 of the caches' page sizes, -1 when not a power of two (:mod:`~sparsemla.kernels.
    paging`). PREFETCH > 0: iteration i_t prefetches the rows of tile i_t + PREFETCH into L2 (ids loaded one
    iteration before; this split's tiles only)."""
    i_r, i_hd = grid_row_and_program(HEADS_FASTEST)
    i_hb = i_hd // DV_SPLIT
    i_dv = i_hd % DV_SPLIT
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
        if Q_LIFT:  # NoPE columns times 2^LIFT_LOG2 (exact), against the tile's NoPE times 2^-LIFT_LOG2
            b_q = b_q * _lift_cols(o_d).to(tl.bfloat16)[None, :]
    else:
        o_d = tl.arange(0, 256)
        b_qa = tl.load(p_q + o_d[None, :] * stride_qd, mask=m_h[:, None], other=0.0)  # [BLOCK_H, 256] cols 0..255
        b_qb = tl.load(p_q + (256 + o_d)[None, :] * stride_qd, mask=m_h[:, None], other=0.0)  # cols 256..511
        if DOT_F32:
            b_qa = b_qa.to(tl.float32)
            b_qb = b_qb.to(tl.float32)
        if Q_LIFT:
            b_qa = b_qa * _lift_cols(o_d).to(tl.bfloat16)[None, :]
            b_qb = b_qb * _lift_cols(256 + o_d).to(tl.bfloat16)[None, :]

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
    if PREFETCH > 0:  # L2 prefetch: the slot ids of tile t_lo + PREFETCH (this split's tiles only), one tile ahead
        b_idx_pf = _load_tile_idx(p_idx, p_idx_x, n_main, n_x, t_main, t_lo + PREFETCH, o_n, BLOCK_N)
        b_idx_pf = tl.where(t_lo + PREFETCH < t_hi, b_idx_pf, -1)
    for i_t in range(t_lo, t_hi):
        in_main = i_t < t_main
        p_cache = tl.where(in_main, cache, cache_x)
        b_idx = b_idx_next  # [BLOCK_N] slot ids of tile i_t
        b_idx_next = _load_tile_idx(p_idx, p_idx_x, n_main, n_x, t_main, i_t + 1, o_n, BLOCK_N)
        if PREFETCH > 0:
            _prefetch_v4_rows(cache, cache_x, b_idx_pf, i_t + PREFETCH < t_main, page_size, page_stride, page_size_x,
                              page_stride_x, PF_STRIDE, PAGE_SHIFT, PAGE_SHIFT_X)  # fmt: skip
            b_idx_pf = _load_tile_idx(p_idx, p_idx_x, n_main, n_x, t_main, i_t + 1 + PREFETCH, o_n, BLOCK_N)
            b_idx_pf = tl.where(i_t + 1 + PREFETCH < t_hi, b_idx_pf, -1)
        m_n, o_tok, o_rope, o_scale = _token_offsets(b_idx, in_main, page_size, page_stride, page_size_x,
                                                     page_stride_x, PAGE_SHIFT, PAGE_SHIFT_X)  # fmt: skip
        if ALIGNED:
            o_tok = tl.multiple_of(o_tok, 16)
            o_rope = tl.multiple_of(o_rope, 8)
        if SUB_TILES == 2:
            acc, m_i, l_i = _sub_tiles_step(
                acc, m_i, l_i, b_q, b_idx, p_cache, in_main, page_size, page_stride, page_size_x, page_stride_x,
                qk_scale, BLOCK_N, ALIGNED, DOT_F32, DOT_PREC, INT_DEQUANT, CHUNKS_FIRST, Q_LIFT, OPAQUE_TILE,
                PAGE_SHIFT, PAGE_SHIFT_X, SUB_JOINT_REDUCE,
            )  # fmt: skip
        else:
            if DV_SPLIT == 1:
                b_k = _load_kv_tile(p_cache, o_tok, o_rope, o_scale, m_n, BLOCK_N, 0, 8, ALIGNED, DOT_F32, INT_DEQUANT,
                                     CHUNKS_FIRST, Q_LIFT)  # fmt: skip
                if OPAQUE_TILE:
                    b_k = opaque_bf16(b_k)
                b_s = tl.dot(b_q, tl.trans(b_k), input_precision=DOT_PREC)  # [BLOCK_H, BLOCK_N]
            else:
                b_ka = _load_kv_tile(p_cache, o_tok, o_rope, o_scale, m_n, BLOCK_N, 0, 4, ALIGNED, DOT_F32, INT_DEQUANT,
                                     CHUNKS_FIRST, Q_LIFT)  # fmt: skip
                b_kb = _load_kv_tile(p_cache, o_tok, o_rope, o_scale, m_n, BLOCK_N, 4, 4, ALIGNED, DOT_F32, INT_DEQUANT,
                                     CHUNKS_FIRST, Q_LIFT)  # fmt: skip
                if OPAQUE_TILE:
                    b_ka = opaque_bf16(b_ka)
                    b_kb = opaque_bf16(b_kb)
                b_s = tl.dot(b_qa, tl.trans(b_ka), input_precision=DOT_PREC)  # [BLOCK_H, BLOCK_N]
                b_s = tl.dot(b_qb, tl.trans(b_kb), b_s, input_precision=DOT_PREC)
                b_k = tl.where(i_dv == 0, b_ka, b_kb)  # V = this program's half of the row: [BLOCK_N, 256]
            b_s = tl.where(m_n[None, :], b_s * qk_scale, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(b_s, 1))
            if LAZY_RESCALE:
                b_p, m_i, l_i, alpha, moved = _lazy_softmax(b_s, m_new, m_i, l_i)
                if moved:
                    acc = acc * alpha[:, None]
            else:
                m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with nothing valid yet stay at zero weight
                alpha = tl.math.exp2(m_i - m_use)
                b_p = tl.math.exp2(b_s - m_use[:, None])
                l_i = l_i * alpha + tl.sum(b_p, 1)
                m_i = m_new
            if DOT_F32:
                b_pd = b_p
            else:
                b_pd = b_p.to(tl.bfloat16)
            acc = tl.dot(b_pd, b_k, _rescaled(acc, alpha, LAZY_RESCALE), input_precision=DOT_PREC)  # [H, DV]

    lse2 = tl.where(l_i > 0.0, m_i + tl.math.log2(l_i), float("-inf"))
    inv_l = tl.where(l_i > 0.0, 1.0 / l_i, 0.0)
    o_v = i_dv * BLOCK_DV + tl.arange(0, BLOCK_DV)  # this program's output columns
    m_lse = m_h & (i_dv == 0)  # every half computes the same LSE; the first one writes it
    if SINGLE:
        if HAS_SINK:
            inv_l = _sink_scale(inv_l, lse2, sink, o_h, m_h, l_i > 0.0)
        p_o = out + i_r.to(tl.int64) * H_OUT * DV + o_h.to(tl.int64)[:, None] * DV + o_v[None, :]
        tl.store(lse + i_r.to(tl.int64) * H_OUT + o_h, lse2 * 0.6931471805599453, mask=m_lse)
    else:
        p_o = o_part + (i_r.to(tl.int64) * num_splits + i_sp) * H * 512 + o_h.to(tl.int64)[:, None] * 512 + o_v[None, :]
        tl.store(lse_part + (i_r.to(tl.int64) * num_splits + i_sp) * H + o_h, lse2, mask=m_lse)
    b_o = acc * inv_l[:, None]
    if Q_LIFT:
        b_o = b_o * _lift_cols(o_v)[None, :]  # PV over NoPE * 2^-LIFT_LOG2: back to scale (exact)
    tl.store(p_o, b_o.to(p_o.dtype.element_ty), mask=m_h[:, None] & (o_v < DV)[None, :])


@triton.jit
def _sparse_decode_combine_kernel(
    o_part, lse_part, sink, out, lse, H, H_OUT, num_splits,
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
    p_out = out + i_r.to(tl.int64) * H_OUT * DV + o_h[:, None].to(tl.int64) * DV + o_d[None, :]
    tl.store(p_out, (b_acc * b_scale[:, None]).to(out.dtype.element_ty), mask=m_h[:, None] & m_d[None, :])
    if i_db == 0:
        tl.store(lse + i_r.to(tl.int64) * H_OUT + o_h, lse2 * 0.6931471805599453, mask=m_h)


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
        shape = f"[num_pages, page_size, 1, {V4_BYTES_PER_TOKEN}]"
        raise ValueError(f"{name} must be a 1-byte V4 view {shape}, got {list(k_cache.shape)}")
    page_size, page_stride = k_cache.shape[1], k_cache.stride(0)
    if page_stride % 2 or k_cache.data_ptr() % 2:
        raise ValueError(f"{name} pages must start at even byte addresses (bf16 RoPE), got stride {page_stride}")
    if page_stride < page_size * V4_BYTES_PER_TOKEN:
        page = f"{page_size} x {V4_BYTES_PER_TOKEN} bytes"
        raise ValueError(f"{name}.stride(0)={page_stride} is smaller than a page ({page})")
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
    return dev.defined_interpreted(_sparse_decode_kernel)


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
    num_real_heads: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the decode kernel(s): ``(out [B, s_q, H, head_dim_v] bf16, lse [B, H, s_q] fp32)``.

    ``lse`` is a permuted view of a [B, s_q, H] buffer (natural log, sink excluded, -inf for rows with no valid
    entry), the orientation sglang's torch path returns. ``num_splits``: "auto" or a positive int (clamped to the
    number of tiles). Under Triton's CPU interpreter (:func:`sparsemla.kernels.device.interpreting`) the dots run in
    fp32 with small tiles.
    ``num_real_heads``: only the first heads are real (sglang pads q and the sink to 64 heads under tensor
    parallelism and reads back only the real ones): the kernel attends for those, the pad heads' out is 0 and their
    lse -inf, and the configuration is the real head count's.
    """
    interpret = dev.check_interpreting(_is_interpreted())
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
    heads_out = heads
    if num_real_heads is not None:
        if not 0 < num_real_heads <= heads:
            raise ValueError(f"num_real_heads must be in 1..{heads} (q's heads), got {num_real_heads}")
        heads = num_real_heads  # q's first heads; the kernel reads q through its strides, so no copy

    info = dev.launch_info(q.device)
    topk, topk_x = indices.shape[2], idx_x.shape[2] if has_extra else 0
    cfg = config or choose_config(info, heads, batch * s_q, (topk, topk_x))
    rows = batch * s_q
    head_blocks = triton.cdiv(heads, cfg.block_h)
    max_tiles, splits = launch_splits(cfg, info, rows, heads, (topk, topk_x), num_splits)
    aligned = all(t.data_ptr() % 16 == 0 for t in (cache, cache_x)) and page_stride % 16 == 0
    aligned = aligned and page_stride_x % 16 == 0

    # The interpreter truncates fp32 -> bf16 stores (Triton 3.8); there the kernel writes fp32 and torch rounds.
    out_dtype = torch.float32 if interpret else torch.bfloat16
    out = torch.empty(batch, s_q, heads_out, head_dim_v, dtype=out_dtype, device=q.device)
    lse = torch.empty(batch, s_q, heads_out, dtype=torch.float32, device=q.device)
    if heads_out > heads:
        out[:, :, heads:].zero_()
        lse[:, :, heads:].fill_(float("-inf"))
    part_dtype = torch.bfloat16 if cfg.partial_bf16 and not interpret else torch.float32  # fp32 there too, likewise
    if splits > 1:
        o_part = torch.empty(rows, splits, heads, V4_DIM, dtype=part_dtype, device=q.device)
        lse_part = torch.empty(rows, splits, heads, dtype=torch.float32, device=q.device)
    else:
        o_part, lse_part = out, lse  # unused
    dummy = indices  # any tensor for absent optional pointers (never dereferenced: constexpr-guarded)
    grid, heads_fastest = decode_grid(rows, head_blocks * cfg.dv_split, splits, cfg.heads_fastest)
    tiles_per_program = triton.cdiv(max_tiles, splits)
    l2_prefetch = l2_prefetch_default(cfg, tiles_per_program) if cfg.l2_prefetch is None else cfg.l2_prefetch
    if cfg.gluon:
        if interpret or info.capability != (9, 0):
            raise ValueError(f"DecodeConfig.gluon is the sm_90 wgmma tile; this launch is for {info.name}")
        ws = warp_specialize(cfg, tiles_per_program)  # the same bits either way
        fwd = gluon_ws_sm90.sparse_decode_sm90_ws_fwd if ws else gluon_sm90.sparse_decode_sm90_fwd
        fwd(
            q, cache, indices, topk_length, cache_x, idx_x, extra_topk_length, attn_sink, out, lse, o_part, lse_part,
            heads=heads, page=(page_size, page_stride, page_size_x, page_stride_x), splits=splits,
            qk_scale=float(softmax_scale) * LOG2E, has_extra=has_extra, grid=grid, heads_fastest=heads_fastest,
            int_dequant=cfg.int_dequant,
            page_shifts=(page_shift(page_size), page_shift(page_size_x if has_extra else page_size)),
            prefetch=prefetch_ahead(l2_prefetch, cfg.num_stages, interpret), prefetch_stride=cfg.prefetch_stride,
            q_lift=q_lift(cfg, info, tiles_per_program), ids_ahead=cfg.ids_ahead,
        )  # fmt: skip
    else:
        # the interpreter cannot run the integer dequant's inline PTX
        chunks_first = tile_chunks_first() if cfg.chunks_first is None else cfg.chunks_first
        opaque = opaque_tile(cfg, info)
        _sparse_decode_kernel[grid](
            q, cache, indices, topk_length if topk_length is not None else dummy,
            cache_x, idx_x, extra_topk_length if extra_topk_length is not None else dummy,
            attn_sink if attn_sink is not None else dummy,
            out, lse, o_part, lse_part,
            s_q, heads, heads_out, topk, topk_x, page_size, page_stride, page_size_x, page_stride_x, splits,
            float(softmax_scale) * LOG2E,
            q.stride(0), q.stride(1), q.stride(2), q.stride(3),
            indices.stride(0), indices.stride(1), idx_x.stride(0), idx_x.stride(1),
            DV=head_dim_v, BLOCK_H=cfg.block_h, BLOCK_N=cfg.block_n, DV_SPLIT=cfg.dv_split,
            INT_DEQUANT=cfg.int_dequant and not interpret,
            HAS_LEN=topk_length is not None, HAS_EXTRA=has_extra, HAS_LEN_X=extra_topk_length is not None,
            HAS_SINK=attn_sink is not None, SINGLE=splits == 1, ALIGNED=aligned, DOT_F32=interpret,
            DOT_PREC="ieee" if interpret else "tf32", CHUNKS_FIRST=chunks_first,
            OPAQUE_TILE=opaque and not interpret, LAZY_RESCALE=cfg.lazy_rescale,
            Q_LIFT=q_lift(cfg, info, tiles_per_program) and not interpret,
            PREFETCH=prefetch_ahead(l2_prefetch, cfg.num_stages, interpret),
            PF_STRIDE=cfg.prefetch_stride, PAGE_SHIFT=page_shift(page_size),
            PAGE_SHIFT_X=page_shift(page_size_x if has_extra else page_size),  # no extra tiles: the main cache's shift
            SUB_TILES=cfg.sub_tiles, SUB_JOINT_REDUCE=cfg.sub_joint_reduce, HEADS_FASTEST=heads_fastest,
            num_warps=cfg.num_warps, num_stages=cfg.num_stages,
        )  # fmt: skip
    if splits > 1:
        block_s, block_hc, block_d = combine_blocks(splits, heads)
        cgrid = (rows, triton.cdiv(heads, block_hc), triton.cdiv(head_dim_v, block_d))
        _sparse_decode_combine_kernel[cgrid](
            o_part, lse_part, attn_sink if attn_sink is not None else dummy, out, lse, heads, heads_out, splits,
            DV=head_dim_v, BLOCK_S=block_s, BLOCK_H=block_hc, BLOCK_D=block_d, HAS_SINK=attn_sink is not None,
            num_warps=4,
        )  # fmt: skip
    return out.to(torch.bfloat16), lse.permute(0, 2, 1)


# CUDA's limit on a grid's second and third axes
MAX_GRID_YZ = 65535


def decode_grid(
    rows: int, programs_per_row: int, splits: int, heads_fastest: bool
) -> tuple[tuple[int, int, int], bool]:
    """(grid, HEADS_FASTEST) of the main decode kernel: with ``heads_fastest`` and more than one program a row
    (head blocks x V halves), the row's programs on the first axis and the rows on the second, so that they run side
    by side; rows on the first axis where one program covers a row (the same order) or the rows exceed the second
    axis' limit (:data:`MAX_GRID_YZ`)."""
    # two axes rather than one flattened index: the program ids stay hardware registers (the flattened index's
    # division spilled 112 instead of 48 B on sm_89 ahead of time)
    if heads_fastest and programs_per_row > 1 and rows <= MAX_GRID_YZ:
        return (programs_per_row, rows, splits), True
    return (rows, programs_per_row, splits), False


def flops_and_bytes(batch: int, heads: int, topk_total: int) -> tuple[float, float]:
    """(FLOPs, minimum HBM bytes) of one decode call: QK over 512 + PV over 512; KV rows read once (584 B),
    indices, q, out."""
    flops = 2.0 * batch * heads * topk_total * (V4_DIM + V4_DIM)
    nbytes = batch * topk_total * (V4_DATA_BYTES + V4_SCALE_BYTES + 4) + batch * heads * (V4_DIM * 2 * 2 + 4)
    return flops, float(nbytes)


__all__ = [
    "DecodeConfig",
    "choose_config",
    "choose_num_splits",
    "launch_splits",
    "flops_and_bytes",
    "opaque_tile_default",
    "resident_programs",
    "shared_bytes",
    "sparse_decode_fwd",
]
