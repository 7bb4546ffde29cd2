"""Sparse-MLA decode Triton kernel on a CUDA GPU (``pytest -m gpu``): shape grid vs the fp32 reference, corner cases,
NaN-poisoned outputs, CUDA-graph capture + replay, determinism. Skipped without CUDA."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sparsemla import flags
from sparsemla.kernels import layouts
from sparsemla.kernels.sparse_decode import api
from sparsemla.kernels.sparse_decode import triton as sd_triton
from sparsemla.kernels.sparse_decode.reference import sparse_decode_reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

OUT_RTOL = 1e-2  # relative Frobenius error: bf16 P in the PV dot and the bf16 output (measured ~3e-3)
LSE_TOL = 2e-3


def make_case(batch, heads, swa_topk, extra_topk, *, sink, swa_page=256, extra_page=64, invalid=0.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    main = layouts.random_v4_cache(max(2, -(-batch * swa_topk // swa_page)), swa_page, generator=gen)
    kw = dict(
        q=torch.randn(batch, 1, heads, 512, generator=gen).to(torch.bfloat16),
        k_cache=main.k_cache,
        indices=layouts.random_slots(batch, swa_topk, main.num_slots, generator=gen, invalid_fraction=invalid),
        topk_length=torch.randint(swa_topk // 2, swa_topk + 1, (batch,), generator=gen, dtype=torch.int32),
        attn_sink=torch.randn(heads, generator=gen) if sink else None,
        head_dim_v=512,
        softmax_scale=512**-0.5,
    )
    if extra_topk:
        extra = layouts.random_v4_cache(-(-2 * extra_topk // extra_page), extra_page, generator=gen)
        kw["extra_k_cache"] = extra.k_cache
        kw["extra_indices_in_kvcache"] = layouts.random_slots(
            batch, extra_topk, extra.num_slots, generator=gen, invalid_fraction=invalid
        )
        kw["extra_topk_length"] = torch.randint(0, extra_topk + 1, (batch,), generator=gen, dtype=torch.int32)
    return {k: v.cuda() if isinstance(v, torch.Tensor) else v for k, v in kw.items()}


def check(kw, out, lse):
    want_out, want_lse = sparse_decode_reference(**kw)
    assert out.shape == want_out.shape and out.dtype == torch.bfloat16 and lse.shape == want_lse.shape
    assert not torch.isnan(out).any(), "unwritten or NaN output"
    err = float((out.float() - want_out.float()).norm() / want_out.float().norm().clamp_min(1e-30))
    assert err < OUT_RTOL or torch.equal(out, want_out), f"out rel err {err:.2e}"
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse))
    finite = torch.isfinite(want_lse)
    torch.testing.assert_close(lse[finite], want_lse[finite], atol=LSE_TOL, rtol=LSE_TOL)


GRID = [
    pytest.param(b, h, swa, x, sink, id=f"B{b}-H{h}-swa{swa}-x{x}-{'sink' if sink else 'nosink'}")
    for b in (1, 5, 33)
    for h in (8, 16, 63, 64, 128)
    for swa, x, sink in ((128, 512, True), (128, 0, False))
]


@pytest.mark.parametrize("batch,heads,swa_topk,extra_topk,sink", GRID)
def test_grid_matches_reference(nan_empty, batch, heads, swa_topk, extra_topk, sink):
    kw = make_case(batch, heads, swa_topk, extra_topk, sink=sink, invalid=0.05, seed=batch * 1000 + heads)
    out, lse = api.sparse_decode(**kw)
    check(kw, out, lse)


@pytest.mark.parametrize("splits", ["auto", 1, 3, 17])
@pytest.mark.parametrize("swa_page,extra_page,extra_topk", [(256, 64, 2048), (64, 256, 8192)])
def test_long_topk_pages_and_splits(nan_empty, splits, swa_page, extra_page, extra_topk):
    kw = make_case(2, 64, 128, extra_topk, sink=True, swa_page=swa_page, extra_page=extra_page, seed=extra_topk)
    with flags.SPARSEMLA_SPLIT_K.override(splits):
        out, lse = api.sparse_decode(**kw)
    check(kw, out, lse)


def corner_case() -> dict:
    """B = 4, H = 64: row 0 all -1, row 1 lengths 0, row 2 duplicates (they count twice), sink +inf / -inf on heads
    0 / 1, a non-contiguous q."""
    kw = make_case(4, 64, 128, 512, sink=True, seed=4)
    kw["indices"][0] = -1
    kw["extra_indices_in_kvcache"][0] = -1
    kw["topk_length"][1] = 0
    kw["extra_topk_length"][1] = 0
    kw["indices"][2, :, 64:] = kw["indices"][2, :, :64]
    kw["topk_length"][2] = 128
    kw["attn_sink"][0], kw["attn_sink"][1] = float("inf"), float("-inf")
    kw["q"] = torch.randn(4, 1, 64, 1024, device="cuda").to(torch.bfloat16)[..., 1::2]
    return kw


def test_corner_cases(nan_empty):
    kw = corner_case()
    for splits in (1, 4):
        with flags.SPARSEMLA_SPLIT_K.override(splits):
            out, lse = api.sparse_decode(**kw)
        assert torch.equal(out[:2], torch.zeros_like(out[:2]))
        assert torch.equal(out[:, :, 0], torch.zeros_like(out[:, :, 0]))
        check(kw, out, lse)


@pytest.mark.parametrize("batch", [1, 64])
def test_cuda_graph_replay_equals_eager(batch):
    kw = make_case(batch, 64, 128, 512, sink=True, seed=batch)
    eager = api.sparse_decode(**kw)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        api.sparse_decode(**kw)  # warm up on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = api.sparse_decode(**kw)
    fresh = make_case(batch, 64, 128, 512, sink=True, seed=batch + 1)
    for name in ("q", "indices", "topk_length", "extra_indices_in_kvcache", "extra_topk_length"):
        kw[name].copy_(fresh[name])
    graph.replay()
    torch.cuda.synchronize()
    want = api.sparse_decode(**kw)
    assert torch.equal(captured[0], want[0]) and torch.equal(captured[1], want[1])
    assert not torch.equal(captured[0], eager[0])


@pytest.mark.parametrize(
    "cfg",
    [
        sd_triton.DecodeConfig(64, 32, 8, 3),
        sd_triton.DecodeConfig(64, 64, 8, 1),
        sd_triton.DecodeConfig(64, 16, 8, 2),
        sd_triton.DecodeConfig(64, 64, 8, 1, partial_bf16=True),
        sd_triton.DecodeConfig(64, 16, 4, 2, dv_split=2, partial_bf16=True),
        sd_triton.DecodeConfig(64, 64, 8, 1, int_dequant=True),
        sd_triton.DecodeConfig(64, 32, 4, 1, dv_split=2),
        sd_triton.DecodeConfig(32, 16, 4, 1, partial_bf16=True, int_dequant=True),  # the mma.sync targets' tiles
        sd_triton.DecodeConfig(32, 32, 4, 1, partial_bf16=True, int_dequant=True),
        sd_triton.DecodeConfig(16, 16, 4, 1, partial_bf16=True, int_dequant=True),
        sd_triton.DecodeConfig(16, 32, 4, 1, partial_bf16=True, int_dequant=True),
        # the gathered tile chunks-first (what Triton >= 3.8 gets), on this machine's compiler
        sd_triton.DecodeConfig(64, 64, 8, 1, partial_bf16=True, int_dequant=True, chunks_first=True),
        sd_triton.DecodeConfig(64, 16, 4, 2, dv_split=2, partial_bf16=True, int_dequant=True, chunks_first=True),
        sd_triton.DecodeConfig(32, 32, 4, 1, partial_bf16=True, int_dequant=True, chunks_first=True),
        sd_triton.DecodeConfig(16, 16, 4, 1, partial_bf16=True, chunks_first=True),
        # the tile's opaque move forced each way (the launcher's default: on where the dots are mma.sync)
        sd_triton.DecodeConfig(32, 32, 4, 1, partial_bf16=True, int_dequant=True, opaque_tile=False),
        sd_triton.DecodeConfig(32, 32, 4, 1, partial_bf16=True, int_dequant=True, opaque_tile=True),
        sd_triton.DecodeConfig(16, 32, 4, 1, partial_bf16=True, int_dequant=True, opaque_tile=True),
        sd_triton.DecodeConfig(64, 64, 8, 1, partial_bf16=True, int_dequant=True, opaque_tile=True),
        sd_triton.DecodeConfig(64, 32, 4, 1, dv_split=2, int_dequant=True, opaque_tile=True),
        # the lazy rescale (DecodeConfig.lazy_rescale) on the launcher's tiles of each kind
        sd_triton.DecodeConfig(64, 64, 8, 1, partial_bf16=True, int_dequant=True, lazy_rescale=True),
        sd_triton.DecodeConfig(32, 32, 4, 1, partial_bf16=True, int_dequant=True, lazy_rescale=True),
        sd_triton.DecodeConfig(16, 32, 4, 1, partial_bf16=True, int_dequant=True, lazy_rescale=True),
        sd_triton.DecodeConfig(64, 16, 4, 2, dv_split=2, partial_bf16=True, int_dequant=True, lazy_rescale=True),
        # the integer dequant's lift (DecodeConfig.q_lift) forced each way (default: mma.sync tiles, >= 4 tiles each)
        sd_triton.DecodeConfig(32, 32, 4, 1, partial_bf16=True, int_dequant=True, q_lift=True),
        sd_triton.DecodeConfig(16, 32, 4, 1, partial_bf16=True, int_dequant=True, q_lift=True),
        sd_triton.DecodeConfig(64, 16, 4, 2, dv_split=2, partial_bf16=True, int_dequant=True, q_lift=True),
        sd_triton.DecodeConfig(64, 64, 8, 1, partial_bf16=True, int_dequant=True, q_lift=True),
        sd_triton.DecodeConfig(32, 32, 4, 1, partial_bf16=True, int_dequant=True, q_lift=False),
    ],
    ids=lambda c: (
        f"{c.block_h}x{c.block_n}-w{c.num_warps}-s{c.num_stages}-dv{c.dv_split}"
        + ("-bf16part" if c.partial_bf16 else "")
        + ("-intdq" if c.int_dequant else "")
        + ("-chunks" if c.chunks_first else "")
        + ({None: "", True: "-opaque", False: "-noopaque"}[c.opaque_tile])
        + ("-lazy" if c.lazy_rescale else "")
        + ({None: "", True: "-lift", False: "-nolift"}[c.q_lift])
    ),
)
@pytest.mark.parametrize("splits", [1, 3])
def test_other_configs_match_reference(nan_empty, cfg, splits):
    """The tile configs the sweep times (and the previous, chunked kernel body) compute the same function, the tile's
    opaque move on or off."""
    kw = make_case(5, 64, 128, 512, sink=True, invalid=0.05, seed=55 + splits)
    out, lse = sd_triton.sparse_decode_fwd(**kw, num_splits=splits, config=cfg)
    check(kw, out, lse)


@pytest.mark.parametrize("target", ["sm_80", "sm_89", "sm_120"])
@pytest.mark.parametrize(
    "batch,heads", [(16, 16), (64, 8), (64, 128), (128, 64)], ids=["B16-H16", "B64-H8", "B64-H128", "B128-H64"]
)
def test_launcher_choices_for_other_gpus_match_reference(nan_empty, target, batch, heads):
    """The tiles and split counts the launcher picks for another GPU's shared memory per SM (on this GPU's SMs): 32 x
    64 tiles in half tiles from 128 programs where an SM holds as many of them as of 32 x 32 ones (sm_89 / sm_120;
    an A100 keeps 32 x 32), split counts from the opaque tiles' exact size
    (test_programs_per_sm_follow_each_targets_shared_memory) compute the same function."""
    from dataclasses import replace

    from sparsemla.kernels import device as dev

    kw = make_case(batch, heads, 128, 512, sink=True, invalid=0.05, seed=batch + heads)
    here = dev.device_info(kw["q"].device)
    info = replace(dev.target(target), num_sms=here.num_sms)
    if batch * heads >= 4096:  # >= 128 programs of 32 heads
        cfg = sd_triton.choose_config(info, heads, batch)
        want = (32, 1, False) if target == "sm_80" else (64, 2, True)
        assert (cfg.block_n, cfg.sub_tiles, cfg.sub_joint_reduce) == want
    with dev.assume(info):
        out, lse = api.sparse_decode(**kw)
    check(kw, out, lse)


def all_bytes_case(seed: int = 77, q_scale: float = 0.01) -> dict:
    """B = 3, H = 64 decode kwargs whose caches' NoPE bytes are drawn from all 254 non-NaN e4m3 values (subnormals,
    +-0, +-448) under ue8m0 scales 2^-8..2^8, q times ``q_scale``."""
    gen = torch.Generator().manual_seed(seed)
    kw = make_case(3, 64, 128, 512, sink=True, seed=seed)
    nan_free = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8)
    for name in ("k_cache", "extra_k_cache"):
        cache = kw[name]
        pages, page_size = cache.shape[0], cache.shape[1]
        raw = layouts.v4_raw_pages(cache)
        data = raw[:, : page_size * 576].reshape(pages, page_size, 576)
        pick = torch.randint(0, nan_free.numel(), (pages, page_size, 448), generator=gen)
        data[:, :, :448] = nan_free[pick].cuda()
        scales = raw[:, page_size * 576 : page_size * 584].reshape(pages, page_size, 8)
        scales[:, :, :7] = torch.randint(127 - 8, 127 + 9, (pages, page_size, 7), generator=gen).to(torch.uint8).cuda()
    kw["q"] = kw["q"] * q_scale
    return kw


@pytest.mark.parametrize("lift", [False, True], ids=["nolift", "lift"])
@pytest.mark.parametrize("dv_split", [1, 2])
def test_integer_dequant_is_bit_identical_on_every_byte(dv_split, lift):
    """The integer e4m3 -> bf16 path equals the conversion-unit path bit for bit on :func:`all_bytes_case`, with and
    without the lift (q_lift: the 2^-120 folded into the scale multiply, q and the output scaled by 2^8 instead)."""
    kw = all_bytes_case()
    base = sd_triton.DecodeConfig(64, 16, 4, 2, dv_split=dv_split)
    want = sd_triton.sparse_decode_fwd(**kw, num_splits=3, config=base)
    got = sd_triton.sparse_decode_fwd(
        **kw, num_splits=3, config=sd_triton.DecodeConfig(**{**base.__dict__, "int_dequant": True, "q_lift": lift})
    )
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    check(kw, *got)


PREFETCH_TILES = [
    sd_triton.DecodeConfig(32, 32, 4, 1, partial_bf16=True, int_dequant=True),  # mma.sync targets
    sd_triton.DecodeConfig(16, 32, 4, 1, partial_bf16=True, int_dequant=True),
    sd_triton.DecodeConfig(64, 64, 8, 1, partial_bf16=True, int_dequant=True),  # sm_90's wgmma tile
    sd_triton.DecodeConfig(64, 16, 4, 2, dv_split=2, partial_bf16=True, int_dequant=True),
]


@pytest.mark.parametrize("ahead,stride", [(1, 128), (3, 128), (2, 32)], ids=["pf1", "pf3", "pf2-s32"])
@pytest.mark.parametrize("cfg", PREFETCH_TILES, ids=lambda c: f"{c.block_h}x{c.block_n}-w{c.num_warps}-dv{c.dv_split}")
def test_l2_prefetch_changes_no_bit(nan_empty, cfg, ahead, stride):
    """DecodeConfig.l2_prefetch (rows of a tile ahead prefetched into L2) computes the same bits as without it, with
    prefetched tiles crossing from the main cache into the extra one and past a split's end."""
    kw = make_case(5, 64, 128, 512, sink=True, invalid=0.05, seed=91)
    want = sd_triton.sparse_decode_fwd(**kw, num_splits=3, config=dataclasses.replace(cfg, l2_prefetch=0))
    got = sd_triton.sparse_decode_fwd(
        **kw, num_splits=3, config=dataclasses.replace(cfg, l2_prefetch=ahead, prefetch_stride=stride)
    )
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    check(kw, *got)


@pytest.mark.parametrize("joint", [False, True], ids=["own-reductions", "joint-reductions"])
@pytest.mark.parametrize("splits", [1, 5], ids=["1split", "5splits"])
@pytest.mark.parametrize("heads", [64, 29], ids=["H64", "H29"])
def test_sub_tiles_match_reference(nan_empty, heads, splits, joint):
    """sub_tiles=2 (each 64-token tile as its even and odd tokens, P staged half at a time: the 32 x 64 mma.sync
    tile within 101,376 B) on the GPU's own code, invalid entries, the extra cache, the lift and the prefetch
    defaults (8 tiles a program); the same scores as whole tiles up to the bf16 rounding of P."""
    kw = make_case(5, heads, 128, 2048, sink=True, invalid=0.05, seed=77 + heads)
    cfg = sd_triton.DecodeConfig(32, 64, 4, 1, partial_bf16=True, int_dequant=True, sub_tiles=2, sub_joint_reduce=joint)
    out, lse = sd_triton.sparse_decode_fwd(**kw, num_splits=splits, config=cfg)
    check(kw, out, lse)


def test_deterministic():
    kw = make_case(8, 64, 128, 2048, sink=True, seed=8)
    a = api.sparse_decode(**kw)
    for _ in range(3):
        b = api.sparse_decode(**kw)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("real", [8, 13], ids=["TP8-8of64", "13of64"])
def test_padded_heads_skip_the_pad(nan_empty, real):
    """q padded to 64 heads (NaN pad rows, as sglang's uninitialised pad can be): the real heads match the reference
    on the real heads alone, pad heads are 0 / -inf, eager == CUDA-graph replay."""
    kw = make_case(4, 64, 128, 512, sink=True, seed=31)
    kw["q"][:, :, real:] = float("nan")
    out, lse = sd_triton.sparse_decode_fwd(**kw, num_real_heads=real)
    check(dict(kw, q=kw["q"][:, :, :real].contiguous(), attn_sink=kw["attn_sink"][:real].contiguous()),
          out[:, :, :real], lse[:, :real].transpose(1, 2).contiguous().transpose(1, 2))  # fmt: skip
    assert torch.equal(out[:, :, real:], torch.zeros_like(out[:, :, real:])) and torch.isneginf(lse[:, real:]).all()
    graph = torch.cuda.CUDAGraph()
    sd_triton.sparse_decode_fwd(**kw, num_real_heads=real)
    with torch.cuda.graph(graph):
        captured = sd_triton.sparse_decode_fwd(**kw, num_real_heads=real)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured[0], out)


# -- the Gluon tile (sm_90's default from 8 programs; DecodeConfig.gluon) ---------------------------------------------
def _sm90_gluon() -> bool:
    from sparsemla.kernels import device as dev
    from sparsemla.kernels.sparse_decode import gluon_sm90

    return torch.cuda.is_available() and dev.device_info().capability == (9, 0) and gluon_sm90.available()


needs_gluon = pytest.mark.skipif(not _sm90_gluon(), reason="the Gluon tile is sm_90's (native path, Triton >= 3.6)")
GLUON = sd_triton.DecodeConfig(64, 64, 8, 1, partial_bf16=True, int_dequant=True, gluon=True)
# both forms of it: synchronous, and warp-specialized (a producer warpgroup gathers the next tile; the same bits)
TILE = pytest.mark.parametrize("ws", [False, True], ids=["sync", "ws"])


@needs_gluon
@pytest.mark.parametrize("splits", [1, 3, "auto"], ids=["1split", "3splits", "auto"])
@pytest.mark.parametrize("heads", [64, 128, 29], ids=["H64", "H128", "H29"])
@pytest.mark.parametrize(
    "cfg",
    [GLUON, dataclasses.replace(GLUON, partial_bf16=False), dataclasses.replace(GLUON, int_dequant=False)],
    ids=["bf16part-intdq", "fp32part", "fp8cvt"],
)
@TILE
def test_gluon_tile_matches_reference(nan_empty, cfg, heads, splits, ws):
    """The Gluon tile, synchronous and warp-specialized: both caches, -1 entries, valid lengths, the sink, head
    counts that leave part of a block empty, splits with one program each or three tiles (partials bf16 or fp32), the
    fp8 conversion and the integer dequant."""
    kw = make_case(5, heads, 128, 512, sink=True, invalid=0.05, seed=501 + heads)
    cfg = dataclasses.replace(cfg, warp_specialize=ws)
    out, lse = sd_triton.sparse_decode_fwd(**kw, num_splits=splits, config=cfg)
    check(kw, out, lse)


@needs_gluon
@pytest.mark.parametrize("swa_page,extra_page,extra_topk", [(96, 64, 2048), (64, 256, 512), (256, 64, 0)],
                         ids=["div-page+shift", "two-shifts", "no-extra"])  # fmt: skip
@TILE
def test_gluon_tile_pages_and_no_extra(nan_empty, swa_page, extra_page, extra_topk, ws):
    """Page sizes that are not powers of two (divisions), two different shifts, and no extra cache."""
    kw = make_case(9, 64, 128, extra_topk, sink=False, swa_page=swa_page, extra_page=extra_page, invalid=0.05, seed=7)
    check(kw, *sd_triton.sparse_decode_fwd(**kw, config=dataclasses.replace(GLUON, warp_specialize=ws)))


@needs_gluon
@TILE
def test_gluon_tile_corner_cases(nan_empty, ws):
    """Rows with no valid entry (all -1, lengths 0), duplicates, sink +inf / -inf, a non-contiguous q."""
    kw = corner_case()
    for splits in (1, 4):
        out, lse = sd_triton.sparse_decode_fwd(**kw, num_splits=splits,
                                               config=dataclasses.replace(GLUON, warp_specialize=ws))  # fmt: skip
        assert torch.equal(out[:2], torch.zeros_like(out[:2]))
        assert torch.equal(out[:, :, 0], torch.zeros_like(out[:, :, 0]))
        check(kw, out, lse)


@needs_gluon
@pytest.mark.parametrize("splits", [1, 3], ids=["1split", "3splits"])
@TILE
def test_gluon_tile_pad_heads_and_narrow_v(nan_empty, splits, ws):
    """8 real heads of a q padded to 64 (NaN pad rows: never read), and head_dim_v = 256 (the first 256 columns)."""
    cfg = dataclasses.replace(GLUON, warp_specialize=ws)
    kw = make_case(6, 64, 128, 512, sink=True, seed=61)
    kw["q"][:, :, 8:] = float("nan")
    out, lse = sd_triton.sparse_decode_fwd(**kw, num_real_heads=8, num_splits=splits, config=cfg)
    real = dict(kw, q=kw["q"][:, :, :8].contiguous(), attn_sink=kw["attn_sink"][:8].contiguous())
    check(real, out[:, :, :8], lse[:, :8].transpose(1, 2).contiguous().transpose(1, 2))
    assert torch.equal(out[:, :, 8:], torch.zeros_like(out[:, :, 8:])) and torch.isneginf(lse[:, 8:]).all()
    kw["q"][:, :, 8:] = 0.5
    narrow = dict(kw, head_dim_v=256)
    out, lse = sd_triton.sparse_decode_fwd(**narrow, num_splits=splits, config=cfg)
    assert out.shape[-1] == 256
    check(narrow, out, lse)


@needs_gluon
@pytest.mark.parametrize("lift", [False, True], ids=["nolift", "lift"])
def test_gluon_tile_integer_dequant_is_bit_identical_on_every_byte(lift):
    """The Gluon tile's integer e4m3 path equals its conversion-unit path bit for bit on every e4m3 byte, with and
    without the lift (q's NoPE times 2^8 in shared memory, one scale multiply a value, the output times 2^8)."""
    kw = all_bytes_case()
    want = sd_triton.sparse_decode_fwd(**kw, num_splits=3, config=dataclasses.replace(GLUON, int_dequant=False))
    got = sd_triton.sparse_decode_fwd(**kw, num_splits=3, config=dataclasses.replace(GLUON, q_lift=lift))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    check(kw, *got)


@needs_gluon
def test_sm90_launcher_takes_the_gluon_tile_from_8_programs():
    """sm_90's default for H > 16 from GLUON_SM90_MIN_BUSY programs is the Gluon tile (outside SM90_MMA_BUSY)."""
    from sparsemla.kernels import device as dev

    info = dev.device_info()
    assert sd_triton.choose_config(info, 64, 8).gluon and sd_triton.choose_config(info, 128, 4).gluon
    assert not sd_triton.choose_config(info, 64, 7).gluon and not sd_triton.choose_config(info, 16, 64).gluon


@needs_gluon
@pytest.mark.parametrize("ahead,stride", [(1, 128), (3, 32)], ids=["pf1", "pf3-s32"])
def test_gluon_tile_l2_prefetch_changes_no_bit(nan_empty, ahead, stride):
    """The Gluon tile's L2 prefetch (a tile ``ahead`` into L2, crossing from the main cache into the extra one and
    past a split's end) computes the same bits as without it."""
    kw = make_case(5, 64, 128, 512, sink=True, invalid=0.05, seed=93)
    want = sd_triton.sparse_decode_fwd(**kw, num_splits=3, config=dataclasses.replace(GLUON, l2_prefetch=0))
    got = sd_triton.sparse_decode_fwd(
        **kw, num_splits=3, config=dataclasses.replace(GLUON, l2_prefetch=ahead, prefetch_stride=stride)
    )
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    check(kw, *got)


@needs_gluon
@pytest.mark.parametrize("case", ["random", "corners", "div-page-no-extra"])
@pytest.mark.parametrize("prefetch", [0, 1, 3], ids=["pf0", "pf1", "pf3"])
@pytest.mark.parametrize("splits", [1, 3, 17], ids=["1split", "3splits", "17splits"])
def test_gluon_tile_ids_ahead_changes_no_bit(nan_empty, splits, prefetch, case):
    """DecodeConfig.ids_ahead (the Gluon tile's slot ids, and the prefetched tile's, loaded one iteration ahead):
    the same bits, across the main / extra boundary, a split's end and empty splits (17), with rows of no valid
    entry, and with one cache of 96-slot pages."""
    if case == "corners":
        kw = corner_case()
    elif case == "random":
        kw = make_case(5, 64, 128, 512, sink=True, invalid=0.05, seed=97)
    else:
        kw = make_case(5, 64, 128, 0, sink=True, swa_page=96, invalid=0.05, seed=98)
    base = dataclasses.replace(GLUON, l2_prefetch=prefetch)
    want = sd_triton.sparse_decode_fwd(**kw, num_splits=splits, config=base)
    got = sd_triton.sparse_decode_fwd(**kw, num_splits=splits, config=dataclasses.replace(base, ids_ahead=True))
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    check(kw, *got)


@needs_gluon
@pytest.mark.parametrize("ids_ahead", [False, True], ids=["ids", "ids-ahead"])
@pytest.mark.parametrize("case", ["random", "corners", "div-page-no-extra"])
@pytest.mark.parametrize("prefetch", [0, 1, 3], ids=["pf0", "pf1", "pf3"])
@pytest.mark.parametrize("splits", [1, 3, 17], ids=["1split", "3splits", "17splits"])
def test_gluon_tile_warp_specialized_changes_no_bit(nan_empty, splits, prefetch, case, ids_ahead):
    """DecodeConfig.warp_specialize (a producer warpgroup gathers tile i + 1 into the second buffer while the
    consumers multiply tile i): the synchronous tile's bits, with and without ids_ahead and the producer's L2
    prefetch, across the main / extra boundary, a split's end, empty splits (17: the barriers' phases of a program
    with no tile), rows of no valid entry and a cache of 96-slot pages."""
    if case == "corners":
        kw = corner_case()
    elif case == "random":
        kw = make_case(5, 64, 128, 512, sink=True, invalid=0.05, seed=97)
    else:
        kw = make_case(5, 64, 128, 0, sink=True, swa_page=96, invalid=0.05, seed=98)
    base = dataclasses.replace(GLUON, l2_prefetch=prefetch, warp_specialize=False)
    want = sd_triton.sparse_decode_fwd(**kw, num_splits=splits, config=base)
    ws = dataclasses.replace(base, warp_specialize=True, ids_ahead=ids_ahead)
    got = sd_triton.sparse_decode_fwd(**kw, num_splits=splits, config=ws)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    check(kw, *got)


@needs_gluon
def test_gluon_tile_warp_specialized_long_rows_and_graph(nan_empty):
    """Many tiles a program (top-k 2048 + 2048: 64 tiles, both buffers' barrier phases wrap many times), bit-equal to
    the synchronous tile, and captured in a CUDA graph and replayed on new inputs."""
    kw = make_case(3, 64, 2048, 2048, sink=True, invalid=0.02, seed=131)
    sync = dataclasses.replace(GLUON, warp_specialize=False)
    ws = dataclasses.replace(GLUON, warp_specialize=True)
    want = sd_triton.sparse_decode_fwd(**kw, num_splits=1, config=sync)
    got = sd_triton.sparse_decode_fwd(**kw, num_splits=1, config=ws)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    check(kw, *got)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = sd_triton.sparse_decode_fwd(**kw, num_splits=2, config=ws)
    fresh = make_case(3, 64, 2048, 2048, sink=True, invalid=0.02, seed=132)
    for key in ("q", "k_cache", "indices", "topk_length", "extra_k_cache", "extra_indices_in_kvcache",
                "extra_topk_length"):  # fmt: skip
        kw[key].copy_(fresh[key])
    graph.replay()
    torch.cuda.synchronize()
    want = sd_triton.sparse_decode_fwd(**kw, num_splits=2, config=sync)
    assert torch.equal(captured[0], want[0]) and torch.equal(captured[1], want[1])
