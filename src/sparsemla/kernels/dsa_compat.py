"""Drop-ins for the FlashMLA entry points sglang 0.5.23's DeepSeek-V3.2 (DSA) backend calls, with their exact
signatures (``sglang/kernels/ops/attention/flash_mla_interface.py``, over sgl-flash-mla 1.0.0), so the plugin's hook
table can point sglang's names at sparsemla's kernels on GPUs where FlashMLA has no kernel (sm_80..sm_89, sm_120).

Where sglang calls them (``srt/layers/attention/dsa_backend.py``)::

    # flashmla_kv (fp8 KV, 656 B/token, page 64): decode, and prefill when the prefill backend is flashmla_kv
    meta, splits = get_mla_metadata(cache_seqlens=[T] int32, num_q_tokens_per_head_k=H_pad, num_heads_k=1,
                                    num_heads_q=H_pad, is_fp8_kvcache=True, topk=index_topk)
    o, _ = flash_mla_with_kvcache(q=[T, 1, H_pad, 576] bf16, k_cache=[pages, 64, 1, 656], cache_seqlens=[T],
                                  head_dim_v=512, tile_scheduler_metadata=meta, num_splits=splits, softmax_scale=s,
                                  indices=[T, 1, index_topk] int32 slots, block_table=[T, 0] int32,
                                  is_fp8_kvcache=True, kv_format="V32")
    # flashmla_sparse (bf16 KV, 576 wide): prefill, and decode when the decode backend is flashmla_sparse
    o, _, _ = flash_mla_sparse_fwd(q=[T, H_pad, 576] bf16, kv=[slots, 1, 576] bf16, indices=[T, 1, topk] int32,
                                   sm_scale=s, d_v=512, attn_sink=[H_pad] fp32 | None, topk_length=[T] int32 | None)

sglang pads heads to 64 (sm < 10) or 128 (sm >= 10) with zero rows for FlashMLA's tile; our kernels take any head
count, so the padded rows cost work but never change the real heads' results.

Conventions carried over: FlashMLA's sparse decode returns a natural-log ``lse [B, H, s_q]`` (ours does too); the
legacy ``flash_mla_sparse_fwd`` (sglang always passes ``use_legacy=True``) returns ``max_logits`` and ``lse`` in base
2, so they are converted here. ``cache_seqlens`` of the sparse decode is FlashMLA's scheduling hint (the valid entries
are the non-negative indices); ``topk_length``, when sglang passes it, limits each row as FlashMLA documents.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import torch

from sparsemla.kernels.layouts import V32_DIM, V32_FP8_BYTES

LOG2E = 1.0 / math.log(2.0)
# FlashMLA's legacy decode schedule: [num_sm_parts, TileSchedulerMetaDataSize = 8] int32. Ours needs none; one fixed
# row keeps sglang's CUDA-graph buffers (captured at max batch, refilled per replay with copy_) shape-stable.
_SCHED_ROW = 8

_DECODE_OP = "sparsemla.kernels.sparse_decode.api"
_PREFILL_OP = "sparsemla.kernels.sparse_prefill.api"


def _op(module: str, name: str) -> Any:
    """The sibling op, imported at first call (it pulls Triton; the plugin imports this module at hook time)."""
    return getattr(importlib.import_module(module), name)


def v32_kv_format(k_cache: torch.Tensor) -> str | None:
    """``fp8_656`` / ``bf16_576`` for a DeepSeek-V3.2 paged cache ``[pages, 64, 1, W]``; None for anything else (the
    V4 / V4.1 caches sglang's DeepSeek-V4 backend passes through the same entry point)."""
    if k_cache.dim() != 4 or k_cache.shape[2] != 1:
        return None
    width = k_cache.shape[-1]
    if width == V32_FP8_BYTES and k_cache.element_size() == 1:
        return "fp8_656"
    if width == V32_DIM and k_cache.dtype == torch.bfloat16:
        return "bf16_576"
    return None


def is_v32_sparse_decode(call: dict[str, Any]) -> bool:
    """Whether a ``flash_mla_with_kvcache`` call (its arguments by name) is DeepSeek-V3.2's sparse decode: indices
    given, no extra cache or sink (V4's), ``kv_format`` V32 (or unset) and a V3.2 cache with 576-wide q."""
    k_cache, q = call.get("k_cache"), call.get("q")
    if call.get("indices") is None or call.get("extra_k_cache") is not None or call.get("attn_sink") is not None:
        return False
    if call.get("kv_format") not in (None, "V32") or not isinstance(k_cache, torch.Tensor):
        return False
    return isinstance(q, torch.Tensor) and q.shape[-1] == V32_DIM and v32_kv_format(k_cache) is not None


def is_not_v32_sparse_decode(call: dict[str, Any]) -> bool:
    """The complement of :func:`is_v32_sparse_decode` (the DeepSeek-V4 decode hook's share of the entry point)."""
    return not is_v32_sparse_decode(call)


def is_v32_decode_schedule(call: dict[str, Any]) -> bool:
    """Whether a ``get_mla_metadata`` call is the V3.2 sparse-decode schedule (``_compute_flashmla_metadata``)."""
    return call.get("cache_seqlens") is not None and call.get("topk") is not None and bool(call.get("is_fp8_kvcache"))


def get_mla_metadata(
    cache_seqlens: torch.Tensor | None = None,
    num_q_tokens_per_head_k: int | None = None,
    num_heads_k: int | None = None,
    num_heads_q: int | None = None,
    is_fp8_kvcache: bool = False,
    topk: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Contract of ``flash_mla_interface.get_mla_metadata`` for the V3.2 sparse decode: (schedule, num_splits).

    FlashMLA computes a split-KV schedule with a CUDA kernel that has no sm_80..sm_89 / sm_120 image; our decode
    plans its own splits at launch, so these are zeros of FlashMLA's dtypes: a fixed ``[1, 8]`` schedule and
    ``num_splits [T + 1]``. No sync, no allocation beyond them (safe under CUDA-graph capture)."""
    del num_q_tokens_per_head_k, num_heads_k, num_heads_q, topk
    if cache_seqlens is None or not is_fp8_kvcache:
        raise ValueError(
            "sparsemla's get_mla_metadata serves only the V3.2 sparse-decode schedule (cache_seqlens, fp8)"
        )
    device = cache_seqlens.device
    sched = torch.zeros(1, _SCHED_ROW, dtype=torch.int32, device=device)
    return sched, torch.zeros(cache_seqlens.shape[0] + 1, dtype=torch.int32, device=device)


def flash_mla_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None,
    head_dim_v: int,
    tile_scheduler_metadata: Any,
    num_splits: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    descale_q: torch.Tensor | None = None,
    descale_k: torch.Tensor | None = None,
    is_fp8_kvcache: bool = False,
    indices: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices_in_kvcache: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    kv_format: str | None = None,
    *,
    use_legacy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Contract of ``flash_mla_interface.flash_mla_with_kvcache`` in DeepSeek-V3.2 sparse mode: ``(out [B, s_q, H,
    head_dim_v] bf16, lse [B, H, s_q] fp32)``. Other modes (dense, V4 caches, sinks, extra caches, fp8 q) are not
    DeepSeek-V3.2's and raise: the plugin only routes V3.2 calls here (:func:`is_v32_sparse_decode`)."""
    del block_table, cache_seqlens, tile_scheduler_metadata, num_splits, is_fp8_kvcache, use_legacy
    unsupported = {
        "causal": causal,
        "descale_q": descale_q is not None,
        "descale_k": descale_k is not None,
        "attn_sink": attn_sink is not None,
        "extra_k_cache": extra_k_cache is not None,
        "extra_indices_in_kvcache": extra_indices_in_kvcache is not None,
        "extra_topk_length": extra_topk_length is not None,
    }
    bad = [name for name, on in unsupported.items() if on]
    if bad:
        raise ValueError(f"sparsemla V3.2 sparse decode: unsupported arguments {bad} (DeepSeek-V3.2 passes none)")
    if indices is None:
        raise ValueError("sparsemla V3.2 sparse decode: indices are required (dense decode is not DeepSeek-V3.2's)")
    if kv_format not in (None, "V32"):
        raise ValueError(f"sparsemla V3.2 sparse decode: kv_format {kv_format!r} is not V32")
    fmt = v32_kv_format(k_cache)
    if fmt is None:
        raise ValueError(f"k_cache must be a V3.2 cache [pages, 64, 1, 656 B | 576 bf16], got {list(k_cache.shape)}")
    if q.dim() != 4 or q.shape[-1] != V32_DIM:
        raise ValueError(f"q must be [B, s_q, H, {V32_DIM}], got {list(q.shape)}")
    if indices.dim() != 3 or tuple(indices.shape[:2]) != tuple(q.shape[:2]):
        raise ValueError(f"indices must be [B, s_q, topk] matching q {list(q.shape[:2])}, got {list(indices.shape)}")
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    decode = _op(_DECODE_OP, "sparse_decode_v32")
    return decode(q, k_cache, indices, scale, kv_format=fmt, d_v=head_dim_v, topk_length=topk_length)


def flash_mla_sparse_fwd(
    q: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    sm_scale: float,
    d_v: int = 512,
    attn_sink: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    *,
    use_legacy: bool = True,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Contract of ``flash_mla_interface.flash_mla_sparse_fwd``: ``(out [s_q, h_q, d_v] bf16, max_logits [s_q, h_q],
    lse [s_q, h_q])``, the statistics in base 2 when ``use_legacy`` (what sglang's wrapper returns) and natural log
    otherwise; both exclude the sink, as FlashMLA's do (``attn_sink`` [h_q]: sglang passes one for learnable sinks
    only; each row is scaled by ``exp(lse) / (exp(lse) + exp(sink))``, see the op's reference)."""
    prefill = _op(_PREFILL_OP, "sparse_prefill")
    out, max_logits, lse = prefill(q, kv, indices, sm_scale, d_v=d_v, topk_length=topk_length, attn_sink=attn_sink)
    if use_legacy:
        return out, max_logits * LOG2E, lse * LOG2E
    return out, max_logits, lse


__all__ = [
    "flash_mla_sparse_fwd",
    "flash_mla_with_kvcache",
    "get_mla_metadata",
    "is_not_v32_sparse_decode",
    "is_v32_decode_schedule",
    "is_v32_sparse_decode",
    "v32_kv_format",
]
