"""Startup self-check: before an enabled kernel serves, compare it with its fp32 reference on a small random case on
the real device; a mismatch stops the process (RuntimeError names the op, the error and the tolerance).

Every op of the plugin's hook table (``sparsemla.plugin.sglang.HOOKS``, except the ``timer`` hooks, which always run
sglang's original) has an entry in :data:`_CHECKS`; the plugin refuses to register a kernel whose op has none, so the
first eager call of a hook never meets a missing check mid-serving."""

from __future__ import annotations

from typing import Any

import torch

from sparsemla.kernels import layouts

# bf16 output against an fp32 reference: relative L2 error well under 1e-2 (METHOD.md: bf16 operands 1e-3..1e-2).
DECODE_RTOL = 2e-2
INDEXER_RTOL = 2e-2
# Top-k selects positions: the selected sets must be the reference's exactly (no tolerance).
TOPK_TOL = 0.0


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


def _mismatch(got: torch.Tensor, want: torch.Tensor) -> float:
    """Fraction of ``[rows, k]`` entries that differ once each row is sorted (the rows are sets; -1 pads included)."""
    if got.shape != want.shape:
        return float("inf")
    differ = got.cpu().long().sort(dim=1).values != want.cpu().long().sort(dim=1).values
    return float(differ.float().mean()) if differ.numel() else 0.0


def _topk_reference(
    scores: torch.Tensor, lens: torch.Tensor, tables: torch.Tensor, k: int, page_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(positions, page-table slots) [rows, k] of the top-k reference, the page transform in plain torch; -1 pads."""
    from sparsemla.kernels.indexer.reference import indexer_topk_reference

    pos = indexer_topk_reference(scores, lens, k).long()
    pages = torch.gather(tables.long(), 1, pos.clamp(min=0) // page_size)
    slots = torch.where(pos >= 0, pages * page_size + pos.clamp(min=0) % page_size, torch.full_like(pos, -1))
    return pos, slots


def _check_topk_transform(device: torch.device) -> float:
    """``topk_transform_paged`` (the hook of sglang's torch top-k backend) against the top-k reference plus the page
    transform in plain torch: a row long enough to be split, rows longer than k, shorter than k, exactly k and empty;
    slots and raw positions."""
    from sparsemla.kernels.indexer.sglang_compat import topk_transform_paged

    gen = torch.Generator().manual_seed(2468)
    k, page_size, width = 512, 64, 9216  # a 9000-long row: on a GPU, several programs share it (the split path)
    lens = torch.tensor([9000, 1000, 300, 512, 0], dtype=torch.int32)
    rows = lens.numel()
    scores = torch.randn(rows, width, generator=gen)
    tables = torch.stack([torch.randperm(256, generator=gen)[: width // page_size] for _ in range(rows)]).int()
    out = torch.full((rows, k), -7, dtype=torch.int32, device=device)
    raw = torch.full((rows, k), -7, dtype=torch.int32, device=device)
    topk_transform_paged(scores.to(device), lens.to(device), tables.to(device), out, page_size, raw)
    pos, slots = _topk_reference(scores, lens, tables, k, page_size)
    return max(_mismatch(out, slots), _mismatch(raw, pos))


def _check_topk_transform_v2(device: torch.device) -> float:
    """sglang's v2 top-k entry as we serve it: our plan (a zeroed buffer of sglang's shape) then
    ``topk_transform_paged_v2``, in both of its output modes (page-table slots + raw positions; raw positions only),
    against the top-k reference plus the page transform in plain torch."""
    from sparsemla.kernels.indexer.sglang_compat import PLAN_INTS_PER_ROW, plan_topk_v2, topk_transform_paged_v2

    gen = torch.Generator().manual_seed(1357)
    k, page_size, width = 512, 64, 1024
    lens = torch.tensor([900, 511, 513, 0, 1024], dtype=torch.int32)
    rows = lens.numel()
    scores = torch.randn(rows, width, generator=gen)
    tables = torch.stack([torch.randperm(64, generator=gen)[: width // page_size] for _ in range(rows)]).int()
    plan = plan_topk_v2(lens.to(device))
    if tuple(plan.shape) != (rows + 1, PLAN_INTS_PER_ROW) or plan.dtype != torch.int32:
        return float("inf")
    out = torch.full((rows, k), -7, dtype=torch.int32, device=device)
    raw = torch.full((rows, k), -7, dtype=torch.int32, device=device)
    topk_transform_paged_v2(scores.to(device), lens.to(device), tables.to(device), out, page_size, plan, raw)
    only_raw = torch.full((rows, k), -7, dtype=torch.int32, device=device)
    topk_transform_paged_v2(scores.to(device), lens.to(device), None, only_raw, page_size, plan)
    pos, slots = _topk_reference(scores, lens, tables, k, page_size)
    return max(_mismatch(out, slots), _mismatch(raw, pos), _mismatch(only_raw, pos))


_CHECKS = {
    "sparsemla.kernels.sparse_decode.api:sparse_decode": (_check_decode, DECODE_RTOL),
    "sparsemla.kernels.indexer.api:indexer_logits": (_check_indexer, INDEXER_RTOL),
    "sparsemla.kernels.indexer.sglang_compat:topk_transform_paged": (_check_topk_transform, TOPK_TOL),
    "sparsemla.kernels.indexer.sglang_compat:topk_transform_paged_v2": (_check_topk_transform_v2, TOPK_TOL),
    "sparsemla.kernels.indexer.sglang_compat:plan_topk_v2": (_check_topk_transform_v2, TOPK_TOL),
}


def has_check(op: str) -> bool:
    """Whether ``op`` (``module:function``, as in the hook table) has a self-check."""
    return op in _CHECKS


def run_self_check(op: str, device: Any) -> float:
    """Run the check of ``op`` on ``device``; returns the error, raises RuntimeError when it is too large (or when
    ``op`` has no check: the plugin's register() refuses such an op at startup, so this is a programming error)."""
    entry = _CHECKS.get(op)
    if entry is None:
        raise RuntimeError(f"sparsemla: no self-check for {op}; the checked ops are {', '.join(sorted(_CHECKS))}")
    check, tol = entry
    err = check(torch.device(device))
    if not err <= tol:
        raise RuntimeError(
            f"sparsemla self-check failed for {op} on {device}: error {err:.3g} > {tol} against the fp32 "
            "reference. Refusing to serve with this kernel; unset its flag or report the GPU/driver/Triton versions."
        )
    return err
