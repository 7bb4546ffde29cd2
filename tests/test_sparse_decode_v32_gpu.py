"""DeepSeek-V3.2 sparse-MLA decode on a CUDA GPU (``pytest -m gpu``): the real shapes (B up to 128, 16 / 128 heads,
top-k 2048, page 64, s_q 1 and 2) against the fp32 reference for both KV formats, corner cases, every configuration
the chooser returns for any target, CUDA-graph capture == eager, determinism. NaN-poisoned outputs. Skipped without
CUDA."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from sparsemla import flags
from sparsemla.kernels import device as dev
from sparsemla.kernels import layouts
from sparsemla.kernels.sparse_decode import api
from sparsemla.kernels.sparse_decode import triton_v32 as v32
from sparsemla.kernels.sparse_decode.reference import sparse_decode_v32_reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

F16_TILES = [
    v32.V32Config(32, 32, 4, 2, True, nope_chunks=4, opaque_k=True, f16=True),
    v32.V32Config(32, 32, 4, 2, True, False, nope_chunks=4, opaque_k=True, f16=True),
    v32.V32Config(16, 32, 4, 3, True, nope_chunks=4, opaque_k=True, f16=True),
    v32.V32Config(16, 32, 4, 3, True, False, nope_chunks=4, opaque_k=True, f16=True),
    v32.V32Config(64, 64, 8, 3, True, nope_chunks=4, f16=True),
    v32.V32Config(64, 64, 8, 3, True, False, nope_chunks=4, f16=True),
]
# relative Frobenius error of out: bf16 P in the PV dot, bf16 (partials and) output; fp8_656 also rounds the
# dequantized e4m3 * scale to bf16 once (the reference keeps it in fp32)
OUT_RTOL = {"bf16_576": 1e-2, "fp8_656": 1.5e-2}
# fp8: the kernel rounds the dequantized K (e4m3 x fp32 scale) to bf16 before the MMA, as FlashMLA does; the
# reference keeps it in fp32, so one score in a row can move lse by ~2.3e-3 relative (measured on the H200).
LSE_TOL = {"bf16_576": 2e-3, "fp8_656": 4e-3}
SCALE = 576**-0.5
TOPK = 2048


def make_case(kv_format, batch, s_q, heads, topk=TOPK, *, invalid=0.02, lengths="short", seed=0):
    """(args, kwargs) of ``sparse_decode_v32`` on the GPU: distinct random slots per query row from a cache of
    2 x topk slots, some -1; topk_length in [topk / 2, topk] ("short") or None."""
    gen = torch.Generator().manual_seed(seed)
    blocks = max(2, 2 * topk // layouts.V32_PAGE)
    kv = layouts.random_v32_cache(blocks, kv_format, generator=gen)
    num_slots = blocks * layouts.V32_PAGE
    idx = torch.stack([torch.randperm(num_slots, generator=gen)[:topk] for _ in range(batch * s_q)])
    idx = idx.to(torch.int32).view(batch, s_q, topk)
    if invalid:
        idx[torch.rand(idx.shape, generator=gen) < invalid] = -1
    q = torch.randn(batch, s_q, heads, layouts.V32_DIM, generator=gen).to(torch.bfloat16)
    length = None
    if lengths == "short":
        length = torch.randint(topk // 2, topk + 1, (batch,), generator=gen, dtype=torch.int32).cuda()
    args = [q.cuda(), kv.cuda(), idx.cuda(), SCALE]
    return args, dict(kv_format=kv_format, d_v=512, topk_length=length)


def check(args, kw, out, lse):
    want_out, want_lse = sparse_decode_v32_reference(*args, **kw)
    assert out.shape == want_out.shape and out.dtype == torch.bfloat16
    assert lse.shape == want_lse.shape and lse.is_contiguous()
    assert not torch.isnan(out).any(), "unwritten or NaN output"
    assert not torch.isnan(lse).any(), "unwritten or NaN lse"
    err = float((out.float() - want_out.float()).norm() / want_out.float().norm().clamp_min(1e-30))
    assert err < OUT_RTOL[kw["kv_format"]] or torch.equal(out, want_out), f"out rel err {err:.2e}"
    assert torch.equal(torch.isposinf(lse), torch.isposinf(want_lse))
    finite = torch.isfinite(want_lse)
    tol = LSE_TOL[kw["kv_format"]]
    torch.testing.assert_close(lse[finite], want_lse[finite], atol=tol, rtol=tol)


GRID = [
    pytest.param(fmt, b, s, h, id=f"{fmt}-B{b}-s{s}-H{h}")
    for fmt in layouts.V32_FORMATS
    for b in (1, 8, 64, 128)
    for h in (16, 128)
    for s in (1, 2)
]


@pytest.mark.parametrize("kv_format,batch,s_q,heads", GRID)
def test_real_shapes_match_reference(nan_empty, kv_format, batch, s_q, heads):
    args, kw = make_case(kv_format, batch, s_q, heads, seed=batch * 1000 + heads + s_q)
    out, lse = api.sparse_decode_v32(*args, **kw)
    check(args, kw, out, lse)


@pytest.mark.parametrize("kv_format", layouts.V32_FORMATS)
@pytest.mark.parametrize("heads", [1, 3, 17, 33, 64, 127])
def test_odd_head_counts(nan_empty, kv_format, heads):
    args, kw = make_case(kv_format, 5, 2, heads, topk=576, seed=heads)
    out, lse = api.sparse_decode_v32(*args, **kw)
    check(args, kw, out, lse)


@pytest.mark.parametrize("kv_format", layouts.V32_FORMATS)
@pytest.mark.parametrize("splits", ["auto", 1, 3, 17, 64])
def test_splits(nan_empty, kv_format, splits):
    args, kw = make_case(kv_format, 2, 2, 128, seed=7)
    with flags.SPARSEMLA_SPLIT_K.override(splits):
        out, lse = api.sparse_decode_v32(*args, **kw)
    check(args, kw, out, lse)


@pytest.mark.parametrize("kv_format", layouts.V32_FORMATS)
def test_corner_cases(nan_empty, kv_format):
    """All -1 rows and topk_length 0 -> out 0, lse +inf; entries past topk_length ignored; slots past the cache
    invalid; non-contiguous q; a padded (unaligned) page stride."""
    args, kw = make_case(kv_format, 6, 2, 16, lengths=None, seed=4)
    q, kv, idx, _ = args
    kw["topk_length"] = torch.full((6,), TOPK, dtype=torch.int32, device="cuda")
    idx[0] = -1
    kw["topk_length"][1] = 0
    kw["topk_length"][2] = 100
    idx[3, :, ::5] = kv.shape[0] * kv.shape[1] + 12345
    big = torch.randn(6, 2, 32, 1152, device="cuda").to(torch.bfloat16)
    big[:, :, ::2, 1::2] = q
    args[0] = big[:, :, ::2, 1::2]
    for splits in (1, 4):
        with flags.SPARSEMLA_SPLIT_K.override(splits):
            out, lse = api.sparse_decode_v32(*args, **kw)
        assert torch.equal(out[:2], torch.zeros_like(out[:2])) and torch.isposinf(lse[:2]).all()
        check(args, kw, out, lse)
    pad = 4 if kv_format == "fp8_656" else 2
    page = kv.shape[1] * kv.shape[3]
    buf = torch.zeros(kv.shape[0], page + pad, dtype=kv.dtype, device="cuda")
    buf[:, :page] = kv.reshape(kv.shape[0], page)
    with flags.SPARSEMLA_SPLIT_K.override(4):  # the split count of the last `out` above: same reduction order
        unaligned = api.sparse_decode_v32(args[0], buf[:, :page].view(kv.shape), idx, SCALE, **kw)
    assert torch.equal(unaligned[0], out) and torch.equal(unaligned[1], lse)


def _variant_id(cfg: v32.V32Config) -> str:
    chunks = f"-c{cfg.nope_chunks}" if cfg.nope_chunks > 1 else ""
    name = f"{cfg.block_h}x{cfg.block_n}-w{cfg.num_warps}-s{cfg.num_stages}{chunks}{'-stage_k' if cfg.stage_k else ''}"
    name += ("-opaque" if cfg.opaque_k else "") + ("-lazy" if cfg.lazy_rescale else "")
    name += ("-gluon" if cfg.gluon else "") + ("-pf" if cfg.gluon_prefetch else "") + ("-ws" if cfg.gluon_ws else "")
    name += "-f16" if cfg.f16 else ""
    name += "" if cfg.int_dequant else "-cvt"
    return name + {None: "", True: "-lift", False: "-nolift"}[cfg.q_lift]


def _every_chosen_config() -> list[tuple[v32.V32Config, str]]:
    """Each (configuration, format) pair some target gets: a tile is chosen for its format (sm_90's 3-stage fp8_656
    tile needs more shared memory than any GPU has with bf16_576 rows)."""
    pairs = {
        (v32.choose_v32_config(info, h, r, fmt), fmt)
        for info in dev.TARGETS.values()
        for h in (16, 128)
        for r in (1, 128)
        for fmt in layouts.V32_FORMATS
    }
    key = lambda p: (p[1], p[0].block_h, p[0].block_n, p[0].num_warps, p[0].num_stages, p[0].nope_chunks)  # noqa: E731
    return sorted(pairs, key=key)


@pytest.mark.parametrize(
    "cfg,kv_format",
    _every_chosen_config(),
    ids=[f"{f.split('_')[0]}-{_variant_id(c)}" for c, f in _every_chosen_config()],
)
@pytest.mark.parametrize("splits", [1, 3])
def test_every_targets_config_matches_reference(nan_empty, cfg, kv_format, splits):
    """The tiles sm_80..sm_120 get, run here (mma.sync tiles, and sm_90's 64-head wgmma and Gluon tiles in the native
    path; the sm_89 path skips those two)."""
    _runnable(cfg, kv_format)
    args, kw = make_case(kv_format, 3, 2, 128, seed=55 + splits)
    out, lse = v32.sparse_decode_v32_fwd(*args, **kw, num_splits=splits, config=cfg)
    check(args, kw, out, lse)


# V32Config fields beyond the chosen configurations (nope_chunks, stage_k, opaque_k): the tiles
# benchmarks/explore_v32_configs.py sweeps. A tile the device refuses (check_v32_config) or cannot hold (shared memory)
# is skipped.
BF16_VARIANTS = [  # the bf16 tiles (f16=False pinned: the default rule takes f16 from 16 tiles a program)
    v32.V32Config(64, 32, 8, 1, True, nope_chunks=4),
    v32.V32Config(64, 32, 8, 2, True, nope_chunks=4),
    v32.V32Config(64, 32, 8, 3, True, nope_chunks=4),
    v32.V32Config(64, 64, 8, 2, True, nope_chunks=4),
    v32.V32Config(64, 16, 8, 2, True, nope_chunks=4),
    v32.V32Config(64, 32, 8, 2, True, nope_chunks=4, stage_k=True),
    v32.V32Config(32, 32, 4, 2, True, nope_chunks=4, stage_k=True),
    v32.V32Config(16, 32, 4, 2, True, nope_chunks=4),
    v32.V32Config(32, 32, 8, 1, True, nope_chunks=2, stage_k=True),
    # K chunks through the opaque move (bf16 operand layout on mma.sync), with and without stage_k
    v32.V32Config(32, 32, 4, 2, True, nope_chunks=4, stage_k=True, opaque_k=True),
    v32.V32Config(16, 32, 4, 3, True, nope_chunks=4, opaque_k=True),
    # the lazy rescale (V32Config.lazy_rescale) on the chosen tiles of each kind
    v32.V32Config(64, 64, 8, 3, True, nope_chunks=4, lazy_rescale=True),
    v32.V32Config(32, 32, 4, 2, True, nope_chunks=4, opaque_k=True, lazy_rescale=True),
    v32.V32Config(16, 32, 4, 3, True, nope_chunks=4, opaque_k=True, lazy_rescale=True),
    # the integer dequant's lift (V32Config.q_lift) forced each way on the chosen tiles of each kind (fp8_656 only)
    v32.V32Config(64, 64, 8, 3, True, nope_chunks=4, q_lift=True),
    v32.V32Config(32, 32, 4, 2, True, nope_chunks=4, opaque_k=True, q_lift=True),
    v32.V32Config(16, 32, 4, 3, True, nope_chunks=4, opaque_k=True, q_lift=False),
    # sm_90's Gluon tile (V32Config.gluon, fp8_656; elsewhere skipped), synchronous and with its gather a tile ahead,
    # with the e4m3 conversion instructions and with the integer dequant
    v32.V32Config(64, 64, 8, 1, True, gluon=True),
    v32.V32Config(64, 64, 8, 1, True, gluon=True, gluon_prefetch=True),
    v32.V32Config(64, 64, 8, 1, True, int_dequant=False, gluon=True, gluon_prefetch=True),
]
VARIANTS = [
    *(replace(c, f16=False) for c in BF16_VARIANTS),
    v32.V32Config(64, 64, 8, 1, True, int_dequant=False, gluon=True, gluon_prefetch=True, f16=True),
    v32.V32Config(64, 64, 8, 1, True, int_dequant=False, gluon=True, gluon_ws=True),
    # the Triton tiles in f16 (V32Config.f16, fp8_656): the chosen mma.sync tiles and sm_90's 64-head tile, with the
    # integer bits and with the conversion instructions
    *F16_TILES,
]


def _runnable(cfg: v32.V32Config, kv_format: str) -> None:
    info = dev.device_info()
    try:
        v32.check_v32_config(cfg, info, kv_format)
    except ValueError as exc:
        pytest.skip(str(exc))
    if v32.shared_bytes_v32(cfg, kv_format, info) > info.smem_per_block:
        pytest.skip(f"needs more shared memory than sm_{info.arch} has")


@pytest.mark.parametrize("cfg", VARIANTS, ids=_variant_id)
@pytest.mark.parametrize("kv_format", layouts.V32_FORMATS)
@pytest.mark.parametrize(
    "heads,splits", [(128, 1), (128, 3), (33, 2)], ids=["H128-1split", "H128-3splits", "H33-2splits"]
)
def test_config_variants_match_reference(nan_empty, cfg, kv_format, heads, splits):
    _runnable(cfg, kv_format)
    args, kw = make_case(kv_format, 3, 2, heads, seed=91 + heads + splits)
    out, lse = v32.sparse_decode_v32_fwd(*args, **kw, num_splits=splits, config=cfg)
    check(args, kw, out, lse)


@pytest.mark.parametrize("cfg", [VARIANTS[1], VARIANTS[6]], ids=_variant_id)
@pytest.mark.parametrize("kv_format", layouts.V32_FORMATS)
def test_config_variants_corner_cases(nan_empty, cfg, kv_format):
    """All -1 rows and topk_length 0 -> out 0, lse +inf in every chunk; d_v ending inside a chunk."""
    _runnable(cfg, kv_format)
    args, kw = make_case(kv_format, 4, 2, 128, lengths=None, seed=5)
    kw["topk_length"] = torch.full((4,), TOPK, dtype=torch.int32, device="cuda")
    args[2][0] = -1
    kw["topk_length"][1] = 0
    kw["topk_length"][2] = 100
    for splits, d_v in ((1, 512), (4, 512), (4, 200)):
        kw_dv = dict(kw, d_v=d_v)
        out, lse = v32.sparse_decode_v32_fwd(*args, **kw_dv, num_splits=splits, config=cfg)
        assert torch.equal(out[:2], torch.zeros_like(out[:2])) and torch.isposinf(lse[:2]).all()
        check(args, kw_dv, out, lse)


GLUON_TILES = [  # bf16 (f16=False pinned: the Gluon tile's default is f16), then f16
    v32.V32Config(64, 64, 8, 1, True, gluon=True, f16=False),
    v32.V32Config(64, 64, 8, 1, True, gluon=True, gluon_prefetch=True, f16=False),
    v32.V32Config(64, 64, 8, 1, True, int_dequant=False, gluon=True, gluon_prefetch=True, f16=True),
    v32.V32Config(64, 64, 8, 1, True, int_dequant=False, gluon=True, gluon_ws=True),  # warp-specialized, f16
]


@pytest.mark.parametrize("cfg", GLUON_TILES, ids=_variant_id)
def test_gluon_tile_corner_cases(nan_empty, cfg):
    """sm_90's Gluon tile: all -1 rows and topk_length 0 -> out 0, lse +inf; a length ending inside a tile; d_v
    ending inside a chunk; odd head counts (the second 64-head block partly masked); split and unsplit."""
    _runnable(cfg, "fp8_656")
    for heads in (128, 100, 33):
        args, kw = make_case("fp8_656", 4, 2, heads, lengths=None, seed=7 + heads)
        kw["topk_length"] = torch.full((4,), TOPK, dtype=torch.int32, device="cuda")
        args[2][0] = -1
        kw["topk_length"][1] = 0
        kw["topk_length"][2] = 100
        for splits, d_v in ((1, 512), (4, 512), (4, 200), (1, 448)):
            kw_dv = dict(kw, d_v=d_v)
            out, lse = v32.sparse_decode_v32_fwd(*args, **kw_dv, num_splits=splits, config=cfg)
            assert torch.equal(out[:2], torch.zeros_like(out[:2])) and torch.isposinf(lse[:2]).all()
            check(args, kw_dv, out, lse)


@pytest.mark.parametrize("int_dequant", [True, False], ids=["int", "cvt"])
@pytest.mark.parametrize("splits", [1, 3, 17])
def test_gluon_prefetch_changes_no_bit(nan_empty, int_dequant, splits):
    """The Gluon tile's gather one tile ahead (cp.async into staging) computes the same bits as the synchronous
    tile: across split ends, empty splits (17), -1 and out-of-range ids, short rows; and the integer dequant equals
    the e4m3 conversion instructions bit for bit."""
    sync, ahead = (replace(c, int_dequant=int_dequant) for c in GLUON_TILES[:2])
    _runnable(ahead, "fp8_656")
    args, kw = make_case("fp8_656", 5, 2, 128, invalid=0.05, seed=17 + splits)
    num_slots = args[1].shape[0] * args[1].shape[1]
    args[2][1, 0, ::7] = num_slots + 3  # past the cache: invalid
    want = v32.sparse_decode_v32_fwd(*args, **kw, num_splits=splits, config=sync)
    got = v32.sparse_decode_v32_fwd(*args, **kw, num_splits=splits, config=ahead)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    flip = replace(ahead, int_dequant=not int_dequant)
    other = v32.sparse_decode_v32_fwd(*args, **kw, num_splits=splits, config=flip)
    assert torch.equal(other[0], got[0]) and torch.equal(other[1], got[1])
    check(args, kw, *got)


@pytest.mark.parametrize(
    "splits,q_gain", [(1, 0.01), (3, 1.0), (17, 4.0)], ids=["1split-q0.01", "3splits-q1", "17splits-q4"]
)
def test_f16_prefetch_changes_no_bit_and_spans_scales(nan_empty, splits, q_gain):
    """V32Config.f16: the gather a tile ahead computes the synchronous tile's bits; with NoPE tiles of std
    0.002 .. 30 (scales from f16's subnormals up; products f16 holds) and q scaled by ``q_gain`` (its power of two
    moves), the reference's numbers."""
    ahead = GLUON_TILES[2]
    _runnable(ahead, "fp8_656")
    args, kw = make_case("fp8_656", 5, 2, 128, invalid=0.05, seed=23 + splits)
    gen = torch.Generator().manual_seed(splits)
    cache = layouts.random_v32_cache(args[1].shape[0], "fp8_656", generator=gen, tile_std=(0.002, 1.0, 30.0, 3.0))
    args[1] = cache.cuda()
    args[0] = (args[0].float() * q_gain).to(torch.bfloat16)
    want = v32.sparse_decode_v32_fwd(*args, **kw, num_splits=splits, config=replace(ahead, gluon_prefetch=False))
    got = v32.sparse_decode_v32_fwd(*args, **kw, num_splits=splits, config=ahead)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    check(args, kw, *got)


@pytest.mark.parametrize("splits", [1, 3, 17])
@pytest.mark.parametrize("heads", [128, 33])
def test_gluon_ws_tile_computes_the_f16_tile_bits(nan_empty, splits, heads):
    """V32Config.gluon_ws: the warp-specialized tile (a producer warpgroup gathers and dequantizes the next tile)
    computes the prefetching f16 tile's bits: across split ends, empty splits (17), -1 and out-of-range ids, short
    rows (topk_length), a masked head block, all -1 rows, d_v 200."""
    ws, ahead = GLUON_TILES[3], GLUON_TILES[2]
    _runnable(ws, "fp8_656")
    args, kw = make_case("fp8_656", 5, 2, heads, invalid=0.05, seed=61 + splits)
    num_slots = args[1].shape[0] * args[1].shape[1]
    args[2][1, 0, ::7] = num_slots + 3  # past the cache: invalid
    args[2][2] = -1
    for d_v in (512, 200):
        kw_dv = dict(kw, d_v=d_v)
        want = v32.sparse_decode_v32_fwd(*args, **kw_dv, num_splits=splits, config=ahead)
        got = v32.sparse_decode_v32_fwd(*args, **kw_dv, num_splits=splits, config=ws)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        check(args, kw_dv, *got)


@pytest.mark.parametrize("cfg", F16_TILES[::2], ids=_variant_id)
@pytest.mark.parametrize("q_gain", [0.01, 4.0], ids=["q0.01", "q4"])
def test_f16_tiles_integer_bits_equal_conversions_and_span_scales(nan_empty, cfg, q_gain):
    """V32Config.f16 in the Triton tiles: the integer bits (e4m3 * 2^-8 times the scale * 2^8) give the conversion
    instructions' bits where scales are f16-normal; NoPE tiles of std 0.002 .. 30 and q scaled by ``q_gain``: the
    reference's numbers."""
    _runnable(cfg, "fp8_656")
    args, kw = make_case("fp8_656", 3, 2, 100, invalid=0.05, seed=41)
    gen = torch.Generator().manual_seed(5)
    cache = layouts.random_v32_cache(args[1].shape[0], "fp8_656", generator=gen, tile_std=(0.002, 1.0, 30.0, 3.0))
    args[1] = cache.cuda()
    args[0] = (args[0].float() * q_gain).to(torch.bfloat16)
    got = v32.sparse_decode_v32_fwd(*args, **kw, num_splits=3, config=cfg)
    check(args, kw, *got)
    cvt = replace(cfg, int_dequant=False)
    if dev.device_info().has_fp8:  # (sm_80/86 have no conversion instructions)
        normal = layouts.random_v32_cache(args[1].shape[0], "fp8_656", generator=gen).cuda()  # scales >= 2^-14
        ints = v32.sparse_decode_v32_fwd(args[0], normal, *args[2:], **kw, num_splits=3, config=cfg)
        cvts = v32.sparse_decode_v32_fwd(args[0], normal, *args[2:], **kw, num_splits=3, config=cvt)
        assert torch.equal(ints[0], cvts[0]) and torch.equal(ints[1], cvts[1])


@pytest.mark.parametrize("cfg", GLUON_TILES, ids=_variant_id)
def test_gluon_tile_strided_q_int64_lengths_ragged_topk(nan_empty, cfg):
    """sm_90's Gluon tile with a non-contiguous q (stride 2 along its 576 dims), int64 topk_length and a top-k that
    is not a multiple of its 64-token tile: the reference's numbers, and the same bits as a contiguous q."""
    _runnable(cfg, "fp8_656")
    args, kw = make_case("fp8_656", 3, 2, 128, topk=2000, seed=29)
    kw["topk_length"] = kw["topk_length"].long()
    big = torch.randn(3, 2, 128, 1152, device="cuda").to(torch.bfloat16)
    big[..., ::2] = args[0]
    strided = [big[..., ::2], *args[1:]]
    for splits in (1, 5):
        want = v32.sparse_decode_v32_fwd(*args, **kw, num_splits=splits, config=cfg)
        got = v32.sparse_decode_v32_fwd(*strided, **kw, num_splits=splits, config=cfg)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
        check(strided, kw, *got)


def test_gluon_tile_refuses_what_it_cannot_run():
    """V32Config.gluon: the bf16_576 cache and an unaligned fp8_656 cache are refused with a reason, not run."""
    cfg = GLUON_TILES[0]
    _runnable(cfg, "fp8_656")
    args, kw = make_case("bf16_576", 2, 1, 128, seed=3)
    with pytest.raises(ValueError, match="fp8_656"):
        v32.sparse_decode_v32_fwd(*args, **kw, config=cfg)
    args, kw = make_case("fp8_656", 2, 1, 128, seed=3)
    kv = args[1]
    page = kv.shape[1] * kv.shape[3]
    buf = torch.zeros(kv.shape[0], page + 4, dtype=kv.dtype, device="cuda")  # pages 4 bytes apart from 16-aligned
    buf[:, :page] = kv.reshape(kv.shape[0], page)
    with pytest.raises(ValueError, match="16-byte"):
        v32.sparse_decode_v32_fwd(args[0], buf[:, :page].view(kv.shape), *args[2:], **kw, config=cfg)


PREFETCH_TILES = [  # the chosen tiles of each kind (sm_90's wgmma tile, the mma.sync tiles of H > 16 and H <= 16)
    v32.V32Config(64, 64, 8, 3, True, nope_chunks=4),
    v32.V32Config(32, 32, 4, 2, True, nope_chunks=4, opaque_k=True),
    v32.V32Config(16, 32, 4, 3, True, nope_chunks=4, opaque_k=True),
]


@pytest.mark.parametrize("ahead,stride", [(1, 128), (4, 128), (2, 32)], ids=["pf1", "pf4", "pf2-s32"])
@pytest.mark.parametrize("cfg", PREFETCH_TILES, ids=_variant_id)
@pytest.mark.parametrize("kv_format", layouts.V32_FORMATS)
def test_l2_prefetch_changes_no_bit(nan_empty, cfg, kv_format, ahead, stride):
    """V32Config.l2_prefetch (rows of a tile ahead prefetched into L2) computes the same bits as without it, with
    prefetched tiles past a split's end and invalid slots among them."""
    _runnable(cfg, kv_format)
    args, kw = make_case(kv_format, 3, 2, 128, seed=93)
    want = v32.sparse_decode_v32_fwd(*args, **kw, num_splits=3, config=cfg)
    pf = replace(cfg, l2_prefetch=ahead, prefetch_stride=stride)
    got = v32.sparse_decode_v32_fwd(*args, **kw, num_splits=3, config=pf)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    check(args, kw, *got)


@pytest.mark.parametrize("chunks,stage_k", [(1, False), (4, True)], ids=["chosen", "c4-stage_k"])
def test_integer_dequant_is_bit_identical_to_the_fp8_type(chunks, stage_k):
    """The integer e4m3 -> bf16 path (every target) equals the fp8 conversion instructions (sm_89+) bit for bit,
    NoPE bytes drawn from all 254 non-NaN e4m3 values (also with the NoPE dims in chunks, K staged once)."""
    if not dev.device_info().has_fp8:
        pytest.skip("needs a GPU with an e4m3 type for the comparison path")
    args, kw = make_case("fp8_656", 4, 2, 128, seed=77)
    kv = args[1]
    nan_free = torch.tensor([b for b in range(256) if b & 0x7F != 0x7F], dtype=torch.uint8, device="cuda")
    pick = torch.randint(0, nan_free.numel(), kv[..., :512].shape, device="cuda")
    kv[..., :512] = nan_free[pick]
    args[0] = args[0] * 0.01
    base = v32.V32Config(32, 32, 8, 1, nope_chunks=chunks, stage_k=stage_k, f16=False)  # (f16: its own test)
    a = v32.sparse_decode_v32_fwd(*args, **kw, num_splits=3, config=base)
    b = v32.sparse_decode_v32_fwd(*args, **kw, num_splits=3, config=replace(base, int_dequant=False))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    check(args, kw, *a)


@pytest.mark.parametrize("kv_format", layouts.V32_FORMATS)
@pytest.mark.parametrize("batch,heads", [(1, 128), (64, 16), (128, 128)])
def test_cuda_graph_replay_equals_eager(kv_format, batch, heads):
    args, kw = make_case(kv_format, batch, 2, heads, seed=batch)
    eager = api.sparse_decode_v32(*args, **kw)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        api.sparse_decode_v32(*args, **kw)  # warm up (compile) on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = api.sparse_decode_v32(*args, **kw)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured[0], eager[0]) and torch.equal(captured[1], eager[1])
    fresh, fresh_kw = make_case(kv_format, batch, 2, heads, seed=batch + 1)
    args[0].copy_(fresh[0])
    args[2].copy_(fresh[2])
    kw["topk_length"].copy_(fresh_kw["topk_length"])
    graph.replay()
    torch.cuda.synchronize()
    want = api.sparse_decode_v32(*args, **kw)
    assert torch.equal(captured[0], want[0]) and torch.equal(captured[1], want[1])
    assert not torch.equal(captured[0], eager[0])


def test_deterministic():
    args, kw = make_case("fp8_656", 8, 2, 128, seed=8)
    a = api.sparse_decode_v32(*args, **kw)
    for _ in range(3):
        b = api.sparse_decode_v32(*args, **kw)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
