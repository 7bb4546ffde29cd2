"""sglang 0.5.23's DSA backend resolution, amended for GPUs where none of its DeepSeek-V3.2 kernels runs.

``sglang.srt.arg_groups.overrides._dsa_split_backend_resolution(view)`` picks ``--dsa-prefill-backend`` /
``--dsa-decode-backend`` when the user left them unset: fp8 KV -> ``trtllm`` if SM major >= 10 else ``flashmla_kv``;
bf16 KV -> prefill ``flashmla_sparse``, decode ``trtllm`` if SM major >= 10 else ``fa3``. On sm_120 ``trtllm``
(FlashInfer's trtllm-gen, SM100/103 only) fails with "Unsupported architecture"; on sm_80..sm_89 ``fa3`` is Hopper's
and FlashMLA has no kernel either. With ``SPARSEMLA_DSA_V32`` on, on those GPUs, each backend sglang chose that has
no kernel there becomes the FlashMLA impl whose kernel calls the plugin routes to sparsemla (``flashmla_kv`` reads
the 656-byte fp8 cache, ``flashmla_sparse`` the 576-wide bf16 one); Hopper and Blackwell datacenter GPUs, explicit
user choices, HiSparse, learnable sinks (already ``flashmla_sparse``) and GLM's SM12x ``flashinfer_sparse_mla`` are
left as sglang resolved them. The KV pool width (576 vs 656) is derived later from these backends, so it follows.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from sparsemla import flags

log = logging.getLogger("sparsemla.plugin")

# SM majors with no DeepSeek-V3.2 sparse-attention kernel in sglang 0.5.23: Ampere/Ada (8) and RTX Blackwell (12).
NO_DSA_KERNEL_MAJORS = (8, 12)
# sglang's auto choices that have no kernel on those GPUs.
NO_KERNEL_BACKENDS = ("trtllm", "fa3")
# Our replacement per KV dtype: the FlashMLA impl that reads that cache layout.
REPLACEMENT = {"fp8_e4m3": "flashmla_kv", "bfloat16": "flashmla_sparse"}
FIELDS = ("dsa_prefill_backend", "dsa_decode_backend")
# The MLA shape our V3.2 kernels read: 512 latent + 64 RoPE (576-wide q.k).
KV_LORA_RANK, QK_ROPE_HEAD_DIM = 512, 64


def enabled() -> bool:
    return flags.SPARSEMLA_DSA_V32.get() and not flags.SPARSEMLA_DISABLE.get()


def amend(declared: dict[str, Any], *, capability: tuple[int, int], kv_cache_dtype: str, hf_config: Any,
          hisparse: bool) -> dict[str, Any]:  # fmt: skip
    """``declared`` (sglang's resolution) with the backends that cannot run on ``capability`` replaced; the same
    object when nothing changes."""
    if capability[0] not in NO_DSA_KERNEL_MAJORS or hisparse or kv_cache_dtype not in REPLACEMENT:
        return declared
    if getattr(hf_config, "kv_lora_rank", None) != KV_LORA_RANK:
        return declared
    if getattr(hf_config, "qk_rope_head_dim", None) != QK_ROPE_HEAD_DIM:
        return declared
    swap = {f: REPLACEMENT[kv_cache_dtype] for f in FIELDS if declared.get(f) in NO_KERNEL_BACKENDS}
    return {**declared, **swap} if swap else declared


def resolve_dsa_backends(original: Callable[..., dict], view: Any, *args: Any, **kwargs: Any) -> dict:
    """AROUND hook of ``_dsa_split_backend_resolution``: sglang's resolution, then :func:`amend` when the flag is on
    (flag off: sglang's dict itself). Reads the GPU as sglang's pass does (``torch.cuda.get_device_capability``)."""
    declared = original(view, *args, **kwargs)
    if not enabled() or not declared:
        return declared
    from sglang.srt.arg_groups.overrides import model_config_of
    from sglang.srt.runtime_context import get_platform

    platform = get_platform()
    if platform.is_hip or platform.is_npu or platform.is_xpu:
        return declared
    import torch

    capability = tuple(torch.cuda.get_device_capability())
    amended = amend(
        declared,
        capability=(int(capability[0]), int(capability[1])),
        kv_cache_dtype=str(view.kv_cache_dtype),
        hf_config=model_config_of(view).hf_config,
        hisparse=bool(getattr(view, "enable_hisparse", False)),
    )
    if amended is not declared:
        log.warning(
            "sparsemla: SPARSEMLA_DSA_V32 on sm_%d%d (%s KV): DSA backends prefill=%s, decode=%s (sglang chose %s, "
            "which has no kernel on this GPU; their FlashMLA calls run sparsemla's kernels)",
            capability[0], capability[1], view.kv_cache_dtype, amended.get("dsa_prefill_backend"),
            amended.get("dsa_decode_backend"), {f: declared.get(f) for f in FIELDS if f in declared},
        )  # fmt: skip
    return amended
