"""Sparse-MLA prefill for DeepSeek-V3.2 (DSA) with ``flash_mla_sparse_fwd``'s contract (bf16 KV, h_kv = 1)."""

from sparsemla.kernels.sparse_prefill.api import sparse_prefill

__all__ = ["sparse_prefill"]
