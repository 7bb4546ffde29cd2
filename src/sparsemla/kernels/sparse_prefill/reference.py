"""fp32 torch reference of sparse-MLA prefill: the spec the Triton kernel is tested against.

Semantics (those of sgl-flash-mla 1.0.0's ``flash_mla_sparse_fwd``, current kernels, and its test reference):

* ``q`` [s_q, h_q, d_qk] bf16, ``kv`` [s_kv, 1, d_qk] bf16 (h_kv = 1). d_qk = 576 for DeepSeek-V3.2's MLA latent
  (512 NoPE, which is also the value, then 64 RoPE); 512 (no RoPE part) is accepted too.
* ``indices`` [s_q, 1, topk] int32 rows of ``kv``. Entry j of query i is invalid when ``indices[i, 0, j] < 0``, when it
  is ``>= s_kv`` or when ``j >= topk_length[i]`` (``topk_length`` [s_q] int32, optional; values are clamped to
  ``0..topk``). Duplicated rows count as many times as they are listed.
* ``score[i, h, j] = sm_scale * q[i, h] . kv[indices[i, 0, j]]`` over all d_qk dims, ``-inf`` for invalid entries.
* ``max_logits[i, h] = max_j score`` (natural units, sm_scale applied; ``-inf`` when query i has no valid entry).
* ``lse[i, h] = logsumexp_j score`` (natural log; ``+inf`` when query i has no valid entry, FlashMLA's convention).
* ``attn_sink`` [h_q] fp32 (optional): the output is additionally multiplied by ``exp(lse) / (exp(lse) +
  exp(sink[h]))``; +inf gives a zero row, -inf has no effect; ``lse`` and ``max_logits`` exclude it.
* ``out[i, h] = sum_j exp(score[i, h, j] - lse[i, h]) * kv[indices[i, 0, j], :d_v]`` in bf16; 0 for a query with no
  valid entry.

Returns ``(out [s_q, h_q, d_v] bf16, max_logits [s_q, h_q] fp32, lse [s_q, h_q] fp32)``.
"""

from __future__ import annotations

import torch

# Query rows per chunk: bounds the [rows, h_q, topk] score tensor of a long prefill (8192 x 128 x 2048 fp32 = 8 GB).
_ROWS_PER_CHUNK = 256


def _valid_mask(indices: torch.Tensor, s_kv: int, topk_length: torch.Tensor | None) -> torch.Tensor:
    """[s_q, topk] bool: the entries that count (see the module docstring)."""
    valid = (indices >= 0) & (indices < s_kv)
    if topk_length is not None:
        pos = torch.arange(indices.shape[-1], device=indices.device).view(1, -1)
        valid = valid & (pos < topk_length.to(indices.device).long().view(-1, 1))
    return valid


def sparse_prefill_reference(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sparse-MLA prefill in fp32 (see the module docstring for the exact semantics).

    Args: q [s_q, h_q, d_qk] bf16; kv [s_kv, 1, d_qk] bf16; indices [s_q, 1, topk] int32; sm_scale float; d_v <= d_qk;
    topk_length [s_q] int32 or None; attn_sink [h_q] fp32 or None.
    Returns (out [s_q, h_q, d_v] bf16, max_logits [s_q, h_q] fp32, lse [s_q, h_q] fp32)."""
    s_q, heads, _ = q.shape
    s_kv = kv.shape[0]
    rows = kv.reshape(s_kv, -1).float()  # [s_kv, d_qk]
    idx = indices.reshape(s_q, -1)
    valid = _valid_mask(idx, s_kv, topk_length)
    out = torch.empty(s_q, heads, d_v, dtype=torch.bfloat16, device=q.device)
    max_logits = torch.empty(s_q, heads, dtype=torch.float32, device=q.device)
    lse = torch.empty(s_q, heads, dtype=torch.float32, device=q.device)
    for lo in range(0, s_q, _ROWS_PER_CHUNK):
        hi = min(lo + _ROWS_PER_CHUNK, s_q)
        ok = valid[lo:hi]  # [n, topk]
        gathered = rows[torch.where(ok, idx[lo:hi], 0).long()]  # [n, topk, d_qk]
        gathered = gathered * ok.unsqueeze(-1)  # invalid rows contribute nothing, even a NaN in row 0
        scores = torch.einsum("nhd,ntd->nht", q[lo:hi].float(), gathered) * sm_scale
        scores = scores.masked_fill(~ok.unsqueeze(1), float("-inf"))  # [n, h_q, topk]
        row_lse = torch.logsumexp(scores, dim=-1)  # [n, h_q]
        lonely = torch.isneginf(row_lse)
        lse_out = row_lse
        if attn_sink is not None:
            lse_out = torch.logaddexp(row_lse, attn_sink.float().to(q.device).view(1, heads))
        weights = torch.exp(scores - lse_out.masked_fill(lonely, float("inf")).unsqueeze(-1))
        o = torch.einsum("nht,ntv->nhv", weights, gathered[..., :d_v]).masked_fill(lonely.unsqueeze(-1), 0.0)
        out[lo:hi] = o.to(torch.bfloat16)
        max_logits[lo:hi] = scores.amax(dim=-1)
        lse[lo:hi] = row_lse.masked_fill(lonely, float("inf"))
    return out, max_logits, lse


__all__ = ["sparse_prefill_reference"]
