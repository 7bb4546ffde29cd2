"""Lightning indexer for DeepSeek-V4: paged MQA logits over real lengths, and top-k."""

from sparsemla.kernels.indexer.api import indexer_logits, indexer_logits_topk, indexer_topk

__all__ = ["indexer_logits", "indexer_logits_topk", "indexer_topk"]
