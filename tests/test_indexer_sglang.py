"""The benchmark's torch baselines and our sglang-contract top-k against sglang 0.5.23's own functions (CPU; skipped
where sglang is not importable)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.indexer import torch_fallback_logits, torch_topk_transform
from sparsemla.kernels import layouts
from sparsemla.kernels.indexer import sglang_compat


@pytest.fixture(scope="module")
def sgl_indexer():
    return pytest.importorskip("sglang.srt.layers.attention.dsv4.indexer")


def _case(seed: int):
    g = torch.Generator().manual_seed(seed)
    seq_lens = torch.tensor([130, 1, 0, 64], dtype=torch.int32)
    kv = layouts.random_indexer_cache(20, generator=g)
    pt = layouts.random_page_table(seq_lens, 6, 20, generator=g)
    q = (torch.randn(4, 1, 64, 128, generator=g) * 2).to(torch.float8_e4m3fn)
    w = torch.randn(4, 64, generator=g)
    return q, kv, w, seq_lens, pt


def test_torch_fallback_equals_sglang(sgl_indexer):
    """The benchmark's `torch_fallback` re-implementation is sglang's fp8_paged_mqa_logits_torch_sm120, bit for bit."""
    q, kv, w, seq_lens, pt = _case(1)
    ours = torch_fallback_logits(q, kv, w, seq_lens, pt, 384)
    theirs = sgl_indexer.fp8_paged_mqa_logits_torch_sm120(q, kv, w, seq_lens, pt, None, 384, False)
    assert torch.equal(ours, theirs)


def test_topk_transforms_select_sglangs_sets(sgl_indexer):
    """Our `torch_topk` re-implementation equals sglang's topk_transform_pytorch_vectorized; our sglang-contract
    top-k picks the same slot set per row (distinct logits, so the set is unique)."""
    g = torch.Generator().manual_seed(2)
    rows, k = 4, 512
    seq_lens = torch.tensor([2000, 512, 30, 0], dtype=torch.int32)
    scores = torch.randn(rows, 2048, generator=g)
    table = torch.randperm(200, generator=g)[: rows * 32].view(rows, 32).to(torch.int32)
    theirs = torch.empty(rows, k, dtype=torch.int32)
    sgl_indexer.topk_transform_pytorch_vectorized(scores, seq_lens, table, theirs, 64)
    mine = torch.empty(rows, k, dtype=torch.int32)
    torch_topk_transform(scores, seq_lens, table, mine, 64)
    assert torch.equal(torch.sort(mine, dim=1).values, torch.sort(theirs, dim=1).values)
    ours = torch.full((rows, k), -7, dtype=torch.int32)
    sglang_compat.topk_transform_paged(scores, seq_lens, table, ours, 64)
    assert torch.equal(torch.sort(ours, dim=1).values, torch.sort(theirs, dim=1).values)
