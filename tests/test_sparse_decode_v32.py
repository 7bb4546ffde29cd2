"""DeepSeek-V3.2 sparse-MLA decode (``sparse_decode_v32``): the Triton kernel on the CPU interpreter (tiny shapes)
against the fp32 reference, the V3.2 byte layouts, and the launch configuration on every target.

Every kernel call runs the real Triton kernels through ``TRITON_INTERPRET`` (dots in fp32 there, so the tolerance is
tight); outputs are NaN-poisoned (``nan_empty``) so an element the kernel never wrote fails the test.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from sparsemla import flags
from sparsemla.kernels import device as dev
from sparsemla.kernels import layouts
from sparsemla.kernels.sparse_decode import api
from sparsemla.kernels.sparse_decode import triton_v32 as v32
from sparsemla.kernels.sparse_decode.reference import sparse_decode_v32_reference

OUT_RTOL = 1e-4  # relative Frobenius error of out (fp32 dots in the interpreter; both sides round to bf16)
LSE_ATOL = 1e-4
SCALE = 576**-0.5

interpreted = pytest.mark.skipif(
    not v32._is_interpreted(), reason="needs TRITON_INTERPRET=1 at startup (tests/conftest.py sets it on CPU)"
)


def make_case(kv_format, batch, s_q, heads, topk, *, blocks=3, invalid=0.0, lengths=None, seed=0):
    """(args, kwargs) of ``sparse_decode_v32``: a random cache of ``blocks`` 64-token pages, distinct slots per query
    row (each of the s_q rows its own set), a fraction set to -1."""
    gen = torch.Generator().manual_seed(seed)
    kv = layouts.random_v32_cache(blocks, kv_format, generator=gen)
    num_slots = blocks * layouts.V32_PAGE
    rows = [torch.randperm(num_slots, generator=gen)[:topk] for _ in range(batch * s_q)]
    idx = torch.stack(rows).to(torch.int32).view(batch, s_q, topk)
    if invalid:
        idx[torch.rand(idx.shape, generator=gen) < invalid] = -1
    q = torch.randn(batch, s_q, heads, layouts.V32_DIM, generator=gen).to(torch.bfloat16)
    kw = dict(kv_format=kv_format, d_v=512, topk_length=None)
    if lengths == "short":
        kw["topk_length"] = torch.randint(0, topk + 1, (batch,), generator=gen, dtype=torch.int32)
    elif lengths == "full":
        kw["topk_length"] = torch.full((batch,), topk, dtype=torch.int32)
    return [q, kv, idx, SCALE], kw


def check(args, kw, out, lse):
    want_out, want_lse = sparse_decode_v32_reference(*args, **kw)
    assert out.shape == want_out.shape and out.dtype == torch.bfloat16
    assert lse.shape == want_lse.shape and lse.dtype == torch.float32 and lse.is_contiguous()
    assert not torch.isnan(out).any(), "unwritten or NaN output"
    assert not torch.isnan(lse).any(), "unwritten or NaN lse"
    err = (out.float() - want_out.float()).norm() / want_out.float().norm().clamp_min(1e-30)
    assert err < OUT_RTOL or torch.equal(out, want_out), f"out rel err {err:.2e}"
    assert torch.equal(torch.isposinf(lse), torch.isposinf(want_lse)), "empty rows must have lse +inf"
    finite = torch.isfinite(want_lse)
    torch.testing.assert_close(lse[finite], want_lse[finite], atol=LSE_ATOL, rtol=LSE_ATOL)


# -- the kernel on the interpreter ------------------------------------------------------------------------------------
CASES = [
    pytest.param("fp8_656", 2, 1, 3, 40, 0.2, "full", 1, id="fp8-B2-s1-H3-1split"),
    pytest.param("fp8_656", 2, 2, 16, 48, 0.1, "short", 3, id="fp8-B2-s2-H16-short-3splits"),
    pytest.param("fp8_656", 1, 1, 128, 24, 0.1, None, 2, id="fp8-B1-s1-H128-2splits"),
    pytest.param("fp8_656", 3, 1, 33, 37, 0.0, None, "auto", id="fp8-B3-s1-H33-auto"),
    pytest.param("bf16_576", 2, 1, 3, 40, 0.2, "full", 1, id="bf16-B2-s1-H3-1split"),
    pytest.param("bf16_576", 1, 2, 16, 48, 0.1, "short", 4, id="bf16-B1-s2-H16-short-4splits"),
    pytest.param("bf16_576", 1, 1, 128, 24, 0.0, None, "auto", id="bf16-B1-s1-H128-auto"),
]


@interpreted
@pytest.mark.parametrize("kv_format,batch,s_q,heads,topk,invalid,lengths,splits", CASES)
def test_matches_reference(nan_empty, kv_format, batch, s_q, heads, topk, invalid, lengths, splits):
    args, kw = make_case(kv_format, batch, s_q, heads, topk, invalid=invalid, lengths=lengths, seed=heads + topk)
    with flags.SPARSEMLA_SPLIT_K.override(splits):
        out, lse = api.sparse_decode_v32(*args, **kw)
    check(args, kw, out, lse)


@interpreted
@pytest.mark.parametrize("kv_format", layouts.V32_FORMATS)
def test_empty_rows_short_lengths_and_out_of_range_slots(nan_empty, kv_format):
    """All -1 -> out 0, lse +inf (FlashMLA); topk_length 0 likewise; entries past topk_length never count (they hold
    valid slots here); slots >= num_blocks * 64 are invalid, not read."""
    args, kw = make_case(kv_format, 4, 2, 5, 32, lengths="full", seed=5)
    q, kv, idx, _ = args
    idx[0] = -1  # both query tokens of request 0
    kw["topk_length"][1] = 0
    kw["topk_length"][2] = 7
    idx[3, 0, ::3] = kv.shape[0] * kv.shape[1] + 1000  # out of range
    for splits in (1, 3):
        with flags.SPARSEMLA_SPLIT_K.override(splits):
            out, lse = api.sparse_decode_v32(*args, **kw)
        assert torch.equal(out[:2], torch.zeros_like(out[:2]))
        assert torch.isposinf(lse[:2]).all()
        assert torch.isfinite(lse[2:]).all()
        check(args, kw, out, lse)
    # request 2 equals the same call on its first 7 entries alone
    short = [q[2:3], kv, idx[2:3, :, :7].contiguous(), SCALE]
    want_out, want_lse = sparse_decode_v32_reference(*short, kv_format=kv_format)
    torch.testing.assert_close(out[2:3].float(), want_out.float(), atol=2e-2, rtol=1e-2)
    torch.testing.assert_close(lse[2:3], want_lse, atol=LSE_ATOL, rtol=LSE_ATOL)


@interpreted
def test_mtp_rows_shared_or_own_index_sets(nan_empty):
    """s_q = 2: each query token reads its own index row; with a shared set, token 1 equals a call for token 1 alone."""
    args, kw = make_case("fp8_656", 2, 2, 8, 32, invalid=0.1, seed=8)
    q, kv, idx, _ = args
    own = api.sparse_decode_v32(*args, **kw)
    check(args, kw, *own)
    shared = [q, kv, idx[:, :1].expand(-1, 2, -1).contiguous(), SCALE]
    out, lse = api.sparse_decode_v32(*shared, **kw)
    check(shared, kw, out, lse)
    alone = api.sparse_decode_v32(q[:, 1:].contiguous(), kv, idx[:, :1].contiguous(), SCALE, **kw)
    assert torch.equal(out[:, 1:], alone[0]) and torch.equal(lse[:, :, 1:], alone[1])


@interpreted
@pytest.mark.parametrize("kv_format", layouts.V32_FORMATS)
def test_strided_q_and_cache_views(nan_empty, kv_format):
    """q strided along every dim; the cache a view into a larger buffer with a padded page stride (not a multiple of
    16: the unaligned path); fp8 caches also as float8_e4m3fn / int8 views: same results."""
    args, kw = make_case(kv_format, 2, 2, 6, 40, invalid=0.1, lengths="short", seed=13)
    q, kv, idx, _ = args
    base = torch.randn(2, 2, 12, 1152, generator=torch.Generator().manual_seed(13)).to(torch.bfloat16)
    base[:, :, ::2, ::2] = q
    q_strided = base[:, :, ::2, ::2]
    assert q_strided.stride(3) == 2
    pad = 4 if kv_format == "fp8_656" else 2  # bytes / bf16 values per page
    page = kv.shape[1] * kv.shape[3]
    buf = torch.zeros(kv.shape[0], page + pad, dtype=kv.dtype)
    buf[:, :page] = kv.reshape(kv.shape[0], page)
    kv_strided = buf[:, :page].view(kv.shape)
    assert kv_strided.stride(0) == page + pad
    want = api.sparse_decode_v32(*args, **kw)
    check(args, kw, *want)
    got = api.sparse_decode_v32(q_strided, kv_strided, idx, SCALE, **kw)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    if kv_format == "fp8_656":
        for dtype in (torch.float8_e4m3fn, torch.int8):
            view = api.sparse_decode_v32(q, kv.view(dtype), idx, SCALE, **kw)
            assert torch.equal(view[0], want[0]) and torch.equal(view[1], want[1])


@interpreted
def test_d_v_and_deterministic(nan_empty):
    args, kw = make_case("fp8_656", 1, 1, 16, 48, invalid=0.1, seed=21)
    kw["d_v"] = 448
    with flags.SPARSEMLA_SPLIT_K.override(3):
        a = api.sparse_decode_v32(*args, **kw)
        b = api.sparse_decode_v32(*args, **kw)
    assert a[0].shape[-1] == 448
    check(args, kw, *a)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@interpreted
def test_topk_zero_gives_empty_rows(nan_empty):
    args, kw = make_case("bf16_576", 2, 1, 4, 8, seed=2)
    args[2] = args[2][:, :, :0]
    out, lse = api.sparse_decode_v32(*args, **kw)
    assert torch.equal(out, torch.zeros_like(out)) and torch.isposinf(lse).all()


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda a, kw: kw.update(kv_format="fp8"), "kv_format"),
        (lambda a, kw: a.__setitem__(0, a[0].float()), "bf16"),
        (lambda a, kw: a.__setitem__(0, a[0][..., :512]), "576"),
        (lambda a, kw: a.__setitem__(2, a[2].long()), "int32"),
        (lambda a, kw: a.__setitem__(2, a[2][:1]), "indices"),
        (lambda a, kw: kw.update(topk_length=torch.zeros(3, dtype=torch.int32)), "topk_length"),
        (lambda a, kw: kw.update(kv_format="bf16_576"), "kv_cache"),
        (lambda a, kw: a.__setitem__(1, a[1][..., :576]), "kv_cache"),
        (lambda a, kw: kw.update(d_v=513), "d_v"),
    ],
)
def test_bad_inputs_raise(mutate, match):
    args, kw = make_case("fp8_656", 2, 1, 4, 16, seed=1)
    mutate(args, kw)
    with pytest.raises(ValueError, match=match):
        if match == "kv_format":
            api.sparse_decode_v32(*args, **kw)
        else:
            v32.sparse_decode_v32_fwd(*args, **kw)


def test_forced_reference_has_the_same_contract():
    args, kw = make_case("fp8_656", 2, 2, 4, 16, seed=3)
    args[2][0] = -1
    with flags.SPARSEMLA_FORCE_REFERENCE.override(True):
        out, lse = api.sparse_decode_v32(*args, **kw)
    assert out.shape == (2, 2, 4, 512) and lse.shape == (2, 4, 2) and lse.is_contiguous()
    assert torch.equal(out[0], torch.zeros_like(out[0])) and torch.isposinf(lse[0]).all()
    assert torch.isfinite(lse[1]).all()


# -- the byte layout --------------------------------------------------------------------------------------------------
def test_fp8_656_bytes_are_where_flashmla_documents_them():
    """One row built by hand from FlashMLA's documented layout: [512 e4m3][4 x fp32 scale][64 x bf16], decoded."""
    gen = torch.Generator().manual_seed(0)
    nope = torch.randn(512, generator=gen).to(torch.float8_e4m3fn)
    scales = torch.tensor([0.5, 3.0, 0.125, 7.0])
    rope = torch.randn(64, generator=gen).to(torch.bfloat16)
    row = torch.cat([nope.view(torch.uint8), scales.view(torch.uint8), rope.view(torch.uint8)])
    assert row.numel() == layouts.V32_FP8_BYTES == 656
    cache = torch.zeros(1, 64, 1, 656, dtype=torch.uint8)
    cache[0, 5, 0] = row
    got = layouts.decode_v32_rows(cache, torch.tensor([5]), "fp8_656")[0]
    want = torch.cat([(nope.float().view(4, 128) * scales[:, None]).view(512), rope.float()])
    assert torch.equal(got, want)


def test_quantized_cache_is_close_to_its_latents():
    gen = torch.Generator().manual_seed(1)
    latent = torch.randn(64, 576, generator=gen) * torch.linspace(0.1, 10, 576)
    rows = layouts.quantize_v32_fp8(latent)
    assert rows.shape == (64, 656) and rows.dtype == torch.uint8
    back = layouts.decode_v32_rows(rows.view(1, 64, 1, 656), torch.arange(64), "fp8_656")
    rel = (back[:, :512] - latent[:, :512]).abs() / latent[:, :512].abs().amax(dim=1, keepdim=True)
    assert rel.max() < 2**-4  # e4m3: 3 mantissa bits, scale = amax / 448
    torch.testing.assert_close(back[:, 512:], latent[:, 512:].to(torch.bfloat16).float())
    scales = rows[:, 512:528].contiguous().view(torch.float32)
    torch.testing.assert_close(scales, latent[:, :512].abs().view(64, 4, 128).amax(-1) / 448)


def test_random_caches_have_distinct_tile_scales_and_no_zeros():
    kv = layouts.random_v32_cache(2, "fp8_656", generator=torch.Generator().manual_seed(2))
    scales = kv[..., 512:528].contiguous().view(torch.float32).view(-1, 4)
    assert (scales[:, 2] > 4 * scales[:, 0]).float().mean() > 0.9
    bf = layouts.random_v32_cache(2, "bf16_576", generator=torch.Generator().manual_seed(2))
    assert bf.shape == (2, 64, 1, 576) and bf.dtype == torch.bfloat16 and (bf != 0).float().mean() > 0.99


# -- launch configuration ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize("target", list(dev.TARGETS))
@pytest.mark.parametrize("kv_format", layouts.V32_FORMATS)
def test_configs_fit_every_target(target, kv_format):
    info = dev.target(target)
    for heads in (1, 3, 16, 17, 64, 128):
        for rows in (1, 8, 9, 128, 256):
            cfg = v32.choose_v32_config(info, heads, rows, kv_format)
            assert v32.shared_bytes_v32(cfg, kv_format) <= info.smem_per_block, (target, heads, rows, cfg)
            assert cfg.int_dequant, "the integer e4m3 path is the one every target compiles"
            assert cfg.block_h >= min(heads, 32) or cfg.block_h == 16


def test_small_budget_targets_get_narrower_bf16_tiles():
    assert v32.choose_v32_config(dev.target("sm_120"), 128, 64, "bf16_576").block_n == 16
    assert v32.choose_v32_config(dev.target("sm_80"), 128, 64, "bf16_576").block_n == 32
    assert v32.choose_v32_config(dev.target("sm_120"), 128, 64, "fp8_656").block_n == 32
    assert v32.choose_v32_config(dev.target("sm_90"), 16, 1).block_h == 16


@pytest.mark.slow
def test_aot_compiles_fit_and_match_the_estimate(tmp_path):
    """Ahead-of-time compile of two V3.2 cases for sm_80 and sm_120 (the integer dequant path, the smallest budget):
    no spills over 256 B, within budget, and ``shared_bytes_v32`` equal to (never below) the compiler's figure."""
    from sparsemla.kernels.aot import decode_v32_cases

    names = [n for n in decode_v32_cases() if n.endswith("B64 H128 topk2048 s_q1")]
    cmd = [sys.executable, "-m", "sparsemla.kernels.aot", "--arch", "sm_80", "--arch", "sm_120"]
    cmd += [f"--case={n}" for n in names] + ["--json", str(tmp_path / "aot.json")]
    run = subprocess.run(cmd, env=flags.child_env({"TRITON_INTERPRET": None}), capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    recs = [r for r in json.loads((tmp_path / "aot.json").read_text())["records"] if "combine" not in r["kernel"]]
    assert len(recs) == 2 * len(names) == 4
    for r in recs:
        fmt = r["case"].split()[1]
        cfg = v32.choose_v32_config(dev.target(r["target"]), 128, 64, fmt)
        assert r["shared"] <= v32.shared_bytes_v32(cfg, fmt), r
        assert r["spilled"] <= 256 and r["shared"] <= r["budget"], r
