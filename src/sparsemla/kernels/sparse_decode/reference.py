"""fp32 torch references of sparse-MLA decode: the specs the Triton kernels are tested against.

DeepSeek-V3.2 (FlashMLA's V3.2 formats): :func:`sparse_decode_v32_reference` (semantics in its docstring).
DeepSeek-V4, below.

Semantics (those of sglang 0.5.23's DSv4 decode call, ``flash_mla_with_kvcache_sm120(**kwargs)``):

* ``q`` [B, s_q, H, 512] bf16: the absorbed query (NoPE part already multiplied by W_UK) with RoPE applied.
* Keys are gathered from one or two V4 caches (layout in :mod:`sparsemla.kernels.layouts`): the main cache through
  ``indices`` [B, s_q, topk] int32 slot ids and, optionally, an ``extra_k_cache`` through ``extra_indices_in_kvcache``.
  The candidate list of a query is the concatenation main ++ extra. An entry is invalid when its slot is negative or
  its position j >= ``topk_length[b]`` (resp. ``extra_topk_length[b]``). Duplicated slots count as many times as listed.
* ``score[h, j] = softmax_scale * q[h] . k[j]`` over all 512 dims; ``lse[h] = logsumexp_j score[h, j]`` over valid j
  (``-inf`` when a query has no valid entry).
* ``attn_sink`` [H] fp32 (optional) is an extra logit per head with a zero value vector: the output uses
  ``lse_out = logaddexp(lse, sink[h])``; the returned ``lse`` excludes it. ``sink = +inf`` gives a zero row;
  ``-inf`` has no effect.
* ``out[h] = sum_j exp(score[h, j] - lse_out[h]) * v[j, :head_dim_v]`` with V = the dequantized 512-wide row;
  a query with no valid entry gets ``out = 0``.

Returns ``(out [B, s_q, H, head_dim_v] bf16, lse [B, H, s_q] fp32)`` (lse in the orientation sglang's torch path gives).
"""

from __future__ import annotations

import torch

from sparsemla.kernels.layouts import V32_NOPE_DIM, decode_v4_rows, decode_v32_rows


def _gather(
    k_cache: torch.Tensor, indices: torch.Tensor, length: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp32 rows [B, s_q, topk, 512] with invalid rows zeroed, valid mask [B, s_q, topk])."""
    batch, _, topk = indices.shape
    valid = indices >= 0
    if length is not None:
        pos = torch.arange(topk, device=indices.device).view(1, 1, topk)
        valid = valid & (pos < length.view(batch, 1, 1).to(indices.device))
    rows = decode_v4_rows(k_cache, indices.clamp(min=0))
    return rows * valid.unsqueeze(-1), valid


def sparse_decode_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    indices: torch.Tensor,
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    head_dim_v: int = 512,
    softmax_scale: float | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices_in_kvcache: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sparse-MLA decode in fp32 (see the module docstring for the exact semantics)."""
    batch, s_q, heads, dim = q.shape
    if softmax_scale is None:
        softmax_scale = dim**-0.5
    kv, valid = _gather(k_cache, indices, topk_length)
    if extra_k_cache is not None and extra_indices_in_kvcache is not None:
        kv_x, valid_x = _gather(extra_k_cache, extra_indices_in_kvcache, extra_topk_length)
        kv, valid = torch.cat([kv, kv_x], dim=2), torch.cat([valid, valid_x], dim=2)
    qf = q.float()[..., : kv.shape[-1]]
    scores = torch.einsum("bshd,bstd->bsht", qf, kv) * softmax_scale  # [B, s_q, H, T]
    scores = scores.masked_fill(~valid.unsqueeze(2), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [B, s_q, H]
    lse_out = lse
    if attn_sink is not None:
        lse_out = torch.logaddexp(lse, attn_sink.float().view(1, 1, heads).to(lse.device))
    lonely = torch.isneginf(lse)
    weights = torch.exp(scores - lse_out.masked_fill(lonely, float("inf")).unsqueeze(-1))
    out = torch.einsum("bsht,bstv->bshv", weights, kv[..., :head_dim_v])
    out = out.masked_fill(lonely.unsqueeze(-1), 0.0)
    return out.to(torch.bfloat16), lse.permute(0, 2, 1)


def sparse_decode_v32_reference(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    *,
    kv_format: str,
    d_v: int = V32_NOPE_DIM,
    topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3.2 sparse-MLA decode in fp32 (FlashMLA's sparse ``flash_mla_with_kvcache`` semantics, V3.2 formats).

    ``q`` [B, s_q, H, 576] bf16; ``kv_cache`` a V3.2 cache (:mod:`sparsemla.kernels.layouts`, "fp8_656" or
    "bf16_576"); ``indices`` [B, s_q, topk] int32 slot ids, one row per query token. Entry j of row (b, s) is valid
    when ``0 <= slot < num_blocks * page_size`` and ``j < topk_length[b]`` (when given). ``score = sm_scale * q . k``
    over 576 dims; ``lse`` = natural-log logsumexp over the valid entries; ``out = softmax . v[:, :d_v]`` (V = the
    first ``d_v`` NoPE values). A query token with no valid entry gets ``out = 0`` and ``lse = +inf`` (FlashMLA).
    Returns ``(out [B, s_q, H, d_v] bf16, lse [B, H, s_q] fp32 contiguous)``."""
    batch, s_q, _, _ = q.shape
    topk = indices.shape[-1]
    num_slots = kv_cache.shape[0] * kv_cache.shape[1]
    valid = (indices >= 0) & (indices < num_slots)
    if topk_length is not None:
        pos = torch.arange(topk, device=indices.device).view(1, 1, topk)
        valid = valid & (pos < topk_length.view(batch, 1, 1).to(indices.device))
    kv = decode_v32_rows(kv_cache, torch.where(valid, indices, 0), kv_format) * valid.unsqueeze(-1)
    scores = torch.einsum("bshd,bstd->bsht", q.float(), kv) * sm_scale  # [B, s_q, H, topk]
    scores = scores.masked_fill(~valid.unsqueeze(2), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)  # [B, s_q, H]
    lonely = torch.isneginf(lse)
    weights = torch.exp(scores - lse.masked_fill(lonely, float("inf")).unsqueeze(-1))
    out = torch.einsum("bsht,bstv->bshv", weights, kv[..., :d_v]).masked_fill(lonely.unsqueeze(-1), 0.0)
    lse = lse.masked_fill(lonely, float("inf"))
    return out.to(torch.bfloat16), lse.permute(0, 2, 1).contiguous()
