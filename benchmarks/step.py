"""GPU benchmark of a whole DeepSeek-V4-Flash decode step, flags off vs on: ``python -m benchmarks.step``.

The step (43 layers shaped as sglang 0.5.23 configures DeepSeek-V4-Flash, random weights and caches) is described
in :mod:`benchmarks.step_model`; how a point is captured, timed and profiled in
:mod:`benchmarks.step_run`. Flag states: :data:`sparsemla.variant.VARIANTS`, from ``baseline`` (sglang's SM120 per-head
Triton decode + the torch indexer over the page-table width) to :data:`sparsemla.variant.ALL_ON` (= provider
``sparsemla``: our decode and indexer kernels). Reference states (:data:`benchmarks.step_model.REFERENCES`, not flag
states): ``flashmla_decode+triton_indexer`` = sglang's fast decode on Hopper (FlashMLA's ``flash_mla_with_kvcache``
from the sgl-flash-mla wheel) with our indexer standing in for DeepGEMM's; measured where FlashMLA loads and runs
(else ``references`` says why not). Grid: B in {1, 16, 32, 64}
x real context {4k, 64k}, server context length (the cap the torch indexer scans) 1M.

Writes ``<out-dir>/step-<gpu>-<date>.json``::

    {"op": "step", "gpu", "git_sha", "date", "torch", "triton", "cuda", "cap", "model", "impl", "method",
     "rows": [{"B", "ctx", "provider": "baseline" | "sparsemla" | <reference>, "us", "tok_s"}],  # compared states
     "variant_rows": [{"variant", "B", "ctx", "us", "min_us", "max_us", "reps", "mode", "tok_s"}],  # every state
     "speedup": {ctx: {B: baseline_us / sparsemla_us}},
     "speedup_vs_reference": {reference: {ctx: {B: reference_us / sparsemla_us}}},
     "references": {reference: {"description", "measured", "reason" | "flash_mla", "sched_meta"}},
     "impl": {..., "states": {state: {"kind", "decode", "indexer_logits", "top_k", ["stands_in_for"]}}},
     "marginal_us": {variant: {ctx: least-squares slope of step time over B (µs per extra request)}},
     "kernel_share": {variant: {ctx: {B: {"step_us", "total_gpu_us", "categories", "category_us", "top", "kernels",
                                         "categories_sum_within_1pct", "files"}}}},
     "hook_overhead": [{"B", "plain_us", "hooked_us", "overhead_pct", ...}],
     "checks": {...}, "skipped": [...], "errors": [...]}

and one gzipped chrome trace per point under ``--trace-dir``. The simulator calibration is written from that JSON by
src/sparsemla/ops/sim/calibrate_from_step.py (``make bench-step`` runs both). Needs a CUDA GPU unless
``--tiny`` (a CPU smoke run of the harness at small dense dims, eager, no profile).
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import typer

from benchmarks.step_model import (
    DECODE_FLASHMLA,
    DECODE_SPARSEMLA,
    FLASHMLA_REFERENCE,
    MAIN_VARIANTS,
    REFERENCES,
    TINY,
    V4_FLASH,
    VARIANTS,
    DecodeFn,
    DecodeStep,
    ModelShape,
    make_inputs,
    make_weights,
    state_kernels,
    weight_bytes,
)
from benchmarks.step_run import (
    hook_overhead,
    kernel_share,
    load_hook,
    prepare,
    profile_summary,
    time_step,
)
from sparsemla import artifacts, flags
from sparsemla import variant as kernel_variant
from sparsemla.artifacts import write_json_atomic

app = typer.Typer(add_completion=False, help=__doc__)

CAP = 1 << 20
BATCHES = (1, 16, 32, 64)
CONTEXTS = (4096, 65536)
SPARSEMLA = kernel_variant.ALL_ON


def point_order(batches: tuple[int, ...], contexts: tuple[int, ...]) -> list[tuple[int, int]]:
    """(ctx, B) in the order they run: per context (given order), B smallest, largest, then the rest ascending, so a
    run cut short by its time budget still has the issue's target points (B = 1 and 64 at the first context)."""
    bs = sorted(set(batches))
    ordered = bs[:1] + bs[-1:] + bs[1:-1] if len(bs) > 1 else bs
    return [(ctx, b) for ctx in contexts for b in ordered]


def variant_order(variants: tuple[str, ...], references: tuple[str, ...] = ()) -> list[str]:
    """The two compared states first, then the reference states (the step table's other comparison), then the
    single-flag states (only needed for the simulator calibration)."""
    return (
        [v for v in VARIANTS if v in variants and v in MAIN_VARIANTS]
        + [r for r in REFERENCES if r in references]
        + [v for v in VARIANTS if v in variants and v not in MAIN_VARIANTS]
    )


INDEXER_IMPL = {
    False: (
        "benchmarks.indexer.torch_fallback_logits (re-implementation of sglang 0.5.23's "
        "fp8_paged_mqa_logits_torch_sm120; scans cap / 4 compressed tokens)",
        "benchmarks.indexer.torch_topk_transform (re-implementation of sglang 0.5.23's "
        "topk_transform_pytorch_vectorized: torch.topk over the cap)",
    ),
    True: (
        "sparsemla.kernels.indexer.sglang_compat.fp8_paged_mqa_logits (Triton, real lengths)",
        "sparsemla.kernels.indexer.sglang_compat.topk_transform_paged (Triton top-512 + page transform)",
    ),
}
SPARSEMLA_DECODE_IMPL = "sparsemla.kernels.sparse_decode (Triton, head-batched MMA)"


def flashmla_impl(flash_mla: Any) -> str:
    """What the reference state's decode is, with the FlashMLA build that ran."""
    version = getattr(flash_mla, "__version__", "unknown version")
    return (
        f"flash_mla.flash_mla_with_kvcache (sgl-flash-mla {version}; use_legacy=True: the SM90 sparse fp8 decode of "
        "the V4 584-byte layout, is_fp8_kvcache=True, the kwargs sglang 0.5.23's DeepseekV4AttnBackend passes on "
        "Hopper; benchmarks.decode.FlashMLADecode)"
    )


def state_impl(state: str, baseline_label: str, flash_mla: Any = None, deep_gemm: str = "") -> dict[str, str]:
    """The exact kernels one state runs (the JSON's ``impl.states`` entry)."""
    decode, triton_indexer = state_kernels(state)
    logits, topk = INDEXER_IMPL[triton_indexer]
    entry = {
        "kind": "reference (not a sparsemla flag state)" if state in REFERENCES else "flag state",
        "decode": {DECODE_SPARSEMLA: SPARSEMLA_DECODE_IMPL, DECODE_FLASHMLA: flashmla_impl(flash_mla)}.get(
            decode, baseline_label
        ),
        "indexer_logits": logits,
        "top_k": topk,
    }
    if state == FLASHMLA_REFERENCE:
        entry["stands_in_for"] = (
            "stock sglang 0.5.23 on Hopper runs DeepGEMM's fp8_paged_mqa_logits (sgl-deep-gemm 0.2.3.post2) and its "
            f"JIT topk_transform_paged_v2 for the indexer; our indexer kernels stand in for both (deep_gemm here: "
            f"{deep_gemm or 'not probed'}), so flags on vs this state differs in the decode kernel alone"
        )
    return entry


def probe_deep_gemm() -> str:
    """Whether DeepGEMM's Python package loads in this process (recorded next to the stand-in indexer)."""
    import importlib
    import importlib.util

    if importlib.util.find_spec("deep_gemm") is None:
        return "not installed"
    try:
        importlib.import_module("deep_gemm")
    except Exception as exc:  # noqa: BLE001 -- e.g. the ABI mismatch of its extension with this torch
        return f"installed but does not load ({type(exc).__name__}: {str(exc)[:200]})"
    return "loads (not used: the reference state's indexer is ours)"


def sglang_decode(path: Path) -> DecodeFn:
    """sglang 0.5.23's ``flash_mla_sparse_decode_triton`` (loaded from its source file) behind the kwargs contract."""
    from benchmarks.decode import load_sglang_triton

    fn = load_sglang_triton(path)

    def call(q, k_cache, indices, topk_length, attn_sink, head_dim_v, softmax_scale, extra_k_cache=None,
             extra_indices_in_kvcache=None, extra_topk_length=None):  # fmt: skip
        return fn(q, k_cache, indices, topk_length, attn_sink, head_dim_v, softmax_scale, extra_k_cache,
                  extra_indices_in_kvcache, extra_topk_length)  # fmt: skip

    return call


def consistency_checks(
    inp: Any, baseline_decode: DecodeFn, gen: torch.Generator, fast_decode: DecodeFn | None = None
) -> dict[str, Any]:
    """Both states compute the same function on one point's caches: top-512 slot agreement of the two indexers
    (fraction of the torch path's slots our path also picked) and the relative error between the two decodes on the
    ratio-4 and ratio-128 caches; with ``fast_decode`` (FlashMLA) also its relative error against our decode there
    (``flashmla_rel_err_*``, or ``flashmla_error`` when it fails: the other checks stand)."""
    from benchmarks.indexer import torch_fallback_logits, torch_topk_transform
    from sparsemla.kernels import sparse_decode
    from sparsemla.kernels.indexer.sglang_compat import fp8_paged_mqa_logits, topk_transform_paged

    dev, B = inp.x.device, inp.batch
    c4, c128 = inp.caches[4], inp.caches[128]
    q = torch.randn(B, 1, 64, 128, generator=gen, device=dev).to(torch.float8_e4m3fn)
    w = torch.randn(B, 64, generator=gen, device=dev) * 64**-0.5
    k = c4.topk_slots.shape[1]
    ref = torch.empty(B, k, dtype=torch.int32, device=dev)
    ours = torch.empty_like(ref)
    width = inp.cap // 4
    torch_topk_transform(torch_fallback_logits(q, c4.idx_keys, w, inp.c4_len, inp.page_table, width), inp.c4_len,
                         inp.page_table, ref, 64)  # fmt: skip
    logits = fp8_paged_mqa_logits(q, c4.idx_keys, w, inp.c4_len, inp.page_table, None, width, False)
    topk_transform_paged(logits, inp.c4_len, inp.page_table, ours, 64)
    agree = []
    for r, o in zip(ref.tolist(), ours.tolist(), strict=True):
        want = {s for s in r if s >= 0}
        agree.append(len(want & set(o)) / max(len(want), 1))
    qd = torch.randn(B, 1, 64, 512, generator=gen, device=dev).to(torch.bfloat16)
    sink = torch.randn(64, generator=gen, device=dev)
    out = {"indexer_topk_agreement": sum(agree) / len(agree)}
    for name, cache, idx, lens in (
        ("decode_rel_err_c4", c4, ref.view(B, 1, k), inp.c4_topk_len),
        ("decode_rel_err_c128", c128, inp.c128_idx, inp.c128_len),
    ):
        kw = dict(q=qd, k_cache=cache.swa, indices=inp.swa_idx, topk_length=inp.swa_len, attn_sink=sink,
                  head_dim_v=512, softmax_scale=512**-0.5, extra_k_cache=cache.extra,
                  extra_indices_in_kvcache=idx, extra_topk_length=lens)  # fmt: skip
        a = baseline_decode(**kw)[0].float()
        b = sparse_decode(**kw)[0].float()
        out[name] = float((a - b).norm() / a.norm().clamp_min(1e-30))
        if fast_decode is not None and "flashmla_error" not in out:
            try:
                f = fast_decode(**kw)[0].float()
            except Exception as exc:  # noqa: BLE001 -- recorded; the measurements decide what runs
                out["flashmla_error"] = repr(exc)[:500]
                continue
            out[name.replace("decode_", "flashmla_")] = float((f - b).norm() / b.norm().clamp_min(1e-30))
    return out


def least_squares_slope(points: list[tuple[float, float]]) -> float | None:
    """Slope of y over x (None with fewer than two distinct x)."""
    if len({x for x, _ in points}) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def provider_name(state: str) -> str | None:
    """The issue-schema provider of a state: ``baseline`` / ``sparsemla``, a reference by its own name, else None."""
    return MAIN_VARIANTS.get(state, state if state in REFERENCES else None)


def speedup_vs_references(variant_rows: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, float]]]:
    """{reference: {ctx: {B: reference step µs / flags-on step µs}}} over the points where both were timed."""
    cell = {(r["variant"], r["ctx"], r["B"]): r["us"] for r in variant_rows}
    out: dict[str, dict[str, dict[str, float]]] = {}
    for (state, ctx, b), us in sorted(cell.items()):
        if state in REFERENCES and (SPARSEMLA, ctx, b) in cell:
            out.setdefault(state, {}).setdefault(str(ctx), {})[str(b)] = us / cell[(SPARSEMLA, ctx, b)]
    return out


def derived_tables(variant_rows: list[dict[str, Any]]) -> tuple[list[dict], dict, dict]:
    """(issue-schema rows of the compared states, speedup per ctx/B, marginal per-request µs per state/ctx)."""
    rows = [
        {"B": r["B"], "ctx": r["ctx"], "provider": provider_name(r["variant"]), "us": r["us"], "tok_s": r["tok_s"]}
        for r in variant_rows
        if provider_name(r["variant"]) is not None
    ]
    cell = {(r["variant"], r["ctx"], r["B"]): r["us"] for r in variant_rows}
    speedup: dict[str, dict[str, float]] = {}
    for (variant, ctx, b), us in cell.items():
        if variant == kernel_variant.BASELINE and (SPARSEMLA, ctx, b) in cell:
            speedup.setdefault(str(ctx), {})[str(b)] = us / cell[(SPARSEMLA, ctx, b)]
    marginal: dict[str, dict[str, float | None]] = {}
    for variant, ctx in sorted({(v, c) for v, c, _ in cell}):
        pts = [(b, us) for (v, c, b), us in cell.items() if v == variant and c == ctx]
        marginal.setdefault(variant, {})[str(ctx)] = least_squares_slope(pts)
    rows.sort(key=lambda r: (r["provider"], r["ctx"], r["B"]))
    return rows, speedup, marginal


def run_bench(
    *,
    shape: ModelShape,
    device: torch.device,
    batches: tuple[int, ...],
    contexts: tuple[int, ...],
    cap: int,
    variants: tuple[str, ...],
    out_path: Path,
    trace_dir: Path | None,
    baseline_decode: DecodeFn,
    baseline_label: str,
    references: tuple[str, ...] = (),
    flash_mla: Any = None,
    flash_mla_reason: str = "",
    deep_gemm: str = "",
    hook: Callable[..., Any] | None = None,
    budget_s: float = 200.0,
    target_s: float = 1.0,
    min_reps: int = 3,
    max_reps: int = 20,
    sha: str = "unknown",
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Measure every (state, ctx, B) point that fits ``budget_s`` and write the JSON after each; returns it.

    ``references``: reference states to measure as well; they need ``flash_mla`` (the module, from
    :func:`benchmarks.decode.load_flash_mla`), else each is recorded as not measured with ``flash_mla_reason``."""
    import triton

    from benchmarks.decode import FlashMLADecode

    unknown = [r for r in references if r not in REFERENCES]
    if unknown:
        raise ValueError(f"unknown reference state(s) {unknown}; the reference states are {', '.join(REFERENCES)}")

    t_start = time.perf_counter()
    gen = torch.Generator(device=device).manual_seed(seed)
    on_gpu = device.type == "cuda"
    gpu = torch.cuda.get_device_name(device) if on_gpu else "cpu"
    layers, lm_head, final_norm = make_weights(shape, device, gen)
    doc: dict[str, Any] = {
        "op": "step",
        "gpu": gpu,
        "git_sha": sha,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda or "none",
        "cap": cap,
        "model": {
            "name": "deepseek-ai/DeepSeek-V4-Flash" if shape == V4_FLASH else "tiny (CPU smoke shape)",
            "num_layers": shape.num_layers,
            "indexer_layers": shape.indexer_layers,
            "compress_ratios": list(shape.compress_ratios),
            "shape": {k: getattr(shape, k) for k in shape.__dataclass_fields__},
            "deployment": f"one rank of DP-attention + EP{shape.ep}: {shape.local_experts} local experts per layer",
        },
        "impl": {
            "baseline_decode": baseline_label,
            "baseline_indexer": "benchmarks.indexer.torch_fallback_logits + torch_topk_transform "
            "(faithful re-implementations of sglang 0.5.23's fp8_paged_mqa_logits_torch_sm120 and "
            "topk_transform_pytorch_vectorized; width = cap / 4 compressed tokens)",
            "sparsemla_decode": "sparsemla.kernels.sparse_decode (Triton, head-batched MMA)",
            "sparsemla_indexer": "sparsemla.kernels.indexer.sglang_compat.fp8_paged_mqa_logits + topk_transform_paged",
            "states": {
                st: state_impl(st, baseline_label, flash_mla, deep_gemm)
                for st in [*VARIANTS, *references]
                if st in variants or (st in references and flash_mla is not None)
            },
        },
        "references": {},
        "method": (
            "one CUDA graph per (state, B, ctx) holding the whole 43-layer step, captured after one eager warm-up; "
            "one untimed replay, then per-replay CUDA-event times (median); one replay profiled with torch.profiler "
            "(CUDA activity) -> kernel shares via sparsemla.traces"
            if on_gpu
            else "CPU smoke run: eager steps timed with perf_counter, no profile"
        ),
        "weight_bytes_per_step": {str(b): weight_bytes(shape, layers, lm_head, b) for b in batches},
        "variant_rows": [],
        "rows": [],
        "speedup": {},
        "speedup_vs_reference": {},
        "marginal_us": {},
        "kernel_share": {},
        "hook_overhead": [],
        "checks": {},
        "skipped": [],
        "errors": [],
    }

    def elapsed() -> float:
        return time.perf_counter() - t_start

    per_step: dict[str, bool] = {}  # reference -> FlashMLA's schedule computed inside every step (else once a point)
    for ref in references:
        entry: dict[str, Any] = {"description": REFERENCES[ref]}
        if flash_mla is None:
            entry |= {"measured": False, "reason": flash_mla_reason or "FlashMLA was not loaded"}
        else:
            per_step[ref] = True
            entry |= {
                "measured": True,
                "flash_mla": str(getattr(flash_mla, "__version__", "unknown")),
                "sched_meta": "one FlashMLASchedMeta per layer type, computed inside every step (as sglang's "
                "captured decode step computes one per compress ratio)",
            }
        doc["references"][ref] = entry
    measured_refs = tuple(per_step)

    def build(variant: str, inp: Any, every_step: bool) -> DecodeStep:
        fast = FlashMLADecode(flash_mla, per_step=every_step) if variant in per_step else None
        return DecodeStep(shape, layers, lm_head, final_norm, inp, variant, baseline_decode, fast)

    def prepare_state(variant: str, inp: Any) -> Any:
        try:
            return prepare(build(variant, inp, per_step.get(variant, False)), device)
        except Exception as exc:
            if not per_step.get(variant):
                raise
            # FlashMLA's split schedule computed inside the captured step failed: compute it once per point in the
            # warm-up instead (the same schedule: the lengths do not change between steps) if that runs, and say so.
            try:
                prepared = prepare(build(variant, inp, False), device)
            except Exception:  # noqa: BLE001 -- the state fails either way: report the first error
                raise exc from None
            per_step[variant] = False
            doc["references"][variant]["sched_meta"] = (
                "one FlashMLASchedMeta per layer type, computed once per point in the eager warm-up and reused by "
                f"every timed step (computing it inside the captured step failed: {repr(exc)[:300]})"
            )
            log(f"{variant}: per-step FlashMLA schedule failed under capture ({exc!r}); computing it once per point")
            return prepared

    checked = False
    for ctx, b in point_order(batches, contexts):
        if elapsed() > budget_s:
            doc["skipped"].append(
                {"B": b, "ctx": ctx, "variants": [*variants, *measured_refs], "reason": "time budget"}
            )
            continue
        inp = make_inputs(shape, b, ctx, cap, device, gen)
        if not checked and b >= 2:
            try:
                fast = FlashMLADecode(flash_mla) if measured_refs else None
                doc["checks"] = {"B": b, "ctx": ctx, **consistency_checks(inp, baseline_decode, gen, fast)}
            except Exception as exc:  # a failed check is reported, the measurements still run
                doc["errors"].append({"B": b, "ctx": ctx, "where": "checks", "error": repr(exc)})
            checked = True
        for variant in variant_order(variants, measured_refs):
            if variant not in MAIN_VARIANTS and variant not in REFERENCES and elapsed() > 0.75 * budget_s:
                doc["skipped"].append({"B": b, "ctx": ctx, "variants": [variant], "reason": "time budget"})
                continue
            prepared = None
            try:
                prepared = prepare_state(variant, inp)
                t = time_step(prepared, device, target_s, min_reps, max_reps)
                row = {"variant": variant, "B": b, "ctx": ctx, **t, "tok_s": b / (t["us"] * 1e-6)}
                doc["variant_rows"].append(row)
                if on_gpu and trace_dir is not None:
                    name = f"step-{variant.replace('+', '_')}-B{b}-ctx{ctx}.trace.json.gz"
                    summary, mode = profile_summary(prepared, t["us"], trace_dir / name)
                    entry = kernel_share(summary, t["us"]) | {"profiled": mode}
                    doc["kernel_share"].setdefault(variant, {}).setdefault(str(ctx), {})[str(b)] = entry
                if (
                    hook is not None
                    and on_gpu
                    and variant == SPARSEMLA
                    and ctx == contexts[0]
                    and b
                    in (
                        min(batches),
                        max(batches),
                    )
                ):
                    doc["hook_overhead"].append(
                        {
                            "ctx": ctx,
                            **hook_overhead(prepared, b, hook, lambda: flags.SPARSEMLA_STEP_METRICS.override(True)),
                        }
                    )
                ms = t["us"] / 1e3
                log(f"{variant:<26} B={b:<3} ctx={ctx:<6} {ms:10.3f} ms  ({t['reps']} reps)  [{elapsed():.0f}s]")
            except Exception as exc:  # noqa: BLE001 -- one failing point (e.g. out of memory) must not lose the run
                doc["errors"].append({"variant": variant, "B": b, "ctx": ctx, "error": repr(exc)[:2000]})
                log(f"{variant:<26} B={b:<3} ctx={ctx:<6} FAILED: {exc!r}"[:400])
            finally:
                if prepared is not None:
                    prepared.release()
                del prepared
            doc["rows"], doc["speedup"], doc["marginal_us"] = derived_tables(doc["variant_rows"])
            doc["speedup_vs_reference"] = speedup_vs_references(doc["variant_rows"])
            doc["elapsed_s"] = elapsed()
            write_json_atomic(out_path, doc, indent=1)
        del inp
        if on_gpu:
            torch.cuda.empty_cache()
    doc["rows"], doc["speedup"], doc["marginal_us"] = derived_tables(doc["variant_rows"])
    doc["speedup_vs_reference"] = speedup_vs_references(doc["variant_rows"])
    doc["elapsed_s"] = elapsed()
    write_json_atomic(out_path, doc, indent=1)
    return doc


def print_summary(doc: dict[str, Any], log: Callable[[str], None] = print) -> None:
    """Step table (ms, tok/s, speedups vs the fallback and vs each reference) and every profiled point's categories."""
    refs = list(doc.get("speedup_vs_reference", {}))
    head = f"{'ctx':>6} {'B':>3} | {'baseline ms':>12} {'sparsemla ms':>13} {'speedup':>8}"
    log(head + "".join(f" | {r} ms, on vs it" for r in refs) + " | tok/s off / on")
    cell = {(r["provider"], r["ctx"], r["B"]): r for r in doc["rows"]}
    nan = float("nan")
    for ctx, b in sorted({(r["ctx"], r["B"]) for r in doc["rows"]}):
        off, on = cell.get(("baseline", ctx, b)), cell.get(("sparsemla", ctx, b))
        sp = doc["speedup"].get(str(ctx), {}).get(str(b), nan)
        off_ms, on_ms = (off["us"] / 1e3 if off else nan), (on["us"] / 1e3 if on else nan)
        off_tps, on_tps = (off["tok_s"] if off else nan), (on["tok_s"] if on else nan)
        line = f"{ctx:>6} {b:>3} | {off_ms:12.2f} {on_ms:13.2f} {sp:8.1f}"
        for r in refs:
            ref = cell.get((r, ctx, b))
            vs = doc["speedup_vs_reference"][r].get(str(ctx), {}).get(str(b), nan)
            line += f" | {(ref['us'] / 1e3 if ref else nan):10.2f} {vs:6.2f}x"
        log(f"{line} | {off_tps:.1f} / {on_tps:.1f}")
    for r, entry in doc.get("references", {}).items():
        if not entry.get("measured"):
            log(f"{r}: not measured: {entry.get('reason')}")
    for variant, by_ctx in doc["kernel_share"].items():
        for ctx, by_b in by_ctx.items():
            for b, entry in by_b.items():
                cats = " ".join(f"{c}={s:.1%}" for c, s in entry["categories"].items() if s > 0)
                log(f"{variant} ctx={ctx} B={b}: gpu {entry['total_gpu_us'] / 1e3:.2f} ms  {cats}")
    for h in doc["hook_overhead"]:
        log(f"step-metric hook B={h['B']}: {h['plain_us']:.1f} -> {h['hooked_us']:.1f} us ({h['overhead_pct']:+.2f}%)")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(v) for v in text.split(",") if v.strip())


@app.command()
def main(
    out_dir: Path = typer.Option(Path("results/bench"), help="Where step-<gpu>-<date>.json is written."),
    trace_dir: Path = typer.Option(Path("results/traces/step"), help="Where the per-point chrome traces go."),
    batches: str = typer.Option(",".join(map(str, BATCHES)), help="Comma-separated batch sizes."),
    contexts: str = typer.Option(",".join(map(str, CONTEXTS)), help="Comma-separated real context lengths."),
    cap: int = typer.Option(CAP, help="Server context length (page-table width the torch indexer scans)."),
    variants: str = typer.Option(",".join(VARIANTS), help="Flag states to measure."),
    references: str = typer.Option(
        FLASHMLA_REFERENCE,
        help="Reference states to measure too (comma-separated; '' for none): "
        + "; ".join(f"{k}: {v}" for k, v in REFERENCES.items())
        + ". Recorded as not measured where FlashMLA does not load or run.",
    ),
    sglang_src: Path = typer.Option(
        Path(".gpu/sglang_src/flash_mla_sm120_triton.py"), help="sglang 0.5.23's flash_mla_sm120_triton.py (baseline)."
    ),
    step_hook: str = typer.Option("", help="module:function of the per-step metric hook whose overhead to measure."),
    budget_s: float = typer.Option(200.0, help="Stop starting new points after this many seconds."),
    git_sha_: str = typer.Option("", "--git-sha", help="Commit measured (default: git rev-parse HEAD)."),
    tiny: bool = typer.Option(False, help="CPU smoke run at small dense dims (no GPU needed, no profile)."),
    ranks: int = typer.Option(
        1, min=1, help="Ranks (one process per GPU; NCCL, gloo with --tiny): > 1 runs benchmarks.step_ranks."
    ),
    deployment: str = typer.Option("tp", help="With --ranks > 1: tp (TP N) or dp-attention (DP-attention + EP N)."),
) -> None:
    """Measure the decode step in every flag state over the grid and write the JSON (needs a CUDA GPU)."""
    from benchmarks.indexer import gpu_slug
    from sparsemla.console import fail

    if ranks > 1:  # -- the multi-rank step (benchmarks/step_ranks.py): flags off vs on, B per rank --
        from benchmarks import step_ranks

        try:
            written = step_ranks.main(
                ranks=ranks, deployment=deployment, out_dir=out_dir, trace_dir=trace_dir,
                batches=batches if batches != ",".join(map(str, BATCHES)) else ",".join(map(str, step_ranks.BATCHES)),
                contexts=contexts, cap=cap, sglang_src=sglang_src, budget_s=max(budget_s, 400.0),
                sha=git_sha_ or artifacts.git_sha() or "unknown", tiny=tiny,
            )  # fmt: skip
        except (ValueError, RuntimeError) as exc:
            fail(str(exc), "python -m benchmarks.step --ranks 8 --deployment tp|dp-attention on an 8-GPU machine")
        print(f"wrote {written}")
        return

    bad = [v for v in variants.split(",") if v not in VARIANTS]
    if bad:
        fail(f"unknown variant(s) {', '.join(bad)}", f"choose from {', '.join(VARIANTS)}")
    refs = tuple(r for r in references.split(",") if r.strip())
    bad = [r for r in refs if r not in REFERENCES]
    if bad:
        fail(f"unknown reference state(s) {', '.join(bad)}", f"choose from {', '.join(REFERENCES)} (or '')")
    try:
        bs, ctxs = _ints(batches), _ints(contexts)
    except ValueError:
        fail(f"batches/contexts must be comma-separated integers, got {batches!r} / {contexts!r}")
    if tiny:
        device, shape = torch.device("cpu"), TINY
        from sparsemla.kernels import sparse_decode

        baseline, label = sparse_decode, "fp32 reference (CPU smoke run; sglang's kernel needs a GPU)"
    else:
        if not torch.cuda.is_available():
            fail("the step benchmark needs a CUDA GPU", "run it on the GPU machine (make bench-step), or use --tiny")
        if not sglang_src.is_file():
            fail(
                f"sglang's decode source {sglang_src} is missing", "put sglang 0.5.23's flash_mla_sm120_triton.py there"
            )
        device, shape = torch.device("cuda"), V4_FLASH
        baseline, label = sglang_decode(sglang_src), f"sglang 0.5.23 flash_mla_sparse_decode_triton ({sglang_src.name})"
    from benchmarks.decode import load_flash_mla

    flash_mla, flash_mla_reason = load_flash_mla(device) if refs else (None, "")
    hook = load_hook(step_hook) if step_hook else None
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    out_path = out_dir / f"step-{gpu_slug(gpu)}-{_dt.date.today().isoformat()}.json"
    doc = run_bench(
        shape=shape, device=device, batches=bs, contexts=ctxs, cap=cap, variants=tuple(variants.split(",")),
        out_path=out_path, trace_dir=None if tiny else trace_dir, baseline_decode=baseline, baseline_label=label,
        references=refs, flash_mla=flash_mla, flash_mla_reason=flash_mla_reason,
        deep_gemm=probe_deep_gemm() if refs else "", hook=hook, budget_s=budget_s,
        sha=git_sha_ or artifacts.git_sha() or "unknown",
    )  # fmt: skip
    print_summary(doc)
    print(f"wrote {out_path}")


if __name__ == "__main__":
    app()
