"""Triton exact top-k of the lightning indexer (DeepSeek-V4): the per-row selection the top-k kernel and the fused
logits + top-k tail of :mod:`sparsemla.kernels.indexer.triton` share, the top-k kernel and its launcher.

Semantics are those of :func:`sparsemla.kernels.indexer.reference.indexer_topk_reference` (this module never imports
it).

Top-k (exact, deterministic): one program per row finds the k-th largest key by radix passes (``tl.histogram``: 5-bit
digits in registers, see :func:`radix_bits`; STREAM_BITS-bit ones when streaming; a compare-count 4-bit variant measured
2-3x slower on the H200) over an order-preserving int32 image of the fp32 logits, compacts the winners (ties at the
threshold go to the smaller positions), then sorts the k winners by (value desc, position asc) with one bitonic sort of
a packed int64. Each row takes one of three paths, chosen on the device from its length: ``length <= k`` needs no
selection; a row that fits a register tile (``TOPK_ROW_TILES`` / ``FUSED_ROW_TILES``: a small and a large tile, so a
short row does not pay for the large one) is loaded once, its keys stay in registers for every radix pass and the
compaction scan, and the search stops after the first pass whose threshold bin holds exactly the keys still needed (at
most seven 5-bit or four 8-bit passes); a longer row streams from memory once per pass (the same early-stopping search:
at most four 8-bit passes, then the compaction). The tile sizes come from shapes only (``k``, the row capacity and, for
the top-k kernel, the row count), so a captured CUDA graph replays for any lengths.

Split rows (top-k kernel): when the SMs outnumber the rows, a row longer than its span (``topk_span``) is shared by up
to ``splits`` programs (a shape-only grid; how many take part is decided on the device from the row's length). Each owns
a contiguous span, adds its span's histogram of a radix pass (2 ** STREAM_BITS bins streaming; 2 ** split_reg_bits()
bins where the span is held in registers, see SPLIT_REG_TILE) into the row's histogram in a workspace (int32 atomics:
exact, order-free), and waits at a per-row arrival counter until every participant has added its own; all participants
then read the same merged histogram and take the same decisions (threshold bin, early stop). After the last pass each
participant publishes its span's winner counts (read off its own histograms), and writes its winners at their
position-order slots (so the set and its order are deterministic). The last participant to arrive sorts (when asked),
writes the page slots, and zeroes the row's workspace for the next launch. A split launch has one solo program per row
besides the participants (the grid's first ``rows`` programs): it selects the rows that get a single participant (by
default those of at most ``SPLIT_SPAN`` positions), which then never share an SM with one another while the rows are
fewer than the SMs. Participants take their (row, part) from a start ticket, so every program a participant waits for
has started before it: no deadlock while the SMs hold at least ``splits`` programs at once. The interpreter runs
programs one after another, so it always uses one program per row (tests/test_topk_split_threads.py runs split launches
there with one thread per program).

Wide launches (:class:`TopkLaunch`, :func:`topk_wide`): with at least ``WIDE_MIN_ROWS`` rows of at most
``WIDE_MAX_COLS`` positions, each program is ``WIDE_WARPS`` warps, a row of up to ``WIDE_SPAN`` positions is held in
one program's register tile, and a longer one is shared by participants that each hold a ``WIDE_SPAN`` span in
registers (the split protocol above, no filter). Fewer rows, longer rows and k = 1024 keep the 8-warp launch.

Two-pass filter (long rows): instead of four radix passes over the whole row, one pass keeps the maximum of each of
``GROUPS`` strided groups (position mod GROUPS); the radix prefix ``t`` of the k-th largest maximum bounds the
threshold from below (k groups have a key >= ``t``), a second pass lists the keys >= ``t`` in position order, and the
k winners are selected among those candidates in one register tile. A row whose candidates overflow the tile (many
keys tied at the threshold) takes the radix passes, so the result is always exact. Split rows run the filter with
their group maxima merged by atomic max and two barriers; where it runs by default is in ``_filter_choice``.

Order: ``sorted=True`` lists the winners by (value desc, position asc); ``sorted=False`` by ascending position (the
same set; sglang's top-k leaves the order unspecified and its consumer is order-invariant), which skips the sort.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sparsemla.kernels import device as dev
from sparsemla.kernels.indexer import topk_smem
from sparsemla.kernels.layouts import IDX_PAGE

TOPK_SIZES = (512, 1024, 2048)
# Register tiles (elements) of the top-k's in-register path, (small, max), per kernel: rows up to max are loaded once
# and selected in registers, longer rows stream. Both compile without spills for sm_90 up to 16384 (see _topk_paths;
# the fused tail runs at the logits kernel's 8 warps, the top-k kernel at TOPK_WARPS); a 16384 tile takes ~250
# registers a thread, so the top-k kernel keeps a large tile only for a single wave of rows (see _topk_row_tiles).
# H200, CUDA-graph replay, top-512 of one row (results/bench/explore/topk_explore-h200-2026-11-29.json): a 4k row
# 19.2 us in a 4096 tile vs 29.4 streaming; a 16k row 128 us in a 16384 tile vs 87 streaming -- so the large tile
# is 4096 too until the in-register passes get cheaper than streaming at 16k.
TOPK_ROW_TILES = (4096, 4096)
FUSED_ROW_TILES = (4096, 4096)
TOPK_WARPS = 8
# ``.maxnreg`` of split launches whose participants hold spans in a register tile (SPLIT_REG_TILE). Left to itself,
# ptxas allocates split k = 512 launches 64 registers a thread on sm_90 and spills 8-24 B (the limit is 255; it
# chooses 64); under a cap of 128 it allocates 96 there (114-128 on sm_86/89/100/120) and spills nothing, which is
# what lets k = 512 keep the tile's gains.
# k = 2048 allocates 126-128 on sm_90 either way (H200: same times); ahead of time the cap removes its 8 B spill on
# sm_86/89 and adds 8-24 B on sm_100 (docs/portability.md; only sm_90 was timed). One-program launches and streaming
# spans keep ptxas's own allocation; explicit tiles past SPLIT_SPAN need a higher cap (an 8192-key tile takes ~225
# registers under 255). None: never capped.
TOPK_MAXNREG: int | None = 128
# Split rows: a participant's span is at least SPLIT_SPAN positions, or SPLIT_SPAN_FEW where the whole grid holds at
# most SPLIT_FEW_PROGRAMS_PER_SM programs per SM (few rows: more participants per row pay, the SMs are otherwise
# idle); at most SPLITS_MAX programs share a row, and the grid asks for about SPLIT_PROGRAMS_PER_SM programs per SM in
# all (shape-only choices: graph-safe). H200, CUDA-graph replay (results/bench/explore/topk_participants_*): B = 8,
# k = 512, 16k rows take 19 us with 16 participants of 1024 against 33 us with 4 of 4096, 64k rows 29 vs 34 us with
# 32 participants; at B = 64 the 4096 span stays best past 4k (16k: 49 us with 4 participants, 54 with 8). Rows of at
# most SPLIT_SPAN positions stay in one program (B = 8, 4k, k = 2048: 18 us against 25 us in four 1024 spans).
SPLIT_SPAN = 4096
SPLIT_SPAN_FEW = 1024
SPLIT_FEW_PROGRAMS_PER_SM = 2
SPLITS_MAX = 32
SPLIT_PROGRAMS_PER_SM = 4
# Two-pass filter of long rows (see _select_filtered / _filter_split): (GROUPS, CANDS) per k -- strided groups whose
# maxima bound the threshold, and the register tile the candidates are selected in -- and the loads in flight per
# streaming step. On smooth rows about GROUPS * ln(GROUPS / (GROUPS - k)) candidates pass (590 for k = 512, 2,840
# for k = 2048); more than CANDS (many keys tied at the threshold) falls back to the radix passes. Its two in-register
# selections cost a fixed ~20-70 us, so it pays only where each participant's span is long and the radix passes
# contend for the SMs. H200, CUDA-graph replay, real logits (results/bench/explore/topk_filter_sweep2-*): B = 64
# (8 participants per row), k = 512: 64k rows 92 us vs 143 for the radix passes, 256k 170 vs 481, but 16k 56 vs 49;
# k = 2048: 256k 326 vs 457, 64k 220 vs 135; B = 1 (16-32 participants) it lost at every length. So by default it
# runs in split launches of at least FILTER_MIN_PROGRAMS_PER_SM programs per SM, for rows whose span reaches
# FILTER_MIN_SPAN[k]; k = 1024 was not measured and keeps the radix passes; single-program rows keep streaming (the
# filter was not measured against them in one run). Explicit ``filter_tiles`` always filter long rows (tests).
FILTER_TILES = {512: (2048, 1024), 1024: (0, 0), 2048: (4096, 4096)}
FILTER_MIN_SPAN = {512: 8192, 1024: 1 << 30, 2048: 32768}
FILTER_MIN_PROGRAMS_PER_SM = 2
FILTER_UNROLL = 4
_WS_GROUPS = max(g for g, _ in FILTER_TILES.values())  # group maxima the split workspace always has room for
# Digit widths of the in-register radix search (_threshold_prefix), chosen per launch by radix_bits. The streaming
# passes (_select_streaming, _select_split: each pass streams the row or span) take STREAM_BITS-bit digits. Every
# search takes ceil(32 / bits) passes at most, the last digit narrower, and stops early once a threshold bin holds
# exactly the keys still needed. Widths are a compiler question as much as a GPU one: Triton 3.6 lowers a 2 ** bits-bin
# tl.histogram to `bits` warp votes plus a popcount per bin (cost grows with the bins: 5-bit digits won there),
# Triton 3.8 to one shared-memory atomic per key (fewer, wider passes win). histogram_per_key picks by the compiler:
# on Triton >= 3.8 (production) WIDE_DIGIT_BITS-bit digits in every register search (radix_bits, split_reg_bits).
# H200, Triton 3.8 cubins replayed (prod_cubins), CUDA-graph replay of 20 calls, real logits
# (results/bench/explore/topk_t38_ab-native-h200-2026-12-03.json, 12 shapes): 8-bit against the 3.6 choice (5-bit
# register digits) is faster at 8 shapes (B = 64 16k k = 2048 22.2 -> 19.6 us, B = 8 16k k = 512 13.9 -> 11.5),
# within 0.3 us at 2 and slower at 2 (B = 8 16k k = 2048 12.7 -> 13.3, B = 64 64k k = 2048 58.2 -> 59.5); 11-bit
# digits lost at 8 of 12. Only the wgmma path's top-k was replayed (the formal run, topk-h200-2026-12-04.json, agrees).
# RADIX_BITS_CHOICES: the widths the kernels accept (tests and sweeps reach each one).
RADIX_BITS = 5
RADIX_BITS_WIDE_K = 8
WIDE_DIGIT_BITS = 8
STREAM_BITS = 8
RADIX_BITS_CHOICES = (4, 5, 6, 8, 10, 11, 12)
# Streaming loops (passes over a row or span in _topk_block pieces) issue each piece's loads one step ahead
# (_stream_piece) when set (``prefetch`` of indexer_topk_fwd: per launch). H100, 3.8 cubins, graph replay
# (results/bench/explore/topk_streampf_ab-native-h100-c6c9131.json): 4-25 % faster in every row of 8-warp launches
# with streamed spans (B = 8 x 64k, k = 512: 42.2 -> 33.7 us), none of which the launcher chooses. In the streamed
# spans it does choose (k = 1024; topk_streampf2_ab-native-h100-3a51a61.json) 2-3 % faster at 1k spans and 4 % slower
# at B = 64 x 64k: off by default.
STREAM_PREFETCH = False
# Split participants hold their span in a register tile as long as the launch's shortest span (topk_span: 1024 or
# 4096) and run the radix search there with SPLIT_REG_BITS-bit digits (one merged histogram and barrier per pass);
# longer spans stream STREAM_BITS-bit passes (_select_split). H200, CUDA-graph replay of 20 calls, real logits
# (results/bench/explore/topk_split_regs_ab2-native-h200-2026-12-03.json, _gate-*): k = 2048 gains wherever the
# tile is full (B = 64 8k 38 -> 28 us, 16k 39 -> 31, 32k 74 -> 58; B = 128 16k 71 -> 53; B = 8 16k 26 -> 17; the
# sm_89 path B = 64 16k 38 -> 31) and is even where spans outgrow it (B = 1 and 8 at 64k, B = 64 at 64k). k = 512
# gains once TOPK_MAXNREG makes ptxas allocate it 96 registers instead of 64 (topk_maxnreg-native-h200-2026-12-03
# .json: B = 64 16k 44 -> 30, 32k 73 -> 51, 8k 37 -> 28; B = 128 16k 76 -> 52; B = 8 16k 16 -> 14; B = 64 64k,
# where the filter runs, even; the formal run: B = 1 16k 11.2 -> 12.2, the one loss); at 64 registers the tile
# spilled and slowed the streaming passes next to it (B = 64 16k 44 -> 63). k = 1024 is not measured: it streams.
# SPLIT_REG_TILE[k]: whether split participants hold spans in registers.
SPLIT_REG_TILE = {512: True, 1024: False, 2048: True}
SPLIT_REG_BITS = 5  # Triton < 3.8; see split_reg_bits
# Wide launches (TopkLaunch.wide): at least WIDE_MIN_ROWS rows of at most WIDE_MAX_COLS, k with a span tile
# (SPLIT_REG_TILE): WIDE_WARPS-warp programs, a row of up to WIDE_SPAN keys held in one program's register tile
# (TOPK_ROW_TILES' large tile raised to WIDE_SPAN), longer rows split into WIDE_SPAN spans held in registers by
# WIDE_WARPS-warp participants. sglang v2's shape at B = 64 (one 1024-thread CTA per row), with our radix search.
# H200, Triton 3.8 cubins, CUDA-graph replay of 20 calls, real logits, every output exact
# (results/bench/explore/topk_coarse1_ab3-native-h200.json, _ab4): against the launcher's choice before (8 warps, 4096
# tiles and spans, 8 participants per 64k row), B = 64 k = 512 4k 8.3 -> 8.0 us, 16k 19.5 -> 16.4, 64k 41.9 -> 44.2
# (the one loss: two waves of participants); k = 2048 4k 7.4 -> 7.3, 16k 19.6 -> 18.0, 64k 59.6 -> 49.0; B = 32 64k
# 31.8 -> 23.1 / 34.0 -> 26.4; B = 128 16k 31.0 -> 18.7 / 32.1 -> 19.0; B = 8 lost (16k 11.5 -> 16.1: 8 SMs busy).
# Longer rows (256k) were not measured this way and keep the launch before.
WIDE_MIN_ROWS = 32
# Position-order launches whose wide register spans take more than one wave select with the spans in shared memory
# (topk_smem: three participants an sm_90 SM; 132 SMs hold 99 rows of 64k at once, against 33 in registers). The choice
# sees the capacity, not the lengths, so short rows pay. H100, 3.8 cubins, graph replay of 20, cap 64k, us at k = 512 /
# 2048 (results/bench/explore/topk_smem_ab4-native-h100-e66452d.json), registers -> shared memory: B = 64 x 64k 44.8
# -> 33.3 / 44.5 -> 36.3, B = 48 x 64k 42.5 -> 33.5 / 43.2 -> 35.2, B = 128 x 64k 85.7 -> 64.2 / 90.0 -> 64.5; lengths
# 16k 15.6 -> 17.9 / 15.8 -> 18.5, 4k 7.0 -> 10.1 / 7.1 -> 10.6, 1k 6.6 -> 7.2 / 3.5 -> 2.6 at B = 64; B = 32 x 64k
# (one wave either way) 24.8 -> 29.1, so not there (smem_spans).
SMEM_SPANS = True
# Where smem_spans picks the shared-memory spans, split the rows by length instead (graph-safe: each kernel reads the
# lengths on the device and leaves the other's rows untouched): rows of at most WIDE_SPAN positions in the register
# launch (one 16-warp program each, ~3 us faster at 4k-16k), longer ones in the shared-memory spans, the two kernels
# on two streams forked from the caller's and joined back (two branches of a captured graph), so a launch costs about
# the slower of the two. H100, 3.8 cubins, graph replay of 20, cap 64k, every output exact, us at k = 512 / 2048
# (results/bench/explore/topk_split_ab-native-h100-89ae9a3.json), shared memory alone -> split (register launch
# alone): B = 64 x 4k 10.0 -> 7.6 / 10.5 -> 8.4 (7.0 / 7.7), 16k 17.6 -> 16.5 / 18.5 -> 16.7 (15.7 / 15.8), 64k 32.3
# -> 32.4 / 35.7 -> 35.9, B = 128 x 64k 63.8 -> 64.0 / 65.7 -> 66.2; lengths drawn from 1..64k: B = 64 31.7 -> 31.8 /
# 32.4 -> 32.4, B = 128 47.3 -> 40.8 / 48.4 -> 41.2. The fork and join cost ~0.7 us over the register launch alone.
LENGTH_SPLIT = True
# (Session 46's fork variants, measured in session 47 on an H200 at 1d4ce53,
# results/bench/explore/topk_fork_ab-native-h200-1d4ce53.json, us at k = 512 / 2048: the register launch on the forked
# stream instead, 64 x 4k 7.5 -> 6.7 / 7.6 -> 6.8, 16k 16.5 -> 15.6 / 16.7 -> 15.9, but 64k 32.0 -> 40.5 / 35.1 -> 41.8
# and 128 x 1..64k 40.9 -> 50.6 / 42.2 -> 51.1; the side stream at normal priority within 0.55 us of high; each register
# row's page slots written by its compaction 16k +1.1 / +1.1 alone and +0.9 / +1.1 in the split (4k alone 7.0 -> 6.9 /
# 7.3 -> 6.9). Concluded: the knobs and DIRECT_SLOTS were removed.) Our reading, not measured directly: the launch
# enqueued first is dispatched first, and at 4k-16k the shared-memory launch's 256 programs (about two an SM, each
# taking a start ticket, then reading its row's length, before it finds nothing to do) hold the SMs that the 16-warp
# register programs need whole. Those programs reading every length first and exiting without a ticket where no row
# is longer than WIDE_SPAN (session 47's LENGTH_SPLIT_SCAN) was measured in session 48 on an H100 at ce7efee
# (results/bench/explore/topk_scan_ab-native-h100-ce7efee.json, us at k = 512 / 2048): 64 x 16k 16.5 -> 16.2 /
# 16.7 -> 16.5, 64 x 64k 35.6 -> 36.0 / 35.0 -> 35.8; removed.
WIDE_MAX_COLS = 65536
WIDE_SPAN = 16384
WIDE_WARPS = 16


# ---------------------------------------------------------------------------------------------------------------------
# device helpers
# ---------------------------------------------------------------------------------------------------------------------
@triton.jit
def _order_key(v):
    """int32 image of fp32 ``v`` whose signed order is the float order (-0.0 maps onto +0.0; NaN unsupported)."""
    x = v.to(tl.int32, bitcast=True)
    x = tl.where(x == -2147483647 - 1, 0, x)
    return x ^ ((x >> 31) & 0x7FFFFFFF)


@triton.jit
def _load_row(ptr, mask, FROM_L2: tl.constexpr):
    """fp32 loads; ``FROM_L2`` reads through L2 (.cg) because other CTAs of this launch wrote the data."""
    if FROM_L2:
        v = tl.load(ptr, mask=mask, other=0.0, cache_modifier=".cg")
    else:
        v = tl.load(ptr, mask=mask, other=0.0)
    return v


@triton.jit
def _bin_combine(n_a, ge_a, above_a, n_b, ge_b, above_b):
    return n_a + n_b, tl.minimum(ge_a, ge_b), tl.maximum(above_a, above_b)


@triton.jit
def _pick_bin(hist, k_rem, BIG: tl.constexpr):
    """Radix step over a histogram (bins in key order): the bin ``d`` holding the ``k_rem``-th largest key, the number
    of keys in bins above it, and the number in it (one fused reduction after the suffix scan)."""
    ge = tl.cumsum(hist, axis=0, reverse=True)  # [bins] keys at or above each bin
    sel = ge >= k_rem  # bins [0, d]
    n_sel, ge_d, above = tl.reduce((sel.to(tl.int32), tl.where(sel, ge, BIG), tl.where(sel, 0, ge)), 0, _bin_combine)
    return n_sel - 1, above, ge_d - above


@triton.jit
def _stream_first(src_ptr, lo, hi, BLOCK: tl.constexpr, FROM_L2: tl.constexpr, PREFETCH: tl.constexpr):
    """The first piece ``src_ptr[lo:lo + BLOCK]`` (masked at ``hi``) of a streaming loop with ``PREFETCH``, loaded
    before the loop starts; else a placeholder the loop never reads."""
    if PREFETCH:
        offs = lo + tl.arange(0, BLOCK)
        ahead = _load_row(src_ptr + offs, offs < hi, FROM_L2)  # [BLOCK]
    else:
        ahead = tl.zeros([BLOCK], dtype=tl.float32)
    return ahead


@triton.jit
def _stream_piece(src_ptr, offs, m, hi, ahead, BLOCK: tl.constexpr, FROM_L2: tl.constexpr, PREFETCH: tl.constexpr):
    """One step of a streaming loop over ``src_ptr`` in ``BLOCK`` pieces: returns this piece's fp32 values
    (positions ``offs``, mask ``m``) and what the next step takes as ``ahead``. With ``PREFETCH`` this piece was
    loaded one step earlier (``ahead``) and the next one's loads are issued now, so their latency overlaps this
    piece's work instead of stalling the next step (Triton does not software-pipeline loads that feed no dot);
    the piece past ``hi`` is fully masked (no memory traffic). Costs ``BLOCK`` / threads registers more."""
    if PREFETCH:
        v = ahead
        nxt = offs + BLOCK
        ahead = _load_row(src_ptr + nxt, nxt < hi, FROM_L2)  # [BLOCK] the next piece
    else:
        v = _load_row(src_ptr + offs, m, FROM_L2)  # [BLOCK]
    return v, ahead


@triton.jit
def _span_digit_histogram(
    src_ptr,
    lo,
    hi,
    prefix,
    TOP: tl.constexpr,
    SHIFT: tl.constexpr,
    NB: tl.constexpr,
    BLOCK: tl.constexpr,
    FROM_L2: tl.constexpr,
    PREFETCH: tl.constexpr = False,
):
    """[NB] histogram of the digit ``bits [SHIFT, TOP)`` of the sign-flipped order keys of ``src_ptr[lo:hi]``
    (streamed in ``BLOCK`` pieces; ``PREFETCH``: each piece's loads issued one step ahead, see
    :func:`_stream_piece`), counting only keys whose bits at and above ``TOP`` equal ``prefix``'s (all keys when
    ``TOP`` is 32). The streaming counterpart of one pass of :func:`_radix_threshold`."""
    o_b = tl.arange(0, BLOCK)
    hist = tl.zeros([NB], dtype=tl.int32)
    ahead = _stream_first(src_ptr, lo, hi, BLOCK, FROM_L2, PREFETCH)
    for start in range(lo, hi, BLOCK):
        offs = start + o_b
        m = offs < hi
        v, ahead = _stream_piece(src_ptr, offs, m, hi, ahead, BLOCK, FROM_L2, PREFETCH)
        ukey = _order_key(v) ^ (-2147483647 - 1)  # [BLOCK]
        if TOP < 32:
            m = m & ((ukey >> TOP) == (prefix >> TOP))
        hist += tl.histogram((ukey >> SHIFT) & (NB - 1), NB, mask=m)
    return hist


@triton.jit
def _merge_histogram(hist, hist_ptr, bar_ptr, target, NB: tl.constexpr):
    """Split rows: adds this participant's ``hist`` [NB] into the row's ``hist_ptr`` [NB] (int32 atomics: exact,
    order-free), waits until ``target`` arrivals at ``bar_ptr`` and returns the row's merged histogram [NB]."""
    o_bin = tl.arange(0, NB)
    tl.atomic_add(hist_ptr + o_bin, hist, mask=hist > 0, sem="relaxed", scope="gpu")
    _arrive_and_wait(bar_ptr, target)
    return tl.load(hist_ptr + o_bin, cache_modifier=".cg")  # [NB] the whole row's


@triton.jit
def _radix_threshold(
    ukey,
    valid,
    zero,
    K: tl.constexpr,
    BITS: tl.constexpr,
    BIG: tl.constexpr,
    hist_ptr,
    bar_ptr,
    n_part,
    phase0,
    MERGE: tl.constexpr,
    src_ptr,
    lo,
    hi,
    BLOCK: tl.constexpr,
    FROM_L2: tl.constexpr,
    COUNTS: tl.constexpr,
    PREFETCH: tl.constexpr = False,
):
    """Radix search over register keys ``ukey`` (sign-flipped order keys: unsigned order as int32 bits; ``valid`` of
    them) for the ``K``-th largest: returns ``(prefix, low, k_rem, phase)``, the threshold's flipped bits above
    ``low`` (the lower ones zero), how many keys whose bits above ``low`` equal the prefix's win, and the barrier
    phases used. Digits of ``BITS`` bits from the top (the last one narrower), one ``tl.histogram`` of ``2 ** BITS``
    bins per pass; a pass that leaves exactly ``k_rem`` keys in its threshold bin ends the search early. ``zero`` is
    an int32 scalar 0 (the loop-carried values take its type); ``BIG`` exceeds every count.

    ``MERGE`` (split rows): each pass's histogram is merged with the other participants' through ``hist_ptr``
    [passes, 2 ** BITS] and a barrier at ``bar_ptr`` (phases from ``phase0``, ``n_part`` arrivals each), so every
    participant takes the same decisions; otherwise those arguments are unused.

    ``BLOCK > 0`` (streaming): the keys are not in registers (``ukey`` and ``valid`` unused); each pass streams
    ``src_ptr[lo:hi]`` in ``BLOCK`` pieces (:func:`_span_digit_histogram`, ``PREFETCH``: loads one piece ahead).

    ``COUNTS``: also returns ``(n_above, n_in)``, how many of *these* keys (this participant's, before any merge)
    lie above the threshold's settled bits and how many share them, read off each pass's own histogram (a key above
    the threshold is counted in the pass where its digit first exceeds the chosen one) -- what a split participant
    needs to place its winners, without another pass over its keys. Else both are 0.

    Why narrow digits: Triton lowers ``tl.histogram`` to one warp ballot per bit of the bin index and, per lane, a
    mask-and-popcount for each bin it owns, so a 256-bin pass costs ~100 instructions per 32 keys and a 32-bin pass
    ~30; seven 5-bit passes at most against four 8-bit ones (see RADIX_BITS for where each is used)."""
    NB: tl.constexpr = tl.constexpr(1) << BITS
    prefix = zero  # the threshold's flipped bits, one digit at a time from the top
    k_rem = zero + K  # keys still to take from the bin that matches ``prefix``
    low = zero + 32  # low bits of the threshold not determined yet
    more = zero + 1  # 0 once a pass leaves exactly k_rem keys in its threshold bin (all of them win)
    phase = zero + phase0
    n_above = zero
    n_in = zero
    for p in tl.static_range((32 + BITS - 1) // BITS):
        top = 32 - BITS * p  # bits at and above ``top`` are settled (constexpr: p is a static index)
        shift = (top - BITS) * (top > BITS)  # this pass's digit: bits [shift, top)
        if more != 0:
            # a narrower last digit (shift 0) also holds settled bits: the same in every key counted, so the OR
            # below sets them again
            if BLOCK > 0:
                hist = _span_digit_histogram(src_ptr, lo, hi, prefix, top, shift, NB, BLOCK, FROM_L2,
                                             PREFETCH)  # fmt: skip  # [NB]
            else:
                if p == 0:
                    m = valid
                else:
                    m = valid & ((ukey >> top) == (prefix >> top))
                digit = (ukey >> shift) & (NB - 1)
                hist = tl.histogram(digit, NB, mask=m)  # [NB]
            own = hist  # [NB] these keys' own counts
            if MERGE:
                phase += 1
                hist = _merge_histogram(hist, hist_ptr + p * NB, bar_ptr, phase * n_part, NB)
            d, above, in_bin = _pick_bin(hist, k_rem, BIG)
            if COUNTS:
                o_bin = tl.arange(0, NB)
                n_above += tl.sum(tl.where(o_bin > d, own, 0), axis=0)
                n_in = tl.sum(tl.where(o_bin == d, own, 0), axis=0)
            k_rem -= above
            prefix = prefix | (d << shift)
            low = zero + shift
            more = (in_bin != k_rem).to(tl.int32)
    return prefix, low, k_rem, phase, n_above, n_in


@triton.jit
def _threshold_prefix(key, valid, zero, K: tl.constexpr, ROW: tl.constexpr, BITS: tl.constexpr):
    """Radix search of :func:`_radix_threshold` over order keys ``key`` [ROW] (``valid`` of them, more than ``K``)
    in one program: returns ``(prefix, low, k_rem)`` with the threshold's bits above ``low`` in order-key form."""
    ukey = key ^ (-2147483647 - 1)  # unsigned order as int32 bits (sign flipped): digit order is key order
    prefix, low, k_rem, _, _, _ = _radix_threshold(ukey, valid, zero, K, BITS, ROW + 1, zero, zero, zero, 0, False,
                                                   zero, zero, zero, 0, False, False)  # fmt: skip
    return prefix ^ (-2147483647 - 1), low, k_rem


# Winners' scattered stores (_write_winners, the streaming and candidate lists) through inline PTX wherever Triton
# compiles (not on its interpreter): a tl.store of data-dependent addresses gets a layout of its own (one element per
# thread), and converting the compaction scan's layout (four contiguous elements per thread) to it took shared-memory
# round trips and three barriers per eight elements (Triton 3.8, sm_90 SASS). An elementwise asm keeps the operands
# where they are: the top-k kernel's shared memory 16-32 KB -> 4-8 KB and its spills 24-128 -> 0-16 B a thread on
# every target (docs/portability.md), the same bits; H100, 3.8 cubins, graph replay: the same times at every shape
# (results/bench/explore/topk_scatter_asm_ab-native-h100-8951c7b.json; B = 64 16k k = 2048 18.07 / 18.07 us).
SCATTER_ASM = tl.constexpr(not dev.defined_interpreted(_order_key))  # as triton.jit defined this module's kernels
SCATTER_ASM_PTX = tl.constexpr("{ .reg .pred p; setp.ne.b32 p, $3, 0; @p st.global.b32 [$1], $2; mov.b32 $0, 0; }")


@triton.jit
def _scatter_store(ptr, value, mask):
    """``tl.store(ptr, value, mask=mask)`` for int32 ``value`` without a layout conversion (see SCATTER_ASM)."""
    if SCATTER_ASM:
        tl.inline_asm_elementwise(
            asm=SCATTER_ASM_PTX,
            constraints="=r,l,r,r",
            args=[ptr, value, mask.to(tl.int32)],
            dtype=tl.int32,
            is_pure=False,
            pack=1,
        )
    else:
        tl.store(ptr, value, mask=mask)


# The winners' ranks over a [N / WINNERS_COLS, WINNERS_COLS] view of the N register keys (a reshape that keeps
# position order): each row of WINNERS_COLS adjacent keys (8 lanes of 4 keys at 32) is scanned on its own and only
# the N / WINNERS_COLS row totals across the program, instead of one scan over the whole row (16k keys at 16k, about
# 3.75 of a solo row's 12.5 us in session 43's timeline). Same ranks, same slots. Triton 3.8, 64 x 16k: 6-11 % fewer
# SASS instructions, the same registers (results/bench/explore/topk_winners2d_aot-t38-2026-12-07.json). H100, 3.8
# cubins, graph replay of 20, every output exact, us at k = 512 / 2048, one scan -> 32 (128): 64 x 16k 16.6 -> 15.1
# (15.6) / 16.8 -> 15.3 (15.9), 4k 7.6 -> 7.5 / 8.0 -> 8.0, 64 x 1..64k 32.3 -> 32.3 / 32.4 -> 32.2, B = 8 and 1 x 16k
# within 0.5 (results/bench/explore/topk_w2d32_ab-native-h100-ce7efee.json, topk_w2d128_ab-native-h100-ce7efee.json).
# Against 32 (15.1 / 15.3 at 64 x 16k): 16 15.1 / 15.5, 8 15.8 / 16.1, the one scan 16.3 / 16.6, the rest within 0.3
# (topk_w2d{16,8,65536}_ab-native-h100-28bb4c3.json).
WINNERS_COLS = tl.constexpr(32)


@triton.jit
def _write_winners(key, valid, payload, prefix, low, k_rem, gt_before, eq_before, idx_out_ptr):
    """Writes ``payload`` of the keys among ``key`` [N] (``valid`` of them) that win against the threshold ``prefix``
    (order-key bits above ``low``): every key above it, and the ``k_rem`` keys equal to it that come first in the
    row. ``gt_before`` / ``eq_before`` keys above / equal to it come earlier in the row (other spans), so a winner's
    slot of ``idx_out_ptr`` is its rank in position order. At most 32768 keys (one scan counts both in 16 bits)."""
    hi = key >> low
    thr = prefix >> low
    N: tl.constexpr = key.shape[0]
    C: tl.constexpr = WINNERS_COLS if N >= WINNERS_COLS else N
    gt = tl.reshape(valid & (hi > thr), [N // C, C])  # [N / C, C] adjacent keys a row (position order kept)
    eq = tl.reshape(valid & (hi == thr), [N // C, C])
    both = gt.to(tl.int32) | (eq.to(tl.int32) << 16)  # one scan counts both
    row_total = tl.sum(both, axis=1)  # [N / C]
    row_before = tl.cumsum(row_total, axis=0) - row_total  # [N / C] counts in the rows before
    before = tl.cumsum(both, axis=1) - both + row_before[:, None]  # [N / C, C]
    eq_rank = eq_before + (before >> 16)  # ties before this one in the row
    take = gt | (eq & (eq_rank < k_rem))
    slot = gt_before + (before & 0xFFFF) + tl.minimum(eq_rank, k_rem)  # winners before this one
    _scatter_store(idx_out_ptr + slot, tl.reshape(payload, [N // C, C]), take)


@triton.jit
def _select_keys(key, valid, payload, zero, idx_out_ptr, K: tl.constexpr, ROW: tl.constexpr, BITS: tl.constexpr):
    """Writes ``payload`` of the top-``K`` of the register keys ``key`` [ROW] (``valid`` of them, at least ``K``) to
    ``idx_out_ptr[0:K]`` in index order; ties at the threshold go to the smaller indices."""
    tl.static_assert(ROW <= 32768, "the compaction scan packs two 16-bit counts")
    prefix, low, k_rem = _threshold_prefix(key, valid, zero, K, ROW, BITS)
    _write_winners(key, valid, payload, prefix, low, k_rem, zero, zero, idx_out_ptr)


@triton.jit
def _select_in_registers(
    src_ptr, length, idx_out_ptr, K: tl.constexpr, ROW: tl.constexpr, FROM_L2: tl.constexpr, BITS: tl.constexpr
):
    """Writes the positions of the top-``K`` keys of ``src_ptr[0:length]`` (``K < length <= ROW``) to
    ``idx_out_ptr[0:K]`` in position order. The row is loaded once; every radix pass is a histogram of the keys
    held in registers."""
    o_r = tl.arange(0, ROW)
    valid = o_r < length
    key = _order_key(_load_row(src_ptr + o_r, valid, FROM_L2))  # [ROW]
    _select_keys(key, valid, o_r, length * 0, idx_out_ptr, K, ROW, BITS)


@triton.jit
def _group_maxima(src_ptr, lo, hi, GROUPS: tl.constexpr, UNROLL: tl.constexpr, FROM_L2: tl.constexpr):
    """[GROUPS] int32: lane j holds the largest key among positions ``lo + j + i * GROUPS`` in ``[lo, hi)`` (the
    smallest int32, below every key, where there is none); ``UNROLL`` loads of ``GROUPS`` keys are in flight."""
    o_g = tl.arange(0, GROUPS)
    smallest = -2147483647 - 1  # below every key (-inf maps above it)
    gmax = tl.full([GROUPS], smallest, dtype=tl.int32)
    for start in range(lo, hi, GROUPS * UNROLL):
        for u in tl.static_range(UNROLL):
            offs = start + u * GROUPS + o_g
            m = offs < hi
            key = _order_key(_load_row(src_ptr + offs, m, FROM_L2))  # [GROUPS]
            gmax = tl.maximum(gmax, tl.where(m, key, smallest))
    return gmax


@triton.jit
def _list_candidates(
    src_ptr, lo, hi, t, out_ptr, CANDS: tl.constexpr, GROUPS: tl.constexpr, UNROLL: tl.constexpr, FROM_L2: tl.constexpr
):
    """Writes the positions in ``[lo, hi)`` whose keys are >= ``t`` to ``out_ptr`` in position order (the first
    ``CANDS`` of them) and returns how many there are."""
    o_g = tl.arange(0, GROUPS)
    n = lo * 0
    for start in range(lo, hi, GROUPS * UNROLL):
        for u in tl.static_range(UNROLL):
            offs = start + u * GROUPS + o_g
            m = offs < hi
            key = _order_key(_load_row(src_ptr + offs, m, FROM_L2))  # [GROUPS]
            c = (m & (key >= t)).to(tl.int32)
            slot = n + tl.cumsum(c, axis=0) - c
            _scatter_store(out_ptr + slot, offs, (c != 0) & (slot < CANDS))
            n += tl.sum(c, axis=0)
    return n


@triton.jit
def _select_filtered(
    src_ptr,
    length,
    idx_out_ptr,
    cand_ptr,
    K: tl.constexpr,
    GROUPS: tl.constexpr,
    CANDS: tl.constexpr,
    UNROLL: tl.constexpr,
    FROM_L2: tl.constexpr,
    BITS: tl.constexpr,
):
    """Same contract as :func:`_select_in_registers` for a row longer than ``GROUPS`` in two streaming passes, or
    returns 0 (nothing written) when more than ``CANDS`` candidates pass the filter; 1 when done.

    Pass 1 keeps the maximum of each of ``GROUPS`` strided groups (position mod GROUPS: a sorted or drifting row
    spreads over every group); the ``K``-th largest maximum's radix prefix ``t`` bounds the threshold from below,
    since the ``K`` groups whose maxima are at least ``t`` hold at least ``K`` keys >= ``t``. Pass 2 writes the
    positions of the keys >= ``t`` (in position order) to ``cand_ptr[0:CANDS]``; they are then gathered into one
    register tile and selected exactly there. On smooth rows about ``GROUPS * ln(GROUPS / (GROUPS - K))`` keys pass;
    a row of many equal keys at the threshold may not fit, and then the caller streams. ``UNROLL`` loads of
    ``GROUPS`` keys are in flight per step."""
    zero = length * 0
    gmax = _group_maxima(src_ptr, zero, length, GROUPS, UNROLL, FROM_L2)  # [GROUPS]
    # every group holds a key (length > GROUPS): the K-th largest of GROUPS > K maxima exists
    t, _low, _k_rem = _threshold_prefix(gmax, tl.arange(0, GROUPS) < GROUPS, zero, K, GROUPS, BITS)
    n_cand = _list_candidates(src_ptr, zero, length, t, cand_ptr, CANDS, GROUPS, UNROLL, FROM_L2)
    done = (n_cand <= CANDS).to(tl.int32)
    if done != 0:
        tl.debug_barrier()
        _select_candidates(src_ptr, n_cand, cand_ptr, idx_out_ptr, K, CANDS, BITS)
    return done


@triton.jit
def _select_streaming(
    src_ptr,
    length,
    idx_out_ptr,
    K: tl.constexpr,
    BLOCK: tl.constexpr,
    FROM_L2: tl.constexpr,
    BITS: tl.constexpr,
    PREFETCH: tl.constexpr = False,
):
    """Same contract as :func:`_select_in_registers` for rows of any length: the radix search of
    :func:`_radix_threshold` with ``BITS``-bit digits (early stop), each pass streaming the row in ``BLOCK`` pieces,
    then one compaction pass (``PREFETCH``: loads one piece ahead, :func:`_stream_piece`)."""
    zero = length * 0
    prefix, low, k_rem, _, _, _ = _radix_threshold(zero, zero, zero, K, BITS, 2147483647, zero, zero, zero, 0, False,
                                                   src_ptr, zero, length, BLOCK, FROM_L2, False,
                                                   PREFETCH)  # fmt: skip
    # keys above the threshold's settled bits all win; k_rem of those equal to them win, smallest positions first
    thr = (prefix ^ (-2147483647 - 1)) >> low
    o_b = tl.arange(0, BLOCK)
    n_sel = zero
    n_eq = zero
    ahead = _stream_first(src_ptr, zero, length, BLOCK, FROM_L2, PREFETCH)
    for start in range(0, length, BLOCK):
        offs = start + o_b
        m = offs < length
        v, ahead = _stream_piece(src_ptr, offs, m, length, ahead, BLOCK, FROM_L2, PREFETCH)
        hk = _order_key(v) >> low  # [BLOCK]
        gt = (m & (hk > thr)).to(tl.int32)
        eq = (m & (hk == thr)).to(tl.int32)
        eq_rank = n_eq + tl.cumsum(eq, axis=0) - eq
        take = gt | (eq & (eq_rank < k_rem).to(tl.int32))
        slot = n_sel + tl.cumsum(take, axis=0) - take
        _scatter_store(idx_out_ptr + slot, offs, take != 0)
        n_sel += tl.sum(take, axis=0)
        n_eq += tl.sum(eq, axis=0)


@triton.jit
def _finish_row(
    src_ptr,
    length,
    idx_out_ptr,
    slot_out_ptr,
    pt_row_ptr,
    K: tl.constexpr,
    SORT: tl.constexpr,
    WRITE_SLOTS: tl.constexpr,
    WRITE_IDX: tl.constexpr,
    PAGE_BITS: tl.constexpr,
    FROM_L2: tl.constexpr,
):
    """Final output of one row whose winners sit in ``idx_out_ptr[0:K]`` in position order (when ``length > K``; a
    shorter row needs no selection): sorted by (value desc, position asc) when ``SORT``, -1 padded, and the page slots
    with ``WRITE_SLOTS``."""
    o_k = tl.arange(0, K)
    count = tl.minimum(length, K)
    if length > K:
        pos = tl.load(idx_out_ptr + o_k, cache_modifier=".cg")  # [K] the K winners, in position order
    else:
        pos = o_k
    ok = o_k < count
    if SORT:
        v = _load_row(src_ptr + pos, ok, FROM_L2)  # [K]
        key = tl.where(ok, _order_key(v), -2147483647 - 1)
        packed = (key.to(tl.int64) << 32) | (0x7FFFFFFF - pos).to(tl.int64)
        packed = tl.sort(packed, descending=True)
        pos = 0x7FFFFFFF - packed.to(tl.int32)  # low 32 bits
    tl.debug_barrier()
    if WRITE_IDX:
        tl.store(idx_out_ptr + o_k, tl.where(ok, pos, -1))
    if WRITE_SLOTS:
        page = tl.load(pt_row_ptr + (pos >> PAGE_BITS), mask=ok, other=0)
        slots = (page << PAGE_BITS) | (pos & ((1 << PAGE_BITS) - 1))
        tl.store(slot_out_ptr + o_k, tl.where(ok, slots, -1))


@triton.jit
def _topk_row(
    src_ptr,
    length,
    idx_out_ptr,
    slot_out_ptr,
    pt_row_ptr,
    K: tl.constexpr,
    BLOCK: tl.constexpr,
    ROW_SMALL: tl.constexpr,
    ROW_MAX: tl.constexpr,
    STREAM: tl.constexpr,
    WRITE_SLOTS: tl.constexpr,
    WRITE_IDX: tl.constexpr,
    PAGE_BITS: tl.constexpr,
    FROM_L2: tl.constexpr,
    SORT: tl.constexpr,
    cand_ptr,
    GROUPS: tl.constexpr,
    CANDS: tl.constexpr,
    UNROLL: tl.constexpr,
    BITS: tl.constexpr,
    STREAM_BITS: tl.constexpr,
    PREFETCH: tl.constexpr = False,
):
    """Top-``K`` positions of ``src_ptr[0:length]`` (fp32, contiguous), -1 padded, in one program.

    The selection path is chosen per row on the device: ``length <= K`` needs none, ``length <= ROW_SMALL`` and
    ``length <= ROW_MAX`` hold the row in registers (two register tiles so a short row does not pay for a long tile),
    longer rows (compiled only with ``STREAM``) take the two-pass filter of :func:`_select_filtered` when ``GROUPS``
    (``cand_ptr`` [CANDS] int32 scratch) and stream (``STREAM_BITS``-bit digits, ``PREFETCH`` see
    :func:`_stream_piece`) when it is 0 or the candidates overflow it; ``BITS``: the digits of the register searches.
    ``idx_out_ptr`` [K] int32 receives positions (it is also the selection's scratch, so it is always written); with
    ``WRITE_SLOTS`` ``slot_out_ptr`` [K] receives ``pt_row[pos >> PAGE_BITS] << PAGE_BITS | pos & page_mask``.
    Order: see :func:`_finish_row`."""
    if length > K:
        if length <= ROW_SMALL:
            _select_in_registers(src_ptr, length, idx_out_ptr, K, ROW_SMALL, FROM_L2, BITS)
        if ROW_MAX > ROW_SMALL:
            if (length > ROW_SMALL) & (length <= ROW_MAX):
                _select_in_registers(src_ptr, length, idx_out_ptr, K, ROW_MAX, FROM_L2, BITS)
        if STREAM:
            if length > ROW_MAX:
                done = length * 0
                if GROUPS > 0:
                    done = _select_filtered(
                        src_ptr, length, idx_out_ptr, cand_ptr, K, GROUPS, CANDS, UNROLL, FROM_L2, BITS
                    )
                if done == 0:
                    _select_streaming(src_ptr, length, idx_out_ptr, K, BLOCK, FROM_L2, STREAM_BITS, PREFETCH)
        tl.debug_barrier()
    _finish_row(src_ptr, length, idx_out_ptr, slot_out_ptr, pt_row_ptr, K, SORT, WRITE_SLOTS, WRITE_IDX, PAGE_BITS,
                FROM_L2)  # fmt: skip


@triton.jit
def _arrive_and_wait(bar_ptr, target):
    """Counts this program's arrival at the row's counter and spins until ``target`` arrivals (all participants of
    this phase). The CTA barrier before the release orders every thread's earlier stores and atomics before it."""
    tl.debug_barrier()
    n = tl.atomic_add(bar_ptr, 1, sem="acq_rel", scope="gpu") + 1
    while n < target:
        n = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _exchange_counts(n_gt, n_eq, cnt_ptr, part, bar_ptr, target, SPLITS: tl.constexpr):
    """Split rows: publishes this span's counts of keys above / equal to the threshold at ``cnt_ptr[part]``
    ([SPLITS, 2] int32), waits until ``target`` arrivals at ``bar_ptr`` and returns the counts of the spans before
    this one, ``(gt_before, eq_before)``: where its winners start in position order."""
    tl.store(cnt_ptr + part * 2, n_gt)
    tl.store(cnt_ptr + part * 2 + 1, n_eq)
    _arrive_and_wait(bar_ptr, target)
    o_s = tl.arange(0, SPLITS)
    earlier = o_s < part
    gt_before = tl.sum(tl.load(cnt_ptr + o_s * 2, mask=earlier, other=0, cache_modifier=".cg"), axis=0)
    eq_before = tl.sum(tl.load(cnt_ptr + o_s * 2 + 1, mask=earlier, other=0, cache_modifier=".cg"), axis=0)
    return gt_before, eq_before


@triton.jit
def _select_split(
    src_ptr,
    lo,
    hi,
    part,
    n_part,
    hist_ptr,
    cnt_ptr,
    bar_ptr,
    idx_out_ptr,
    K: tl.constexpr,
    BLOCK: tl.constexpr,
    SPLITS: tl.constexpr,
    BITS: tl.constexpr,
    HIST_REGION: tl.constexpr,
    phase0,
    PREFETCH: tl.constexpr = False,
):
    """Participant ``part`` of ``n_part`` in the top-``K`` of one row, owning positions ``[lo, hi)``: the radix
    search of :func:`_radix_threshold` (``BITS``-bit digits, early stop), each pass streaming its span (``PREFETCH``:
    loads one ``BLOCK`` piece ahead, :func:`_stream_piece`), with the row's
    histogram merged through ``hist_ptr`` [passes, 2 ** BITS] int32 and ``bar_ptr``; then its span's winners go to
    their position-order slots of ``idx_out_ptr[0:K]`` (span counts exchanged through ``cnt_ptr`` [SPLITS, 2]).
    Returns the barrier phases used, ``phase0`` (those already used at the row's counter) included."""
    tl.static_assert(((32 + BITS - 1) // BITS) * (1 << BITS) <= HIST_REGION, "a row's histogram region")
    zero = lo * 0
    prefix, low, k_rem, phase, n_gt, n_eq = _radix_threshold(zero, zero, zero, K, BITS, 2147483647, hist_ptr, bar_ptr,
                                                             n_part, phase0, True, src_ptr, lo, hi, BLOCK, False,
                                                             True, PREFETCH)  # fmt: skip
    # this span's keys above / equal to the threshold's settled bits (n_gt, n_eq: from its own histograms), exchanged
    # so each span knows where its winners go
    thr = (prefix ^ (-2147483647 - 1)) >> low
    o_b = tl.arange(0, BLOCK)
    phase += 1
    gt_before, eq_before = _exchange_counts(n_gt, n_eq, cnt_ptr, part, bar_ptr, phase * n_part, SPLITS)
    ahead = _stream_first(src_ptr, lo, hi, BLOCK, False, PREFETCH)
    for start in range(lo, hi, BLOCK):
        offs = start + o_b
        m = offs < hi
        v, ahead = _stream_piece(src_ptr, offs, m, hi, ahead, BLOCK, False, PREFETCH)
        hk = _order_key(v) >> low  # [BLOCK]
        gt = (m & (hk > thr)).to(tl.int32)
        eq = (m & (hk == thr)).to(tl.int32)
        eq_rank = eq_before + tl.cumsum(eq, axis=0) - eq  # ties before this one in the row
        take = (gt != 0) | ((eq != 0) & (eq_rank < k_rem))
        slot = gt_before + tl.cumsum(gt, axis=0) - gt + tl.minimum(eq_rank, k_rem)  # winners before this one
        _scatter_store(idx_out_ptr + slot, offs, take)
        gt_before += tl.sum(gt, axis=0)
        eq_before += tl.sum(eq, axis=0)
    return phase


@triton.jit
def _select_split_registers(
    src_ptr,
    lo,
    hi,
    part,
    n_part,
    hist_ptr,
    cnt_ptr,
    bar_ptr,
    idx_out_ptr,
    K: tl.constexpr,
    TILE: tl.constexpr,
    SPLITS: tl.constexpr,
    BITS: tl.constexpr,
    HIST_REGION: tl.constexpr,
    phase0,
):
    """Same contract as :func:`_select_split` for a span of at most ``TILE`` positions, loaded once and held in
    registers: the radix search of :func:`_radix_threshold` (``BITS``-bit digits, early stop) with each pass's
    span histogram merged through ``hist_ptr`` [passes, 2 ** BITS] and a barrier, then the span's counts exchanged
    (:func:`_exchange_counts`) and its winners written from registers (:func:`_write_winners`)."""
    NB: tl.constexpr = tl.constexpr(1) << BITS
    tl.static_assert(((32 + BITS - 1) // BITS) * NB <= HIST_REGION, "a row's histogram region")
    tl.static_assert(TILE <= 32768, "the compaction scan packs two 16-bit counts")
    offs = lo + tl.arange(0, TILE)
    valid = offs < hi
    key = _order_key(_load_row(src_ptr + offs, valid, False))  # [TILE]
    ukey = key ^ (-2147483647 - 1)  # sign flipped: digit order is key order (see _radix_threshold)
    zero = lo * 0
    prefix, low, k_rem, phase, n_gt, n_eq = _radix_threshold(ukey, valid, zero, K, BITS, 2147483647, hist_ptr, bar_ptr,
                                                             n_part, phase0, True, zero, zero, zero, 0, False,
                                                             True)  # fmt: skip
    prefix = prefix ^ (-2147483647 - 1)
    phase += 1
    gt_before, eq_before = _exchange_counts(n_gt, n_eq, cnt_ptr, part, bar_ptr, phase * n_part, SPLITS)
    _write_winners(key, valid, offs, prefix, low, k_rem, gt_before, eq_before, idx_out_ptr)
    return phase


@triton.jit
def _filter_split(
    src_ptr,
    lo,
    hi,
    part,
    n_part,
    gmax_ptr,
    cnt_ptr,
    bar_ptr,
    cand_ptr,
    K: tl.constexpr,
    GROUPS: tl.constexpr,
    CANDS: tl.constexpr,
    UNROLL: tl.constexpr,
    SPLITS: tl.constexpr,
    BITS: tl.constexpr,
):
    """Participant ``part`` of ``n_part`` in the two-pass filter of :func:`_select_filtered` over one row, owning
    positions ``[lo, hi)``. Its span's group maxima merge into the row's ``gmax_ptr`` [GROUPS] (uint32 atomic max of
    the sign-flipped keys: 0, the workspace's resting value, is below every key); after a barrier every participant
    derives the same threshold, writes its span's candidates to its slab ``cand_ptr[(1 + part) * CANDS:]`` and its
    count to ``cnt_ptr[part]``; after a second barrier it copies them to their position-order slots of the row's
    list ``cand_ptr[0:CANDS]``. Returns ``(2, n_cand)``: the barrier phases used and the row's candidate count (the
    same on every participant; more than ``CANDS``: nothing was copied)."""
    o_g = tl.arange(0, GROUPS)
    zero = lo * 0
    smallest = -2147483647 - 1
    gmax = _group_maxima(src_ptr, lo, hi, GROUPS, UNROLL, False)  # [GROUPS] this span's
    ugmax = gmax_ptr.to(tl.pointer_type(tl.uint32))
    ukey = (gmax ^ smallest).to(tl.uint32, bitcast=True)  # unsigned order of the sign-flipped keys = signed order
    group = (lo + o_g) % GROUPS  # lane j of every step of this span holds positions = lo + j (mod GROUPS)
    tl.atomic_max(ugmax + group, ukey, mask=ukey != 0, sem="relaxed", scope="gpu")
    _arrive_and_wait(bar_ptr, n_part)
    merged = tl.load(ugmax + o_g, cache_modifier=".cg").to(tl.int32, bitcast=True) ^ smallest  # [GROUPS] row's
    t, _low, _k_rem = _threshold_prefix(merged, o_g < GROUPS, zero, K, GROUPS, BITS)
    slab = cand_ptr + (1 + part) * CANDS
    n_mine = _list_candidates(src_ptr, lo, hi, t, slab, CANDS, GROUPS, UNROLL, False)
    tl.store(cnt_ptr + part, n_mine)
    _arrive_and_wait(bar_ptr, 2 * n_part)
    o_s = tl.arange(0, SPLITS)
    counts = tl.load(cnt_ptr + o_s, mask=o_s < n_part, other=0, cache_modifier=".cg")  # [SPLITS]
    n_cand = tl.sum(counts, axis=0)
    if n_cand <= CANDS:
        base = tl.sum(tl.where(o_s < part, counts, 0), axis=0)
        o_c = tl.arange(0, CANDS)
        mine = o_c < n_mine
        pos = tl.load(slab + o_c, mask=mine, other=0, cache_modifier=".cg")  # [CANDS]
        tl.store(cand_ptr + base + o_c, pos, mask=mine)
    return zero + 2, n_cand


@triton.jit
def _select_candidates(
    src_ptr, n_cand, cand_ptr, idx_out_ptr, K: tl.constexpr, CANDS: tl.constexpr, BITS: tl.constexpr
):
    """Top-``K`` of the ``n_cand`` (``K <= n_cand <= CANDS``) positions listed in position order at ``cand_ptr``,
    selected in one register tile; their positions go to ``idx_out_ptr[0:K]`` in position order."""
    o_c = tl.arange(0, CANDS)
    ok = o_c < n_cand
    pos = tl.load(cand_ptr + o_c, mask=ok, other=0, cache_modifier=".cg")  # [CANDS]
    key = tl.where(ok, _order_key(_load_row(src_ptr + pos, ok, False)), -2147483647 - 1)
    _select_keys(key, ok, pos, n_cand * 0, idx_out_ptr, K, CANDS, BITS)


# ---------------------------------------------------------------------------------------------------------------------
# kernel
# ---------------------------------------------------------------------------------------------------------------------
@triton.jit
def _indexer_topk_kernel(
    logits_ptr,  # fp32 [rows, >= lengths], unit column stride
    lens_ptr,  # int32 [rows]
    pt_ptr,  # int32 [rows, max_pages] (WRITE_SLOTS only)
    idx_ptr,  # int32 [rows, K] positions (always written: it is also the compaction scratch)
    slot_ptr,  # int32 [rows, K] page-table slots (WRITE_SLOTS only)
    ws_ptr,  # int32 (SPLITS > 1): [ticket | rows counters | rows x HIST_REGION | rows x 3 SPLITS | rows x GROUPS]
    cand_ptr,  # int32 [rows, stride_cand] filter scratch (GROUPS > 0): the row's list [CANDS] (+ SPLITS slabs)
    stride_cand,
    stride_l,
    stride_pt,
    stride_idx,
    stride_slot,
    n_cols,
    n_rows,
    len_max,  # rows longer than this are another launch's (LENGTH_SPLIT): left untouched
    K: tl.constexpr,
    BLOCK: tl.constexpr,
    ROW_SMALL: tl.constexpr,
    ROW_MAX: tl.constexpr,
    STREAM: tl.constexpr,
    WRITE_SLOTS: tl.constexpr,
    PAGE_BITS: tl.constexpr,
    SORT: tl.constexpr,
    SPLITS: tl.constexpr,
    SPAN: tl.constexpr,
    filter_min_span,
    GROUPS: tl.constexpr,
    CANDS: tl.constexpr,
    UNROLL: tl.constexpr,
    RADIX: tl.constexpr,
    REG_SPAN: tl.constexpr,
    REG_BITS: tl.constexpr,
    SPLIT_ROW: tl.constexpr,
    STREAM_BITS: tl.constexpr,
    HIST_REGION: tl.constexpr,
    PREFETCH: tl.constexpr,
):
    # part -1: a solo program (every program of a one-program launch; the first n_rows of a split launch, see the
    # module docstring); split participants take (row, part) from a start ticket.
    pid = tl.program_id(0)
    if SPLITS == 1:
        i_r = pid.to(tl.int64)
        part = pid * 0 - 1
    elif pid < n_rows:
        i_r = pid.to(tl.int64)
        part = pid * 0 - 1
    else:
        ticket = tl.atomic_add(ws_ptr, 1, sem="relaxed", scope="gpu")
        if ticket == n_rows * SPLITS - 1:
            tl.atomic_xchg(ws_ptr, 0, sem="relaxed", scope="gpu")  # the last ticket: ready for the next launch
        i_r = (ticket // SPLITS).to(tl.int64)
        part = ticket % SPLITS
    n = tl.minimum(tl.maximum(tl.load(lens_ptr + i_r), 0), n_cols)
    mine = n <= len_max
    src = logits_ptr + i_r * stride_l
    p_idx = idx_ptr + i_r * stride_idx
    p_slot = slot_ptr + i_r * stride_slot
    p_pt = pt_ptr + i_r * stride_pt
    p_cand = cand_ptr + i_r * stride_cand
    # rows of at most SPLIT_ROW positions stay in one program whatever the span (SPLIT_SPAN by default, see topk_span)
    n_part = tl.where(n > SPLIT_ROW, tl.minimum(tl.maximum(tl.cdiv(n, SPAN), 1), SPLITS), 1)
    if ((n <= K) | (n_part == 1)) & mine:
        if part < 0:
            if SPLITS == 1:
                _topk_row(src, n, p_idx, p_slot, p_pt, K, BLOCK, ROW_SMALL, ROW_MAX, STREAM, WRITE_SLOTS, True,
                          PAGE_BITS, False, SORT, p_cand, GROUPS, CANDS, UNROLL, RADIX, STREAM_BITS,
                          PREFETCH)  # fmt: skip
            else:  # a split launch filters only split rows (its span gate does not apply to one program)
                _topk_row(src, n, p_idx, p_slot, p_pt, K, BLOCK, ROW_SMALL, ROW_MAX, STREAM, WRITE_SLOTS, True,
                          PAGE_BITS, False, SORT, p_cand, 0, 1, 1, RADIX, STREAM_BITS, PREFETCH)  # fmt: skip
    elif (part >= 0) & (part < n_part) & mine:
        rows64 = i_r * 0 + n_rows  # int64: the region offsets grow with the row count
        p_bar = ws_ptr + 1 + i_r
        p_hist = ws_ptr + 1 + rows64 + i_r * HIST_REGION
        p_cnt = ws_ptr + 1 + rows64 * (1 + HIST_REGION) + i_r * (SPLITS * 3)
        p_gmax = ws_ptr + 1 + rows64 * (1 + HIST_REGION + SPLITS * 3) + i_r * GROUPS
        span = tl.cdiv(n, n_part)
        lo = part * span
        hi = tl.minimum(lo + span, n)
        phase = n * 0
        n_cand = n * 0 + CANDS + 1  # more than fit: the radix passes
        if GROUPS > 0:
            if span >= filter_min_span:
                phase, n_cand = _filter_split(src, lo, hi, part, n_part, p_gmax, p_cnt + 2 * SPLITS, p_bar, p_cand,
                                              K, GROUPS, CANDS, UNROLL, SPLITS, RADIX)  # fmt: skip
        if n_cand > CANDS:
            in_regs = n * 0
            if REG_SPAN > 0:
                in_regs = (span <= REG_SPAN).to(tl.int32)
            if in_regs != 0:
                if REG_SPAN > 0:  # compiled only with a tile
                    phase = _select_split_registers(src, lo, hi, part, n_part, p_hist, p_cnt, p_bar, p_idx, K,
                                                    REG_SPAN, SPLITS, REG_BITS, HIST_REGION, phase)  # fmt: skip
            else:
                phase = _select_split(src, lo, hi, part, n_part, p_hist, p_cnt, p_bar, p_idx, K, BLOCK, SPLITS,
                                      STREAM_BITS, HIST_REGION, phase, PREFETCH)  # fmt: skip
        tl.debug_barrier()
        arrived = tl.atomic_add(p_bar, 1, sem="acq_rel", scope="gpu") + 1
        if arrived == (phase + 1) * n_part:
            tl.debug_barrier()
            # the last participant: every other one is past its last read of the row's workspace
            # zero all of it: a later launch with another row count lays the workspace out differently
            o_h = tl.arange(0, HIST_REGION)
            tl.store(p_hist + o_h, tl.zeros([HIST_REGION], dtype=tl.int32), cache_modifier=".cg")
            o_c = tl.arange(0, 4 * SPLITS)  # the 3 SPLITS counts (a power-of-two range, masked)
            tl.store(p_cnt + o_c, tl.zeros([4 * SPLITS], dtype=tl.int32), mask=o_c < 3 * SPLITS, cache_modifier=".cg")
            if GROUPS > 0:
                o_g = tl.arange(0, GROUPS)
                tl.store(p_gmax + o_g, tl.zeros([GROUPS], dtype=tl.int32), cache_modifier=".cg")
            tl.atomic_xchg(p_bar, 0, sem="relaxed", scope="gpu")
            if n_cand <= CANDS:
                _select_candidates(src, n_cand, p_cand, p_idx, K, CANDS, RADIX)
                tl.debug_barrier()
            _finish_row(src, n, p_idx, p_slot, p_pt, K, SORT, WRITE_SLOTS, True, PAGE_BITS, False)


# ---------------------------------------------------------------------------------------------------------------------
# launcher
# ---------------------------------------------------------------------------------------------------------------------
def _topk_block(k: int) -> int:
    """Row elements per radix-pass iteration of the streaming path."""
    return 2048 if k >= 2048 else 1024


def _topk_row_tiles(rows: int, num_sms: int) -> tuple[int, int]:
    """:data:`TOPK_ROW_TILES` when every row gets its own SM; for more rows than SMs only the small tile, so the
    streaming rows keep several programs per SM resident (a shape-only choice: graph-safe)."""
    if rows <= num_sms:
        return TOPK_ROW_TILES
    return TOPK_ROW_TILES[0], TOPK_ROW_TILES[0]


def _topk_paths(k: int, n_cols: int, tiles: tuple[int, int]) -> tuple[int, int, bool]:
    """Register-tile sizes ``(ROW_SMALL, ROW_MAX)`` and whether the streaming path is compiled, from shapes only (so a
    captured CUDA graph replays for any lengths). Tiles never exceed the row capacity's power of two and stay above
    ``k`` (shorter rows need no selection); rows longer than ``ROW_MAX`` stream."""
    cap = triton.next_power_of_2(max(n_cols, 1))
    small = max(min(tiles[0], cap), 2 * k)
    big = max(min(tiles[1], cap), small)
    return small, big, n_cols > big


def _filter_tiles(k: int, row_max: int, tiles: tuple[int, int] | None) -> tuple[int, int]:
    """``(GROUPS, CANDS)`` of the filter path (``GROUPS == 0``: off): powers of two with ``k < GROUPS <= row_max``
    (a row that reaches the filter is longer than its groups) and ``CANDS >= k``."""
    groups, cands = FILTER_TILES[k] if tiles is None else tiles
    if groups == 0:
        return 0, 1
    groups = min(groups, row_max)
    if groups & (groups - 1) or cands & (cands - 1) or groups <= k or cands < k:
        raise ValueError(f"filter tiles must be powers of two with {k} < groups <= {row_max}, cands >= {k}")
    return groups, cands


def _filter_choice(
    k: int,
    rows: int,
    splits: int,
    row_max: int,
    stream: bool,
    wide: bool,
    info: dev.DeviceInfo,
    tiles: tuple[int, int] | None,
    launch_wide: bool = False,
) -> tuple[int, int, int]:
    """``(GROUPS, CANDS, min_span)`` of a launch, from shapes only: explicit ``tiles`` filter every row past the
    register tiles (``min_span`` 0); by default only split launches (``wide``: rows may be longer than a span) of at
    least :data:`FILTER_MIN_PROGRAMS_PER_SM` programs per SM filter, rows whose span reaches :data:`FILTER_MIN_SPAN`;
    wide launches (``launch_wide``, :class:`TopkLaunch`) never."""
    if tiles is not None:
        groups, cands = _filter_tiles(k, row_max, tiles) if stream or (splits > 1 and wide) else (0, 1)
        return groups, cands, 0
    if launch_wide:  # its 16k register spans beat the filter (topk_coarse1_ab4-native-h200.json: 64k 46.7 / 51.1 us)
        return 0, 1, 0
    if splits > 1 and wide and rows * splits >= FILTER_MIN_PROGRAMS_PER_SM * info.num_sms:
        groups, cands = _filter_tiles(k, row_max, None)
        return groups, cands, FILTER_MIN_SPAN[k]
    return 0, 1, 0


def histogram_per_key() -> bool:
    """Whether the Triton compiling the launches lowers ``tl.histogram`` to one shared-memory atomic per key (3.8 and
    newer), which makes wide digits pay (:data:`WIDE_DIGIT_BITS`). Read at every launch from
    ``device.TRITON_VERSION``: a replay of another Triton's cubins (benchmarks/prod_cubins.py) sets it to that
    compiler's, so the launches it makes are the ones that compiler was given."""
    return dev.triton_at_least(3, 8)


def split_reg_bits() -> int:
    """Digit width of the split participants' span-tile radix search: :data:`SPLIT_REG_BITS` (Triton < 3.8),
    :data:`WIDE_DIGIT_BITS` where :func:`histogram_per_key`."""
    return WIDE_DIGIT_BITS if histogram_per_key() else SPLIT_REG_BITS


def radix_bits(k: int, groups: int) -> int:
    """Digit width of the in-register radix search of a top-k launch: :data:`RADIX_BITS`, except
    :data:`RADIX_BITS_WIDE_K` for k = 2048 launches that compile the filter (``groups > 0``). H200, CUDA-graph
    replay, B = 64 (results/bench/explore/topk_radix_bits_ab-*, README): 5-bit digits took a 4k row's top-512 from 21.4
    to 18.6 us and the fused B = 1 4k top-512 from 16.4 to 15.0 us (20 calls per graph), but made the k = 2048 split
    launches with the filter compiled in slower (64 x 16k: 47 -> 64 us, 64 x 64k: 138 -> 193), where 8-bit stays.
    Those are Triton 3.6 times; where :func:`histogram_per_key` (Triton >= 3.8) every launch takes
    :data:`WIDE_DIGIT_BITS`."""
    if histogram_per_key():
        return WIDE_DIGIT_BITS
    return RADIX_BITS_WIDE_K if k >= 2048 and groups > 0 else RADIX_BITS


def hist_region(*bits: int) -> int:
    """Workspace ints a split row's merged histograms take: every pass of the widest search among ``bits`` (passes
    x 2 ** bits), rounded up to a power of two (the last participant zeroes it with one block store)."""
    return triton.next_power_of_2(max(-(-32 // b) << b for b in bits))


def _check_bits(**widths: int) -> None:
    for name, bits in widths.items():
        if bits not in RADIX_BITS_CHOICES:
            raise ValueError(f"{name} must be one of {RADIX_BITS_CHOICES}, got {bits}")


def _check_k(k: int) -> None:
    if k not in TOPK_SIZES:
        raise ValueError(f"k must be one of {TOPK_SIZES}, got {k}")


def topk_splits(rows: int, n_cols: int, info: dev.DeviceInfo) -> int:
    """Programs that may share one row (the grid's second factor), from shapes and the device only: enough for rows
    of ``n_cols`` (more than :data:`SPLIT_SPAN`) to be split into :data:`SPLIT_SPAN_FEW` spans, within about
    :data:`SPLIT_PROGRAMS_PER_SM` programs per SM in all (at most :data:`SPLITS_MAX` and the SM count, a power of
    two). One under the interpreter, which runs programs one at a time (a participant would wait for one that never
    starts)."""
    if info is dev.INTERPRETER or rows == 0 or n_cols <= SPLIT_SPAN:
        return 1  # rows of one SPLIT_SPAN are never shared
    want = triton.cdiv(n_cols, SPLIT_SPAN_FEW)
    room = max(info.num_sms * SPLIT_PROGRAMS_PER_SM // rows, 1)
    # a row's participants wait for each other, so all of them must be resident at once; a program of the k = 2048
    # tiles may be the only one an SM holds (registers): at most one participant per SM (GPUs with < 32 SMs)
    splits = min(want, room, SPLITS_MAX, info.num_sms)
    return 1 if splits < 2 else triton.next_power_of_2(splits + 1) // 2  # the largest power of two <= splits


def topk_span(rows: int, splits: int, info: dev.DeviceInfo) -> int:
    """The shortest span a participant of a split row owns (how many take part is ``cdiv(length, span)``, at most
    ``splits``): :data:`SPLIT_SPAN_FEW` where ``rows * splits`` programs are at most
    :data:`SPLIT_FEW_PROGRAMS_PER_SM` per SM, else :data:`SPLIT_SPAN`. From shapes and the device only. Rows of at
    most :data:`SPLIT_SPAN` positions stay in one program either way."""
    return SPLIT_SPAN_FEW if rows * splits <= SPLIT_FEW_PROGRAMS_PER_SM * info.num_sms else SPLIT_SPAN


def _reg_tile(k: int, span: int) -> int:
    """The register tile split participants hold their span in by :data:`SPLIT_REG_TILE`: the launch's shortest
    ``span``, or 0 (spans stream) where ``k`` streams or the span is not a power of two up to :data:`SPLIT_SPAN`
    (explicit spans from tests)."""
    if not SPLIT_REG_TILE[k] or span & (span - 1) or span > SPLIT_SPAN:
        return 0
    return span


@dataclass(frozen=True)
class TopkLaunch:
    """Launch shape of the top-k kernel, from shapes and the device only (graph-safe): ``splits`` programs that may
    share a row, the shortest participant ``span``, the participants' register tile ``reg_span`` (0: spans stream),
    ``split_row`` (longer rows are split), the one-program register tiles ``row_tiles`` (small, large), ``num_warps``
    and ``wide`` (see :data:`WIDE_MIN_ROWS`)."""

    splits: int
    span: int
    reg_span: int
    split_row: int
    row_tiles: tuple[int, int]
    num_warps: int
    wide: bool = False


def topk_wide(rows: int, n_cols: int, k: int, info: dev.DeviceInfo) -> bool:
    """Whether a launch takes the wide shape (:data:`WIDE_MIN_ROWS`): enough rows to busy the SMs with one program
    each, rows short enough to be held in at most ``WIDE_MAX_COLS // WIDE_SPAN`` register spans, and a ``k`` whose
    spans are held in registers. Never under the interpreter (no split rows there)."""
    return (
        info is not dev.INTERPRETER
        and rows >= WIDE_MIN_ROWS
        and n_cols <= WIDE_MAX_COLS
        and SPLIT_REG_TILE[k]
        and info.num_sms >= WIDE_MAX_COLS // WIDE_SPAN  # a row's participants are resident at once (one per SM)
    )


def smem_spans(rows: int, n_cols: int, k: int, info: dev.DeviceInfo) -> bool:
    """Whether a position-order launch takes the spans in shared memory by default (:data:`SMEM_SPANS`): where the
    wide launch's register spans need more than one wave of participants (one per SM) and an SM holds three of the
    shared-memory ones, so they run in one."""
    if not SMEM_SPANS or not topk_wide(rows, n_cols, k, info) or topk_smem.fits(rows, n_cols, k, info):
        return False
    waves_in_registers = rows * -(-n_cols // WIDE_SPAN) > info.num_sms
    return waves_in_registers and topk_smem.resident(info) >= 3


def choose_topk_launch(rows: int, n_cols: int, k: int, info: dev.DeviceInfo, wide: bool | None = None) -> TopkLaunch:
    """The top-k kernel's launch for ``rows`` rows of capacity ``n_cols`` and ``k`` on ``info``: the wide shape
    where :func:`topk_wide` (or ``wide``, forced by tests and sweeps), else 8-warp programs with :func:`topk_splits`,
    :func:`topk_span`, :func:`_reg_tile` and :func:`_topk_row_tiles`."""
    if topk_wide(rows, n_cols, k, info) if wide is None else wide:
        splits = 1 if n_cols <= WIDE_SPAN else triton.next_power_of_2(triton.cdiv(n_cols, WIDE_SPAN))
        reg_span = WIDE_SPAN if SPLIT_REG_TILE[k] else 0
        return TopkLaunch(splits, WIDE_SPAN, reg_span, WIDE_SPAN, (TOPK_ROW_TILES[0], WIDE_SPAN), WIDE_WARPS, True)
    splits = topk_splits(rows, n_cols, info)
    span = topk_span(rows, splits, info)
    return TopkLaunch(splits, span, _reg_tile(k, span), SPLIT_SPAN, _topk_row_tiles(rows, info.num_sms), TOPK_WARPS)


class _SplitWorkspace:
    """Grow-only, zero-filled int32 workspace per device for split rows: the start ticket, per-row arrival counters,
    histograms, span counts and group maxima. Every launch leaves all of it at zero (launches with other row counts
    lay it out differently). Warm up every shape before CUDA-graph capture so that no growth happens inside one; an
    outgrown buffer is kept alive, since a graph captured earlier may still use it."""

    def __init__(self) -> None:
        self.bufs: dict[torch.device, torch.Tensor] = {}
        self.retired: list[torch.Tensor] = []  # outgrown buffers: a captured CUDA graph may still point at one

    @staticmethod
    def ints(rows: int, splits: int, groups: int, region: int) -> int:
        return 1 + rows * (1 + region + 3 * splits + groups)

    def get(self, device: torch.device, rows: int, splits: int, groups: int, region: int) -> torch.Tensor:
        need = self.ints(rows, splits, max(groups, _WS_GROUPS), region)  # one size for every k: fewer regrowths
        buf = self.bufs.get(device)
        if buf is None or buf.numel() < need:
            if buf is not None:
                self.retired.append(buf)
            buf = torch.zeros(need, dtype=torch.int32, device=device)
            self.bufs[device] = buf
        return buf


_SPLIT_WS = _SplitWorkspace()


def indexer_topk_fwd(
    logits: torch.Tensor,
    lengths: torch.Tensor,
    k: int,
    *,
    out: torch.Tensor | None = None,
    page_table: torch.Tensor | None = None,
    page_size: int = IDX_PAGE,
    out_slots: torch.Tensor | None = None,
    sorted: bool = True,
    row_tiles: tuple[int, int] | None = None,
    splits: int | None = None,
    span: int | None = None,
    filter_tiles: tuple[int, int] | None = None,
    reg_span: int | None = None,
    reg_bits: int | None = None,
    split_row: int | None = None,
    bits: int | None = None,
    stream_bits: int | None = None,
    wide: bool | None = None,
    block: int | None = None,
    prefetch: bool | None = None,
    smem: bool | None = None,
    length_max: int | None = None,
) -> torch.Tensor:
    """Top-``k`` positions ``[rows, k]`` int32 among ``t < lengths[row]``, -1 padded: by (value desc, position asc)
    with ``sorted``, else by ascending position (the same set).

    With ``page_table`` [rows, max_pages] int32 also writes ``out_slots`` [rows, k] with
    ``page_table[row, pos // page_size] * page_size + pos % page_size`` (-1 padded). Returns the positions.
    ``row_tiles`` overrides the register tiles of :func:`_topk_row_tiles`, ``splits`` the programs per row of
    :func:`topk_splits`, ``span`` the shortest participant span of :func:`topk_span` and ``filter_tiles``
    :data:`FILTER_TILES` (``(0, 0)``: rows past the register tiles stream), ``reg_span`` / ``reg_bits``
    the span tile of :data:`SPLIT_REG_TILE` / :data:`SPLIT_REG_BITS` (``reg_span=0``: split spans always stream),
    ``split_row`` the longest row that stays in one program in a split launch (:data:`SPLIT_SPAN`), ``bits`` the
    digits of the in-register searches (:func:`radix_bits`) and ``stream_bits`` those of the streaming passes
    (:data:`STREAM_BITS`), ``wide`` the launch shape (:func:`choose_topk_launch`: by default :func:`topk_wide`),
    ``block`` the streaming loops' piece (:func:`_topk_block`) and ``prefetch`` whether they load a piece ahead
    (:data:`STREAM_PREFETCH`); tests and sweeps use these to reach every path. ``smem``: the spans in shared memory
    (:mod:`~sparsemla.kernels.indexer.topk_smem`, position order only; by default where :func:`smem_spans`);
    ``smem=True`` where that kernel cannot run raises ValueError with the reason. ``length_max``: rows longer than
    this are left untouched (another launch writes them, see :data:`LENGTH_SPLIT`); the launch is chosen for rows of
    at most that many positions."""
    _check_k(k)
    if logits.dim() != 2 or logits.dtype != torch.float32 or logits.stride(1) != 1:
        got = f"{logits.dtype} {list(logits.shape)}"
        raise ValueError(f"logits must be fp32 [rows, cols] with unit column stride, got {got}")
    rows = logits.shape[0]
    lengths = lengths.reshape(-1)
    if lengths.numel() != rows or lengths.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"lengths must be int [rows={rows}], got {lengths.dtype} {list(lengths.shape)}")
    lengths = lengths.to(torch.int32)
    if out is None:
        out = torch.empty((rows, k), dtype=torch.int32, device=logits.device)
    if out.shape != (rows, k) or out.dtype != torch.int32 or out.stride(1) != 1:
        raise ValueError(f"out must be int32 [{rows}, {k}] with unit column stride")
    write_slots = page_table is not None
    if write_slots:
        if page_size & (page_size - 1):
            raise ValueError(f"page_size must be a power of two, got {page_size}")
        if out_slots is None or out_slots.shape != (rows, k) or out_slots.dtype != torch.int32:
            raise ValueError(f"out_slots must be int32 [{rows}, {k}] when page_table is given")
        if page_table.dtype != torch.int32 or page_table.shape[0] != rows:
            raise ValueError(f"page_table must be int32 [{rows}, max_pages]")
    if rows == 0:
        return out
    pt = page_table if write_slots else lengths
    slots = out_slots if write_slots else out
    if length_max is not None and (smem or length_max < 0):
        raise ValueError(f"length_max must be >= 0 and takes the Triton kernel (smem=False), got {length_max}")
    info = dev.launch_info(logits.device)
    if smem:
        why = (
            "it writes position order only (sorted=False)" if sorted else topk_smem.fits(rows, logits.shape[1], k, info)
        )
        if why:
            raise ValueError(f"smem=True: the shared-memory top-k cannot take this launch: {why}")
    if smem or (smem is None and length_max is None and not sorted and smem_spans(rows, logits.shape[1], k, info)):
        ws = _SPLIT_WS.get(logits.device, rows, topk_smem.SMEM_SPLITS, 0, topk_smem.workspace_region())
        if smem is None and LENGTH_SPLIT:
            return _length_split(logits, lengths, k, out, page_table, out_slots, page_size, ws)
        return topk_smem.topk_smem_fwd(logits, lengths, k, out, page_table, out_slots, page_size, ws)
    cols = logits.shape[1] if length_max is None else min(logits.shape[1], length_max)  # what the launch is chosen for
    if wide is None and any(x is not None for x in (splits, span, reg_span, split_row, row_tiles)):
        wide = False  # explicit knobs tune the 8-warp launch (tests and sweeps); ``wide=True`` with them: the wide one
    launch = choose_topk_launch(rows, cols, k, info, wide)
    n_split = launch.splits if splits is None else splits
    if n_split < 1 or n_split & (n_split - 1) or (n_split > 1 and info is dev.INTERPRETER):
        raise ValueError(f"splits must be a power of two >= 1 (1 under the interpreter), got {n_split}")
    if span is None:
        span = launch.span if splits is None or launch.wide else topk_span(rows, n_split, info)
    if span < 1:
        raise ValueError(f"span must be >= 1, got {span}")
    if reg_span is None:
        reg_span = launch.reg_span if span == launch.span else _reg_tile(k, span)
    reg_bits = split_reg_bits() if reg_bits is None else reg_bits
    stream_bits = STREAM_BITS if stream_bits is None else stream_bits
    if reg_span < 0 or reg_span & (reg_span - 1) or reg_span > 32768:
        raise ValueError(f"reg_span must be 0 or a power of two <= 32768, got {reg_span}")
    tiles = row_tiles or launch.row_tiles
    row_small, row_max, stream = _topk_paths(k, cols, tiles)
    groups, cands, min_span = _filter_choice(k, rows, n_split, row_max, stream, cols > span, info,
                                             filter_tiles, launch.wide)  # fmt: skip
    bits = radix_bits(k, groups) if bits is None else bits
    _check_bits(bits=bits, reg_bits=reg_bits, stream_bits=stream_bits)
    block = _topk_block(k) if block is None else block
    if block < 256 or block > 16384 or block & (block - 1):
        raise ValueError(f"block must be a power of two in [256, 16384], got {block}")
    prefetch = STREAM_PREFETCH if prefetch is None else bool(prefetch)
    region = hist_region(reg_bits, stream_bits)
    ws = _SPLIT_WS.get(logits.device, rows, n_split, groups, region) if n_split > 1 else lengths
    cand_cols = cands * (n_split + 1 if n_split > 1 else 1)
    cand = torch.empty((rows, cand_cols), dtype=torch.int32, device=logits.device) if groups else lengths
    grid = rows * (n_split + 1) if n_split > 1 else rows  # split launches: a solo program per row + participants
    _indexer_topk_kernel[(grid,)](
        logits,
        lengths,
        pt,
        out,
        slots,
        ws,
        cand,
        cand_cols,
        logits.stride(0),
        pt.stride(0),
        out.stride(0),
        slots.stride(0),
        logits.shape[1],
        rows,
        cols,  # rows past it are another launch's (a row's length never exceeds logits.shape[1])
        K=k,
        BLOCK=block,
        ROW_SMALL=row_small,
        ROW_MAX=row_max,
        STREAM=stream,
        WRITE_SLOTS=write_slots,
        PAGE_BITS=max(page_size.bit_length() - 1, 0),
        SORT=sorted,
        SPLITS=n_split,
        SPAN=span,
        filter_min_span=min_span,
        GROUPS=groups,
        CANDS=cands,
        UNROLL=FILTER_UNROLL,
        RADIX=bits,
        REG_SPAN=reg_span if n_split > 1 else 0,
        REG_BITS=reg_bits,
        SPLIT_ROW=launch.split_row if split_row is None else max(split_row, 0),
        STREAM_BITS=stream_bits,
        HIST_REGION=region,
        PREFETCH=prefetch,
        num_warps=launch.num_warps,
        maxnreg=TOPK_MAXNREG if n_split > 1 and reg_span > 0 else None,
    )
    return out


_SIDE_STREAMS: dict[torch.device, torch.cuda.Stream] = {}


def _length_split(
    logits: torch.Tensor,
    lengths: torch.Tensor,
    k: int,
    out: torch.Tensor,
    page_table: torch.Tensor | None,
    out_slots: torch.Tensor | None,
    page_size: int,
    ws: torch.Tensor,
) -> torch.Tensor:
    """:data:`LENGTH_SPLIT`: rows longer than WIDE_SPAN in the shared-memory spans on a side stream forked from the
    current one, the others in the register launch on the current stream, joined back before returning (inputs and
    outputs are freed, if ever, on the current stream after the join). The side stream is a high-priority one (the
    callers' streams, a graph's capture stream included, are not), created at the first, eager, call."""

    def registers(length_max: int | None) -> torch.Tensor:
        return indexer_topk_fwd(logits, lengths, k, out=out, page_table=page_table, page_size=page_size,
                                out_slots=out_slots, sorted=False, smem=False, length_max=length_max)  # fmt: skip

    def shared_memory() -> None:
        topk_smem.topk_smem_fwd(logits, lengths, k, out, page_table, out_slots, page_size, ws, len_min=WIDE_SPAN)

    if logits.shape[1] <= WIDE_SPAN:  # no row for the shared-memory spans (smem_spans took it for its row count)
        return registers(None)
    if logits.device.type != "cuda":  # ahead-of-time compiles (compile-only, CPU tensors): the two launches in order
        shared_memory()
        return registers(WIDE_SPAN)
    main = torch.cuda.current_stream(logits.device)
    side = _SIDE_STREAMS.get(logits.device)
    if side is None:
        side = _SIDE_STREAMS[logits.device] = torch.cuda.Stream(logits.device, priority=-1)
    side.wait_stream(main)
    with torch.cuda.stream(side):
        shared_memory()
    registers(WIDE_SPAN)
    main.wait_stream(side)
    return out


__all__ = [
    "FILTER_TILES",
    "FUSED_ROW_TILES",
    "RADIX_BITS_CHOICES",
    "SPLIT_REG_TILE",
    "STREAM_BITS",
    "TOPK_MAXNREG",
    "TOPK_ROW_TILES",
    "TOPK_SIZES",
    "TOPK_WARPS",
    "WIDE_MAX_COLS",
    "WIDE_MIN_ROWS",
    "WIDE_SPAN",
    "WIDE_WARPS",
    "TopkLaunch",
    "choose_topk_launch",
    "indexer_topk_fwd",
    "topk_span",
    "topk_splits",
    "topk_wide",
]
