"""Lightning-indexer Triton kernels on Triton's CPU interpreter (tiny shapes), plus dispatch and input checks.

The interpreter is chosen when ``@triton.jit`` runs, so a fixture reloads ``sparsemla.kernels.indexer.topk`` and
``.triton`` with ``TRITON_INTERPRET=1`` and reloads them back afterwards."""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

from sparsemla import flags
from sparsemla.kernels import device as dev
from sparsemla.kernels import layouts
from sparsemla.kernels.indexer import api, topk
from sparsemla.kernels.indexer import triton as triton_mod
from sparsemla.kernels.indexer.reference import indexer_logits_reference, indexer_topk_reference, row_lengths


@pytest.fixture(scope="module")
def tri():
    mp = pytest.MonkeyPatch()
    mp.setenv("TRITON_INTERPRET", "1")
    import sparsemla.kernels.indexer.triton as module

    importlib.reload(topk)  # first: the logits kernel's fused tail calls topk's device functions
    yield importlib.reload(module)
    mp.undo()
    importlib.reload(topk)
    importlib.reload(module)


def _inputs(seq: list[int], next_n: int, max_pages: int, seed: int, heads: int = 64, lens_2d: bool = False):
    g = torch.Generator().manual_seed(seed)
    seq_lens = torch.tensor(seq, dtype=torch.int32)
    need = sum(-(-s // 64) for s in seq) + 3
    kv = layouts.random_indexer_cache(need, generator=g)
    pt = layouts.random_page_table(seq_lens, max_pages, need, generator=g)
    q = (torch.randn(len(seq), next_n, heads, 128, generator=g) * 2).to(torch.float8_e4m3fn)
    w = torch.randn(len(seq) * next_n, heads, generator=g)
    if lens_2d:
        seq_lens = seq_lens.view(-1, 1)
    return q, kv, w, seq_lens, pt


@pytest.mark.parametrize(
    "seq, next_n, lens_2d, swap_ab",
    [
        pytest.param([70, 0, 1], 1, False, False, id="B3-n1-L70,0,1"),
        pytest.param([130, 64], 2, True, True, id="B2-n2-L130,64-swapAB"),
    ],
)
def test_logits_match_reference_and_leave_tail_unwritten(tri, seq, next_n, lens_2d, swap_ab):
    """Every position below a row's length equals the fp32 reference; a NaN-poisoned output keeps NaN past it."""
    q, kv, w, seq_lens, pt = _inputs(seq, next_n, max_pages=5, seed=len(seq) + next_n, lens_2d=lens_2d)
    cap = pt.shape[1] * 64
    out = torch.full((len(seq) * next_n, cap), float("nan"))
    tri._launch_logits(q, kv, w, seq_lens, pt, out, cap, swap_ab=swap_ab)
    ref = indexer_logits_reference(q, kv, w, seq_lens, pt, None, cap, True)
    lens = row_lengths(seq_lens, len(seq), next_n, cap)
    written = torch.arange(cap)[None, :] < lens[:, None]
    assert torch.isfinite(out[written]).all()
    assert torch.isnan(out[~written]).all()
    err = (out[written] - ref[written]).norm() / ref[written].norm()
    assert err < 1e-5


def test_clean_logits_and_per_row_lengths(tri):
    """[B, next_n] lengths are used per row; clean_logits writes -inf past them; max_seq_len narrower than the table."""
    q, kv, w, _, pt = _inputs([100, 40], 2, max_pages=3, seed=7)
    seq_lens = torch.tensor([[90, 100], [0, 37]], dtype=torch.int32)
    out = tri.indexer_logits_fwd(q, kv, w, seq_lens, pt, 150, True)
    ref = indexer_logits_reference(q, kv, w, seq_lens, pt, None, 150, True)
    assert out.shape == (4, 150)
    assert torch.equal(torch.isinf(out), torch.isinf(ref))
    fin = torch.isfinite(ref)
    assert torch.allclose(out[fin], ref[fin], rtol=1e-5, atol=1e-6)


def test_topk_exact_with_ties(tri):
    """Top-512 equals the reference exactly (order too) with many tied values, -0.0 vs +0.0, short and empty rows;
    a negative length counts as 0 and one past the capacity as the capacity, in the kernel and the reference alike."""
    g = torch.Generator().manual_seed(3)
    logits = torch.round(torch.randn(6, 1400, generator=g) * 4) / 4  # heavy ties
    logits[1, :200] = 0.0
    logits[1, 200:400] = -0.0
    lengths = torch.tensor([1400, 700, 300, 0, -3, 1405], dtype=torch.int32)
    out = torch.full((6, 512), -7, dtype=torch.int32)
    topk.indexer_topk_fwd(logits, lengths, 512, out=out)
    assert torch.equal(out, indexer_topk_reference(logits, lengths, 512))
    assert (out[2, 300:] == -1).all() and (out[3] == -1).all() and (out[4] == -1).all()
    assert torch.equal(out[5], indexer_topk_reference(logits[5:], torch.tensor([1400]), 512)[0])


def _digit_cases() -> list:
    """(where, digit width, pass): every pass of every width the kernels accept (topk.RADIX_BITS_CHOICES), in the
    in-register search (one-program rows, ``bits``) and in the streaming passes (``stream_bits``)."""
    cases = []
    for where in ("registers", "streaming"):
        for bits in topk.RADIX_BITS_CHOICES:
            for p in range(1, -(-32 // bits) + 1):
                cases.append(pytest.param(where, bits, p, id=f"{where}-{bits}bit-exit-after-pass{p}"))
    return cases


@pytest.mark.parametrize("where, bits, passes", _digit_cases())
def test_topk_radix_digit_edges(tri, where, bits, passes):
    """Rows built bit by bit so the radix search (``bits``-wide digits from the top, the last one narrower) ends
    after each of its passes: 500 keys win outright, the threshold bin holds the 12 keys still needed, and losers
    whose keys differ from those only in the digit's lowest bit sit at smaller positions -- a pass that ended one bit
    short, or a wrong digit boundary, takes them instead. ``streaming``: a 1024-key register tile, so the 2048-key
    row streams (the interpreter runs one program per row: no split, no filter)."""
    n, k, take = 2048, 512, 12
    top = 32 - bits * (passes - 1)  # the deciding digit is bits [shift, top) of the sign-flipped key
    shift = max(top - bits, 0)
    width = top - shift
    assert width >= 2
    one = 0x3F800000  # 1.0: positive floats, so the order key is the bit pattern and the sign flip sets bit 31
    common = (one >> top << top) if top < 32 else 0  # the digits above the deciding one: those of 1.0
    if passes == 1:  # the top digit holds the sign bit and the exponent's top: stay at or below 1.0's (finite)
        win_d = (one >> shift) & ((1 << width) - 1)
        lose = (win_d - 2) & ~1
    else:
        win_d, lose = (1 << width) - 1, 0
    thr = lose + 1  # the digit's lowest bit alone separates the threshold bin from the losers
    bits_row = torch.full((n,), common | (lose << shift), dtype=torch.int64)
    bits_row[:500] = common | (win_d << shift)  # outright winners
    win = torch.arange(n - take, n)
    bits_row[win] = common | (thr << shift)  # the threshold bin, at the end of the row
    bits_row |= 0x15 & ((1 << shift) - 1)  # the same lower bits everywhere: never deciding
    logits = bits_row.to(torch.int32).view(torch.float32).view(1, n)
    assert torch.isfinite(logits).all() and (logits > 0).all()
    out = torch.full((1, k), -7, dtype=torch.int32)
    kw = dict(bits=bits) if where == "registers" else dict(row_tiles=(1024, 1024), stream_bits=bits)
    topk.indexer_topk_fwd(logits, torch.tensor([n], dtype=torch.int32), k, out=out, sorted=False, **kw)
    assert torch.equal(out[0], torch.cat([torch.arange(500), win]).to(torch.int32))


@pytest.mark.parametrize("bits", [5, 8, 11], ids=lambda b: f"{b}bit")
@pytest.mark.parametrize("where", ["registers", "streaming"])
def test_radix_search_counts_its_own_keys_above_and_at_the_threshold(tri, where, bits):
    """What a split participant places its winners by, read off the search's own histograms (``COUNTS``): how many
    keys lie above the threshold's settled bits and how many share them, against a count over the keys themselves,
    on random, tied and all-equal rows (early stops after every pass), in registers and streaming."""
    import triton
    import triton.language as tl

    @triton.jit  # defined here: the fixture has made triton.jit interpret
    def _probe_kernel(x_ptr, n, out_ptr, K: tl.constexpr, BITS: tl.constexpr, ROW: tl.constexpr, BLOCK: tl.constexpr):
        o = tl.arange(0, ROW)
        valid = o < n
        key = topk._order_key(tl.load(x_ptr + o, mask=valid, other=0.0))  # [ROW]
        zero = n * 0
        prefix, low, k_rem, _, n_above, n_in = topk._radix_threshold(
            key ^ (-2147483647 - 1), valid, zero, K, BITS, 2147483647, zero, zero, zero, 0, False, x_ptr, zero, n,
            BLOCK, False, True)  # fmt: skip
        tl.store(out_ptr + 0, prefix ^ (-2147483647 - 1))
        tl.store(out_ptr + 1, low)
        tl.store(out_ptr + 2, k_rem)
        tl.store(out_ptr + 3, n_above)
        tl.store(out_ptr + 4, n_in)

    g = torch.Generator().manual_seed(bits)
    k, n = 100, 1500
    rows = [torch.randn(n, generator=g), torch.round(torch.randn(n, generator=g) * 2) / 2, torch.full((n,), 0.75),
            torch.randn(n, generator=g) * 1e-30]  # fmt: skip
    for x in rows:
        out = torch.zeros(5, dtype=torch.int32)
        _probe_kernel[(1,)](x, n, out, K=k, BITS=bits, ROW=2048, BLOCK=256 if where == "streaming" else 0)
        prefix, low, k_rem, n_above, n_in = out.tolist()
        raw = (x + 0.0).view(torch.int32).long()  # + 0.0: -0.0 becomes +0.0, as in the kernel
        hk = (raw ^ ((raw >> 31) & 0x7FFFFFFF)) >> low  # order keys
        thr = prefix >> low
        assert n_above == int((hk > thr).sum()) == k - k_rem
        assert n_in == int((hk == thr).sum()) and 1 <= k_rem <= n_in


def test_topk_page_transform(tri):
    """With a page table the kernel also writes page_table[pos // 64] * 64 + pos % 64 (-1 padded)."""
    g = torch.Generator().manual_seed(4)
    logits = torch.randn(2, 900, generator=g)
    lengths = torch.tensor([900, 100], dtype=torch.int32)
    table = torch.randperm(64, generator=g)[:30].view(2, 15).to(torch.int32)
    pos = torch.empty(2, 512, dtype=torch.int32)
    slots = torch.full((2, 512), -7, dtype=torch.int32)
    topk.indexer_topk_fwd(logits, lengths, 512, out=pos, page_table=table, page_size=64, out_slots=slots)
    ref = indexer_topk_reference(logits, lengths, 512)
    assert torch.equal(pos, ref)
    assert torch.equal(slots.long(), _page_slots(ref, table))


def test_fused_logits_topk(tri):
    """One launch (logits into the workspace, last program per request selects) equals top-k of the logits; the
    per-request counters are back at zero for the next launch."""
    q, kv, w, seq_lens, pt = _inputs([600, 40], 1, max_pages=12, seed=11)
    cap = pt.shape[1] * 64
    out = tri.indexer_logits_topk_fwd(q, kv, w, seq_lens, pt, 512)
    logits = tri.indexer_logits_fwd(q, kv, w, seq_lens, pt, cap, True)
    assert torch.equal(out, indexer_topk_reference(logits, row_lengths(seq_lens, 2, 1, cap), 512))
    assert int(tri._WORKSPACE.counters[q.device].sum()) == 0


def _by_position(ref: torch.Tensor) -> torch.Tensor:
    """The reference's positions in ascending order per row (``sorted=False``), -1 padded."""
    return torch.where(ref >= 0, ref, 1 << 30).sort(dim=1).values.masked_fill(ref < 0, -1)


def _page_slots(pos: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """int64 page slots of positions ``pos`` through ``table`` (64-token pages), -1 where ``pos`` is."""
    p = pos.clamp(min=0).long()
    return torch.where(pos >= 0, table.long().gather(1, p // 64) * 64 + p % 64, -1)


def _hard_rows(lengths: list[int], cols: int, k: int, seed: int) -> torch.Tensor:
    """Rows that stress the threshold search, cycled over the rows: heavy ties, negatives, +-0.0, +-inf, one value
    everywhere, exactly k copies of the largest value (the first radix pass settles it), plain random ones."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for r in range(len(lengths)):
        kind = r % 6
        if kind == 0:
            x = torch.round(torch.randn(cols, generator=g) * 3) / 3  # a few dozen distinct values
        elif kind == 1:
            x = torch.randn(cols, generator=g) - 2.0
            x[torch.rand(cols, generator=g) < 0.3] = 0.0
            x[torch.rand(cols, generator=g) < 0.3] = -0.0
        elif kind == 2:
            x = torch.randn(cols, generator=g)
            x[torch.randint(0, cols, (40,), generator=g)] = float("inf")
            x[torch.randint(0, cols, (40,), generator=g)] = float("-inf")
        elif kind == 3:
            x = torch.full((cols,), -1.5)
        elif kind == 4:
            x = torch.exp2(torch.randint(-20, 20, (cols,), generator=g).float())
            n = max(lengths[r], 1)
            x[torch.randperm(n, generator=g)[:k]] = 2.0**30
        else:
            x = torch.randn(cols, generator=g) * 1e3
        rows.append(x)
    return torch.stack(rows)


def test_topk_paths_from_shapes_only(tri):
    """Tile sizes depend on k, the row capacity and the row count only; a tile never exceeds the capacity's power of
    two, stays above k, rows past the larger tile stream, and more rows than SMs drop the large tile."""
    tiles = (4096, 16384)
    assert topk._topk_paths(512, 65536, tiles) == (4096, 16384, True)
    assert topk._topk_paths(512, 16384, tiles) == (4096, 16384, False)
    assert topk._topk_paths(512, 3000, tiles) == (4096, 4096, False)
    assert topk._topk_paths(512, 600, tiles) == (1024, 1024, False)
    assert topk._topk_paths(2048, 1000, tiles) == (4096, 4096, False)
    assert topk._topk_paths(2048, 10000, tiles) == (4096, 16384, False)
    assert topk._topk_paths(512, 5000, (1024, 2048)) == (1024, 2048, True)
    sms = dev.launch_info(torch.device("cpu")).num_sms
    assert topk._topk_row_tiles(sms, sms) == topk.TOPK_ROW_TILES
    assert topk._topk_row_tiles(sms + 1, sms) == (topk.TOPK_ROW_TILES[0],) * 2


def test_topk_every_path_at_tile_edges(tri):
    """Small register tiles (1024, 2048) so one call walks every path: length <= k, the small tile, the large tile
    and streaming, at k, k + 1 and each tile's edges, on rows built to break the radix search."""
    k = 512
    lengths = [0, 1, k - 1, k, k + 1, 1023, 1024, 1025, 2047, 2048, 2049, 2600]
    logits = _hard_rows(lengths, 2600, k, seed=23)  # rows settle after 1, 2, 3 and 4 radix passes
    lens = torch.tensor(lengths, dtype=torch.int32)
    out = torch.full((len(lengths), k), -7, dtype=torch.int32)
    topk.indexer_topk_fwd(logits, lens, k, out=out, row_tiles=(1024, 2048))
    assert torch.equal(out, indexer_topk_reference(logits, lens, k))


@pytest.mark.parametrize(
    ("block", "prefetch"), [(256, False), (256, True), (1024, True)], ids=["block256", "block256-prefetch",
                                                                          "block1024-prefetch"]
)  # fmt: skip
def test_topk_streaming_pieces_and_prefetch(tri, block, prefetch):
    """Rows past a 1024-key register tile stream in ``block`` pieces, loaded in place or one piece ahead
    (``prefetch``: the last piece's look-ahead lies past the row, fully masked), at lengths one past a piece, on a
    piece's edge and between; both orders equal the reference and the -7 poison is gone."""
    k = 512
    lengths = [1025, 1279, 1280, 1536, 2048, 2049, 2600]
    logits = _hard_rows(lengths, 2600, k, seed=block + prefetch)
    lens = torch.tensor(lengths, dtype=torch.int32)
    for ordered in (True, False):
        out = torch.full((len(lengths), k), -7, dtype=torch.int32)
        topk.indexer_topk_fwd(logits, lens, k, out=out, row_tiles=(1024, 1024), block=block, prefetch=prefetch,
                              sorted=ordered)  # fmt: skip
        ref = indexer_topk_reference(logits, lens, k)
        if not ordered:
            ref = ref.sort(dim=1).values  # every row is longer than k: no -1 padding
        assert torch.equal(out, ref), (block, prefetch, ordered)


@pytest.mark.parametrize("width", [4, 11, 12], ids=lambda w: f"{w}bit")
def test_topk_digit_widths_on_hard_rows(tri, width):
    """Every digit width agrees with the reference on the rows built to break the search (ties, +-0.0, +-inf, all
    equal, exactly k copies of the largest) in both one-program paths: registers (``bits``) and streaming
    (``stream_bits``, rows past a register tile of 2k), at lengths around k and the tile."""
    k = 512
    lengths = [k - 1, k + 1, 2 * k, 2 * k + 1, 3 * k + 5, 2600]
    cols = max(lengths)
    logits = _hard_rows(lengths, cols, k, seed=width + k)
    lens = torch.tensor(lengths, dtype=torch.int32)
    ref = indexer_topk_reference(logits, lens, k)
    out = torch.full((len(lengths), k), -7, dtype=torch.int32)
    topk.indexer_topk_fwd(logits, lens, k, out=out, row_tiles=(2 * k, 2 * k), bits=width, stream_bits=width)
    assert torch.equal(out, ref)


@pytest.mark.parametrize(
    ("k", "tiles", "filt"),
    [(512, (1024, 1024), (1024, 1024)), (1024, (2048, 2048), (2048, 2048))],
    ids=["k512-g1024-c1024", "k1024-g2048-c2048"],
)
def test_topk_filter_path_and_its_fallback(tri, k, tiles, filt):
    """Rows past the register tiles take the two-pass filter (group maxima -> candidates -> one register tile):
    random, ascending, tie-heavy and -inf-tailed rows; an all-equal row has more candidates than the tile and falls
    back to streaming. Both orders equal the reference; the padding is written (-7 poison gone)."""
    g = torch.Generator().manual_seed(31)
    cols = 5000
    logits = torch.randn(7, cols, generator=g)
    logits[1] = torch.sort(logits[1]).values  # ascending: the largest keys all sit at the end
    logits[2] = torch.round(logits[2] * 4) / 4  # heavy ties at the threshold
    logits[3] = 0.25  # all equal: every key passes the filter
    logits[4, 2000:] = float("-inf")
    logits[5] = torch.sort(logits[5], descending=True).values
    lengths = torch.tensor([cols, 4100, 3500, 2600, 4999, tiles[1] + 1, 3001], dtype=torch.int32)
    ref = indexer_topk_reference(logits, lengths, k)
    for srt in (True, False):
        out = torch.full((7, k), -7, dtype=torch.int32)
        topk.indexer_topk_fwd(logits, lengths, k, out=out, row_tiles=tiles, filter_tiles=filt, sorted=srt)
        expect = ref if srt else _by_position(ref)
        assert torch.equal(out, expect), f"sorted={srt}"


def test_filter_runs_where_it_was_measured_faster():
    """By default the two-pass filter runs only in split launches of >= 2 programs per SM (rows longer than a span),
    from a per-k minimum span; explicit tiles filter every long row; k = 1024 (not measured) never by default."""
    info = dev.target("sm_90")
    g512, c512 = topk.FILTER_TILES[512]
    assert topk._filter_choice(512, 64, 8, 4096, False, True, info, None) == (g512, c512, topk.FILTER_MIN_SPAN[512])
    assert topk._filter_choice(512, 1, 16, 4096, False, True, info, None) == (0, 1, 0)  # 16 programs: radix passes
    assert topk._filter_choice(512, 64, 8, 4096, False, False, info, None) == (0, 1, 0)  # no row is longer than a span
    assert topk._filter_choice(512, 512, 1, 4096, True, True, info, None) == (0, 1, 0)  # single-program rows stream
    assert topk._filter_choice(1024, 64, 8, 4096, False, True, info, None) == (0, 1, topk.FILTER_MIN_SPAN[1024])
    assert topk._filter_choice(512, 1, 1, 1024, True, True, info, (1024, 1024)) == (1024, 1024, 0)
    assert topk._filter_choice(512, 1, 1, 4096, False, True, info, (1024, 1024)) == (0, 1, 0)  # nothing streams


def test_split_spans_use_register_tiles_where_measured_faster():
    """The register tile is the launch's shortest span for k = 512 and 2048 (measured with TOPK_MAXNREG); k = 1024
    streams; spans that are not a power of two or longer than SPLIT_SPAN (explicit, from tests) stream."""
    assert topk._reg_tile(2048, 4096) == 4096 and topk._reg_tile(2048, 1024) == 1024
    assert topk._reg_tile(512, 4096) == 4096 and topk._reg_tile(512, 1024) == 1024 and topk._reg_tile(1024, 1024) == 0
    assert topk.TOPK_MAXNREG is not None and topk.TOPK_MAXNREG >= 96  # k = 512's tile spills under ptxas's 64
    assert topk._reg_tile(2048, 3000) == 0 and topk._reg_tile(2048, 8192) == 0


@pytest.mark.parametrize("arch", ["sm_90", "sm_120"])
def test_split_rows_take_more_participants_when_few_rows(arch):
    """Few rows: up to SPLITS_MAX programs per row of 1024-position spans (the SMs are otherwise idle); many rows keep
    4096-position spans; the grid stays within SPLIT_PROGRAMS_PER_SM programs per SM; one program on the interpreter."""
    info = dev.target(arch)
    for rows in (1, 4, 8, 64, 300):
        splits = topk.topk_splits(rows, 65536, info)
        assert splits & (splits - 1) == 0 and splits <= topk.SPLITS_MAX
        assert splits == 1 or rows * splits <= info.num_sms * topk.SPLIT_PROGRAMS_PER_SM
        few = rows * splits <= topk.SPLIT_FEW_PROGRAMS_PER_SM * info.num_sms
        assert topk.topk_span(rows, splits, info) == (topk.SPLIT_SPAN_FEW if few else topk.SPLIT_SPAN)
    assert topk.topk_splits(1, 65536, info) == topk.SPLITS_MAX and topk.topk_span(1, 32, info) == 1024
    assert topk.topk_span(64, topk.topk_splits(64, 65536, info), info) == 4096
    assert topk.topk_splits(8, topk.SPLIT_SPAN, info) == 1  # rows of one SPLIT_SPAN stay in one program
    assert topk.topk_splits(8, topk.SPLIT_SPAN + 1, info) == 4
    assert topk.topk_splits(8, 65536, dev.INTERPRETER) == 1
    small = dataclasses.replace(info, num_sms=10)  # e.g. an A2: a row's participants must all be resident at once
    assert topk.topk_splits(1, 65536, small) == 8


@pytest.mark.parametrize("arch", ["sm_80", "sm_86", "sm_89", "sm_90", "sm_100", "sm_120"])
def test_logits_config_per_code_path(arch):
    """From MMA_SYNC_FEW_SPLITS_FROM rows mma.sync targets run at most 4 longer programs per SM (rounded down: 9
    splits at B=64 on 132 SMs measured as slow as 17); wgmma targets and fewer rows keep 8 per SM (rounded up). Every
    target keeps swap-AB, and the fused and logits launches take the same operand order and splits (the head sum's
    order decides near-ties in the top-k)."""
    info = dev.target(arch)
    mma_sync = not info.has_wgmma
    for batch in (1, 8, 31, 32, 64, 128):
        cfg = triton_mod.choose_logits_config(info, batch, 1, 64)
        fused = triton_mod.choose_logits_config(info, batch, 1, 64, fuse_topk=True)
        assert cfg.swap_ab and fused.swap_ab and fused.num_splits == cfg.num_splits
        if mma_sync and batch >= triton_mod.MMA_SYNC_FEW_SPLITS_FROM:
            assert cfg.num_splits == info.num_sms * 4 // batch
        else:
            assert cfg.num_splits == min(256, -(-info.num_sms * 8 // batch))
    assert triton_mod.choose_logits_config(dev.target("sm_89"), 64, 1, 64).num_splits == 8  # 142 SMs
    assert triton_mod.choose_logits_config(dev.INTERPRETER, 64, 1, 64).swap_ab is False


def test_smem_spans_choice_and_refusals(monkeypatch):
    """The spans in shared memory (topk_smem) by default only where SMEM_SPANS, position order, and the wide register
    spans need two waves on an SM that holds three 66 KB programs (sm_90 / sm_100, not sm_89 / sm_120); an explicit
    ``smem=True`` the kernel cannot honour (the interpreter, value order, rows past 64k, k outside the sizes) raises
    ValueError with the reason; every target fits it ahead of time (tests/test_aot.py)."""
    from sparsemla.kernels.indexer import topk_smem

    assert topk.SMEM_SPANS is True  # on since the A/B against the register spans (topk_smem_ab-native-h100-3f258ff)
    h100 = dev.TARGETS["sm_90"]
    assert topk_smem.resident(h100) >= 3 and topk_smem.resident(dev.TARGETS["sm_89"]) == 1
    assert topk.smem_spans(64, 65536, 512, h100) and topk.smem_spans(64, 65536, 2048, dev.TARGETS["sm_100"])
    assert topk.smem_spans(34, 65536, 512, h100)  # 136 register spans on 132 SMs: two waves
    assert not topk.smem_spans(33, 65536, 512, h100)  # 132 register spans: one wave already
    assert not topk.smem_spans(32, 65536, 512, h100)
    assert not topk.smem_spans(64, 16384, 512, h100)  # one program a row
    assert not topk.smem_spans(64, 65536, 1024, h100)  # k = 1024: no wide launch
    assert not topk.smem_spans(64, 65536, 512, dev.TARGETS["sm_89"])  # one 66 KB program an SM
    assert not topk.smem_spans(64, 65536, 512, dev.INTERPRETER)
    logits, lens = torch.randn(4, 1024), torch.full((4,), 1024, dtype=torch.int32)
    for kw, why in ((dict(sorted=False), "interpreter"), (dict(sorted=True), "position order")):
        with pytest.raises(ValueError, match=why):
            topk.indexer_topk_fwd(logits, lens, 512, smem=True, **kw)
    assert "capacity of 70000" in topk_smem.fits(64, 70000, 512, h100)
    assert "k must be" in topk_smem.fits(64, 65536, 256, h100)
    assert topk_smem.fits(64, 65536, 2048, h100) is None
    monkeypatch.setattr(topk, "SMEM_SPANS", False)
    assert not topk.smem_spans(64, 65536, 512, h100)


@pytest.mark.parametrize("arch", ["sm_86", "sm_90", "sm_120"])
def test_wide_launch_where_measured_faster(arch):
    """The wide launch (16-warp programs, 16k register tiles and spans) takes >= WIDE_MIN_ROWS rows of at most
    WIDE_MAX_COLS for k = 512 and 2048; fewer rows, longer ones, k = 1024, the interpreter and explicit knobs keep the
    8-warp launch, whose choices are unchanged."""
    info = dev.TARGETS[arch]
    for k in (512, 2048):
        one = topk.choose_topk_launch(64, 16384, k, info)
        assert one == topk.TopkLaunch(1, 16384, 16384, 16384, (4096, 16384), topk.WIDE_WARPS, True)
        assert topk.choose_topk_launch(topk.WIDE_MIN_ROWS, 65536, k, info).splits == 4
        assert topk.choose_topk_launch(256, 40000, k, info).splits == 4  # 40000 / 16384 -> 3, a power of two: 4
        for rows, cols in ((topk.WIDE_MIN_ROWS - 1, 65536), (64, topk.WIDE_MAX_COLS + 1)):
            narrow = topk.choose_topk_launch(rows, cols, k, info)
            splits = topk.topk_splits(rows, cols, info)
            span = topk.topk_span(rows, splits, info)
            assert narrow == topk.TopkLaunch(splits, span, topk._reg_tile(k, span), topk.SPLIT_SPAN,
                                             topk._topk_row_tiles(rows, info.num_sms), topk.TOPK_WARPS)  # fmt: skip
        assert not topk.choose_topk_launch(64, 16384, k, info, wide=False).wide
    assert not topk.choose_topk_launch(64, 16384, 1024, info).wide
    assert not topk.choose_topk_launch(64, 16384, 512, dev.INTERPRETER).wide
    assert not topk.topk_wide(64, 16384, 512, dataclasses.replace(info, num_sms=2))  # a row's spans co-resident
    assert topk._filter_choice(512, 512, 4, 16384, True, True, info, None, launch_wide=True) == (0, 1, 0)


def test_topk_wide_launch_on_the_interpreter(tri):
    """The wide launch forced under the interpreter (rows of up to 16k, one program each: its 16k register tile next
    to the 4k one) equals the reference on the rows built to break the search, in both orders."""
    k = 512
    lengths = [0, 1, k - 1, k, k + 1, 3000, 4096, 4097, 9000, 16384]
    logits = _hard_rows(lengths, 16384, k, seed=5)
    lens = torch.tensor(lengths, dtype=torch.int32)
    ref = indexer_topk_reference(logits, lens, k)
    out = torch.full((len(lengths), k), -7, dtype=torch.int32)
    topk.indexer_topk_fwd(logits, lens, k, out=out, wide=True, sorted=False)
    assert torch.equal(out, _by_position(ref))


def test_topk_length_max_leaves_longer_rows(tri):
    """``length_max`` (topk.LENGTH_SPLIT's register launch): rows of at most that many positions exact in position
    order, page slots included, longer rows' outputs untouched (another launch writes them); the launch is chosen for
    the shorter rows only (the interpreter runs the forced wide launch's 16k tile), bad values refused."""
    k, cut, cols = 512, 16384, 40960
    lengths = [0, 1, k - 1, k, k + 1, 4097, 9000, cut, cut + 1, 30000, cols]
    logits = _hard_rows(lengths, cols, k, seed=11)
    lens = torch.tensor(lengths, dtype=torch.int32)
    table = torch.randperm(len(lengths) * cols // 64, generator=torch.Generator().manual_seed(3)).view(len(lengths), -1)
    table = table.to(torch.int32)
    out = torch.full((len(lengths), k), -7, dtype=torch.int32)
    slots = torch.full_like(out, -7)
    topk.indexer_topk_fwd(logits, lens, k, out=out, page_table=table, page_size=64, out_slots=slots, sorted=False,
                          wide=True, length_max=cut)  # fmt: skip
    expect = _by_position(indexer_topk_reference(logits, lens, k))
    mine = lens <= cut
    assert torch.equal(out[mine], expect[mine])
    assert torch.equal(slots[mine].long(), _page_slots(expect[mine], table[mine]))
    assert bool((out[~mine] == -7).all()) and bool((slots[~mine] == -7).all())
    for kw in (dict(length_max=-1), dict(length_max=cut, smem=True)):
        with pytest.raises(ValueError, match="length_max"):
            topk.indexer_topk_fwd(logits, lens, k, sorted=False, **kw)


def test_filter_tiles_are_checked():
    assert topk._filter_tiles(512, 4096, None) == topk.FILTER_TILES[512]
    assert topk._filter_tiles(2048, 4096, (8192, 4096)) == (4096, 4096)  # groups never exceed the register tile
    assert topk._filter_tiles(512, 4096, (0, 0)) == (0, 1)
    for bad in ((512, 1024), (1000, 1024), (1024, 256)):
        with pytest.raises(ValueError, match="filter tiles"):
            topk._filter_tiles(512, 4096, bad)


def test_topk_register_path_k1024_slots(tri):
    """k = 1024 through both register tiles with the page-table transform (int64 lengths, strided logits rows)."""
    k = 1024
    g = torch.Generator().manual_seed(8)
    base = _hard_rows([0] * 3, 5000, k, seed=9)
    logits = base[:, :4500]  # row stride 5000 > cols
    lengths = torch.tensor([2100, 4096, 4500], dtype=torch.int64)
    table = torch.randperm(400, generator=g)[: 3 * 71].view(3, 71).to(torch.int32)
    pos = torch.empty(3, k, dtype=torch.int32)
    slots = torch.full((3, k), -7, dtype=torch.int32)
    topk.indexer_topk_fwd(logits, lengths, k, out=pos, page_table=table, out_slots=slots, row_tiles=(2048, 4096))
    ref = indexer_topk_reference(logits, lengths, k)
    assert torch.equal(pos, ref)
    assert torch.equal(slots.long(), _page_slots(ref, table))


def test_fused_topk_every_path(tri):
    """Fused launch with small tiles (1024, 2048), next_n = 2: rows in the small tile, the large tile and streaming,
    row lengths straddling a tile edge within one request; one row of all-equal logits (a zero query)."""
    q, kv, w, seq_lens, pt = _inputs([1025, 2049, 700], 2, max_pages=40, seed=13, heads=16)
    q[2, 0] = torch.zeros(16, 128).to(q.dtype)  # row 4: every logit is 0.0, the top-k is the first 512 positions
    cap = pt.shape[1] * 64
    out = tri.indexer_logits_topk_fwd(q, kv, w, seq_lens, pt, 512, row_tiles=(1024, 2048))
    logits = tri.indexer_logits_fwd(q, kv, w, seq_lens, pt, cap, True)
    assert torch.equal(out, indexer_topk_reference(logits, row_lengths(seq_lens, 3, 2, cap), 512))
    assert int(tri._WORKSPACE.counters[q.device].sum()) == 0


def test_dispatch(monkeypatch):
    """Plain CPU -> reference; TRITON_INTERPRET -> Triton; SPARSEMLA_FORCE_REFERENCE wins."""
    t = torch.zeros(1)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert api.select_backend(t) == "reference"
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert api.select_backend(t) == "interpreter"
    with flags.SPARSEMLA_FORCE_REFERENCE.override(True):
        assert api.select_backend(t) == "reference"


def test_plain_cpu_api_uses_reference(monkeypatch):
    """Without the interpreter the public ops run the reference (and agree with it)."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q, kv, w, seq_lens, pt = _inputs([90, 5], 1, max_pages=2, seed=5)
    out = api.indexer_logits(q, kv, w, seq_lens, pt, None, 128, True)
    assert torch.equal(out, indexer_logits_reference(q, kv, w, seq_lens, pt, None, 128, True))
    top = api.indexer_logits_topk(q, kv, w, seq_lens, pt, 512)
    assert torch.equal(top, indexer_topk_reference(out, seq_lens.long(), 512))


def test_bad_inputs(tri):
    """Clear errors for an unsupported k, next_n, cache shape or dtype."""
    q, kv, w, seq_lens, pt = _inputs([64], 1, max_pages=1, seed=1)
    with pytest.raises(ValueError, match="k must be one of"):
        topk.indexer_topk_fwd(torch.zeros(1, 64), seq_lens, 100)
    with pytest.raises(ValueError, match="next_n"):
        tri.indexer_logits_fwd(q.expand(1, 3, 64, 128), kv, w, seq_lens, pt)
    with pytest.raises(ValueError, match="kv_cache_fp8"):
        tri.indexer_logits_fwd(q, kv[:, :32], w, seq_lens, pt)
    with pytest.raises(ValueError, match="page_table"):
        tri.indexer_logits_fwd(q, kv, w, seq_lens, pt.long())
    with pytest.raises(ValueError, match="logits"):
        topk.indexer_topk_fwd(torch.zeros(1, 64, dtype=torch.float64), seq_lens, 512)
    for bad in (dict(reg_span=3000), dict(reg_span=65536)):
        with pytest.raises(ValueError, match="reg_span must be"):
            topk.indexer_topk_fwd(torch.randn(1, 64), seq_lens, 512, **bad)
    for block in (128, 3000, 32768):
        with pytest.raises(ValueError, match=f"block must be a power of two in \\[256, 16384\\], got {block}"):
            topk.indexer_topk_fwd(torch.randn(1, 64), seq_lens, 512, block=block)
    for name, width in (("reg_bits", 7), ("bits", 9), ("stream_bits", 16)):
        with pytest.raises(ValueError, match=f"{name} must be one of .*got {width}"):
            topk.indexer_topk_fwd(torch.randn(1, 64), seq_lens, 512, **{name: width})


def test_report_section_renders_committed_json():
    """The committed H200 JSON has every provider in one run and renders the docs section with its targets."""
    import json
    from pathlib import Path

    from benchmarks.report_indexer import indexer_section

    files = sorted(Path("results/bench").glob("indexer-*.json"))
    if not files:
        pytest.skip("no committed indexer benchmark JSON")
    data = json.loads(files[-1].read_text())
    assert data["op"] == "indexer" and data["git_sha"]
    providers = {r["provider"] for r in data["rows"]}
    assert {"sparsemla", "sparsemla_topk", "torch_fallback", "torch_topk", "floor"} <= providers
    text = indexer_section(data)
    assert "| B=64 ctx=65536 logits | 160 |" in text and "Cap independence" in text


def test_code_paths_note_bounds_the_sm89_path_by_its_mma_rate(tmp_path):
    """The code-path section's bound line: GFLOP of the longest B=64 logits over the sm_89 path's best fp8 GEMM rate,
    the share of it the kernel reaches, and what 1.2x of native would need; no line without both ceiling files."""
    import json

    from benchmarks.report_indexer import _mma_ceiling_lines

    cells = {(64, 65536, 65536): {"sparsemla_graph": 200.0, "sparsemla_sm89path_graph": 400.0}}
    assert _mma_ceiling_lines(cells, 64, tmp_path) == []
    explore = tmp_path / "results" / "bench" / "explore"
    explore.mkdir(parents=True)
    rows = [
        dict(dtype="fp8_e4m3", tflops=100.0),
        dict(dtype="fp8_e4m3", tflops=343.6),
        dict(dtype="bf16", tflops=400.0),
    ]
    (explore / "mma_ceiling-sm89-x-2026-01-01.json").write_text(
        json.dumps({"rows": rows + [dict(dtype="bf16", error="x")]})
    )
    (explore / "mma_ceiling-native-x-2026-01-01.json").write_text(
        json.dumps({"rows": [dict(dtype="fp8_e4m3", tflops=1000.0)]})
    )
    text = "".join(_mma_ceiling_lines(cells, 64, explore))
    # 2 * 64 * 65536 * 64 * 128 = 68.7 GFLOP: 200 us at 343.6 TFLOP/s, 1.00x native; 172 TFLOP/s = 50 %; 1.2x -> 83 %
    assert "peak at 344 TFLOP/s against 1000 with wgmma" in text and "bf16 mma.sync (400)" in text
    assert "68.7 GFLOP" in text and "200 µs at that peak (1.00x" in text and "(50% of it)" in text
    assert "would take 83%" in text and "Why (ahead of time" not in text
    lowering = [
        dict(case="indexer logits B=64 ctx=64k", kernel="_indexer_logits_kernel", assembled_for=arch, ops=ops)
        for arch, ops in (("sm_89", {"QMMA.16832": 64}), ("sm_90a", {"F2FP.F16": 192, "HMMA.16816": 128}))
    ]
    (explore / "fp8_mma_lowering-2026-01-01.json").write_text(json.dumps({"meta": {"ptxas": "V9"}, "rows": lowering}))
    text = "".join(_mma_ceiling_lines(cells, 64, explore))
    assert "fp8_mma_lowering-2026-01-01.json`, ptxas V9" in text
    assert "has 192 `F2FP.F16`, 128 `HMMA.16816`; assembled for sm_89 the same PTX has 64 `QMMA.16832`" in text
