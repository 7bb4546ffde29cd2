"""Sparse-MLA prefill Triton kernel on the CPU interpreter (tiny shapes) against the fp32 reference.

Every call runs the real Triton kernel through ``TRITON_INTERPRET`` (dots in fp32 there, so the tolerance is tight);
outputs are NaN-poisoned so an element the kernel never wrote fails the test. The reference itself is pinned to a
direct softmax formula on one case, so the two cannot drift together.
"""

from __future__ import annotations

import pytest
import torch

from sparsemla import flags
from sparsemla.kernels import device as dev
from sparsemla.kernels.sparse_prefill import api
from sparsemla.kernels.sparse_prefill import triton as sp_triton
from sparsemla.kernels.sparse_prefill.reference import sparse_prefill_reference

OUT_RTOL = 1e-4  # relative Frobenius error of out (fp32 dots in the interpreter; both sides round to bf16)
STAT_TOL = 1e-4  # lse / max_logits, absolute and relative

pytestmark = pytest.mark.skipif(
    not sp_triton._is_interpreted(), reason="needs TRITON_INTERPRET=1 at startup (tests/conftest.py sets it on CPU)"
)


def make_case(s_q, heads, topk, s_kv, *, d_qk=576, invalid=0.0, lengths=None, sink=False, seed=0):
    """``flash_mla_sparse_fwd`` arguments: random q / kv (never zeros), ``invalid`` of the indices -1 or >= s_kv."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(s_q, heads, d_qk, generator=gen).to(torch.bfloat16)
    kv = torch.randn(s_kv, 1, d_qk, generator=gen).to(torch.bfloat16)
    idx = torch.randint(0, s_kv, (s_q, 1, topk), generator=gen, dtype=torch.int32)
    bad = torch.rand(idx.shape, generator=gen) < invalid
    out_of_range = torch.randint(s_kv, s_kv + 5, idx.shape, generator=gen, dtype=torch.int32)
    idx = torch.where(bad, torch.where(torch.rand(idx.shape, generator=gen) < 0.5, -1, out_of_range), idx)
    kw = dict(q=q, kv=kv, indices=idx, sm_scale=d_qk**-0.5, d_v=512, topk_length=None)
    if lengths == "short":
        kw["topk_length"] = torch.randint(0, topk + 1, (s_q,), generator=gen, dtype=torch.int32)
    if sink:
        kw["attn_sink"] = torch.randn(heads, generator=gen) * 2
    return kw


def check(kw, got):
    out, max_logits, lse = got
    want_out, want_max, want_lse = sparse_prefill_reference(**kw)
    assert out.shape == want_out.shape and out.dtype == torch.bfloat16
    assert max_logits.shape == lse.shape == want_lse.shape and lse.dtype == max_logits.dtype == torch.float32
    assert not torch.isnan(out).any(), "unwritten or NaN output"
    assert not torch.isnan(lse).any() and not torch.isnan(max_logits).any()
    err = (out.float() - want_out.float()).norm() / want_out.float().norm().clamp_min(1e-30)
    assert err < OUT_RTOL or torch.equal(out, want_out), f"out rel err {err:.2e}"
    for got_stat, want_stat in ((max_logits, want_max), (lse, want_lse)):
        assert torch.equal(got_stat.isposinf(), want_stat.isposinf())
        assert torch.equal(got_stat.isneginf(), want_stat.isneginf())
        finite = torch.isfinite(want_stat)
        torch.testing.assert_close(got_stat[finite], want_stat[finite], atol=STAT_TOL, rtol=STAT_TOL)


@pytest.mark.parametrize(
    "s_q,heads,topk,s_kv,d_qk,invalid,lengths,sink",
    [
        pytest.param(3, 16, 40, 50, 576, 0.2, None, False, id="H16-invalid"),
        pytest.param(2, 3, 33, 40, 576, 0.1, "short", False, id="H3-short"),
        pytest.param(2, 20, 24, 30, 576, 0.0, "short", True, id="H20-2blocks-sink"),
        pytest.param(2, 16, 20, 64, 512, 0.1, None, True, id="d512-sink"),
    ],
)
def test_matches_reference(nan_empty, s_q, heads, topk, s_kv, d_qk, invalid, lengths, sink):
    kw = make_case(s_q, heads, topk, s_kv, d_qk=d_qk, invalid=invalid, lengths=lengths, sink=sink, seed=heads + topk)
    check(kw, api.sparse_prefill(**kw))


def test_empty_rows_and_lengths(nan_empty):
    """All -1, all >= s_kv, topk_length 0 (even with valid indices) and a negative length: out 0, max_logits -inf,
    lse +inf; topk_length < topk must ignore the entries past it (here valid ones)."""
    kw = make_case(6, 16, 40, 48, seed=5)
    kw["topk_length"] = torch.full((6,), 40, dtype=torch.int32)
    kw["indices"][0] = -1
    kw["indices"][1] = 48
    kw["topk_length"][2] = 0
    kw["topk_length"][3] = -3
    kw["topk_length"][4] = 7
    out, max_logits, lse = got = api.sparse_prefill(**kw)
    assert torch.equal(out[:4], torch.zeros_like(out[:4]))
    assert torch.isposinf(lse[:4]).all() and torch.isneginf(max_logits[:4]).all()
    assert torch.isfinite(lse[4:]).all()
    check(kw, got)
    short = dict(kw, indices=kw["indices"][4:5, :, :7].contiguous(), q=kw["q"][4:5], topk_length=None)
    torch.testing.assert_close(got[2][4:5], sparse_prefill_reference(**short)[2], atol=1e-6, rtol=1e-6)


def test_duplicates_count_twice_and_noncontiguous_q(nan_empty):
    kw = make_case(2, 16, 32, 40, seed=9)
    kw["indices"][:, :, 16:] = kw["indices"][:, :, :16]
    big = torch.randn(2, 16, 2 * 576, generator=torch.Generator().manual_seed(9)).to(torch.bfloat16)
    kw["q"] = big[..., ::2]  # stride 2 along d_qk
    got = api.sparse_prefill(**kw)
    check(kw, got)
    once = dict(kw, indices=kw["indices"][:, :, :16].contiguous())
    # listing every row twice adds log(2) to the lse and leaves out unchanged
    torch.testing.assert_close(got[2], sparse_prefill_reference(**once)[2] + 0.6931471805599453, atol=1e-4, rtol=0)


def test_sink_infinities(nan_empty):
    kw = make_case(2, 16, 24, 30, sink=True, seed=4)
    kw["attn_sink"][0], kw["attn_sink"][1] = float("inf"), float("-inf")
    out, max_logits, lse = got = api.sparse_prefill(**kw)
    assert torch.equal(out[:, 0], torch.zeros_like(out[:, 0])), "sink +inf must give a zero row"
    nosink = api.sparse_prefill(**dict(kw, attn_sink=None))
    assert torch.equal(out[:, 1], nosink[0][:, 1]), "sink -inf must have no effect"
    assert torch.equal(lse, nosink[2]) and torch.equal(max_logits, nosink[1]), "the sink never enters lse"
    check(kw, got)


def test_reference_is_the_softmax_formula():
    """One query, one head, by hand: natural-log lse, max_logits with sm_scale applied, invalid entries skipped."""
    kw = make_case(1, 1, 6, 8, seed=2)
    kw["indices"][0, 0] = torch.tensor([3, -1, 5, 8, 3, 0], dtype=torch.int32)
    rows = kw["kv"][[3, 5, 3, 0], 0].float()
    s = rows @ kw["q"][0, 0].float() * kw["sm_scale"]
    out, max_logits, lse = sparse_prefill_reference(**kw)
    torch.testing.assert_close(lse[0, 0], torch.logsumexp(s, 0))
    torch.testing.assert_close(max_logits[0, 0], s.max())
    torch.testing.assert_close(out[0, 0].float(), (torch.softmax(s, 0) @ rows[:, :512]).bfloat16().float())


def test_deterministic_and_config_override():
    kw = make_case(2, 16, 40, 50, invalid=0.1, seed=11)
    a = api.sparse_prefill(**kw)
    b = sp_triton.sparse_prefill_fwd(**kw, config=sp_triton.PrefillConfig(block_h=16, block_n=32, num_warps=4))
    assert torch.equal(a[0], api.sparse_prefill(**kw)[0])
    check(kw, b)


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda kw: kw.update(q=kw["q"].float()), "bf16"),
        (lambda kw: kw.update(q=kw["q"][..., :500]), "576"),
        (lambda kw: kw.update(indices=kw["indices"].long()), "int32"),
        (lambda kw: kw.update(kv=kw["kv"].expand(-1, 2, -1)), "h_kv"),
        (lambda kw: kw.update(d_v=576), "d_v"),
        (lambda kw: kw.update(topk_length=torch.zeros(1, dtype=torch.int32)), "topk_length"),
        (lambda kw: kw.update(attn_sink=torch.zeros(3)), "attn_sink"),
    ],
)
def test_bad_inputs_raise(mutate, match):
    kw = make_case(2, 16, 16, 20, seed=1)
    mutate(kw)
    with pytest.raises(ValueError, match=match):
        api.sparse_prefill(**kw)
    with pytest.raises(ValueError):
        sp_triton.PrefillConfig(block_h=24, block_n=16, num_warps=4)


def test_backend_selection_and_configs():
    q = torch.zeros(1, 16, 576, dtype=torch.bfloat16)
    assert api.select_backend(q) == "interpreter"
    with flags.SPARSEMLA_FORCE_REFERENCE.override(True):
        kw = make_case(2, 16, 16, 20, seed=1)
        assert torch.equal(api.sparse_prefill(**kw)[0], sparse_prefill_reference(**kw)[0])
    # wgmma targets get 64-head blocks for many heads, mma.sync targets 16 (their 101,376 B); 16-head blocks at TP 8
    # (whether each fits is the aot cases' job: tests/test_aot.py)
    got = {
        (name, h): sp_triton.choose_config(info, h).block_h for name, info in dev.TARGETS.items() for h in (3, 16, 128)
    }
    assert {got[(name, 128)] for name in ("sm_90", "sm_100")} == {64}
    assert {got[(name, 128)] for name in ("sm_80", "sm_86", "sm_89", "sm_120")} == {16}
    assert {got[(name, h)] for name in dev.TARGETS for h in (3, 16)} == {16}
