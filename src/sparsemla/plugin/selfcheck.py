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


def _v32_attention_reference(
    q: torch.Tensor, rows: torch.Tensor, valid: torch.Tensor, sm_scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 softmax attention of q [n, H, 576] over gathered rows [n, T, 576] (valid [n, T]): (out [n, H, 512], lse
    [n, H], natural log, +inf for a row with no valid entry). Independent of the ops' own references."""
    scores = torch.einsum("nhd,ntd->nht", q.float(), rows.float() * valid.unsqueeze(-1)) * sm_scale
    scores = scores.masked_fill(~valid.unsqueeze(1), float("-inf"))
    lse = torch.logsumexp(scores, dim=-1)
    lonely = torch.isneginf(lse)
    weights = torch.exp(scores - lse.masked_fill(lonely, float("inf")).unsqueeze(-1))
    out = torch.einsum("nht,ntv->nhv", weights, rows.float()[..., : layouts.V32_NOPE_DIM] * valid.unsqueeze(-1))
    return out, lse.masked_fill(lonely, float("inf"))


def _check_dsa_v32_decode(device: torch.device) -> float:
    """sglang's flashmla_kv decode call as the plugin serves it (``flash_mla_with_kvcache`` drop-in, fp8 656-byte
    cache, heads padded to 64, -1 padded indices and an all-invalid row) against fp32 attention over the rows
    dequantized in torch; out and lse."""
    from sparsemla.kernels.dsa_compat import flash_mla_with_kvcache, get_mla_metadata

    gen = torch.Generator().manual_seed(3232)
    blocks, tokens, heads, topk = 6, 3, 64, 128
    cache = layouts.random_v32_cache(blocks, "fp8_656", generator=gen)
    idx = torch.randint(0, blocks * layouts.V32_PAGE, (tokens, 1, topk), generator=gen, dtype=torch.int32)
    idx[1, 0, 100:] = -1
    idx[2] = -1
    q = torch.randn(tokens, 1, heads, layouts.V32_DIM, generator=gen).to(torch.bfloat16)
    lens = torch.tensor([topk, 100, 0], dtype=torch.int32)
    sched, splits = get_mla_metadata(lens.to(device), heads, 1, heads, True, topk)
    out, lse = flash_mla_with_kvcache(
        q=q.to(device), k_cache=cache.to(device), block_table=torch.empty(tokens, 0, dtype=torch.int32, device=device),
        cache_seqlens=lens.to(device), head_dim_v=512, tile_scheduler_metadata=sched, num_splits=splits,
        softmax_scale=0.1352, indices=idx.to(device), is_fp8_kvcache=True, kv_format="V32",
    )  # fmt: skip
    valid = idx[:, 0] >= 0
    rows = layouts.decode_v32_rows(cache, idx[:, 0].clamp(min=0), "fp8_656")
    ref, ref_lse = _v32_attention_reference(q[:, 0], rows, valid, 0.1352)
    return max(_rel_err(out[:, 0].cpu(), ref), _rel_err(lse.cpu()[:, :, 0], ref_lse))


def _check_dsa_v32_prefill(device: torch.device) -> float:
    """sglang's flashmla_sparse call as the plugin serves it (``flash_mla_sparse_fwd`` drop-in, bf16 576-wide KV,
    topk_length shorter than the row, -1 pads) against fp32 attention; out and the base-2 lse sglang receives."""
    from sparsemla.kernels.dsa_compat import LOG2E, flash_mla_sparse_fwd

    gen = torch.Generator().manual_seed(2323)
    s_kv, tokens, heads, topk = 300, 4, 16, 64
    kv = torch.randn(s_kv, 1, layouts.V32_DIM, generator=gen).to(torch.bfloat16)
    idx = torch.randint(0, s_kv, (tokens, 1, topk), generator=gen, dtype=torch.int32)
    idx[3, 0, 10:] = -1
    lens = torch.tensor([topk, 40, 1, topk], dtype=torch.int32)
    q = torch.randn(tokens, heads, layouts.V32_DIM, generator=gen).to(torch.bfloat16)
    out, _, lse = flash_mla_sparse_fwd(q.to(device), kv.to(device), idx.to(device), 0.1352, 512, None, lens.to(device))
    pos = torch.arange(topk).view(1, topk)
    valid = (idx[:, 0] >= 0) & (pos < lens.view(-1, 1))
    ref, ref_lse = _v32_attention_reference(q, kv[idx[:, 0].clamp(min=0).long(), 0], valid, 0.1352)
    return max(_rel_err(out.cpu(), ref), _rel_err(lse.cpu(), ref_lse * LOG2E))


def _check_dsa_v32_schedule(device: torch.device) -> float:
    """The schedule drop-in keeps sglang's CUDA-graph buffers shape-stable: a fixed schedule, ``num_splits [T + 1]``,
    int32 zeros on the device (0.0 when so, inf otherwise)."""
    from sparsemla.kernels.dsa_compat import get_mla_metadata

    shapes = []
    for rows in (1, 7):
        sched, splits = get_mla_metadata(torch.ones(rows, dtype=torch.int32, device=device), 64, 1, 64, True, 2048)
        ok = sched.dtype == splits.dtype == torch.int32 and splits.shape == (rows + 1,)
        ok = ok and not sched.any() and not splits.any() and sched.device.type == splits.device.type == device.type
        shapes.append(tuple(sched.shape) if ok else None)
    return 0.0 if None not in shapes and shapes[0] == shapes[1] else float("inf")


_CHECKS = {
    "sparsemla.kernels.sparse_decode.api:sparse_decode": (_check_decode, DECODE_RTOL),
    "sparsemla.kernels.indexer.api:indexer_logits": (_check_indexer, INDEXER_RTOL),
    "sparsemla.kernels.indexer.sglang_compat:topk_transform_paged": (_check_topk_transform, TOPK_TOL),
    "sparsemla.kernels.indexer.sglang_compat:topk_transform_paged_v2": (_check_topk_transform_v2, TOPK_TOL),
    "sparsemla.kernels.indexer.sglang_compat:plan_topk_v2": (_check_topk_transform_v2, TOPK_TOL),
    "sparsemla.kernels.dsa_compat:flash_mla_with_kvcache": (_check_dsa_v32_decode, DECODE_RTOL),
    "sparsemla.kernels.dsa_compat:flash_mla_sparse_fwd": (_check_dsa_v32_prefill, DECODE_RTOL),
    "sparsemla.kernels.dsa_compat:get_mla_metadata": (_check_dsa_v32_schedule, 0.0),
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
