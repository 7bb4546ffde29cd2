"""Public sparse-MLA decode op with sglang's DSv4 call contract (``flash_mla_with_kvcache_sm120(**kwargs)``)."""

from __future__ import annotations

from typing import Any

import torch

from sparsemla import flags
from sparsemla.kernels.device import select_backend
from sparsemla.kernels.layouts import V4_BYTES_PER_TOKEN, V4_DIM, V32_FORMATS, V32_NOPE_DIM

# Keyword arguments sglang's DSv4 backend passes (sm120 entry and the FlashMLA entry on Hopper/Blackwell datacenter);
# the FlashMLA-only ones are accepted and ignored in sparse mode, as FlashMLA itself ignores them there.
_IGNORED = (
    "block_table",
    "cache_seqlens",
    "tile_scheduler_metadata",
    "num_splits",
    "is_fp8_kvcache",
    "causal",
    "use_legacy",
    "kv_format",
    "descale_q",
    "descale_k",
    "enable_batch_invariant",
)


def _validate(q: torch.Tensor, k_cache: torch.Tensor, indices: torch.Tensor, head_dim_v: int) -> None:
    if q.dim() != 4:
        raise ValueError(f"q must be [B, s_q, H, {V4_DIM}], got {list(q.shape)}")
    if k_cache.dim() != 4 or k_cache.shape[-1] != V4_BYTES_PER_TOKEN:
        shape = f"[num_pages, page_size, 1, {V4_BYTES_PER_TOKEN}]"
        raise ValueError(f"k_cache must be a V4 view {shape}, got {list(k_cache.shape)}")
    if indices.dim() != 3 or indices.shape[:2] != q.shape[:2]:
        raise ValueError(f"indices must be [B, s_q, topk] matching q {list(q.shape[:2])}, got {list(indices.shape)}")
    if head_dim_v > V4_DIM:
        raise ValueError(f"head_dim_v must be <= {V4_DIM}, got {head_dim_v}")


def sparse_decode(**kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V4 sparse-MLA decode: ``(out [B, s_q, H, head_dim_v] bf16, lse [B, H, s_q] fp32)``.

    Args (keywords, as sglang passes them):
        q: [B, s_q, H, 512] bf16 absorbed query with RoPE applied.
        k_cache: V4 page-split cache view [num_pages, page_size, 1, 584] (uint8 or float8 view; ``stride(0)`` = page).
        indices: [B, s_q, topk] int32 slot ids ``page * page_size + offset``; -1 = invalid.
        topk_length: [B] int32 or None; only the leftmost ``topk_length[b]`` entries count (may be 0).
        attn_sink: [H] fp32 or None; +inf gives a zero row, -inf no effect; the returned lse excludes it.
        head_dim_v: output width (512: V is the full latent).
        softmax_scale: float or None (then 512 ** -0.5).
        extra_k_cache / extra_indices_in_kvcache / extra_topk_length: a second cache (own page size) appended to the
            candidate list.
        num_real_heads: int or None (not an sglang argument: the plugin adds it): only q's first heads are real, as
            when sglang pads q to 64 heads under tensor parallelism; the pad heads get out 0 and lse -inf and cost
            nothing.
    Semantics: :mod:`sparsemla.kernels.sparse_decode.reference`.
    """
    for name in _IGNORED:
        kwargs.pop(name, None)
    q, k_cache, indices = kwargs["q"], kwargs["k_cache"], kwargs["indices"]
    head_dim_v = int(kwargs.get("head_dim_v", V4_DIM))
    real = kwargs.get("num_real_heads")
    _validate(q, k_cache, indices, head_dim_v)
    args = dict(
        q=q,
        k_cache=k_cache,
        indices=indices,
        topk_length=kwargs.get("topk_length"),
        attn_sink=kwargs.get("attn_sink"),
        head_dim_v=head_dim_v,
        softmax_scale=kwargs.get("softmax_scale"),
        extra_k_cache=kwargs.get("extra_k_cache"),
        extra_indices_in_kvcache=kwargs.get("extra_indices_in_kvcache"),
        extra_topk_length=kwargs.get("extra_topk_length"),
    )
    if select_backend(q) == "reference":
        from sparsemla.kernels.sparse_decode.reference import sparse_decode_reference

        out, lse = sparse_decode_reference(**args)
        if real is not None and real < q.shape[2]:  # the same pad-head contract as the kernel
            out[:, :, real:] = 0
            lse[:, real:] = float("-inf")
        return out, lse
    from sparsemla.kernels.sparse_decode.triton import sparse_decode_fwd

    num_splits = flags.SPARSEMLA_SPLIT_K.get()
    return sparse_decode_fwd(**args, num_splits=num_splits, num_real_heads=real)


def sparse_decode_v32(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    *,
    kv_format: str,
    d_v: int = V32_NOPE_DIM,
    topk_length: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3.2 (DSA) sparse-MLA decode over FlashMLA's V3.2 KV formats, on every GPU from sm_80.

    Args:
        q: [B, s_q, H, 576] bf16 absorbed query (512 NoPE | 64 RoPE); any strides. Any H >= 1 (FlashMLA needs 64 or
            128; no padding needed here). s_q > 1 (MTP): each query token has its own index row.
        kv_cache: [num_blocks, page_size (64), 1, W] paged latent cache, addressed through its strides (last dim
            contiguous). ``kv_format="fp8_656"``: W = 656 bytes (uint8, int8 or float8_e4m3fn), per token
            ``[512 x e4m3 NoPE][4 x fp32 scale, one per 128 NoPE values][64 x bf16 RoPE]``, NoPE value = e4m3 *
            scale; rows 4-byte aligned. ``kv_format="bf16_576"``: W = 576 bf16 (512 NoPE then 64 RoPE).
        indices: [B, s_q, topk] int32 flat slot ids ``block * page_size + offset``, contiguous along topk. -1 (any
            negative id, and any id >= num_blocks * page_size) = invalid, skipped. Duplicates count as listed.
        sm_scale: softmax scale applied to q . k (576-wide dot).
        kv_format: "fp8_656" or "bf16_576".
        d_v: output width (V = the first d_v NoPE values; DeepSeek-V3.2: 512).
        topk_length: [B] int32 or None: only the leftmost ``topk_length[b]`` entries of both s_q rows of request b
            count (0 allowed; values above topk mean topk).

    Returns:
        out: [B, s_q, H, d_v] bf16 = softmax(sm_scale * q K^T) V over the valid entries.
        lse: [B, H, s_q] fp32 contiguous, natural-log logsumexp of the scaled scores (FlashMLA's ``softmax_lse``).
        A query token with no valid entry (all -1, or topk_length 0) gets out = 0 and lse = +inf, as FlashMLA's
        sparse decode does.

    Semantics: :func:`sparsemla.kernels.sparse_decode.reference.sparse_decode_v32_reference`.
    """
    if kv_format not in V32_FORMATS:
        raise ValueError(f"kv_format must be one of {V32_FORMATS}, got {kv_format!r}")
    if select_backend(q) == "reference":
        from sparsemla.kernels.sparse_decode.reference import sparse_decode_v32_reference

        return sparse_decode_v32_reference(
            q, kv_cache, indices, sm_scale, kv_format=kv_format, d_v=d_v, topk_length=topk_length
        )
    from sparsemla.kernels.sparse_decode.triton_v32 import sparse_decode_v32_fwd

    return sparse_decode_v32_fwd(
        q, kv_cache, indices, sm_scale, kv_format=kv_format, d_v=d_v, topk_length=topk_length,
        num_splits=flags.SPARSEMLA_SPLIT_K.get(),
    )  # fmt: skip
