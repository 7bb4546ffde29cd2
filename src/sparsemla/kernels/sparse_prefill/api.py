"""Public sparse-MLA prefill op with ``flash_mla_sparse_fwd``'s call contract (sgl-flash-mla 1.0.0, current kernels)."""

from __future__ import annotations

import torch

from sparsemla.kernels.device import select_backend

D_QK = 576  # DeepSeek-V3.2's MLA latent: 512 NoPE (= the value) + 64 RoPE
D_V = 512


def _validate(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, d_v: int) -> None:
    if q.dim() != 3 or q.shape[-1] not in (D_V, D_QK):
        raise ValueError(f"q must be [s_q, h_q, {D_QK}] (or 512 without RoPE), got {list(q.shape)}")
    if kv.dim() != 3 or kv.shape[1] != 1 or kv.shape[2] != q.shape[-1]:
        raise ValueError(f"kv must be [s_kv, 1, {q.shape[-1]}] (h_kv = 1), got {list(kv.shape)}")
    if indices.dim() != 3 or tuple(indices.shape[:2]) != (q.shape[0], 1):
        raise ValueError(f"indices must be [s_q={q.shape[0]}, 1, topk], got {list(indices.shape)}")
    if not 0 < d_v <= D_V:
        raise ValueError(f"d_v must be in 1..{D_V} (FlashMLA accepts only 512), got {d_v}")


def sparse_prefill(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = D_V,
    topk_length: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """DeepSeek sparse-MLA prefill: ``(out [s_q, h_q, d_v] bf16, max_logits [s_q, h_q] fp32, lse [s_q, h_q] fp32)``.

    Args (``flash_mla_sparse_fwd``'s, positional order kept):
        q: [s_q, h_q, 576] bf16 absorbed queries (512 NoPE + 64 RoPE; 512 without RoPE is accepted); any h_q >= 1.
        kv: [s_kv, 1, 576] bf16 latent rows; V = the first ``d_v`` columns.
        indices: [s_q, 1, topk] int32 rows of kv; < 0 or >= s_kv = invalid. Duplicates count as often as listed.
        sm_scale: softmax scale applied to q . k.
        d_v: 512.
        topk_length: [s_q] int32 or None: only the leftmost ``topk_length[i]`` entries of row i count (0 allowed).
        attn_sink: [h_q] fp32 or None: out times exp(lse) / (exp(lse) + exp(sink)); lse / max_logits exclude it.
    Returns: max_logits = max score (sm_scale applied, natural units), lse = natural-log logsumexp; a query with no
    valid entry gets out 0, max_logits -inf, lse +inf. Semantics: :mod:`sparsemla.kernels.sparse_prefill.reference`.
    """
    _validate(q, kv, indices, d_v)
    if select_backend(q) == "reference":
        from sparsemla.kernels.sparse_prefill.reference import sparse_prefill_reference

        return sparse_prefill_reference(q, kv, indices, sm_scale, d_v, topk_length, attn_sink)
    from sparsemla.kernels.sparse_prefill.triton import sparse_prefill_fwd

    return sparse_prefill_fwd(q, kv, indices, sm_scale, d_v, topk_length, attn_sink)
