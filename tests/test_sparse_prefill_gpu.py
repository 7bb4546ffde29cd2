"""Sparse-MLA prefill Triton kernel on a CUDA GPU (``pytest -m gpu``): sglang's shapes (1k / 8k-token chunks, 16 / 128
heads, top-k 2048) vs the fp32 reference, corner cases, NaN-poisoned outputs, CUDA-graph replay, determinism, and
FlashMLA's ``flash_mla_sparse_fwd`` where it is installed. Skipped without CUDA."""

from __future__ import annotations

import pytest
import torch

from sparsemla.kernels.sparse_prefill import api
from sparsemla.kernels.sparse_prefill.reference import sparse_prefill_reference

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

OUT_RTOL = 1e-2  # relative Frobenius error of out: bf16 P in the PV dot and the bf16 output
STAT_TOL = 2e-3  # lse / max_logits: bf16 q . k dots with fp32 accumulation (tf32 never: bf16 operands)


def make_case(s_q, heads, topk, s_kv, *, d_qk=576, invalid=0.05, lengths=True, sink=False, seed=0):
    """Random inputs on the GPU: distinct rows per query (as the indexer's top-k gives), ``invalid`` of them -1."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(s_q, heads, d_qk, device="cuda", generator=gen).to(torch.bfloat16)
    kv = torch.randn(s_kv, 1, d_qk, device="cuda", generator=gen).to(torch.bfloat16)
    rows = []
    for lo in range(0, s_q, 512):
        n = min(512, s_q - lo)
        rows.append(torch.rand(n, s_kv, device="cuda", generator=gen).topk(topk, dim=-1).indices)
    idx = torch.cat(rows).to(torch.int32)
    idx = torch.where(torch.rand(idx.shape, device="cuda", generator=gen) < invalid, -1, idx)
    kw = dict(q=q, kv=kv, indices=idx.view(s_q, 1, topk), sm_scale=d_qk**-0.5, d_v=512, topk_length=None)
    if lengths:
        kw["topk_length"] = torch.randint(topk // 2, topk + 1, (s_q,), device="cuda", generator=gen, dtype=torch.int32)
    if sink:
        kw["attn_sink"] = torch.randn(heads, device="cuda", generator=gen)
    return kw


def check(kw, got, ref_rows=None):
    """Compare with the reference on ``ref_rows`` (a slice of query rows; all when None)."""
    out, max_logits, lse = got
    sl = slice(None) if ref_rows is None else ref_rows
    sub = dict(kw, q=kw["q"][sl], indices=kw["indices"][sl])
    if kw.get("topk_length") is not None:
        sub["topk_length"] = kw["topk_length"][sl]
    want_out, want_max, want_lse = sparse_prefill_reference(**sub)
    out, max_logits, lse = out[sl], max_logits[sl], lse[sl]
    assert out.shape == want_out.shape and out.dtype == torch.bfloat16
    assert not torch.isnan(out).any(), "unwritten or NaN output"
    err = float((out.float() - want_out.float()).norm() / want_out.float().norm().clamp_min(1e-30))
    assert err < OUT_RTOL, f"out rel err {err:.2e}"
    for got_stat, want_stat in ((max_logits, want_max), (lse, want_lse)):
        assert torch.equal(torch.isinf(got_stat), torch.isinf(want_stat))
        finite = torch.isfinite(want_stat)
        torch.testing.assert_close(got_stat[finite], want_stat[finite], atol=STAT_TOL, rtol=STAT_TOL)


@pytest.mark.parametrize(
    "s_q,heads",
    [(1024, 16), (1024, 128), (8192, 16), (8192, 128), (1024, 64), (333, 3)],
    ids=lambda v: str(v),
)
def test_sglang_shapes_match_reference(nan_empty, s_q, heads):
    kw = make_case(s_q, heads, 2048, 16384, seed=s_q + heads)
    got = api.sparse_prefill(**kw)
    rows = slice(None) if s_q * heads <= 1024 * 128 else slice(s_q - 512, s_q)  # the reference is slow at 8k x 128
    check(kw, got, rows)
    if rows != slice(None):
        check(kw, got, slice(0, 256))


@pytest.mark.parametrize("d_qk,sink", [(576, True), (512, True), (512, False)])
def test_sink_and_nope_only_keys(nan_empty, d_qk, sink):
    kw = make_case(257, 64, 512, 4096, d_qk=d_qk, sink=sink, seed=d_qk)
    if sink:
        kw["attn_sink"][0], kw["attn_sink"][1] = float("inf"), float("-inf")
    got = api.sparse_prefill(**kw)
    check(kw, got)
    if sink:
        assert torch.equal(got[0][:, 0], torch.zeros_like(got[0][:, 0])), "sink +inf must give a zero row"


def test_corner_rows(nan_empty):
    """All -1 rows, out-of-range rows, topk_length 0 and < topk, duplicates, non-contiguous q."""
    kw = make_case(64, 16, 2048, 4096, seed=3)
    idx, lens = kw["indices"], kw["topk_length"]
    idx[0] = -1
    idx[1] = 4096 + 7  # >= s_kv: invalid
    lens[2] = 0
    lens[3] = 1
    lens[4] = 100
    idx[5, :, 1024:] = idx[5, :, :1024]  # every row twice
    big = torch.randn(64, 16, 2 * 576, device="cuda").to(torch.bfloat16)
    kw["q"] = big[..., ::2]
    out, max_logits, lse = api.sparse_prefill(**kw)
    assert torch.equal(out[:3], torch.zeros_like(out[:3]))
    assert torch.isposinf(lse[:3]).all() and torch.isneginf(max_logits[:3]).all()
    check(kw, (out, max_logits, lse))


def test_cuda_graph_replay_and_determinism(nan_empty):
    kw = make_case(512, 16, 2048, 8192, seed=7)
    first = api.sparse_prefill(**kw)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = api.sparse_prefill(**kw)
    graph.replay()
    torch.cuda.synchronize()
    for a, b in zip(first, captured, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("heads", [64, 128])
def test_agrees_with_flashmla(heads):
    """Same inputs through sgl-flash-mla's ``flash_mla_sparse_fwd`` (legacy SM90 kernel on Hopper, whose statistics
    are base 2; the current kernels' are natural log): out within bf16 noise, statistics after converting bases."""
    flash_mla = pytest.importorskip("flash_mla")
    major = torch.cuda.get_device_capability()[0]
    if major not in (9, 10):
        pytest.skip("FlashMLA's sparse prefill is built for sm_90 / sm_100 only")
    legacy = major == 9
    kw = make_case(1024, heads, 2048, 16384, invalid=0.0, seed=heads)
    ours = api.sparse_prefill(**kw)
    theirs = flash_mla.flash_mla_sparse_fwd(
        kw["q"], kw["kv"], kw["indices"], kw["sm_scale"], 512, None, kw["topk_length"], use_legacy=legacy,
        return_log2_lse=True if legacy else None,
    )  # fmt: skip
    base = 0.6931471805599453 if legacy else 1.0
    err = float((ours[0].float() - theirs[0].float()).norm() / theirs[0].float().norm())
    assert err < OUT_RTOL, err
    torch.testing.assert_close(ours[1], theirs[1].float() * base, atol=STAT_TOL, rtol=STAT_TOL)
    torch.testing.assert_close(ours[2], theirs[2].float() * base, atol=STAT_TOL, rtol=STAT_TOL)
