"""The real head count per rank of the DeepSeek-V4 attention call in flight, for the decode hooks.

Under tensor parallelism sglang 0.5.23 pads q (uninitialised rows) and the sink (zeros) to 64 heads before its decode
kernel (``srt/models/deepseek_v4.py``, ``MqaAttentionBase.forward``) and reads back only ``out[:, :real]``; with 8
real heads a kernel that honours the pad computes 56 heads for nothing. The backend's ``_forward_attention(self, q, k,
v, layer, ...)`` runs around every decode kernel call and ``layer.tp_q_head_num`` is sglang's own real count, so an
AROUND hook there records it for the duration of the call (a context variable: nested and concurrent calls see
their own). It is a Python int read while a CUDA graph is captured, so the captured launch is the real-heads one.
"""

from __future__ import annotations

import contextvars
from collections.abc import Callable
from typing import Any

_REAL_HEADS: contextvars.ContextVar[int | None] = contextvars.ContextVar("sparsemla_real_heads", default=None)


def current() -> int | None:
    """The real head count of the attention call in flight, or None outside one."""
    return _REAL_HEADS.get()


def track_real_heads(original: Callable[..., Any], self: Any, q: Any, k: Any, v: Any, layer: Any, *args: Any,
                     **kwargs: Any) -> Any:  # fmt: skip
    """AROUND hook of ``DeepseekV4AttnBackend._forward_attention``: runs sglang's method with the layer's real head
    count recorded (always the original: this hook only observes)."""
    heads = getattr(layer, "tp_q_head_num", None)
    token = _REAL_HEADS.set(int(heads) if isinstance(heads, int) and heads > 0 else None)
    try:
        return original(self, q, k, v, layer, *args, **kwargs)
    finally:
        _REAL_HEADS.reset(token)
