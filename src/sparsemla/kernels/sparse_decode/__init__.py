"""Sparse-MLA decode for DeepSeek-V4 (V4 page-split fp8 KV cache)."""

from sparsemla.kernels.sparse_decode.api import sparse_decode

__all__ = ["sparse_decode"]
