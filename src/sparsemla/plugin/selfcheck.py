"""Startup self-check: before an enabled kernel serves, compare it with its fp32 reference on a small random case on
the real device; a mismatch stops the process (RuntimeError names the op, the error and the tolerance)."""

from __future__ import annotations

from typing import Any

import torch

from sparsemla.kernels import layouts

# bf16 output against an fp32 reference: relative L2 error well under 1e-2 (METHOD.md: bf16 operands 1e-3..1e-2).
DECODE_RTOL = 2e-2
INDEXER_RTOL = 2e-2


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    finite = torch.isfinite(ref)
    if not torch.equal(finite, torch.isfinite(out)):
        return float("inf")
    num = (out.float() - ref.float())[finite].norm()
    den = ref.float()[finite].norm().clamp_min(1e-30)
    return float(num / den)


def _check_decode(device: torch.device) -> float:
    from sparsemla.kernels.sparse_decode.api import sparse_decode
    from sparsemla.kernels.sparse_decode.reference import sparse_decode_reference

    gen = torch.Generator().manual_seed(1234)
    main = layouts.random_v4_cache(2, 256, generator=gen, device=device)
    extra = layouts.random_v4_cache(8, 64, generator=gen, device=device)
    batch, heads = 3, 64
    kwargs: dict[str, Any] = dict(
        q=torch.randn(batch, 1, heads, 512, generator=gen).to(torch.bfloat16).to(device),
        k_cache=main.k_cache,
        indices=layouts.random_slots(batch, 128, main.num_slots, generator=gen, device=device, invalid_fraction=0.1),
        topk_length=torch.tensor([128, 77, 5], dtype=torch.int32, device=device),
        attn_sink=torch.randn(heads, generator=gen).to(device),
        head_dim_v=512,
        softmax_scale=512**-0.5,
        extra_k_cache=extra.k_cache,
        extra_indices_in_kvcache=layouts.random_slots(batch, 256, extra.num_slots, generator=gen, device=device),
        extra_topk_length=torch.tensor([256, 3, 200], dtype=torch.int32, device=device),
    )
    out, _ = sparse_decode(**kwargs)
    ref, _ = sparse_decode_reference(**kwargs)
    return _rel_err(out, ref)


def _check_indexer(device: torch.device) -> float:
    from sparsemla.kernels.indexer.api import indexer_logits
    from sparsemla.kernels.indexer.reference import indexer_logits_reference

    gen = torch.Generator().manual_seed(4321)
    seq_lens = torch.tensor([300, 1, 64, 129], dtype=torch.int32)
    cache = layouts.random_indexer_cache(16, generator=gen, device=device)
    table = layouts.random_page_table(seq_lens, 8, 16, generator=gen, device=device)
    q = torch.randn(4, 1, 64, 128, generator=gen).to(torch.float8_e4m3fn).to(device)
    weights = torch.randn(4, 64, generator=gen).to(device)
    args = (q, cache, weights, seq_lens.to(device), table, None, 512, True)
    return _rel_err(indexer_logits(*args), indexer_logits_reference(*args))


_CHECKS = {
    "sparsemla.kernels.sparse_decode.api:sparse_decode": (_check_decode, DECODE_RTOL),
    "sparsemla.kernels.indexer.api:indexer_logits": (_check_indexer, INDEXER_RTOL),
}


def run_self_check(op: str, device: Any) -> float:
    """Run the check of ``op`` on ``device``; returns the relative error, raises RuntimeError when it is too large."""
    check, rtol = _CHECKS[op]
    err = check(torch.device(device))
    if not err <= rtol:
        raise RuntimeError(
            f"sparsemla self-check failed for {op} on {device}: relative error {err:.3g} > {rtol} against the fp32 "
            "reference. Refusing to serve with this kernel; unset its flag or report the GPU/driver/Triton versions."
        )
    return err
