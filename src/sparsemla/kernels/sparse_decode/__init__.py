"""Sparse-MLA decode for DeepSeek-V4 (V4 page-split fp8 KV cache) and DeepSeek-V3.2 (FlashMLA's fp8_656 / bf16_576)."""

from sparsemla.kernels.sparse_decode.api import sparse_decode, sparse_decode_v32

__all__ = ["sparse_decode", "sparse_decode_v32"]
