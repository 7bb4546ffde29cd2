"""Sparse-MLA decode Triton kernel on the CPU interpreter (tiny shapes) against the fp32 reference.

Every call runs the real Triton kernels through ``TRITON_INTERPRET`` (dots in fp32 there, so the tolerance is tight);
outputs are NaN-poisoned so an element the kernel never wrote fails the test.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sparsemla import flags
from sparsemla.kernels import device as dev
from sparsemla.kernels import layouts
from sparsemla.kernels.sparse_decode import api
from sparsemla.kernels.sparse_decode import triton as sd_triton
from sparsemla.kernels.sparse_decode.reference import sparse_decode_reference

OUT_RTOL = 1e-4  # relative Frobenius error of out (fp32 dots in the interpreter; both sides round to bf16)
LSE_ATOL = 1e-4


pytestmark = pytest.mark.skipif(
    not sd_triton._is_interpreted(), reason="needs TRITON_INTERPRET=1 at startup (tests/conftest.py sets it on CPU)"
)


def make_case(batch, heads, topk, extra_topk, *, sink=True, invalid=0.0, seed=0, lengths="full", pages=(64, 32)):
    """sglang-contract kwargs: main cache page 64 (padded page stride), extra cache page 32 (``pages``)."""
    gen = torch.Generator().manual_seed(seed)
    main = layouts.random_v4_cache(3, pages[0], generator=gen)
    kw = dict(
        q=torch.randn(batch, 1, heads, 512, generator=gen).to(torch.bfloat16),
        k_cache=main.k_cache,
        indices=layouts.random_slots(batch, topk, main.num_slots, generator=gen, invalid_fraction=invalid),
        topk_length=None,
        attn_sink=torch.randn(heads, generator=gen) * 2 if sink else None,
        head_dim_v=512,
        softmax_scale=512**-0.5,
    )
    if lengths == "short":
        kw["topk_length"] = torch.randint(0, topk + 1, (batch,), generator=gen, dtype=torch.int32)
    elif lengths == "full":
        kw["topk_length"] = torch.full((batch,), topk, dtype=torch.int32)
    if extra_topk:
        extra = layouts.random_v4_cache(2, pages[1], generator=gen)
        kw["extra_k_cache"] = extra.k_cache
        kw["extra_indices_in_kvcache"] = layouts.random_slots(
            batch, extra_topk, extra.num_slots, generator=gen, invalid_fraction=invalid
        )
        kw["extra_topk_length"] = torch.randint(0, extra_topk + 1, (batch,), generator=gen, dtype=torch.int32)
    return kw


def check(kw, out, lse):
    want_out, want_lse = sparse_decode_reference(**kw)
    assert out.shape == want_out.shape and out.dtype == torch.bfloat16
    assert lse.shape == want_lse.shape and lse.stride() == want_lse.stride()
    assert not torch.isnan(out).any(), "unwritten or NaN output"
    err = (out.float() - want_out.float()).norm() / want_out.float().norm().clamp_min(1e-30)
    assert err < OUT_RTOL or torch.equal(out, want_out), f"out rel err {err:.2e}"
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))
    finite = torch.isfinite(want_lse)
    torch.testing.assert_close(lse[finite], want_lse[finite], atol=LSE_ATOL, rtol=LSE_ATOL)


@pytest.mark.parametrize(
    "batch,heads,topk,extra_topk,sink,invalid,lengths,splits",
    [
        pytest.param(2, 8, 40, 20, True, 0.2, "full", 1, id="H8-extra-sink-1split"),
        pytest.param(2, 8, 40, 20, True, 0.2, "short", 4, id="H8-extra-sink-short-4splits"),
        pytest.param(1, 16, 48, 0, False, 0.0, None, "auto", id="H16-noextra-nosink-auto"),
        pytest.param(1, 63, 24, 24, True, 0.1, "full", 3, id="H63-extra-sink-3splits"),
    ],
)
def test_matches_reference(nan_empty, batch, heads, topk, extra_topk, sink, invalid, lengths, splits):
    kw = make_case(batch, heads, topk, extra_topk, sink=sink, invalid=invalid, lengths=lengths, seed=heads + topk)
    with flags.SPARSEMLA_SPLIT_K.override(splits):
        out, lse = api.sparse_decode(**kw)
    check(kw, out, lse)


@pytest.mark.parametrize(
    "pages,extra_topk",
    [((48, 32), 24), ((64, 24), 24), ((40, 20), 24), ((48, 32), 0)],
    ids=["main48-extra32", "main64-extra24", "main40-extra20", "main48-noextra"],
)
def test_pages_not_a_power_of_two(nan_empty, pages, extra_topk):
    """The slot -> (page, row) split divides where a cache's page size is not a power of two (shifts otherwise, and
    shifts of two sizes where both are): either cache, or both, or the only one."""
    kw = make_case(2, 16, 40, extra_topk, invalid=0.1, lengths="short", seed=41, pages=pages)
    with flags.SPARSEMLA_SPLIT_K.override(3):
        out, lse = api.sparse_decode(**kw)
    check(kw, out, lse)


ORDERS = [pytest.param(False, id="tokens-first"), pytest.param(True, id="chunks-first")]


@pytest.mark.parametrize("chunks_first", ORDERS)
@pytest.mark.parametrize("splits", [1, 3], ids=["1split", "3splits"])
def test_column_halves_match_reference(nan_empty, splits, chunks_first):
    """dv_split=2: each program owns one 256-column half (V = that half of the row) and recomputes the scores; the
    halves need no merge and only the first writes the LSE. Both axis orders of the gathered tile."""
    kw = make_case(2, 63, 40, 20, invalid=0.1, lengths="short", seed=21)
    cfg = sd_triton.DecodeConfig(block_h=64, block_n=16, num_warps=4, num_stages=1, dv_split=2,
                                 chunks_first=chunks_first)  # fmt: skip
    out, lse = sd_triton.sparse_decode_fwd(**kw, num_splits=splits, config=cfg)
    check(kw, out, lse)


@pytest.mark.parametrize("joint", [False, True], ids=["own-reductions", "joint-reductions"])
@pytest.mark.parametrize("chunks_first", ORDERS)
@pytest.mark.parametrize(
    "heads,splits,lengths", [(32, 1, "full"), (29, 3, "short")], ids=["H32-1split-full", "H29-3splits-short"]
)
def test_sub_tiles_match_reference(nan_empty, heads, splits, lengths, chunks_first, joint):
    """sub_tiles=2: each tile is gathered, scored and multiplied as its even and odd tokens (two half tiles, one
    online-softmax step), so P is staged half at a time; invalid entries, short rows, the extra cache, both axis
    orders; the halves' row maximum and sum reduced apart or jointly (sub_joint_reduce). Only dv_split=1 without the
    lazy rescale takes it, and only it takes the joint reductions."""
    kw = make_case(2, heads, 40, 24, invalid=0.15, lengths=lengths, seed=23 + heads)
    cfg = sd_triton.DecodeConfig(block_h=32, block_n=16, num_warps=4, num_stages=1, sub_tiles=2,
                                 chunks_first=chunks_first, sub_joint_reduce=joint)  # fmt: skip
    out, lse = sd_triton.sparse_decode_fwd(**kw, num_splits=splits, config=cfg)
    check(kw, out, lse)
    for bad in (dict(sub_tiles=3), dict(sub_tiles=2, dv_split=2), dict(sub_tiles=2, lazy_rescale=True)):
        with pytest.raises(ValueError, match="sub_tiles"):
            dataclasses.replace(cfg, **bad)
    with pytest.raises(ValueError, match="sub_joint_reduce"):
        dataclasses.replace(cfg, sub_tiles=1, sub_joint_reduce=True)


@pytest.mark.parametrize("dv_split", [1, 2], ids=["whole-row", "column-halves"])
@pytest.mark.parametrize("splits", [1, 3], ids=["1split", "3splits"])
def test_heads_fastest_grid_matches_the_row_major_grid(nan_empty, splits, dv_split):
    """heads_fastest (the default): a row's head blocks (and V halves) are adjacent programs of the grid's first
    axis. Four head blocks of 16 (odd real heads: 61), two query rows per batch entry (MTP), short rows and invalid
    entries; the result equals the reference and, bit for bit, the row-major grid's (the same programs, another
    order)."""
    kw = make_case(3, 61, 40, 24, invalid=0.1, lengths="short", seed=27 + splits)
    gen = torch.Generator().manual_seed(5)
    kw["q"] = torch.randn(3, 2, 61, 512, generator=gen).to(torch.bfloat16)
    kw["indices"] = torch.cat([kw["indices"], kw["indices"].roll(7, dims=-1)], dim=1).contiguous()
    kw["extra_indices_in_kvcache"] = kw["extra_indices_in_kvcache"].expand(-1, 2, -1).contiguous()
    cfg = sd_triton.DecodeConfig(block_h=16, block_n=16, num_warps=4, num_stages=1, dv_split=dv_split)
    assert cfg.heads_fastest  # the default
    base = dataclasses.replace(cfg, heads_fastest=False)
    want_out, want_lse = sd_triton.sparse_decode_fwd(**kw, num_splits=splits, config=base)
    out, lse = sd_triton.sparse_decode_fwd(**kw, num_splits=splits, config=cfg)
    check(kw, out, lse)
    assert torch.equal(out, want_out) and torch.equal(lse, want_lse)


def test_decode_grid_puts_a_rows_programs_side_by_side_within_cudas_limits():
    grid = sd_triton.decode_grid
    assert grid(1024, 2, 1, True) == ((2, 1024, 1), True)
    assert grid(64, 4, 3, True) == ((4, 64, 3), True)
    assert grid(1024, 2, 1, False) == ((1024, 2, 1), False)
    assert grid(8192, 1, 1, True) == ((8192, 1, 1), False)  # one program a row: the same order either way
    assert grid(sd_triton.MAX_GRID_YZ, 2, 1, True) == ((2, sd_triton.MAX_GRID_YZ, 1), True)
    assert grid(sd_triton.MAX_GRID_YZ + 1, 2, 1, True) == ((sd_triton.MAX_GRID_YZ + 1, 2, 1), False)


def _climbing_scales(k_cache: torch.Tensor) -> None:
    """Rewrite the ue8m0 scales of a V4 cache so that a slot's NoPE grows 2x every 24 slots (2^-3 .. 2^4)."""
    raw = layouts.v4_raw_pages(k_cache)
    page_size = k_cache.shape[1]
    for slot in range(k_cache.shape[0] * page_size):
        page, off = divmod(slot, page_size)
        at = page_size * layouts.V4_DATA_BYTES + off * layouts.V4_SCALE_BYTES
        raw[page, at : at + layouts.V4_NUM_SCALES] = 124 + slot // 24


@pytest.mark.parametrize("splits", [1, 3], ids=["1split", "3splits"])
@pytest.mark.parametrize("climb", [False, True], ids=["random-scores", "scores-climb-per-tile"])
def test_lazy_rescale_matches_reference(nan_empty, splits, climb):
    """DecodeConfig.lazy_rescale: the reference maximum moves only when a head's maximum passes it by more than
    RESCALE_SLACK. ``climb``: the main cache's rows grow 2x every 24 slots and each row lists its slots in order, so
    a row's maximum rises tile after tile by more than the slack (the rescale is taken mid-row, not only at the
    first tile; checked below on the scores); invalid entries and short rows included."""
    kw = make_case(2, 13, 64, 32, invalid=0.15, lengths="short", seed=31)
    if climb:
        _climbing_scales(kw["k_cache"])
        kw["indices"] = kw["indices"].sort(dim=-1).values
        rows = layouts.decode_v4_rows(kw["k_cache"], kw["indices"][0, 0].clamp_min(0))  # [64, 512]
        s = (kw["q"][0, 0].float() @ rows.T) * kw["softmax_scale"] * sd_triton.LOG2E  # [H, 64] log2 units
        first_tile = s[:, :16].amax(1)
        assert (s[:, 48:].amax(1) > first_tile + sd_triton.RESCALE_SLACK.value).any(), "the case must climb"
    cfg = sd_triton.DecodeConfig(block_h=16, block_n=16, num_warps=4, num_stages=1, lazy_rescale=True)
    out, lse = sd_triton.sparse_decode_fwd(**kw, num_splits=splits, config=cfg)
    check(kw, out, lse)
    base_cfg = dataclasses.replace(cfg, lazy_rescale=False)
    base, base_lse = sd_triton.sparse_decode_fwd(**kw, num_splits=splits, config=base_cfg)
    finite = torch.isfinite(base_lse)
    torch.testing.assert_close(lse[finite], base_lse[finite], atol=LSE_ATOL, rtol=LSE_ATOL)
    torch.testing.assert_close(out.float(), base.float(), atol=1e-3, rtol=1e-2)


def test_bad_config_is_refused():
    kw = make_case(1, 8, 16, 0, seed=2)
    with pytest.raises(ValueError, match="dv_split"):
        sd_triton.sparse_decode_fwd(**kw, config=sd_triton.DecodeConfig(16, 16, 4, 1, dv_split=4))
    with pytest.raises(ValueError, match="num_real_heads"):
        sd_triton.sparse_decode_fwd(**kw, num_real_heads=9)


def test_all_invalid_and_zero_length_give_zero_rows(nan_empty):
    kw = make_case(3, 8, 32, 16, seed=5)
    kw["attn_sink"][:2] = float("-inf")  # -inf sink on a row with no valid entry: still exactly 0, never NaN
    kw["indices"][0] = -1
    kw["extra_indices_in_kvcache"][0] = -1
    kw["topk_length"][1] = 0
    kw["extra_topk_length"][1] = 0
    kw["topk_length"][2] = 5  # shorter than topk: entries past it must not count
    kw["indices"][2, 0, 5:] = 0
    with flags.SPARSEMLA_SPLIT_K.override(2):
        out, lse = api.sparse_decode(**kw)
    assert torch.equal(out[:2], torch.zeros_like(out[:2]))
    assert torch.isneginf(lse[:2]).all()
    check(kw, out, lse)


def test_duplicates_sink_inf_and_noncontiguous_q(nan_empty):
    kw = make_case(2, 8, 32, 16, seed=9)
    kw["indices"][:, :, 16:] = kw["indices"][:, :, :16]  # every slot listed twice
    sink = kw["attn_sink"]
    sink[0], sink[1] = float("inf"), float("-inf")
    big = torch.randn(2, 1, 8, 1024, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    kw["q"] = big[..., ::2]  # stride 2 along the head dim
    out, lse = api.sparse_decode(**kw)
    assert torch.equal(out[:, :, 0], torch.zeros_like(out[:, :, 0])), "sink +inf must give a zero row"
    check(kw, out, lse)


def test_head_dim_v_and_multi_query_rows(nan_empty):
    kw = make_case(2, 8, 24, 0, seed=3)
    kw["head_dim_v"] = 448
    gen = torch.Generator().manual_seed(3)
    kw["q"] = torch.randn(2, 2, 8, 512, generator=gen).to(torch.bfloat16)  # s_q = 2 (MTP), each row its own indices
    kw["indices"] = torch.cat([kw["indices"], kw["indices"].flip(-1)], dim=1).contiguous()
    out, lse = api.sparse_decode(**kw)
    check(kw, out, lse)


def test_deterministic():
    kw = make_case(1, 8, 32, 16, seed=11)
    with flags.SPARSEMLA_SPLIT_K.override(3):
        a = api.sparse_decode(**kw)
        b = api.sparse_decode(**kw)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_backend_selection():
    q = torch.zeros(1, 1, 8, 512, dtype=torch.bfloat16)
    assert api.select_backend(q) == "interpreter"
    with flags.TRITON_INTERPRET.override(False):
        assert api.select_backend(q) == "reference"  # plain CPU tensors
    with flags.SPARSEMLA_FORCE_REFERENCE.override(True):
        assert api.select_backend(q) == "reference"


def test_split_choice_fills_sms_and_drops_to_one():
    assert sd_triton.choose_num_splits(1, 1, 10, 132) == 10  # B=1: every tile its own program
    assert sd_triton.choose_num_splits(64, 1, 10, 132) == 2
    assert sd_triton.choose_num_splits(128, 1, 10, 132) == 1
    assert sd_triton.choose_num_splits(64, 2, 10, 132) == 1  # H=128: two head blocks already fill the GPU
    assert sd_triton.choose_num_splits(1, 1, 10, 132, override=64) == 10  # clamped to the tile count
    assert sd_triton.choose_num_splits(1, 1, 0, 132) == 1
    assert sd_triton.choose_num_splits(8, 1, 20, 132) == 10  # 16 wanted -> 2 tiles each -> 10 splits, none empty
    h200 = dev.target("sm_90")
    assert [sd_triton.choose_config(h200, h, rows=8).block_h for h in (8, 16, 17, 63, 64)] == [16, 16, 64, 64, 64]
    assert sd_triton.choose_config(h200, 64, rows=6).block_n == 16  # 6 programs: the wgmma tile's V halves
    assert sd_triton.choose_config(h200, 64, rows=8).block_n == 64


@pytest.mark.parametrize(
    "heads,rows,extra,block_h,block_n",
    [
        (64, 1, 512, 32, 16),  # 1 program of 64 heads: the mma.sync tiles (SM90_MMA_BUSY), the short one at <= 2 of 32
        (128, 1, 512, 32, 32),
        (64, 4, 512, 32, 32),
        (64, 4, 2048, 32, 32),  # below 8 programs the alternative is the wgmma tile, not the Gluon one
        (64, 4, 8192, 32, 32),
        (128, 1, 32768, 32, 32),
        (128, 3, 512, 64, 16),  # 6: the wgmma tile's V halves
        (64, 8, 512, 64, 64),  # 8 - 15: the Gluon tile
        (128, 4, 512, 64, 64),
        (64, 16, 512, 32, 32),  # 16 - 32: mma.sync again
        (128, 16, 512, 32, 32),
        (64, 16, 2048, 64, 64),  # ... unless the Gluon tile would warp-specialize there
        (128, 16, 2048, 64, 64),
        (64, 33, 512, 64, 64),  # from 33: the Gluon tile
        (128, 32, 512, 64, 64),
        (64, 8192, 512, 64, 64),
    ],
    ids=lambda v: str(v),
)
def test_sm90_takes_the_mma_sync_tiles_where_they_were_faster(heads, rows, extra, block_h, block_n):
    """sm_90 with more than 16 heads: the mma.sync targets' 32-head tiles where rows x 64-head blocks is in
    SM90_MMA_BUSY and the Gluon tile would not warp-specialize (measured faster there on an H100), wgmma / Gluon tiles
    elsewhere; sm_100 keeps its wgmma tiles. 128 window indices + ``extra``."""
    hopper, b200 = dev.target("sm_90"), dev.target("sm_100")
    cfg = sd_triton.choose_tiles(hopper, heads, rows, (128, extra))
    assert (cfg.block_h, cfg.block_n) == (block_h, block_n)
    assert sd_triton.wgmma_tile(cfg, hopper) == (block_h == 64)
    if block_h == 32:  # the tile its sm_89 code path chooses (sm_89's budget per block, this GPU's SMs)
        assert cfg == sd_triton.choose_tiles(dev.running_as(hopper, (8, 9)), heads, rows, (128, extra))
    assert sd_triton.choose_tiles(b200, heads, rows, (128, extra)).block_h == 64


def test_programs_per_sm_follow_each_targets_shared_memory():
    """The split count fills SMs x resident programs: opaque mma.sync tiles are sized exactly (an sm_86/89/120 SM,
    100 KB, holds two 16 x 32 programs of 50,176 B and one 32 x 32 of 67,584 B or one 32 x 64 in half tiles of
    100,352 B; an A100 two 32 x 32 and one 32 x 64), registers cap them at two (an H200 holds two, as its sm_89-path
    split counts were measured). With 32 heads a program: 64-token half tiles from MMA_WIDE_TILE_BUSY programs per
    resident 32 x 32 program where an SM holds as many 32 x 64 ones (not an A100); else from 256 programs an SM that
    holds one 32 x 32 program gets 32 x 16 tiles, one that holds two keeps 32 x 32."""
    h200, sm89, sm80 = dev.target("sm_90"), dev.target("sm_89"), dev.target("sm_80")
    h200_as_sm89 = dev.running_as(h200, (8, 9))
    c16x32 = sd_triton.choose_tiles(sm89, 8, rows=64)
    c32x32 = sd_triton.choose_tiles(sm89, 64, rows=16)
    c32x64 = sd_triton.choose_tiles(sm89, 64, rows=64)
    assert (c16x32.block_h, c16x32.block_n, c32x32.block_h, c32x32.block_n) == (16, 32, 32, 32)
    assert (c32x64.block_h, c32x64.block_n, c32x64.sub_tiles, c32x32.sub_tiles) == (32, 64, 2, 1)
    assert c32x64.sub_joint_reduce and not c32x32.sub_joint_reduce
    assert [sd_triton.shared_bytes(c, sm89) for c in (c16x32, c32x32, c32x64)] == [50_176, 67_584, 100_352]
    assert [sd_triton.resident_programs(c16x32, i) for i in (sm89, dev.target("sm_120"), h200_as_sm89)] == [2, 2, 2]
    assert [sd_triton.resident_programs(c32x32, i) for i in (sm89, sm80, h200_as_sm89)] == [1, 2, 2]
    assert [sd_triton.resident_programs(c32x64, i) for i in (sm89, sm80, h200_as_sm89)] == [1, 1, 2]
    # registers bound the rest (ahead of time): 16 x 16 tiles take 128 registers on the H200 (four per SM), 160 on
    # sm_80 (three); the 32 x 16 tile two everywhere
    c16x16, c32x16 = sd_triton.choose_tiles(sm89, 8, rows=1), sd_triton.choose_tiles(sm89, 64, rows=1)
    assert (c16x16.block_n, c32x16.block_h, c32x16.block_n) == (16, 32, 16)
    assert [sd_triton.resident_programs(c16x16, i) for i in (h200, h200_as_sm89, sm80, sm89)] == [4, 4, 3, 2]
    assert [sd_triton.resident_programs(c32x16, i) for i in (h200_as_sm89, sm80, sm89)] == [2, 2, 2]
    assert sd_triton.resident_programs(sd_triton.choose_tiles(h200, 8, rows=64), h200) == 2
    wide_from = sd_triton.MMA_WIDE_TILE_BUSY
    for info in (sm89, dev.target("sm_86"), dev.target("sm_120"), h200_as_sm89):
        per_sm = sd_triton.resident_programs(c32x32, info)
        for rows, heads in ((wide_from * per_sm // 2, 64), (128, 64), (64, 128), (8192, 128)):
            assert sd_triton.choose_tiles(info, heads, rows).block_n == 64, (info.name, rows, heads)
        assert sd_triton.choose_tiles(info, 64, rows=wide_from * per_sm // 2 - 1).block_n == 32, info.name
    assert [sd_triton.choose_tiles(sm80, 64, rows).block_n for rows in (32, 64, 128, 8192)] == [32, 32, 32, 32]
    for info in (sm89, sm80, h200_as_sm89):
        assert sd_triton.choose_tiles(info, 64, rows=1).block_n == 16  # <= 2 programs: short tiles everywhere
        assert sd_triton.choose_tiles(info, 8, rows=8192).sub_tiles == 1  # 16-head tiles never take half tiles


@pytest.mark.parametrize("splits,heads", [(2, 64), (20, 64), (132, 128), (7, 8)])
def test_combine_blocks_cover_all_splits(splits, heads):
    block_s, block_h, block_d = sd_triton.combine_blocks(splits, heads)
    assert block_s >= splits and block_s & (block_s - 1) == 0
    assert block_h >= 2 and block_d >= 16 and block_s * block_h * block_d <= 8192


def _pad_page_stride(k_cache: torch.Tensor, pad: int) -> torch.Tensor:
    """The same cache with ``pad`` more bytes per page (page stride no longer a multiple of 16: byte-load path)."""
    pages, page_size = k_cache.shape[:2]
    buf = torch.zeros(pages, k_cache.stride(0) + pad, dtype=torch.uint8)
    buf[:, : page_size * 584] = k_cache.reshape(pages, page_size * 584)
    return buf[:, : page_size * 584].view(pages, page_size, 1, 584)


@pytest.mark.parametrize("dv_split", [1, 2], ids=["whole-row", "column-halves"])
@pytest.mark.parametrize("chunks_first", ORDERS)
@pytest.mark.parametrize("pad", [0, 2], ids=["aligned", "unaligned"])
def test_aligned_and_byte_load_paths_match_reference(nan_empty, pad, chunks_first, dv_split):
    kw = make_case(2, 16, 40, 24, invalid=0.1, lengths="short", seed=21)
    if pad:
        kw["k_cache"] = _pad_page_stride(kw["k_cache"], pad)
        kw["extra_k_cache"] = _pad_page_stride(kw["extra_k_cache"], pad)
        assert kw["k_cache"].stride(0) % 16 != 0
    cfg = sd_triton.DecodeConfig(block_h=16 * dv_split**2, block_n=16, num_warps=4, num_stages=1, dv_split=dv_split,
                                 chunks_first=chunks_first)  # fmt: skip
    for splits in (1, 3):
        out, lse = sd_triton.sparse_decode_fwd(**kw, num_splits=splits, config=cfg)
        check(kw, out, lse)


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda kw: kw.update(q=kw["q"].float()), "bf16"),
        (lambda kw: kw.update(indices=kw["indices"].long()), "int32"),
        (lambda kw: kw.update(attn_sink=kw["attn_sink"][:3]), "attn_sink"),
        (lambda kw: kw.update(topk_length=kw["topk_length"][:1]), "topk_length"),
    ],
)
def test_bad_inputs_raise(mutate, match):
    kw = make_case(2, 8, 16, 0, seed=1)
    mutate(kw)
    with pytest.raises(ValueError, match=match):
        sd_triton.sparse_decode_fwd(**kw)


def _lse_layout(lse):
    """The [B, H, s_q] view of a [B, s_q, H] buffer, as the kernel returns it (the real heads' slice is not)."""
    return lse.transpose(1, 2).contiguous().transpose(1, 2)


@pytest.mark.parametrize("heads,real", [(64, 8), (64, 13), (16, 16)], ids=["TP8-pad64", "odd-real", "no-pad"])
def test_padded_heads_compute_only_the_real_ones(nan_empty, heads, real):
    """sglang pads q (uninitialised rows) and the sink (zeros) to 64 heads under TP: with ``num_real_heads`` the real
    heads equal the reference on the real heads alone, the pad heads are out 0 / lse -inf, and pad-row garbage (NaN
    here) never leaks into a real head."""
    kw = make_case(3, heads, 40, 24, invalid=0.1, lengths="short", seed=5)
    kw["q"][:, :, real:] = float("nan")
    out, lse = sd_triton.sparse_decode_fwd(**kw, num_splits=3, num_real_heads=real)
    real_kw = dict(kw, q=kw["q"][:, :, :real].contiguous(), attn_sink=kw["attn_sink"][:real].contiguous())
    check(real_kw, out[:, :, :real], _lse_layout(lse[:, :real]))
    assert torch.equal(out[:, :, real:], torch.zeros_like(out[:, :, real:]))
    assert torch.isneginf(lse[:, real:]).all()


def test_tile_axis_order_follows_the_compiling_triton(monkeypatch):
    """The gathered tile is chunks-first exactly when Triton >= 3.8 compiles (3.6 and 3.8 lay a 3D load's lanes
    over different axes); the tiles themselves do not depend on the compiler."""
    for version, want in (((3, 6), False), ((3, 7), False), ((3, 8), True), ((4, 0), True)):
        monkeypatch.setattr(dev, "TRITON_VERSION", version)
        for info in dev.TARGETS.values():
            for heads, rows in ((8, 1), (64, 64), (128, 8192)):
                cfg = sd_triton.choose_config(info, heads, rows)
                assert cfg.chunks_first is want, (version, info.name, heads, rows)
                assert dataclasses.replace(cfg, chunks_first=None) == sd_triton.choose_tiles(info, heads, rows)


class _LaunchRecorder:
    """Stands in for the decode kernel: records each launch's CHUNKS_FIRST and runs the real kernel."""

    def __init__(self, kernel) -> None:
        self.kernel, self.seen = kernel, []

    def __getitem__(self, grid):
        launch = self.kernel[grid]

        def call(*args, **kwargs):
            self.seen.append(kwargs["CHUNKS_FIRST"])
            return launch(*args, **kwargs)

        return call


@pytest.mark.parametrize(
    "version,given,want",
    [((3, 6), None, False), ((3, 8), None, True), ((3, 8), False, False), ((3, 6), True, True)],
    ids=["3.6-follow", "3.8-follow", "3.8-tokens-first", "3.6-chunks-first"],
)
def test_the_launch_gets_the_configured_or_the_compilers_axis_order(nan_empty, monkeypatch, version, given, want):
    """A configuration's chunks_first reaches the kernel; None (every hand-built configuration's default) follows the
    compiling Triton, like the launcher's own choice."""
    monkeypatch.setattr(dev, "TRITON_VERSION", version)
    recorder = _LaunchRecorder(sd_triton._sparse_decode_kernel)
    monkeypatch.setattr(sd_triton, "_sparse_decode_kernel", recorder)
    monkeypatch.setattr(sd_triton, "_is_interpreted", lambda: True)  # (this module runs only when it is)
    kw = make_case(1, 8, 24, 16, invalid=0.1, seed=5)
    cfg = sd_triton.DecodeConfig(16, 16, 4, 1, chunks_first=given)
    out, lse = sd_triton.sparse_decode_fwd(**kw, num_splits=2, config=cfg)
    check(kw, out, lse)
    auto_out, _ = sd_triton.sparse_decode_fwd(**kw, num_splits=2)
    assert recorder.seen == [want, version >= (3, 8)]
    assert torch.equal(auto_out, out) or (auto_out.float() - out.float()).abs().max() < 1e-2


def test_l2_prefetch_default_follows_the_work_per_program():
    """DecodeConfig.l2_prefetch (None): one tile ahead where a program walks PREFETCH_MIN_TILES tiles or more (timed:
    it wins from 5 tiles a program and loses 1-4 % at 1-3) of >= 512 scores (the 16 x 16 tiles keep their register
    count), none otherwise; an explicit count is kept, negatives refused."""
    many = sd_triton.PREFETCH_MIN_TILES
    tile, small = sd_triton.DecodeConfig(32, 16, 4, 1), sd_triton.DecodeConfig(16, 16, 4, 1)
    assert sd_triton.l2_prefetch_default(tile, many) == 1 and sd_triton.l2_prefetch_default(tile, 10 * many) == 1
    assert sd_triton.l2_prefetch_default(tile, many - 1) == 0 and sd_triton.l2_prefetch_default(tile, 1) == 0
    assert sd_triton.l2_prefetch_default(small, 10 * many) == 0
    assert sd_triton.DecodeConfig(32, 32, 4, 1).l2_prefetch is None
    assert sd_triton.DecodeConfig(32, 32, 4, 1, l2_prefetch=0).l2_prefetch == 0
    with pytest.raises(ValueError, match="l2_prefetch"):
        sd_triton.DecodeConfig(32, 32, 4, 1, l2_prefetch=-1)


@pytest.mark.parametrize("target", ["sm_80", "sm_89", "sm_90", "sm_100", "sm_120"])
def test_q_lift_default_follows_the_tile_and_its_work(target):
    """DecodeConfig.q_lift (None): lifted where the dots are mma.sync and a program walks LIFT_MIN_TILES tiles or more;
    and on sm_90's Gluon tile (its q is in shared memory); never on Triton's wgmma / tcgen05 tiles (the lifted q stays
    in registers there and the tile spills), never without the
    integer dequant; an explicit True / False wins (with the integer dequant)."""
    info = dev.TARGETS[target]
    many, few = sd_triton.LIFT_MIN_TILES, sd_triton.LIFT_MIN_TILES - 1
    for cfg in (sd_triton.choose_tiles(info, h, b) for h in (8, 64, 128) for b in (1, 64, 1024)):
        cfg = dataclasses.replace(cfg, int_dequant=True)
        mma_sync = not sd_triton.wgmma_tile(cfg, info)
        assert sd_triton.q_lift(cfg, info, many) == (mma_sync or cfg.gluon)  # the Gluon tile's q is in shared memory
        assert not sd_triton.q_lift(cfg, info, few)
        assert sd_triton.q_lift(dataclasses.replace(cfg, q_lift=True), info, 1)
        assert not sd_triton.q_lift(dataclasses.replace(cfg, q_lift=False), info, many)
        assert not sd_triton.q_lift(dataclasses.replace(cfg, int_dequant=False, q_lift=True), info, many)
    assert info.capability[0] not in (9, 10) or not sd_triton.q_lift(
        dataclasses.replace(sd_triton.choose_tiles(info, 64, 64), int_dequant=True, gluon=False), info, many
    )


def test_gluon_tile_config_is_sm90s_and_checked(nan_empty):
    """DecodeConfig.gluon: sm_90's choice from GLUON_SM90_MIN_BUSY programs where Gluon is there (never sm_100, whose
    tensor cores are not wgmma, nor mma.sync targets); only the 64 x 64 8-warp one-stage tile without V halves, half
    tiles or lazy rescale; ids_ahead and warp_specialize only with it; its shared memory is the compiler's figure
    (tests/test_aot.py); the interpreter (and any launch not configured for sm_90) refuses it with the reason."""
    from sparsemla.kernels.sparse_decode import gluon_sm90, gluon_ws_sm90

    sm90 = dev.target("sm_90")
    busy = sd_triton.GLUON_SM90_MIN_BUSY
    assert sd_triton.choose_tiles(sm90, 64, busy).gluon == gluon_sm90.available()
    assert sd_triton.choose_tiles(sm90, 128, busy // 2).gluon == gluon_sm90.available()
    assert not sd_triton.choose_tiles(sm90, 64, busy - 1).gluon and not sd_triton.choose_tiles(sm90, 16, 1024).gluon
    for target in ("sm_80", "sm_86", "sm_89", "sm_100", "sm_120"):
        assert not any(sd_triton.choose_tiles(dev.target(target), h, b).gluon for h in (8, 64, 128) for b in (1, 64))
    cfg = sd_triton.DecodeConfig(64, 64, 8, 1, partial_bf16=True, int_dequant=True, gluon=True)
    sync, ws = dataclasses.replace(cfg, warp_specialize=False), dataclasses.replace(cfg, warp_specialize=True)
    assert sd_triton.shared_bytes(sync, sm90) == gluon_sm90.SHARED_BYTES == 139_776
    # warp-specialized (or either, the default): two tile buffers and four mbarriers; still one program per SM
    assert sd_triton.shared_bytes(ws, sm90) == sd_triton.shared_bytes(cfg, sm90) == gluon_ws_sm90.SHARED_BYTES
    assert 205_348 <= gluon_ws_sm90.SHARED_BYTES <= 205_348 + 64
    assert all(sd_triton.resident_programs(c, sm90) == 1 for c in (cfg, sync, ws))
    # the default: warp-specialized from WS_MIN_TILES tiles a program, never without the Gluon tile
    n = sd_triton.WS_MIN_TILES
    assert sd_triton.warp_specialize(cfg, n) and not sd_triton.warp_specialize(cfg, n - 1)
    assert not sd_triton.warp_specialize(sync, 100) and sd_triton.warp_specialize(ws, 1)
    assert not sd_triton.warp_specialize(sd_triton.DecodeConfig(64, 64, 8, 1), 100)
    with pytest.raises(ValueError, match="warp_specialize"):
        sd_triton.DecodeConfig(64, 64, 8, 1, warp_specialize=True)
    for bad in (dict(block_n=32), dict(num_warps=4), dict(num_stages=2), dict(dv_split=2), dict(lazy_rescale=True)):
        with pytest.raises(ValueError, match="gluon"):
            dataclasses.replace(cfg, **bad)
    with pytest.raises(ValueError, match="ids_ahead"):
        sd_triton.DecodeConfig(64, 64, 8, 1, ids_ahead=True)
    kw = make_case(2, 64, 40, 24, seed=3)
    with pytest.raises(ValueError, match="sm_90 wgmma tile"):
        sd_triton.sparse_decode_fwd(**kw, config=cfg)
