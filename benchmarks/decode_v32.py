"""GPU benchmark of DeepSeek-V3.2 (DSA) sparse-MLA decode over FlashMLA's V3.2 caches: ``python -m
benchmarks.decode_v32``.

Providers, all measured in the same run on the same inputs (``PROVIDERS``):

* ``sparsemla``  this project's op :func:`sparsemla.kernels.sparse_decode.sparse_decode_v32` (the Triton kernel of
  :mod:`~sparsemla.kernels.sparse_decode.triton_v32`, configuration from its chooser) at the real head count;
  ``sparsemla_sm89path`` the same in the sm_89 code path (``TRITON_OVERRIDE_ARCH=sm89`` in a child process: mma.sync
  with the configurations sm_80..sm_120 get, within their 101,376 B budget);
* ``flashmla``   fp8_656 only: sgl-flash-mla 1.0.0's legacy SM90 sparse decode, called as sglang 0.5.23's
  ``flashmla_kv`` decode backend calls it (``DeepseekSparseAttnBackend._forward_flashmla_kv``): q viewed as
  ``[B * s_q, 1, H_pad, 576]`` (an MTP token is a row of its own), heads zero-padded to ``H_pad`` = 64 (H <= 64) or
  128 (FlashMLA's only head counts on Hopper), ``flash_mla_with_kvcache(q, k_cache, block_table=[T, 0],
  cache_seqlens, head_dim_v=512, tile_scheduler_metadata, softmax_scale, is_fp8_kvcache=True, indices=[T, 1, topk],
  use_legacy=True, kv_format="V32")`` with the split schedule of ``get_mla_decoding_metadata(cache_seqlens, H_pad,
  1, H_pad, True, topk, use_legacy=True)`` computed once outside the timed call: sglang computes it once per forward
  batch (``_compute_flashmla_metadata``, outside the captured graph) and shares it across the layers. FlashMLA has
  no bf16 sparse decode (its sparse entry asserts ``is_fp8_kvcache``; the SM90 image has the fp8 V3.2 kernel for 64
  and 128 heads only), so it is absent for bf16_576;
* ``flashmla_sparse_fwd`` bf16_576 only: FlashMLA's sparse prefill kernel ``flash_mla_sparse_fwd`` over the flat
  ``[slots, 1, 576]`` cache, as sglang's ``flashmla_sparse`` decode backend calls it (``_forward_flashmla_sparse``:
  q ``[T, H_pad, 576]``, indices ``[T, 1, topk]``, topk_length ``[T]``, legacy kernel, base-2 statistics). It is
  the FlashMLA V3.2 kernel sglang can run for a bf16 cache (its default bf16 decode on Hopper is FA3, not FlashMLA);
* ``reference``  the fp32 torch spec (B <= ``REF_MAX_B`` only);
* ``floor``      max(bytes / measured copy bandwidth, FLOPs / measured bf16 matmul rate), both measured in the run;
  bytes = per query row (b, s) its top-k cache rows read once for all heads (656 or 1152 B + a 4-B index each), q
  (576 bf16) read and out (512 bf16) + lse written once per head; FLOPs = 2 * rows * H * topk * (576 + 512).

The padded FlashMLA call is what is timed (the zero-padding copy of q is not: sglang pays it outside the kernel).
Through the plugin sglang hands our op the padded q too (``dsa_compat.flash_mla_with_kvcache``); here ours runs at the
real H, the kernel comparison the issue asks for.

Inputs are random (never zeros): each request owns ``--ctx`` cache slots on ``ceil(ctx / 64)`` pages scattered over
the cache by a per-request block table; every query row's ``topk`` indices are distinct random slots of its own
request (random order, as the indexer's top-k leaves them), all valid; q ~ N(0, 1) bf16; NoPE tiles ~ N(0, s_t^2)
(s = 0.5, 2, 8, 1, so the four fp8 scales of a row differ), RoPE ~ N(0, 1), quantized as
:func:`~sparsemla.kernels.layouts.quantize_v32_fp8` does; sm_scale = 576^-0.5.

Timings are ``triton.testing.do_bench`` medians (L2 flushed before each repetition) over ``ROTATE`` input sets used in
turn, as in benchmarks/decode.py: ``<provider>`` = eager calls, ``<provider>_graph`` = one CUDA-graph replay of the
same call per repetition (sglang runs decode under CUDA graphs; the 1.3x target is judged on the graph rows). Each code
path runs in its own process; FlashMLA and the reference do not change with Triton's target, so they run in the
native one only. Checks (set 0 of every shape): the relative Frobenius error of ``out`` and the largest |lse| error of
ours and FlashMLA's against the reference (B <= ``REF_MAX_B``), and of FlashMLA's against ours (every B).

Writes ``results/bench/decode_v32-<gpu>-<date>.json``:
``{"op": "decode_v32", "gpu", "device", "git_sha", "torch", "triton", "code_paths", "ceilings", "method", "shapes",
"flashmla", "rows": [{"B", "s_q", "H", "topk", "kv_format", "ctx", "provider", "us", "code_path", ...}], "checks":
[...], "speedups": [{..., "provider", "baseline", "method", "us", "baseline_us", "ratio", "speedup"}],
"target_results": [...]}`` and prints a table.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import typer

from benchmarks import paths as code_paths
from benchmarks.decode import graphed, load_flash_mla, measure_ceilings, rel_err, result_path, write_doc
from sparsemla.kernels.layouts import V32_DIM, V32_FORMATS, V32_NOPE_DIM, V32_PAGE, quantize_v32_fp8, v32_row_width

app = typer.Typer(add_completion=False, help=__doc__)

PROVIDERS: dict[str, str] = {
    "sparsemla": "sparsemla.kernels.sparse_decode.sparse_decode_v32 at the real head count (+ _graph: CUDA-graph "
    "replay; _sm89path: TRITON_OVERRIDE_ARCH=sm89)",
    "flashmla": "fp8_656 only: sgl-flash-mla 1.0.0 flash_mla_with_kvcache (legacy SM90 sparse fp8 decode, "
    'kv_format="V32"), q as [B*s_q, 1, H_pad, 576], as sglang 0.5.23\'s flashmla_kv decode backend calls it',
    "flashmla_sparse_fwd": "bf16_576 only: sgl-flash-mla 1.0.0 flash_mla_sparse_fwd (legacy sparse prefill kernel) "
    "over the flat [slots, 1, 576] cache, as sglang 0.5.23's flashmla_sparse decode backend calls it",
    "reference": "the fp32 torch spec sparse_decode_v32_reference (B <= REF_MAX_B)",
}
# FlashMLA's kernel for each format: the baseline of the ratios (the rows named in the speedups)
BASELINE = {"fp8_656": "flashmla", "bf16_576": "flashmla_sparse_fwd"}
FLASHMLA_NOTES = {
    "fp8_656": "flashmla = flash_mla_with_kvcache, FlashMLA's V3.2 sparse decode kernel (legacy SM90 image: fp8 V3.2 "
    "cache, 64 or 128 heads; H < 64 padded to 64 as sglang does)",
    "bf16_576": "FlashMLA has no bf16 sparse decode (flash_mla_with_kvcache asserts is_fp8_kvcache when indices are "
    "given; its SM90 sparse decode image is the fp8 V3.2 kernel only), so no flashmla row; flashmla_sparse_fwd = "
    "its sparse prefill kernel over the bf16 cache, what sglang's flashmla_sparse decode backend runs (sglang's "
    "default bf16 decode on Hopper is FA3, which is not FlashMLA and not measured here)",
}
ROTATE = 2
REF_MAX_B = 8  # the fp32 reference is timed and checked up to this batch (it gathers [B, s_q, topk, 576] fp32)
SM_SCALE = V32_DIM**-0.5
RATIO_LIMIT = 1.3  # the issue: within 1.3x of FlashMLA's V3.2 kernel in the wgmma (native) path
DEFAULTS = {"batches": "1,8,32,64,128", "heads": "16,128", "s_q": "1", "formats": ",".join(V32_FORMATS)}
_CACHE_CHUNK = 1 << 18  # tokens quantized per step when building a cache (bounds the fp32 latent to ~600 MB)


@dataclass(frozen=True)
class Shape:
    """One benchmark point: batch, query tokens per request (2 = MTP), query heads, indices per query row, cache
    format, cache slots per request."""

    B: int
    s_q: int
    H: int
    topk: int
    kv_format: str
    ctx: int


# -- options and shapes (CPU-tested) -----------------------------------------------------------------------------------
def parse_ints(text: str, name: str) -> list[int]:
    """Comma-separated positive integers, in order, duplicates dropped; ValueError naming the option."""
    try:
        out = list(dict.fromkeys(int(x) for x in text.split(",") if x.strip()))
    except ValueError:
        raise ValueError(f"--{name} takes comma-separated integers, got {text!r}") from None
    if not out or any(v <= 0 for v in out):
        raise ValueError(f"--{name} takes positive integers, got {text!r}")
    return out


def parse_names(text: str, name: str, valid: tuple[str, ...] | dict) -> list[str]:
    """Comma-separated names out of ``valid``, in order, duplicates dropped; ValueError naming the valid ones."""
    chosen = list(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    unknown = [p for p in chosen if p not in valid]
    if unknown or not chosen:
        raise ValueError(f"--{name}: unknown {unknown or text!r}, choose from {', '.join(valid)}")
    return chosen


def shape_grid(batches: str, heads: str, s_q: str, formats: str, topk: int, ctx: int) -> list[Shape]:
    """The benchmark points, format-major then s_q, H, B; ValueError for an option out of range."""
    if topk <= 0 or topk % 64:
        raise ValueError(f"--topk must be a positive multiple of 64 (FlashMLA's tile), got {topk}")
    if ctx < topk:
        raise ValueError(f"--ctx ({ctx}) must be >= --topk ({topk}): the indices are distinct slots of one request")
    sqs = parse_ints(s_q, "s-q")
    if bad := [s for s in sqs if s > 2]:
        raise ValueError(f"--s-q takes 1 and/or 2 (decode, MTP), got {bad}")
    fmts = parse_names(formats, "formats", V32_FORMATS)
    return [
        Shape(b, s, h, topk, fmt, ctx)
        for fmt in fmts
        for s in sqs
        for h in parse_ints(heads, "heads")
        for b in parse_ints(batches, "batches")
    ]


def floor_us(shape: Shape, ceilings: dict[str, float]) -> tuple[float, float, float]:
    """(floor, bytes term, FLOP term) in µs from :func:`~sparsemla.kernels.sparse_decode.triton_v32.
    flops_and_bytes_v32` and the ceilings measured in the run."""
    from sparsemla.kernels.sparse_decode.triton_v32 import flops_and_bytes_v32

    flops, nbytes = flops_and_bytes_v32(shape.B, shape.s_q, shape.H, shape.topk, shape.kv_format)
    t_mem = nbytes / ceilings["copy_bytes_per_s"] * 1e6
    t_mma = flops / ceilings["bf16_flops_per_s"] * 1e6
    return max(t_mem, t_mma), t_mem, t_mma


def flashmla_pad_heads(heads: int) -> int:
    """The head count FlashMLA is called with: 64 or 128 (sglang pads smaller counts to 64 on SM90)."""
    return 64 if heads <= 64 else 128


# -- inputs ------------------------------------------------------------------------------------------------------------
def random_v32_cache(num_blocks: int, kv_format: str, gen: torch.Generator, device: str) -> torch.Tensor:
    """A random V3.2 cache ``[num_blocks, 64, 1, 656 B | 576 bf16]`` built on ``device`` in chunks (the CPU builder
    in layouts.py is too slow for the ~1M-token caches of B = 128): the same distribution and quantizer."""
    tokens = num_blocks * V32_PAGE
    width = v32_row_width(kv_format)
    dtype = torch.uint8 if kv_format == "fp8_656" else torch.bfloat16
    flat = torch.empty(tokens, width, dtype=dtype, device=device)
    tile_std = torch.tensor((0.5, 2.0, 8.0, 1.0), device=device).repeat_interleave(V32_NOPE_DIM // 4)
    for lo in range(0, tokens, _CACHE_CHUNK):
        n = min(_CACHE_CHUNK, tokens - lo)
        latent = torch.randn(n, V32_DIM, device=device, generator=gen)
        latent[:, :V32_NOPE_DIM] *= tile_std
        flat[lo : lo + n] = quantize_v32_fp8(latent) if kv_format == "fp8_656" else latent.to(torch.bfloat16)
    return flat.view(num_blocks, V32_PAGE, 1, width)


def make_inputs(shape: Shape, seed: int, device: str = "cuda", fill: bool = True) -> dict[str, Any]:
    """``sparse_decode_v32`` arguments for one shape plus the block table: ``q`` [B, s_q, H, 576] bf16, ``kv_cache``
    (``B * ceil(ctx / 64)`` pages), ``indices`` [B, s_q, topk] int32 (distinct slots of the row's own request),
    ``block_table`` [B, pages] int32, ``sm_scale``, ``kv_format``, ``ctx``. ``fill=False``: unfilled tensors of the
    same shapes, dtypes and strides (``--build-cubins``: the launches compile from those)."""
    B, s_q, topk, ctx = shape.B, shape.s_q, shape.topk, shape.ctx
    pages = -(-ctx // V32_PAGE)
    if not fill:
        width = v32_row_width(shape.kv_format)
        dtype = torch.uint8 if shape.kv_format == "fp8_656" else torch.bfloat16
        return dict(
            q=torch.empty(B, s_q, shape.H, V32_DIM, dtype=torch.bfloat16, device=device),
            kv_cache=torch.empty(B * pages, V32_PAGE, 1, width, dtype=dtype, device=device),
            indices=torch.empty(B, s_q, topk, dtype=torch.int32, device=device),
            block_table=torch.empty(B, pages, dtype=torch.int32, device=device),
            sm_scale=SM_SCALE,
            kv_format=shape.kv_format,
            ctx=ctx,
        )
    gen = torch.Generator(device=device).manual_seed(seed)
    block_table = torch.randperm(B * pages, device=device, generator=gen).view(B, pages)
    kv_cache = random_v32_cache(B * pages, shape.kv_format, gen, device)
    # distinct positions < ctx per query row (argsort of noise: a random permutation per row), random order
    pos = torch.rand(B * s_q, ctx, device=device, generator=gen).argsort(dim=1)[:, :topk]
    table = block_table.repeat_interleave(s_q, dim=0)  # row b * s_q + s belongs to request b
    slots = table.gather(1, pos // V32_PAGE) * V32_PAGE + pos % V32_PAGE
    return dict(
        q=torch.randn(B, s_q, shape.H, V32_DIM, device=device, generator=gen).to(torch.bfloat16),
        kv_cache=kv_cache,
        indices=slots.to(torch.int32).view(B, s_q, topk),
        block_table=block_table.to(torch.int32),
        sm_scale=SM_SCALE,
        kv_format=shape.kv_format,
        ctx=ctx,
    )


# -- providers ---------------------------------------------------------------------------------------------------------
Call = tuple[Callable[[], Any], Callable[[Any], tuple[torch.Tensor, torch.Tensor]]]  # (timed call, -> (out, lse))


def _pad_rows(q: torch.Tensor, pad: int) -> torch.Tensor:
    """q [B, s_q, H, D] as [B * s_q, pad, D], heads zero-padded (sglang's ``new_zeros`` + copy); a view if pad == H."""
    B, s_q, H, D = q.shape
    rows = q.reshape(B * s_q, H, D)
    if pad == H:
        return rows
    out = q.new_zeros(B * s_q, pad, D)
    out[:, :H] = rows
    return out


def ours_call(kw: dict[str, Any]) -> Call:
    """Our public op on the inputs (topk_length None: every index is valid, as in sglang's flashmla_kv call)."""
    from sparsemla.kernels.sparse_decode import sparse_decode_v32

    def run():
        return sparse_decode_v32(kw["q"], kw["kv_cache"], kw["indices"], kw["sm_scale"], kv_format=kw["kv_format"])

    return run, lambda res: res


def flashmla_decode_call(flash_mla: Any, kw: dict[str, Any]) -> Call:
    """FlashMLA's sparse fp8 decode as sglang's flashmla_kv backend calls it (see the module docstring); the split
    schedule is computed here, once, outside the timed call."""
    q, indices = kw["q"], kw["indices"]
    B, s_q, H, _ = q.shape
    T, topk, pad = B * s_q, indices.shape[-1], flashmla_pad_heads(H)
    q_in = _pad_rows(q, pad).unsqueeze(1)  # [T, 1, pad, 576]
    idx = indices.reshape(T, 1, topk)
    # sglang: dsa_cache_seqlens_int32 = min(seq_len, index_topk); num_q_tokens_per_head_k = seq_len_q (1) * H_pad
    seqlens = torch.full((T,), min(kw["ctx"], topk), dtype=torch.int32, device=q.device)
    sched, splits = flash_mla.get_mla_decoding_metadata(seqlens, pad, 1, pad, True, topk, use_legacy=True)
    block_table = torch.empty((T, 0), dtype=torch.int32, device=q.device)  # sglang passes this (None errors)
    meta_cls = flash_mla.flash_mla_interface.FlashMLASchedMeta

    def run():
        # sglang's wrapper puts the precomputed tensors on a fresh FlashMLASchedMeta every call
        meta = meta_cls(tile_scheduler_metadata=sched, num_splits=splits)
        return flash_mla.flash_mla_with_kvcache(
            q=q_in, k_cache=kw["kv_cache"], block_table=block_table, cache_seqlens=seqlens, head_dim_v=V32_NOPE_DIM,
            tile_scheduler_metadata=meta, num_splits=None, softmax_scale=kw["sm_scale"], causal=False,
            is_fp8_kvcache=True, indices=idx, use_legacy=True, kv_format="V32",
        )  # fmt: skip

    def unpack(res):
        out, lse = res  # [T, 1, pad, 512], natural-log lse [T, pad, 1]
        out = out.reshape(B, s_q, pad, -1)[:, :, :H]
        return out, lse.reshape(B, s_q, pad)[:, :, :H].permute(0, 2, 1)

    return run, unpack


def flashmla_sparse_fwd_call(flash_mla: Any, kw: dict[str, Any]) -> Call:
    """FlashMLA's sparse prefill kernel over the flat bf16 cache, as sglang's flashmla_sparse decode backend calls
    it (q [T, H_pad, 576], indices [T, 1, topk], topk_length [T] = min(seq_len, topk), base-2 statistics)."""
    q, indices, kv = kw["q"], kw["indices"], kw["kv_cache"]
    B, s_q, H, _ = q.shape
    T, topk, pad = B * s_q, indices.shape[-1], flashmla_pad_heads(H)
    q_in = _pad_rows(q, pad)
    flat = kv.view(-1, 1, kv.shape[-1])  # sglang's pool buffer: [slots, 1, 576]; slot ids are the same
    idx = indices.reshape(T, 1, topk)
    length = torch.full((T,), min(kw["ctx"], topk), dtype=torch.int32, device=q.device)

    def run():
        return flash_mla.flash_mla_sparse_fwd(
            q_in, flat, idx, kw["sm_scale"], V32_NOPE_DIM, None, length, use_legacy=True, return_log2_lse=True
        )

    def unpack(res):
        out, _, lse2 = res  # [T, pad, 512], base-2 lse [T, pad]
        lse = (lse2[:, :H] * math.log(2.0)).reshape(B, s_q, H).permute(0, 2, 1)
        return out.reshape(B, s_q, pad, -1)[:, :, :H], lse

    return run, unpack


def reference_call(kw: dict[str, Any]) -> Call:
    from sparsemla.kernels.sparse_decode.reference import sparse_decode_v32_reference

    def run():
        return sparse_decode_v32_reference(
            kw["q"], kw["kv_cache"], kw["indices"], kw["sm_scale"], kv_format=kw["kv_format"]
        )

    return run, lambda res: res


def lse_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest |a - b| over the entries where both are finite."""
    a, b = a.float(), b.float()
    finite = torch.isfinite(a) & torch.isfinite(b)
    return float((a - b)[finite].abs().max()) if bool(finite.any()) else 0.0


# -- one code path -----------------------------------------------------------------------------------------------------
def _time(calls: list[Callable[[], Any]]) -> float:
    """do_bench median (µs, L2 flushed before each repetition) of ``calls`` used in turn."""
    from triton.testing import do_bench

    state = {"i": 0}

    def step():
        state["i"] += 1
        return calls[state["i"] % len(calls)]()

    return do_bench(step, warmup=10, rep=60, return_mode="median") * 1e3


SHARED: dict[str, int] = {}  # kernel name -> metadata.shared of its last launch (recorded next to the timings)


def bench_shape(
    shape: Shape, providers: list[str], flash_mla: Any, code_path: str, replayer: Any = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows (µs, eager and graph replay) of every provider on one shape, and its check record. ``replayer`` (a
    benchmarks.prod_cubins.Replayer): also ``sparsemla_t38_graph``, our calls launched from Triton 3.8 cubins (graph
    replay only: an eager replay is Python ctypes calls, host time production never pays)."""
    from sparsemla.kernels import device as dev
    from sparsemla.kernels.sparse_decode.triton_v32 import choose_v32_config

    seed = 100_000 * shape.B + 1_000 * shape.H + 100 * shape.s_q
    sets = [make_inputs(shape, seed + i) for i in range(ROTATE)]
    fns: dict[str, list[Call]] = {}
    if "sparsemla" in providers:
        fns["sparsemla"] = [ours_call(kw) for kw in sets]
    if replayer is not None:
        fns["sparsemla_t38"] = [replayed(ours_call(kw), replayer) for kw in sets]
    if flash_mla is not None and BASELINE[shape.kv_format] in providers:
        make = flashmla_decode_call if shape.kv_format == "fp8_656" else flashmla_sparse_fwd_call
        fns[BASELINE[shape.kv_format]] = [make(flash_mla, kw) for kw in sets]
    ref = None
    if shape.B <= REF_MAX_B:
        run, _ = reference_call(sets[0])
        ref = run()
        if "reference" in providers:
            fns["reference"] = [reference_call(kw) for kw in sets]

    check: dict[str, Any] = {**shape.__dict__, "rel_err_vs_reference": {}, "lse_err_vs_reference": {},
                             "rel_err_vs_sparsemla": {}}  # fmt: skip
    ours = None
    rows = []
    for name, calls in fns.items():
        base = {**shape.__dict__, "code_path": code_path}
        try:
            out, lse = calls[0][1](calls[0][0]())
        except Exception as exc:  # noqa: BLE001 - a provider that rejects a shape is a row, not a crash
            if name == "sparsemla_t38":
                raise  # build and replay disagree (no cubin for a launch): a row would shrink the 1.3x verdict
            rows.append({**base, "provider": code_paths.provider(name, code_path), "error": str(exc)[:300]})
            continue
        if name == "sparsemla":
            ours = (out, lse)
        if ref is not None and name != "reference":
            check["rel_err_vs_reference"][name] = rel_err(out, ref[0])
            check["lse_err_vs_reference"][name] = lse_err(lse, ref[1])
        if ours is not None and name not in ("sparsemla", "reference"):
            check["rel_err_vs_sparsemla"][name] = rel_err(out, ours[0])
        extra: dict[str, Any] = {}
        if name == "sparsemla":
            cfg = choose_v32_config(dev.launch_info(sets[0]["q"].device), shape.H, shape.B * shape.s_q, shape.kv_format)
            tile = "-gluon" + ("-ws" if cfg.gluon_ws else "-pf" if cfg.gluon_prefetch else "") if cfg.gluon else ""
            kernel = "_sparse_decode_v32" + ("_sm90_ws" if cfg.gluon_ws else "_sm90" if cfg.gluon else "") + "_kernel"
            extra = {"config": f"{cfg.block_h}x{cfg.block_n}-w{cfg.num_warps}-s{cfg.num_stages}{tile}",
                     "shared_bytes": SHARED.get(kernel)}  # fmt: skip
        eager = [c[0] for c in calls]
        if name != "sparsemla_t38":  # an eager replay is ctypes calls from Python: host time production never pays
            us = round(_time(eager), 3)
            rows.append({**base, "provider": code_paths.provider(name, code_path), "us": us, **extra})
        if name == "reference":
            continue  # the spec's own launch time under a graph says nothing
        runs = [graphed(c) for c in eager]
        graph_row = {**base, "provider": code_paths.provider(f"{name}_graph", code_path), "us": round(_time(runs), 3)}
        if any(r is c for r, c in zip(runs, eager, strict=True)):
            if name == "sparsemla_t38":
                raise RuntimeError("a Triton 3.8 replay did not capture into a CUDA graph: its eager time is Python's")
            graph_row["graph_capture_failed"] = True  # graphed() fell back to eager calls
        rows.append({**graph_row, **extra})
        del runs
    del sets, fns, ref, ours
    torch.cuda.empty_cache()
    return rows, check


def replayed(call: Call, replayer: Any) -> Call:
    """``call`` with every kernel launched from the replayer's Triton 3.8 cubins (a graph capture records them)."""
    run, unpack = call

    def from_cubins():
        with replayer:
            return run()

    return from_cubins, unpack


def run_path(
    shapes: list[Shape], providers: list[str], code_path: str, child_out: Path, cubins: Path | None = None
) -> None:
    """Every shape in this process's code path; the rows are saved after each shape (a crash keeps them). With
    ``cubins``: also our calls from ``cubins/<code path>``'s Triton 3.8 cubins."""
    from sparsemla.kernels.aot import watch_launches

    replayer = None
    if cubins is not None:
        from benchmarks import prod_cubins

        replayer = prod_cubins.Replayer(prod_cubins.path_dir(cubins, code_path))

    if code_path != "native":
        providers = [p for p in providers if p == "sparsemla"]  # the baselines do not change with Triton's target
    flash_mla, why = (None, "") if not set(providers) & set(BASELINE.values()) else load_flash_mla(torch.device("cuda"))
    rows: list[dict] = []
    checks: list[dict] = []
    meta = {"code_path": code_path, "flashmla_unavailable": why} if why else {"code_path": code_path}
    with watch_launches(lambda name, kernel: SHARED.__setitem__(name, kernel.metadata.shared)):
        for shape in shapes:
            r, check = bench_shape(shape, providers, flash_mla, code_path, replayer)
            rows += r
            checks.append(check)
            print(json.dumps(r), flush=True)
            child_out.write_text(json.dumps({"rows": rows, "checks": checks, "meta": meta}))


def run_paths(argv: list[str], paths: list[str]) -> tuple[list[dict], list[dict], list[dict]]:
    """Each code path's child process in turn (benchmarks/paths.py): its rows, checks (tagged with the path) and
    meta; a child that fails keeps the rows it saved and its meta says how it ended."""
    rows: list[dict] = []
    checks: list[dict] = []
    metas: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        for path in paths:
            out = Path(tmp) / f"{path}.json"
            try:
                doc = code_paths.run_child("benchmarks.decode_v32", argv, path, out)
                meta = doc.get("meta", {"code_path": path})
            except subprocess.CalledProcessError as exc:
                doc = json.loads(out.read_text()) if out.exists() else {}
                meta = {**doc.get("meta", {"code_path": path}), "error": f"child exited with {exc.returncode}"}
            rows += doc.get("rows", [])
            checks += [{**c, "code_path": path} for c in doc.get("checks", [])]
            metas.append(meta)
    return rows, checks, metas


def build_cubins_for(shapes: list[Shape], out_dir: Path, code_path: str) -> int:
    """No GPU: compile the launches our op makes at every shape in ``code_path`` with this machine's Triton into
    ``out_dir/<code_path>`` (benchmarks/prod_cubins.py), from unfilled inputs of the timed ones' layout, with the split
    count the public op passes. Returns how many cubins were added."""
    from benchmarks import prod_cubins
    from sparsemla import flags
    from sparsemla.kernels.sparse_decode.triton_v32 import sparse_decode_v32_fwd

    def workload() -> None:
        for shape in shapes:
            kw = make_inputs(shape, 0, "cpu", fill=False)
            sparse_decode_v32_fwd(kw["q"], kw["kv_cache"], kw["indices"], kw["sm_scale"], kv_format=kw["kv_format"],
                                  num_splits=flags.SPARSEMLA_SPLIT_K.get())  # fmt: skip

    return len(prod_cubins.build(workload, prod_cubins.path_dir(out_dir, code_path), code_path))


# -- the parent: floors, ratios, JSON ----------------------------------------------------------------------------------
def shape_of(row: dict) -> Shape:
    return Shape(row["B"], row["s_q"], row["H"], row["topk"], row["kv_format"], row["ctx"])


def floor_rows(rows: list[dict], ceilings: dict[str, float]) -> list[dict]:
    """One ``floor`` row per measured shape (with its bytes and FLOP terms)."""
    out = []
    for shape in dict.fromkeys(shape_of(r) for r in rows):
        fl, t_mem, t_mma = floor_us(shape, ceilings)
        out.append({**shape.__dict__, "provider": "floor", "us": round(fl, 3), "bytes_us": round(t_mem, 3),
                    "flops_us": round(t_mma, 3)})  # fmt: skip
    return out


def speedups(rows: list[dict]) -> list[dict]:
    """Per shape, each of our rows against FlashMLA's row of the same method (eager / graph replay) and shape:
    ``ratio`` = ours / FlashMLA (the issue's measure; <= 1.3 wanted), ``speedup`` = FlashMLA / ours."""
    index = {(shape_of(r), r["provider"]): r["us"] for r in rows if r.get("us") is not None}
    ours = list(dict.fromkeys(r["provider"] for r in rows if r["provider"].startswith("sparsemla")))
    out = []
    for shape in dict.fromkeys(shape_of(r) for r in rows):
        for provider in ours:
            graph = provider.endswith("_graph")
            baseline = BASELINE[shape.kv_format] + ("_graph" if graph else "")
            us, base_us = index.get((shape, provider)), index.get((shape, baseline))
            if us is None or base_us is None:
                continue
            out.append({**shape.__dict__, "provider": provider, "baseline": baseline, "method": "graph" if graph
                        else "eager", "us": us, "baseline_us": base_us, "ratio": round(us / base_us, 3),
                        "speedup": round(base_us / us, 3)})  # fmt: skip
    return out


def evaluate_target(speeds: list[dict]) -> list[dict]:
    """The issue's target per format and code path, from the graph-replay ratios: ``pass`` = every measured point
    within RATIO_LIMIT (None when there is none), with the worst point."""
    out = []
    groups: dict[tuple[str, str], list[dict]] = {}
    for s in speeds:
        if s["method"] == "graph":
            groups.setdefault((s["kv_format"], s["provider"]), []).append(s)
    for (fmt, provider), pts in groups.items():
        worst = max(pts, key=lambda s: s["ratio"])
        out.append({"kv_format": fmt, "provider": provider, "baseline": worst["baseline"], "limit": RATIO_LIMIT,
                    "points": len(pts), "within": sum(s["ratio"] <= RATIO_LIMIT for s in pts),
                    "pass": all(s["ratio"] <= RATIO_LIMIT for s in pts), "worst_ratio": worst["ratio"],
                    "worst_at": {k: worst[k] for k in ("B", "s_q", "H")}})  # fmt: skip
    return out


def _print_table(rows: list[dict], speeds: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    cell = {(shape_of(r), r["provider"]): r["us"] for r in rows if r.get("us") is not None}
    ratio = {(shape_of(s), s["provider"]): s["ratio"] for s in speeds}
    table = Table(title="DeepSeek-V3.2 sparse decode (µs, do_bench median, CUDA-graph replay)")
    cols = ("format", "B", "s_q", "H", "ours native", "ours sm89", "FlashMLA", "floor", "native/FM", "sm89/FM")
    for col in cols:
        table.add_column(col, justify="right")
    fmt = lambda v, spec=".2f": "-" if v is None else format(v, spec)
    for shape in dict.fromkeys(shape_of(r) for r in rows):
        base = BASELINE[shape.kv_format] + "_graph"
        table.add_row(
            shape.kv_format, str(shape.B), str(shape.s_q), str(shape.H),
            fmt(cell.get((shape, "sparsemla_graph"))), fmt(cell.get((shape, "sparsemla_sm89path_graph"))),
            fmt(cell.get((shape, base))), fmt(cell.get((shape, "floor"))),
            fmt(ratio.get((shape, "sparsemla_graph")), ".2f"), fmt(ratio.get((shape, "sparsemla_sm89path_graph"))),
        )  # fmt: skip
    Console(width=160).print(table)


def _write(path: Path, gpu: str, git_sha: str, ceilings: dict, rows: list, checks: list, paths: list[str],
           extras: dict[str, Any]) -> None:  # fmt: skip
    code_paths_doc = {
        p: "this GPU's own target (the issue's wgmma path; the V3.2 kernel's 16/32-head tiles lower to mma.sync "
        "there too)"
        if p == "native"
        else f"TRITON_OVERRIDE_ARCH={p}: mma.sync, sm_{p[2:]}'s configurations"
        for p in paths
    }  # fmt: skip
    method = (
        f"triton.testing.do_bench median (L2 flushed before each rep) of eager calls, inputs rotated over {ROTATE} "
        "sets; `*_graph` = one CUDA-graph replay per rep (the 1.3x target is judged on these); each code path in its "
        "own process; FlashMLA's split schedule computed once outside the timed call (sglang: once per batch); "
        "`shared_bytes` = metadata.shared of the decode kernel as launched"
    )
    write_doc(path, "decode_v32", gpu, git_sha, ceilings, rows, checks, code_paths_doc, method)
    doc = json.loads(path.read_text())  # the shared writer's document, plus this op's own keys
    doc.update(extras)
    path.write_text(json.dumps(doc, indent=1) + "\n")


@app.command()
def main(
    out_dir: Path = typer.Option(Path("results/bench"), help="Where decode_v32-<gpu>-<date>.json is written."),
    batches: str = typer.Option(DEFAULTS["batches"], help="Comma-separated batch sizes."),
    heads: str = typer.Option(DEFAULTS["heads"], help="Comma-separated query head counts (per rank)."),
    topk: int = typer.Option(2048, help="Indices per query row (DeepSeek-V3.2's index_topk)."),
    s_q: str = typer.Option(DEFAULTS["s_q"], "--s-q", help="Query tokens per request: 1 and/or 2 (MTP)."),
    formats: str = typer.Option(DEFAULTS["formats"], help="KV cache formats: fp8_656 and/or bf16_576."),
    ctx: int = typer.Option(8192, help="Cache slots per request (the indices are distinct slots among them)."),
    providers: str = typer.Option("sparsemla,flashmla,flashmla_sparse_fwd,reference", help="Providers to time."),
    paths: str = typer.Option(
        "native,sm89",
        help="Code paths: native (the GPU's own target) and/or sm89 (TRITON_OVERRIDE_ARCH=sm89: the mma.sync code and "
        "configurations of sm_80..sm_120), each in its own process.",
    ),
    child_out: Path = typer.Option(None, hidden=True, help="(internal) write this process's rows here."),
    git_sha: str = typer.Option("", help="Commit the numbers belong to (the GPU machine's copy has no .git)."),
    build_cubins: Path = typer.Option(
        None,
        help="No GPU: compile our launches of the grid with this Triton (3.8) in each of --paths, as the GPU machine "
        "(sm_90) runs them, into DIR/<path>.",
    ),
    cubins: Path = typer.Option(
        None, help="GPU: also time sparsemla_t38_graph from DIR/<path>'s Triton 3.8 cubins in each code path."
    ),
) -> None:
    """Time every provider over the shape grid in each code path and write the JSON (needs a CUDA GPU)."""
    from sparsemla.console import fail

    try:  # the options are checked before CUDA is touched
        shapes = shape_grid(batches, heads, s_q, formats, topk, ctx)
        provs = parse_names(providers, "providers", PROVIDERS)
        path_list = code_paths.parse(paths)
    except ValueError as exc:
        fail(str(exc))
    if build_cubins is not None:
        for code_path in path_list:
            added = build_cubins_for(shapes, build_cubins, code_path)
            print(f"{added} cubins added to {build_cubins}/{code_path} (sm_90)")
        return
    if cubins is not None:
        from benchmarks import prod_cubins

        prod_cubins.require(cubins, path_list)
    if not torch.cuda.is_available():
        fail("the V3.2 decode benchmark needs a CUDA GPU", "run it on the GPU machine (make bench-decode-v32)")
    if child_out is not None:
        run_path(shapes, provs, path_list[0], child_out, cubins)
        return

    gpu = torch.cuda.get_device_name()
    ceilings = measure_ceilings()
    torch.cuda.empty_cache()  # the children need the GPU's memory, not this process's cached copy buffers
    rows, checks, metas = run_paths(sys.argv[1:], path_list)
    rows += floor_rows(rows, ceilings)
    speeds = speedups(rows)
    extras = {
        "shapes": {
            "batches": batches,
            "heads": heads,
            "s_q": s_q,
            "topk": topk,
            "ctx": ctx,
            "formats": formats,
            "page_size": V32_PAGE,
            "sm_scale": SM_SCALE,
            "ref_max_B": REF_MAX_B,
        },  # fmt: skip
        "providers": {p: PROVIDERS[p] for p in provs},
        "baselines": BASELINE,
        "flashmla": {fmt: FLASHMLA_NOTES[fmt] for fmt in parse_names(formats, "formats", V32_FORMATS)},
        "path_runs": metas,
        "speedups": speeds,
        "target_results": evaluate_target(speeds),
    }
    path = result_path(out_dir, "decode_v32", gpu)
    _write(path, gpu, git_sha, ceilings, rows, checks, path_list, extras)
    _print_table(rows, speeds)
    for t in extras["target_results"]:
        print(f"{t['kv_format']} {t['provider']}: {t['within']}/{t['points']} within {RATIO_LIMIT}x of "
              f"{t['baseline']} (worst {t['worst_ratio']}x at {t['worst_at']})")  # fmt: skip
    print(f"wrote {path}")


if __name__ == "__main__":
    app()
