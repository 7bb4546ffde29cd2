"""fp32 torch reference of the DeepSeek-V4 lightning-indexer logits ("paged MQA logits") and its top-k.

Logits (the contract of sglang 0.5.23's ``fp8_paged_mqa_logits_torch_sm120`` and DeepGEMM's ``fp8_paged_mqa_logits``):

* ``q_fp8`` [B, next_n, H, 128] float8_e4m3fn; ``kv_cache_fp8`` [num_pages, 64, 1, 132] uint8 pages (64x128 fp8 keys
  then 64 fp32 scales, see :mod:`sparsemla.kernels.layouts`); ``weights`` [B * next_n, H] fp32 (q scale folded in);
  ``seq_lens`` [B] or [B, 1] (or [B, next_n] explicit per-row lengths) int32; ``page_table`` [B, max_pages] int32
  (page ids of each request's tokens in order; entries past the request's length are arbitrary and never read).
* Row ``r = b * next_n + i`` sees the first ``L[r]`` tokens, ``L[r] = seq_len[b] - next_n + 1 + i`` (the query of draft
  token i attends causally; ``next_n = 1`` gives ``seq_len[b]``), clipped to ``[0, max_seq_len]``.
* ``logits[r, t] = sum_h weights[r, h] * relu(q[b, i, h] . k[t]) * scale[t]`` for ``t < L[r]``, where ``k[t]`` is token
  ``t % 64`` of page ``page_table[b, t // 64]``. Positions ``t >= L[r]`` hold ``-inf`` here (a fast path with
  ``clean_logits=False`` may leave them unwritten; with ``clean_logits=True`` it must write ``-inf``).

Returns fp32 ``[B * next_n, max_seq_len]``.

Top-k: :func:`indexer_topk_reference` returns, per row, the positions of the ``k`` largest logits among ``t < L[r]``,
ordered by descending logit with ties broken by the smaller position, padded with ``-1`` when ``L[r] < k``.
"""

from __future__ import annotations

import torch

from sparsemla.kernels.layouts import IDX_PAGE, decode_indexer_pages


def row_lengths(seq_lens: torch.Tensor, batch: int, next_n: int, max_seq_len: int) -> torch.Tensor:
    """Per-row visible lengths ``[B * next_n]`` int64 (see the module docstring)."""
    lens = seq_lens.reshape(batch, -1).long()
    if lens.shape[1] == next_n and next_n > 1:
        rows = lens
    elif lens.shape[1] == 1:
        rows = lens - next_n + 1 + torch.arange(next_n, device=lens.device).view(1, next_n)
    else:
        raise ValueError(f"seq_lens must be [B], [B, 1] or [B, next_n={next_n}], got {list(seq_lens.shape)}")
    return rows.clamp(0, max_seq_len).reshape(-1)


def indexer_logits_reference(
    q_fp8: torch.Tensor,
    kv_cache_fp8: torch.Tensor,
    weights: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    deep_gemm_metadata: object = None,
    max_seq_len: int | None = None,
    clean_logits: bool = False,
) -> torch.Tensor:
    """Indexer logits in fp32 (see the module docstring); O(real length) work per row, like the fast path."""
    batch, next_n, heads, _ = q_fp8.shape
    if max_seq_len is None:
        max_seq_len = page_table.shape[1] * IDX_PAGE
    lengths = row_lengths(seq_lens, batch, next_n, max_seq_len)
    q = q_fp8.float()
    w = weights.float().view(batch, next_n, heads)
    out = torch.full((batch * next_n, max_seq_len), float("-inf"), dtype=torch.float32, device=q.device)
    for b in range(batch):
        longest = int(lengths[b * next_n : (b + 1) * next_n].max()) if next_n else 0
        if longest == 0:
            continue
        n_pages = -(-longest // IDX_PAGE)
        keys, scales = decode_indexer_pages(kv_cache_fp8, page_table[b, :n_pages])
        keys = keys.reshape(-1, keys.shape[-1])[:longest]  # [T, 128]
        scales = scales.reshape(-1)[:longest]  # [T]
        score = torch.relu(torch.einsum("ihd,td->iht", q[b], keys))  # [next_n, H, T]
        logits = torch.einsum("iht,ih->it", score, w[b]) * scales  # [next_n, T]
        for i in range(next_n):
            n = int(lengths[b * next_n + i])
            out[b * next_n + i, :n] = logits[i, :n]
    return out


def indexer_topk_reference(logits: torch.Tensor, lengths: torch.Tensor, k: int) -> torch.Tensor:
    """``[rows, k]`` int32 positions of the top-k logits among ``t < lengths[row]`` (desc. value, then asc. position),
    ``-1``-padded. A length past the row's capacity (``logits.shape[1]``) counts as the capacity, as in the kernels."""
    rows = logits.shape[0]
    out = torch.full((rows, k), -1, dtype=torch.int32, device=logits.device)
    for r in range(rows):
        n = min(int(lengths[r]), logits.shape[1])
        if n <= 0:
            continue
        vals = logits[r, :n].double()
        pos = torch.arange(n, device=logits.device)
        # Sort by position first, then stably by value descending: ties keep the smaller position first.
        order = torch.sort(vals[pos], descending=True, stable=True).indices
        take = order[: min(k, n)]
        out[r, : take.numel()] = take.to(torch.int32)
    return out
