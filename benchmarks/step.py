"""GPU benchmark of a whole DeepSeek-V4-Flash decode step, flags off vs on: ``python -m benchmarks.step``.

The step (43 layers shaped as sglang 0.5.23 configures DeepSeek-V4-Flash, random weights and caches) is described
in :mod:`benchmarks.step_model`; how a point is captured, timed and profiled in
:mod:`benchmarks.step_run`. Flag states: :data:`sparsemla.variant.VARIANTS`, from ``baseline`` (sglang's SM120 per-head
Triton decode + the torch indexer over the page-table width) to :data:`sparsemla.variant.ALL_ON` (= provider
``sparsemla``: our decode and indexer kernels). Grid: B in {1, 16, 32, 64}
x real context {4k, 64k}, server context length (the cap the torch indexer scans) 1M.

Writes ``<out-dir>/step-<gpu>-<date>.json``::

    {"op": "step", "gpu", "git_sha", "date", "torch", "triton", "cuda", "cap", "model", "impl", "method",
     "rows": [{"B", "ctx", "provider": "baseline" | "sparsemla", "us", "tok_s"}],      # the two compared states
     "variant_rows": [{"variant", "B", "ctx", "us", "min_us", "max_us", "reps", "mode", "tok_s"}],  # all four states
     "speedup": {ctx: {B: baseline_us / sparsemla_us}},
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
    MAIN_VARIANTS,
    TINY,
    V4_FLASH,
    VARIANTS,
    DecodeFn,
    DecodeStep,
    ModelShape,
    make_inputs,
    make_weights,
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


def variant_order(variants: tuple[str, ...]) -> list[str]:
    """The two compared states first, then the single-flag states (only needed for the simulator calibration)."""
    return [v for v in VARIANTS if v in variants and v in MAIN_VARIANTS] + [
        v for v in VARIANTS if v in variants and v not in MAIN_VARIANTS
    ]


def sglang_decode(path: Path) -> DecodeFn:
    """sglang 0.5.23's ``flash_mla_sparse_decode_triton`` (loaded from its source file) behind the kwargs contract."""
    from benchmarks.decode import load_sglang_triton

    fn = load_sglang_triton(path)

    def call(q, k_cache, indices, topk_length, attn_sink, head_dim_v, softmax_scale, extra_k_cache=None,
             extra_indices_in_kvcache=None, extra_topk_length=None):  # fmt: skip
        return fn(q, k_cache, indices, topk_length, attn_sink, head_dim_v, softmax_scale, extra_k_cache,
                  extra_indices_in_kvcache, extra_topk_length)  # fmt: skip

    return call


def consistency_checks(inp: Any, baseline_decode: DecodeFn, gen: torch.Generator) -> dict[str, float]:
    """Both states compute the same function on one point's caches: top-512 slot agreement of the two indexers
    (fraction of the torch path's slots our path also picked) and the relative error between the two decodes on the
    ratio-4 and ratio-128 caches."""
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
    return out


def least_squares_slope(points: list[tuple[float, float]]) -> float | None:
    """Slope of y over x (None with fewer than two distinct x)."""
    if len({x for x, _ in points}) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def derived_tables(variant_rows: list[dict[str, Any]]) -> tuple[list[dict], dict, dict]:
    """(issue-schema rows of the two compared states, speedup per ctx/B, marginal per-request µs per variant/ctx)."""
    rows = [
        {"B": r["B"], "ctx": r["ctx"], "provider": MAIN_VARIANTS[r["variant"]], "us": r["us"], "tok_s": r["tok_s"]}
        for r in variant_rows
        if r["variant"] in MAIN_VARIANTS
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
    hook: Callable[..., Any] | None = None,
    budget_s: float = 200.0,
    target_s: float = 1.0,
    min_reps: int = 3,
    max_reps: int = 20,
    sha: str = "unknown",
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Measure every (variant, ctx, B) point that fits ``budget_s`` and write the JSON after each; returns it."""
    import triton

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
        },
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
        "marginal_us": {},
        "kernel_share": {},
        "hook_overhead": [],
        "checks": {},
        "skipped": [],
        "errors": [],
    }

    def elapsed() -> float:
        return time.perf_counter() - t_start

    checked = False
    for ctx, b in point_order(batches, contexts):
        if elapsed() > budget_s:
            doc["skipped"].append({"B": b, "ctx": ctx, "variants": list(variants), "reason": "time budget"})
            continue
        inp = make_inputs(shape, b, ctx, cap, device, gen)
        if not checked and b >= 2:
            try:
                doc["checks"] = {"B": b, "ctx": ctx, **consistency_checks(inp, baseline_decode, gen)}
            except Exception as exc:  # a failed check is reported, the measurements still run
                doc["errors"].append({"B": b, "ctx": ctx, "where": "checks", "error": repr(exc)})
            checked = True
        for variant in variant_order(variants):
            if variant not in MAIN_VARIANTS and elapsed() > 0.75 * budget_s:
                doc["skipped"].append({"B": b, "ctx": ctx, "variants": [variant], "reason": "time budget"})
                continue
            prepared = None
            try:
                step = DecodeStep(shape, layers, lm_head, final_norm, inp, variant, baseline_decode)
                prepared = prepare(step, device)
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
            doc["elapsed_s"] = elapsed()
            write_json_atomic(out_path, doc, indent=1)
        del inp
        if on_gpu:
            torch.cuda.empty_cache()
    doc["rows"], doc["speedup"], doc["marginal_us"] = derived_tables(doc["variant_rows"])
    doc["elapsed_s"] = elapsed()
    write_json_atomic(out_path, doc, indent=1)
    return doc


def print_summary(doc: dict[str, Any], log: Callable[[str], None] = print) -> None:
    """Step table (ms, tok/s, speedup) and the kernel-share categories of every profiled point."""
    log(f"{'ctx':>6} {'B':>3} | {'baseline ms':>12} {'sparsemla ms':>13} {'speedup':>8} | tok/s off / on")
    cell = {(r["provider"], r["ctx"], r["B"]): r for r in doc["rows"]}
    for ctx, b in sorted({(r["ctx"], r["B"]) for r in doc["rows"]}):
        off, on = cell.get(("baseline", ctx, b)), cell.get(("sparsemla", ctx, b))
        nan = float("nan")
        sp = doc["speedup"].get(str(ctx), {}).get(str(b), nan)
        off_ms, on_ms = (off["us"] / 1e3 if off else nan), (on["us"] / 1e3 if on else nan)
        off_tps, on_tps = (off["tok_s"] if off else nan), (on["tok_s"] if on else nan)
        log(f"{ctx:>6} {b:>3} | {off_ms:12.2f} {on_ms:13.2f} {sp:8.1f} | {off_tps:.1f} / {on_tps:.1f}")
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
    sglang_src: Path = typer.Option(
        Path(".gpu/sglang_src/flash_mla_sm120_triton.py"), help="sglang 0.5.23's flash_mla_sm120_triton.py (baseline)."
    ),
    step_hook: str = typer.Option("", help="module:function of the per-step metric hook whose overhead to measure."),
    budget_s: float = typer.Option(200.0, help="Stop starting new points after this many seconds."),
    git_sha_: str = typer.Option("", "--git-sha", help="Commit measured (default: git rev-parse HEAD)."),
    tiny: bool = typer.Option(False, help="CPU smoke run at small dense dims (no GPU needed, no profile)."),
) -> None:
    """Measure the decode step in every flag state over the grid and write the JSON (needs a CUDA GPU)."""
    from benchmarks.indexer import gpu_slug
    from sparsemla.console import fail

    bad = [v for v in variants.split(",") if v not in VARIANTS]
    if bad:
        fail(f"unknown variant(s) {', '.join(bad)}", f"choose from {', '.join(VARIANTS)}")
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
    hook = load_hook(step_hook) if step_hook else None
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    out_path = out_dir / f"step-{gpu_slug(gpu)}-{_dt.date.today().isoformat()}.json"
    doc = run_bench(
        shape=shape, device=device, batches=bs, contexts=ctxs, cap=cap, variants=tuple(variants.split(",")),
        out_path=out_path, trace_dir=None if tiny else trace_dir, baseline_decode=baseline, baseline_label=label,
        hook=hook, budget_s=budget_s, sha=git_sha_ or artifacts.git_sha() or "unknown",
    )  # fmt: skip
    print_summary(doc)
    print(f"wrote {out_path}")


if __name__ == "__main__":
    app()
