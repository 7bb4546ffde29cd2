"""sparsemla.kernels: DeepSeek sparse-attention ops. Imports nothing from plugin, ops, loadtest or dashboards.

Public ops (sglang call contracts): :func:`sparse_decode`, :func:`indexer_logits`, :func:`indexer_topk`.
"""

from sparsemla.kernels.indexer import indexer_logits, indexer_topk
from sparsemla.kernels.sparse_decode import sparse_decode

__all__ = ["indexer_logits", "indexer_topk", "sparse_decode"]
