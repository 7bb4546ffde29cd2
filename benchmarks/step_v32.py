"""GPU benchmark of a whole DeepSeek-V3.2 decode step, flags on vs stock sglang on Hopper: ``python -m
benchmarks.step_v32``.

The step (61 layers shaped as sglang 0.5.23 runs DeepSeek-V3.2, every layer indexed, random weights and fp8 656-byte
caches) and its two states are described in :mod:`benchmarks.step_model_v32`; a point (state, B, ctx) is captured,
timed and profiled as in ``make bench-step`` (:mod:`benchmarks.step_run`: one CUDA graph holding the whole step,
captured after one eager warm-up; one untimed replay, then CUDA-event-timed replays, median; one replay profiled for
the kernel shares). States: ``sparsemla`` (flags on: ``SPARSEMLA_DSA_V32`` + ``SPARSEMLA_TRITON_INDEXER``) and
``flashmla`` (FlashMLA's V3.2 decode from the sgl-flash-mla wheel, measured where it loads, with our indexer standing
in for DeepGEMM's, so the two states differ in the decode kernel alone). Flags off on sm_80..sm_89 / sm_120 is no
state: sglang has no V3.2 path there (the JSON's ``flags_off`` says so). Grid: B in {1, 16, 32, 64} x real context
{4k, 32k}, server context length (the indexer's page-table width) 163840, attention TP ``--tp`` (1: all 128 heads per
rank, DP-attention; 8: 16 heads, padded to 64 for the decode as sglang pads them).

Writes ``<out-dir>/step_v32-<gpu>-<date>.json`` after every point::

    {"op": "step_v32", "gpu", "git_sha", "date", "versions": {"torch", "triton", "cuda", "flash_mla", "sglang_modelled",
     "sparsemla"}, "cap", "model": {"name", "num_layers", "indexer_layers", "layer_types", "shape", "deployment",
     "decode_heads", "params"}, "memory": {B: {ctx: memory_estimate}}, "states": {state: {"description", "flags",
     "measured", ["reason"], "decode", "decode_schedule", "indexer_logits", "top_k", ["stands_in_for"]}}, "flags_off",
     "method", "weight_bytes_per_step": {B: bytes},
     "rows": [{"state", "B", "ctx", "us", "min_us", "max_us", "reps", "mode", "tok_s"}],
     "speedup": {ctx: {B: flashmla_us / sparsemla_us}},   # > 1: flags on is faster
     "marginal_us": {state: {ctx: least-squares slope of step time over B (µs per extra request)}},
     "kernel_share": {state: {ctx: {B: {"step_us", "total_gpu_us", "categories", "category_us", "top", "kernels",
                                        "categories_sum_within_1pct", "files", "profiled"}}}},
     "checks": {"B", "ctx", "rows", "indexer_topk_agreement", "decode_rel_err_<state>"}, "skipped": [...],
     "errors": [...], "elapsed_s"}

and one gzipped chrome trace per point under ``--trace-dir``. Needs a CUDA GPU unless ``--tiny`` (a CPU smoke run of
the harness at :meth:`~benchmarks.step_model_v32.ModelShapeV32.tiny` dims with the fp32 reference ops, eager, no
profile, flags-on state only). Default grid on one H200: ~6.4 GB of shared bf16 weights + <= 3.3 GB of caches per
point; 16 points in ~2-4 minutes (a step streams ~75 GB of weights at B = 1, ~197 GB at B = 64); ``--budget-s``
stops starting new points and keeps what was measured.
"""

from __future__ import annotations

import datetime as _dt
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import typer

from benchmarks.decode_v32 import parse_ints
from benchmarks.step import least_squares_slope, point_order, probe_deep_gemm
from benchmarks.step_model_v32 import (
    FLAGS,
    FLASHMLA,
    KV_FORMAT,
    MOE,
    SPARSEMLA,
    STATES,
    DecodeStepV32,
    ModelShapeV32,
    V32Decode,
    make_inputs,
    make_weights,
    memory_estimate,
    weight_bytes,
)
from benchmarks.step_run import kernel_share, prepare, profile_summary, time_step
from sparsemla import SGLANG_VERSION, artifacts
from sparsemla.artifacts import write_json_atomic

app = typer.Typer(add_completion=False, help=__doc__)

CAP = 163840  # DeepSeek-V3.2's context length: sglang's decode graphs size real_page_table for it
BATCHES = (1, 16, 32, 64)
CONTEXTS = (4096, 32768)
TINY_GRID = {"batches": (1, 2), "contexts": (512,)}
BUDGET_S = 300.0
CHECK_ROWS = 8  # requests of one point the consistency check compares (the fp32 references loop over them)

FLAGS_OFF = (
    "flags off is not a state here: on sm_80..sm_89 and sm_120 sglang 0.5.23 has no DeepSeek-V3.2 path without "
    "SPARSEMLA_DSA_V32 (its auto DSA backends fa3 / trtllm and FlashMLA have no kernel there; see "
    "src/sparsemla/plugin/dsa_v32.py), so there is no fallback step to measure; on Hopper flags off is stock sglang, "
    "the flashmla state"
)
INDEXER_LOGITS = (
    "sparsemla.kernels.indexer.sglang_compat.fp8_paged_mqa_logits (Triton, real lengths; = indexer.api.indexer_logits, "
    "the op of the plugin's indexer_deepgemm hook on deep_gemm.fp8_paged_mqa_logits, which sglang's V3.2 Indexer "
    "calls through resolve_fp8_paged_mqa_logits_fn); width = the page-table width x 64 = cap"
)
TOP_K = (
    "sparsemla.kernels.indexer.sglang_compat.topk_transform_paged (Triton top-2048 + page-64 transform, the op of the "
    "plugin's top-k hooks)"
)


def state_impl(state: str, flash_mla: Any = None, deep_gemm: str = "") -> dict[str, Any]:
    """The exact kernels one state runs (the JSON's ``states`` entry, less ``measured``)."""
    entry: dict[str, Any] = {"description": STATES[state], "flags": list(FLAGS[state])}
    if state == SPARSEMLA:
        entry |= {
            "decode": "sparsemla.kernels.dsa_compat.flash_mla_with_kvcache -> sparse_decode_v32 (Triton, "
            "kv_format fp8_656): the plugin's dsa_v32_decode hook in place of sglang's FlashMLA wrapper, handed q "
            "padded to H_pad heads as sglang's _forward_flashmla_kv pads it",
            "decode_schedule": "sparsemla.kernels.dsa_compat.get_mla_metadata (zeros: our decode plans its splits "
            "at launch), once per point outside the step",
        }
    else:
        version = getattr(flash_mla, "__version__", "not loaded")
        entry |= {
            "decode": f"flash_mla.flash_mla_with_kvcache (sgl-flash-mla {version}; legacy SM90 sparse fp8 decode: "
            "use_legacy=True, kv_format='V32', is_fp8_kvcache=True, block_table [B, 0], q [B, 1, H_pad, 576], "
            "indices [B, 1, 2048], a fresh FlashMLASchedMeta per call as sglang 0.5.23's flash_mla_interface "
            "wrapper builds it)",
            "decode_schedule": "flash_mla.get_mla_decoding_metadata(min(seq_len, 2048), H_pad, 1, H_pad, True, 2048, "
            "use_legacy=True), once per point outside the step (sglang: _compute_flashmla_metadata once per forward "
            "batch, outside its captured graph, shared by the layers)",
            "stands_in_for": "stock sglang 0.5.23 on Hopper runs DeepGEMM's fp8_paged_mqa_logits for the indexer "
            "logits and its JIT topk_transform_paged_v2 (DSATopKBackend._topk_transform_v2_paged, the default "
            f"decode top-k) for the top-k; our indexer kernels stand in for both (deep_gemm here: "
            f"{deep_gemm or 'not probed'}), so the two states differ in the decode kernel alone",
        }
    return entry | {"indexer_logits": INDEXER_LOGITS, "top_k": TOP_K}


def consistency_checks(
    shape: ModelShapeV32,
    inp: Any,
    gen: torch.Generator,
    states: tuple[str, ...],
    flash_mla: Any = None,
    rows: int = CHECK_ROWS,
) -> dict[str, Any]:
    """Both states compute the same function on one point's MoE-layer caches (its first ``rows`` requests): the
    fraction of the fp32 reference indexer's top-k slots our indexer also picked (random q and weights), then, with
    our slots as the indices and a random 576-wide q, each state's decode against the fp32
    :func:`~sparsemla.kernels.sparse_decode.reference.sparse_decode_v32_reference` (``decode_rel_err_<state>``,
    relative Frobenius error of out; ``decode_error_<state>`` when a decode fails: the other checks stand)."""
    from sparsemla.kernels.indexer.reference import indexer_logits_reference
    from sparsemla.kernels.indexer.sglang_compat import fp8_paged_mqa_logits, topk_transform_paged
    from sparsemla.kernels.layouts import IDX_PAGE, V32_DIM
    from sparsemla.kernels.sparse_decode.reference import sparse_decode_v32_reference

    dev, n, k = inp.x.device, min(inp.batch, rows), shape.index_topk
    c = inp.caches[MOE]
    lens, table = inp.seq_lens[:n].contiguous(), inp.page_table[:n].contiguous()
    q = torch.randn(n, 1, shape.index_heads, shape.index_dim, generator=gen, device=dev).to(torch.float8_e4m3fn)
    w = torch.randn(n, shape.index_heads, generator=gen, device=dev) * shape.index_heads**-0.5
    ours = torch.empty(n, k, dtype=torch.int32, device=dev)
    topk_transform_paged(fp8_paged_mqa_logits(q, c.idx_keys, w, lens, table, None, inp.cap, False), lens, table, ours,
                         IDX_PAGE)  # fmt: skip
    ref = indexer_logits_reference(q, c.idx_keys, w, lens, table, None, inp.ctx, False).topk(k, dim=1).indices
    ref_slots = table.long().gather(1, ref // IDX_PAGE) * IDX_PAGE + ref % IDX_PAGE
    agree = [len(set(r) & set(o)) / k for r, o in zip(ref_slots.tolist(), ours.tolist(), strict=True)]
    out: dict[str, Any] = {"B": inp.batch, "ctx": inp.ctx, "rows": n, "indexer_topk_agreement": sum(agree) / n}
    qd = torch.randn(n, shape.local_heads, V32_DIM, generator=gen, device=dev).to(torch.bfloat16)
    want, _ = sparse_decode_v32_reference(qd.unsqueeze(1), c.kv, ours.view(n, 1, k), shape.softmax_scale,
                                          kv_format=KV_FORMAT)  # fmt: skip
    want = want[:, 0].float()
    for state in states:
        try:
            got = V32Decode(state, shape, inp.decode_lens[:n], flash_mla)(qd, c.kv, ours, shape.softmax_scale)
        except Exception as exc:  # noqa: BLE001 -- recorded; the measurements decide what runs
            out[f"decode_error_{state}"] = repr(exc)[:500]
            continue
        out[f"decode_rel_err_{state}"] = float((got.float() - want).norm() / want.norm().clamp_min(1e-30))
    return out


def derived_tables(rows: list[dict[str, Any]]) -> tuple[dict, dict]:
    """(speedup {ctx: {B: flashmla µs / sparsemla µs}}, marginal per-request µs {state: {ctx: slope}})."""
    cell = {(r["state"], r["ctx"], r["B"]): r["us"] for r in rows}
    speedup: dict[str, dict[str, float]] = {}
    for (state, ctx, b), us in sorted(cell.items()):
        if state == FLASHMLA and (SPARSEMLA, ctx, b) in cell:
            speedup.setdefault(str(ctx), {})[str(b)] = us / cell[(SPARSEMLA, ctx, b)]
    marginal: dict[str, dict[str, float | None]] = {}
    for state, ctx in sorted({(s, c) for s, c, _ in cell}):
        pts = [(b, us) for (s, c, b), us in cell.items() if s == state and c == ctx]
        marginal.setdefault(state, {})[str(ctx)] = least_squares_slope(pts)
    return speedup, marginal


def run_bench(
    *,
    shape: ModelShapeV32,
    device: torch.device,
    batches: tuple[int, ...],
    contexts: tuple[int, ...],
    cap: int,
    states: tuple[str, ...],
    out_path: Path,
    trace_dir: Path | None,
    flash_mla: Any = None,
    flash_mla_reason: str = "",
    deep_gemm: str = "",
    budget_s: float = BUDGET_S,
    target_s: float = 1.0,
    min_reps: int = 3,
    max_reps: int = 20,
    sha: str = "unknown",
    seed: int = 0,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Measure every (state, ctx, B) point that fits ``budget_s`` and write the JSON after each; returns it.

    The ``flashmla`` state needs ``flash_mla`` (the module, from :func:`benchmarks.decode.load_flash_mla`); without
    it the state is recorded as not measured with ``flash_mla_reason``."""
    import triton

    import sparsemla

    unknown = [s for s in states if s not in STATES]
    if unknown:
        raise ValueError(f"unknown state(s) {unknown}; the states are {', '.join(STATES)}")
    t_start = time.perf_counter()
    gen = torch.Generator(device=device).manual_seed(seed)
    on_gpu = device.type == "cuda"
    gpu = torch.cuda.get_device_name(device) if on_gpu else "cpu"
    measured = tuple(s for s in states if s != FLASHMLA or flash_mla is not None)
    layers, lm_head, final_norm = make_weights(shape, device, gen)
    is_v32 = shape == ModelShapeV32.v32(shape.tp)
    doc: dict[str, Any] = {
        "op": "step_v32",
        "gpu": gpu,
        "git_sha": sha,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "versions": {
            "torch": torch.__version__,
            "triton": triton.__version__,
            "cuda": torch.version.cuda or "none",
            "flash_mla": str(getattr(flash_mla, "__version__", "not loaded")),
            "sglang_modelled": SGLANG_VERSION,
            "sparsemla": sparsemla.__version__,
        },
        "cap": cap,
        "model": {
            "name": "deepseek-ai/DeepSeek-V3.2" if is_v32 else "tiny (CPU smoke shape)",
            "num_layers": shape.num_layers,
            "indexer_layers": shape.indexer_layers,
            "layer_types": {t: shape.layer_types.count(t) for t in dict.fromkeys(shape.layer_types)},
            "shape": {k: getattr(shape, k) for k in shape.__dataclass_fields__},
            "deployment": f"one rank of {shape.ep} GPUs: attention TP {shape.tp} ({shape.local_heads} heads per rank), "
            f"DP-attention over {shape.dp} group(s) of B requests, EP{shape.ep} ({shape.local_experts} local experts "
            f"per MoE layer), dense FFN and shared expert TP {shape.tp}; no collectives (one GPU)",
            "decode_heads": {"real": shape.local_heads, "passed_to_decode": shape.flashmla_heads},
            "params": shape.params(),
            "kv_format": KV_FORMAT,
        },
        "memory": {str(b): {str(c): memory_estimate(shape, b, c) for c in contexts} for b in batches},
        "states": {},
        "flags_off": FLAGS_OFF,
        "method": (
            f"one CUDA graph per (state, B, ctx) holding the whole {shape.num_layers}-layer step, captured after one "
            "eager warm-up; one untimed replay, then per-replay CUDA-event times (median); one replay profiled with "
            "torch.profiler (CUDA activity) -> kernel shares via sparsemla.traces"
            if on_gpu
            else "CPU smoke run: eager steps timed with perf_counter (fp32 reference ops), no profile"
        ),
        "weight_bytes_per_step": {str(b): weight_bytes(shape, layers, lm_head, b) for b in batches},
        "rows": [],
        "speedup": {},
        "marginal_us": {},
        "kernel_share": {},
        "checks": {},
        "skipped": [],
        "errors": [],
    }
    for state in states:
        entry = {"measured": state in measured} | state_impl(state, flash_mla, deep_gemm)
        if state not in measured:
            entry["reason"] = flash_mla_reason or "FlashMLA was not loaded"
        doc["states"][state] = entry

    def elapsed() -> float:
        return time.perf_counter() - t_start

    def save() -> None:
        doc["speedup"], doc["marginal_us"] = derived_tables(doc["rows"])
        doc["elapsed_s"] = elapsed()
        write_json_atomic(out_path, doc, indent=1)

    checked = False
    grid = point_order(batches, contexts)
    for ctx, b in grid:
        if elapsed() > budget_s:
            doc["skipped"].append({"B": b, "ctx": ctx, "states": list(measured), "reason": "time budget"})
            continue
        try:
            inp = make_inputs(shape, b, ctx, cap, device, gen)
        except Exception as exc:  # noqa: BLE001 -- e.g. out of memory: the other points still run
            doc["errors"].append({"B": b, "ctx": ctx, "where": "inputs", "error": repr(exc)[:2000]})
            save()
            continue
        if not checked and (b >= 2 or (ctx, b) == grid[-1]):
            try:
                doc["checks"] = consistency_checks(shape, inp, gen, measured, flash_mla)
            except Exception as exc:  # noqa: BLE001 -- a failed check is reported, the measurements still run
                doc["errors"].append({"B": b, "ctx": ctx, "where": "checks", "error": repr(exc)[:2000]})
            checked = True
        for state in measured:
            prepared = None
            try:
                prepared = prepare(DecodeStepV32(shape, layers, lm_head, final_norm, inp, state, flash_mla), device)
                t = time_step(prepared, device, target_s, min_reps, max_reps)
                doc["rows"].append({"state": state, "B": b, "ctx": ctx, **t, "tok_s": b / (t["us"] * 1e-6)})
                if on_gpu and trace_dir is not None:
                    name = f"step_v32-{state}-tp{shape.tp}-B{b}-ctx{ctx}.trace.json.gz"
                    summary, mode = profile_summary(prepared, t["us"], trace_dir / name)
                    share = kernel_share(summary, t["us"]) | {"profiled": mode}
                    doc["kernel_share"].setdefault(state, {}).setdefault(str(ctx), {})[str(b)] = share
                ms = t["us"] / 1e3
                log(f"{state:<10} B={b:<3} ctx={ctx:<6} {ms:10.3f} ms  ({t['reps']} reps)  [{elapsed():.0f}s]")
            except Exception as exc:  # noqa: BLE001 -- one failing point (e.g. out of memory) must not lose the run
                doc["errors"].append({"state": state, "B": b, "ctx": ctx, "error": repr(exc)[:2000]})
                log(f"{state:<10} B={b:<3} ctx={ctx:<6} FAILED: {exc!r}"[:400])
            finally:
                if prepared is not None:
                    prepared.release()
                del prepared
            save()
        del inp
        if on_gpu:
            torch.cuda.empty_cache()
    save()
    return doc


def print_summary(doc: dict[str, Any], log: Callable[[str], None] = print) -> None:
    """Step table (ms, tok/s, FlashMLA / flags-on speedup) and every profiled point's kernel categories."""
    cell = {(r["state"], r["ctx"], r["B"]): r for r in doc["rows"]}
    nan = float("nan")
    log(f"{'ctx':>6} {'B':>3} | {'flashmla ms':>12} {'sparsemla ms':>13} {'speedup':>8} | tok/s flashmla / sparsemla")
    for ctx, b in sorted({(r["ctx"], r["B"]) for r in doc["rows"]}):
        ref, on = cell.get((FLASHMLA, ctx, b)), cell.get((SPARSEMLA, ctx, b))
        sp = doc["speedup"].get(str(ctx), {}).get(str(b), nan)
        ref_ms, on_ms = (ref["us"] / 1e3 if ref else nan), (on["us"] / 1e3 if on else nan)
        tps = f"{ref['tok_s'] if ref else nan:.1f} / {on['tok_s'] if on else nan:.1f}"
        log(f"{ctx:>6} {b:>3} | {ref_ms:12.2f} {on_ms:13.2f} {sp:7.3f}x | {tps}")
    for state, entry in doc["states"].items():
        if not entry.get("measured"):
            log(f"{state}: not measured: {entry.get('reason')}")
    for state, by_ctx in doc["kernel_share"].items():
        for ctx, by_b in by_ctx.items():
            for b, entry in by_b.items():
                cats = " ".join(f"{c}={s:.1%}" for c, s in entry["categories"].items() if s > 0)
                log(f"{state} ctx={ctx} B={b}: gpu {entry['total_gpu_us'] / 1e3:.2f} ms  {cats}")
    if doc["checks"]:
        log(
            "checks: "
            + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in doc["checks"].items())
        )
    for err in doc["errors"]:
        log(f"error: {err}"[:400])


def parse_states(text: str) -> tuple[str, ...]:
    """Comma-separated state names out of :data:`STATES`, in order, duplicates dropped."""
    chosen = tuple(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    bad = [p for p in chosen if p not in STATES]
    if bad or not chosen:
        raise ValueError(f"--states: unknown {bad or text!r}, choose from {', '.join(STATES)}")
    return chosen


def parse_options(
    batches: str, contexts: str, cap: int, states: str, tp: int, tiny: bool
) -> tuple[ModelShapeV32, tuple[int, ...], tuple[int, ...], int, tuple[str, ...]]:
    """(shape, batches, contexts, cap, states) from the CLI's options; ValueError for one out of range. With ``tiny``
    the options left at their defaults take the CPU smoke grid, and the flashmla state (GPU only) is dropped."""
    shape = ModelShapeV32.tiny(tp) if tiny else ModelShapeV32.v32(tp)
    if tiny:
        batches = ",".join(map(str, TINY_GRID["batches"])) if batches == ",".join(map(str, BATCHES)) else batches
        contexts = ",".join(map(str, TINY_GRID["contexts"])) if contexts == ",".join(map(str, CONTEXTS)) else contexts
        cap = shape.max_context if cap == CAP else cap
    bs, ctxs = tuple(parse_ints(batches, "batches")), tuple(parse_ints(contexts, "contexts"))
    chosen = parse_states(states)
    if tiny:
        chosen = tuple(s for s in chosen if s != FLASHMLA) or (SPARSEMLA,)
    if cap % 64:
        raise ValueError(f"--cap must be a multiple of 64 (the page size), got {cap}")
    bad = [c for c in ctxs if c % 64 or not shape.index_topk < c <= cap]
    if bad:
        raise ValueError(
            f"--contexts must be multiples of 64 in ({shape.index_topk}, --cap {cap}] (above index_topk: sglang skips "
            f"the indexer logits below it), got {list(bad)}"
        )
    return shape, bs, ctxs, cap, chosen


@app.command()
def main(
    out_dir: Path = typer.Option(Path("results/bench"), help="Where step_v32-<gpu>-<date>.json is written."),
    trace_dir: Path = typer.Option(Path("results/traces/step_v32"), help="Where the per-point chrome traces go."),
    batches: str = typer.Option(",".join(map(str, BATCHES)), help="Comma-separated batch sizes (requests per rank)."),
    contexts: str = typer.Option(",".join(map(str, CONTEXTS)), help="Comma-separated real context lengths."),
    cap: int = typer.Option(CAP, help="Server context length: the indexer's page-table width x 64 (logits width)."),
    states: str = typer.Option(
        ",".join(STATES), help="States to measure: " + "; ".join(f"{k}: {v}" for k, v in STATES.items()) + "."
    ),
    tp: int = typer.Option(1, min=1, help="Attention TP size: 1 (DP-attention, 128 heads per rank) or 8 (16 heads)."),
    budget_s: float = typer.Option(BUDGET_S, help="Stop starting new points after this many seconds."),
    git_sha_: str = typer.Option("", "--git-sha", help="Commit measured (default: git rev-parse HEAD)."),
    tiny: bool = typer.Option(False, help="CPU smoke run at small dims (no GPU needed, no profile, flags-on only)."),
) -> None:
    """Measure the V3.2 decode step in each state over the grid and write the JSON (needs a CUDA GPU)."""
    from benchmarks.decode import load_flash_mla
    from benchmarks.indexer import gpu_slug
    from sparsemla.console import fail

    try:  # the options are checked before CUDA is touched
        shape, bs, ctxs, cap, chosen = parse_options(batches, contexts, cap, states, tp, tiny)
    except ValueError as exc:
        fail(str(exc))
    if tiny:
        device = torch.device("cpu")
    else:
        if not torch.cuda.is_available():
            fail(
                "the V3.2 step benchmark needs a CUDA GPU", "run it on the GPU machine (make bench-step-v32), or --tiny"
            )
        device = torch.device("cuda")
    flash_mla, reason = load_flash_mla(device) if FLASHMLA in chosen else (None, "")
    gpu = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    out_path = out_dir / f"step_v32-{gpu_slug(gpu)}-{_dt.date.today().isoformat()}.json"
    doc = run_bench(
        shape=shape, device=device, batches=bs, contexts=ctxs, cap=cap, states=chosen, out_path=out_path,
        trace_dir=None if tiny else trace_dir, flash_mla=flash_mla, flash_mla_reason=reason,
        deep_gemm=probe_deep_gemm() if FLASHMLA in chosen else "", budget_s=budget_s,
        sha=git_sha_ or artifacts.git_sha() or "unknown",
    )  # fmt: skip
    print_summary(doc)
    print(f"wrote {out_path}")


if __name__ == "__main__":
    app()
