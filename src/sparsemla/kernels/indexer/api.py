"""Public lightning-indexer ops with the contract of sglang's ``fp8_paged_mqa_logits_torch_sm120`` / DeepGEMM's
``fp8_paged_mqa_logits`` (positional arguments in that order), plus top-k."""

from __future__ import annotations

import torch

from sparsemla.kernels.device import select_backend
from sparsemla.kernels.layouts import IDX_BYTES_PER_TOKEN, IDX_DIM, IDX_PAGE


def indexer_logits(
    q_fp8: torch.Tensor,
    kv_cache_fp8: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    deep_gemm_metadata: object = None,
    max_seq_len: int | None = None,
    clean_logits: bool = False,
) -> torch.Tensor:
    """Indexer logits ``[B * next_n, max_seq_len]`` fp32 (semantics: :mod:`sparsemla.kernels.indexer.reference`).

    Args:
        q_fp8: [B, next_n, 64, 128] float8_e4m3fn queries.
        kv_cache_fp8: [num_pages, 64, 1, 132] uint8 (or fp8 view) key pages: 64x128 fp8 keys then 64 fp32 scales.
        weights: [B * next_n, 64] fp32 per-head weights (q scale folded in).
        seq_lens: [B], [B, 1] or [B, next_n] int32 real lengths.
        page_table: [B, max_pages] int32 page ids; entries past a request's length are never read.
        deep_gemm_metadata: DeepGEMM's schedule (ignored).
        max_seq_len: logits width (defaults to max_pages * 64).
        clean_logits: when True, positions past a row's length are -inf; when False they may be left unwritten.
    """
    if q_fp8.dim() != 4 or q_fp8.shape[-1] != IDX_DIM:
        raise ValueError(f"q_fp8 must be [B, next_n, H, {IDX_DIM}], got {list(q_fp8.shape)}")
    if kv_cache_fp8.dim() != 4 or tuple(kv_cache_fp8.shape[1:]) != (IDX_PAGE, 1, IDX_BYTES_PER_TOKEN):
        shape = f"[num_pages, {IDX_PAGE}, 1, {IDX_BYTES_PER_TOKEN}]"
        raise ValueError(f"kv_cache_fp8 must be {shape}, got {list(kv_cache_fp8.shape)}")
    if select_backend(q_fp8) != "reference":
        from sparsemla.kernels.indexer.triton import indexer_logits_fwd

        return indexer_logits_fwd(q_fp8, kv_cache_fp8, weights, seq_lens, page_table, max_seq_len, clean_logits)
    from sparsemla.kernels.indexer.reference import indexer_logits_reference

    return indexer_logits_reference(
        q_fp8, kv_cache_fp8, weights, seq_lens, page_table, deep_gemm_metadata, max_seq_len, clean_logits
    )


def indexer_topk(logits: torch.Tensor, lengths: torch.Tensor, k: int) -> torch.Tensor:
    """``[rows, k]`` int32 positions of the k largest logits among ``t < lengths[row]`` (desc. value, ties -> smaller
    position), -1 padded. ``k`` in {512, 1024, 2048} on the Triton path."""
    if select_backend(logits) != "reference":
        from sparsemla.kernels.indexer.topk import indexer_topk_fwd

        return indexer_topk_fwd(logits, lengths, k)
    from sparsemla.kernels.indexer.reference import indexer_topk_reference

    return indexer_topk_reference(logits, lengths, k)


def indexer_logits_topk(
    q_fp8: torch.Tensor,
    kv_cache_fp8: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    k: int,
    max_seq_len: int | None = None,
) -> torch.Tensor:
    """Fused decode path: ``indexer_topk(indexer_logits(...), row lengths, k)`` without a logits output tensor."""
    if select_backend(q_fp8) != "reference":
        from sparsemla.kernels.indexer.triton import indexer_logits_topk_fwd

        return indexer_logits_topk_fwd(q_fp8, kv_cache_fp8, weights, seq_lens, page_table, k, max_seq_len)
    from sparsemla.kernels.indexer.reference import indexer_logits_reference, indexer_topk_reference, row_lengths

    batch, next_n = q_fp8.shape[:2]
    width = page_table.shape[1] * IDX_PAGE if max_seq_len is None else max_seq_len
    logits = indexer_logits_reference(q_fp8, kv_cache_fp8, weights, seq_lens, page_table, None, width, False)
    return indexer_topk_reference(logits, row_lengths(seq_lens, batch, next_n, width), k)
