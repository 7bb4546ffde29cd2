"""Drop-in replacements for the sglang 0.5.23 DeepSeek-V4 indexer calls, with their exact signatures, so the plugin's
hook table can point sglang's names at the Triton kernels.

Where sglang 0.5.23 calls them (``srt/layers/attention/dsv4/indexer.py``, ``C4IndexerBackendMixin.forward_c4_indexer``
-> ``run_paged_indexer``)::

    logits = fn(q [rows, 1, 64, 128] fp8, kv [pages, 64, 1, 132], weights [rows, 64] fp32, c4_seq_lens ([rows] or
                [rows, 1]) int32, page_table [rows, max_pages] int32, deep_gemm_metadata, max_compressed_seq_len, False)
    run_topk_transform(rows, logits, plan)   # -> one of the topk_transform_* functions below, writing
                                             #    core_metadata.c4_sparse_page_indices [rows, index_topk] in place

``fn`` is ``deep_gemm.fp8_paged_mqa_logits`` by default, or (``SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=1``) the module
globals ``fp8_paged_mqa_logits_torch`` / ``fp8_paged_mqa_logits_torch_sm120``, which gather every page up to the
page-table width. The page table is the request's 256-token main pages; the compressed (c4) page size is 64, so a
position ``t`` maps to slot ``page_table[row, t // 64] * 64 + t % 64`` -- the same table the indexer keys use.

Top-k outputs are the same *sets* as sglang's (exact top-k; ties at the threshold go to the smaller position); the
order inside a row is by ascending position (``sorted=False``: no sort), where sglang's kernels leave it
unspecified (its torch fallback calls ``torch.topk(sorted=False)``, and lists ``0..L-1`` in order when ``L <= k``).
The sparse-attention consumer is order-invariant.
"""

from __future__ import annotations

from typing import Any

import torch

from sparsemla.kernels.device import select_backend
from sparsemla.kernels.indexer.api import indexer_logits, indexer_topk


def fp8_paged_mqa_logits(
    q_fp8: torch.Tensor,
    kvcache_fp8: torch.Tensor,
    weight: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    deep_gemm_metadata: Any,
    max_seq_len: int,
    clean_logits: bool = False,
) -> torch.Tensor:
    """Contract of ``fp8_paged_mqa_logits_torch[_sm120]`` and ``deep_gemm.fp8_paged_mqa_logits``: fp32
    ``[rows * next_n, max_seq_len]``; positions at or past a row's length are unspecified unless ``clean_logits``."""
    return indexer_logits(
        q_fp8, kvcache_fp8, weight, seq_lens, page_table, deep_gemm_metadata, max_seq_len, clean_logits
    )


class _Scratch:
    """Grow-only int32 ``[rows, k]`` position scratch per device (the top-k kernel compacts winners there)."""

    def __init__(self) -> None:
        self.bufs: dict[tuple[torch.device, int], torch.Tensor] = {}

    def get(self, device: torch.device, rows: int, k: int) -> torch.Tensor:
        buf = self.bufs.get((device, k))
        if buf is None or buf.shape[0] < rows:
            buf = torch.empty((max(rows, 1), k), dtype=torch.int32, device=device)
            self.bufs[(device, k)] = buf
        return buf[:rows]


_SCRATCH = _Scratch()


def topk_transform_paged(
    scores: torch.Tensor,
    seq_lens: torch.Tensor,
    page_tables: torch.Tensor | None,
    out_page_indices: torch.Tensor,
    page_size: int,
    out_raw_indices: torch.Tensor | None = None,
) -> None:
    """Contract of ``topk_transform_pytorch_vectorized`` / ``topk_transform_paged`` (v1): ``k =
    out_page_indices.shape[1]`` (512, 1024 or 2048) best of ``scores[row, :seq_lens[row]]``, written as page-table slots
    into ``out_page_indices`` (-1 padded) and, when given, as positions into ``out_raw_indices``. ``page_tables=None``
    writes positions into ``out_page_indices`` (the v2 raw mode)."""
    rows, k = out_page_indices.shape
    lens = seq_lens.reshape(-1)[:rows]
    if select_backend(scores) == "reference":
        # plain CPU (no interpreter): positions from the reference, the page transform in torch
        pos = _position_order(indexer_topk(scores, lens, k))
        if page_tables is None:
            out_page_indices.copy_(pos)
            if out_raw_indices is not None:
                out_raw_indices.copy_(pos)
        else:
            _write_slots_torch(pos, page_tables, out_page_indices, page_size, out_raw_indices)
        return
    from sparsemla.kernels.indexer.topk import indexer_topk_fwd

    if page_tables is None:
        target = out_page_indices if out_raw_indices is None else out_raw_indices
        indexer_topk_fwd(scores, lens, k, out=target, sorted=False)
        if out_raw_indices is not None:
            out_page_indices.copy_(out_raw_indices)
        return
    idx = out_raw_indices if out_raw_indices is not None else _SCRATCH.get(scores.device, rows, k)
    indexer_topk_fwd(
        scores, lens, k, out=idx, page_table=page_tables, page_size=page_size, out_slots=out_page_indices, sorted=False
    )


def topk_transform_paged_v2(
    scores: torch.Tensor,
    seq_lens: torch.Tensor,
    page_tables: torch.Tensor | None,
    out_page_indices: torch.Tensor,
    page_size: int,
    metadata: torch.Tensor,
    out_raw_indices: torch.Tensor | None = None,
) -> None:
    """Contract of ``topk_transform_paged_v2`` (``metadata`` is sglang's ``plan_topk_v2`` routing plan; not needed)."""
    del metadata
    topk_transform_paged(scores, seq_lens, page_tables, out_page_indices, page_size, out_raw_indices)


# sglang's top-k v2 routing plan: [B + 1, 2] int32, row 0 = {cluster threshold, cluster items}, then {batch, length}
# per row routed to its persistent cluster kernel.
PLAN_INTS_PER_ROW = 2


def plan_topk_v2(
    seq_lens: torch.Tensor, static_threshold: int = -1, *, out: torch.Tensor | None = None
) -> torch.Tensor:
    """Contract of sglang's ``plan_topk_v2`` for :func:`topk_transform_paged_v2`, which needs no plan: sglang's shape,
    zeroed (no row routed to a cluster), written into ``out`` when given. Builds no JIT module and never syncs, so
    sglang's v2 top-k path also runs where its CUDA kernels do not build."""
    del static_threshold
    plan = seq_lens.new_zeros(seq_lens.shape[0] + 1, PLAN_INTS_PER_ROW, dtype=torch.int32) if out is None else out
    return plan.zero_()


def _position_order(pos: torch.Tensor) -> torch.Tensor:
    """Each row's positions ascending, -1 padding last (the order the Triton path writes)."""
    big = torch.iinfo(torch.int32).max
    pos = torch.where(pos >= 0, pos, big).sort(dim=1).values
    return torch.where(pos == big, -1, pos)


def _write_slots_torch(
    pos: torch.Tensor,
    page_tables: torch.Tensor,
    out_page_indices: torch.Tensor,
    page_size: int,
    out_raw_indices: torch.Tensor | None,
) -> None:
    valid = pos >= 0
    p = pos.clamp(min=0).long()
    pages = torch.gather(page_tables.long(), 1, p // page_size)
    slots = torch.where(valid, pages * page_size + p % page_size, torch.full_like(pages, -1))
    out_page_indices.copy_(slots.to(torch.int32))
    if out_raw_indices is not None:
        out_raw_indices.copy_(pos)
