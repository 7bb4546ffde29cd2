"""The DeepSeek-V3.2 decode section of ``docs/performance.md``, rendered from one ``results/bench/decode_v32-*.json``
(``make bench-decode-v32``), or a "not measured yet" note while none is committed.

``decode_v32_section(data)`` is what ``benchmarks/report.py`` calls; ``python -m benchmarks.report_decode_v32
results/bench/decode_v32-h200-<date>.json`` prints the section on its own."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.report import fmt_us

TITLE = "## Sparse-MLA decode (DeepSeek-V3.2, FlashMLA's fp8_656 / bf16_576 caches)"
MARK = {True: "met", False: "**missed**", None: "n/a"}
EXPLORE = Path(__file__).resolve().parents[1] / "results" / "bench" / "explore"


def pending_section() -> str:
    """The section while no decode_v32 JSON is committed."""
    return (
        f"{TITLE}\n\nNot measured yet: `make bench-decode-v32` on the GPU machine writes "
        "`results/bench/decode_v32-<gpu>-<date>.json`: our `sparse_decode_v32` against FlashMLA's V3.2 sparse decode "
        "(sgl-flash-mla 1.0.0, fp8_656; its sparse prefill kernel for bf16_576, as sglang's flashmla_sparse decode "
        "backend runs it) and the roofline floor, B in {1, 8, 32, 64, 128}, H in {16, 128}, top-k 2048, eager and "
        "CUDA-graph replay, native and sm_89 code paths, the issue's 1.3x target evaluated from the measured "
        "rows.\n"
    )


def _key(r: dict) -> tuple:
    return (r["kv_format"], r["s_q"], r["H"], r["B"])


def decode_v32_section(data: dict, explore: Path | None = EXPLORE) -> str:
    """Markdown: the header and targets, one table per cache format, the largest check errors; then the follow-up
    run from ``explore`` (results/bench/explore) where there is one."""
    cells: dict[tuple, dict[str, float]] = {}
    for r in data["rows"]:
        if r.get("us") is not None:  # a provider's error row has no time
            cells.setdefault(_key(r), {})[r["provider"]] = float(r["us"])
    ratios = {(_key(s), s["provider"]): s["ratio"] for s in data.get("speedups", [])}
    ceil = data.get("ceilings", {})
    shapes = data.get("shapes", {})
    out = [
        TITLE,
        "",
        f"{data['gpu']}, torch {data['torch']}, Triton {data['triton']}, commit `{data['git_sha'][:10]}`, "
        f"{data.get('date', '')}. Ceilings measured in the same run: copy "
        f"{ceil.get('copy_bytes_per_s', 0) / 1e12:.2f} TB/s, bf16 matmul {ceil.get('bf16_flops_per_s', 0) / 1e12:.0f} "
        f"TFLOP/s. Top-k {shapes.get('topk', '?')} distinct slots per query row out of {shapes.get('ctx', '?')} per "
        f"request (page 64). {data.get('method', '')}. `floor` = max(bytes / copy bandwidth, FLOPs / bf16 rate).",
        "",
    ]
    out += [f"- `{fmt}`: {note}." for fmt, note in data.get("flashmla", {}).items()]
    for run in data.get("path_runs", []):
        if run.get("error") or run.get("flashmla_unavailable"):
            out.append(f"- code path `{run['code_path']}`: {run.get('error') or run.get('flashmla_unavailable')}.")
    targets = data.get("target_results", [])
    if targets:
        out += ["", "**Target**: within 1.3x of FlashMLA's V3.2 kernel (the fp8 cache) in the wgmma path: the native "
                "code path, CUDA-graph replay, every measured point, as production's Triton 3.8 compiles it "
                "(`sparsemla_t38_graph`; `sparsemla_graph` is the GPU machine's Triton 3.6 compile of the same "
                "source). The sm_89 path's ratios (`sparsemla_sm89path*_graph`) and the bf16 cache against "
                "FlashMLA's sparse prefill kernel are shown beside it:", ""]  # fmt: skip
        for t in targets:
            where = ", ".join(f"{k}={v}" for k, v in t["worst_at"].items())
            out.append(
                f"- `{t['kv_format']}` `{t['provider']}` vs `{t['baseline']}`: {MARK[t['pass']]} "
                f"({t['within']}/{t['points']} points within {t['limit']:g}x; worst {t['worst_ratio']:.2f}x at {where})"
            )
    # Triton 3.8 (production's compiler) columns where the run replayed 3.8 cubins (`--cubins`)
    t38 = [p for p in T38_PROVIDERS if any(p in v for v in cells.values())]
    for fmt in dict.fromkeys(k[0] for k in cells):
        base = data.get("baselines", {}).get(fmt, "flashmla")  # FlashMLA's kernel for this format
        out += [
            "",
            f"**{fmt}**, µs (graph = CUDA-graph replay; FlashMLA = `{base}`; ratios = ours / FlashMLA, graph"
            + ("; `3.8` = our kernels compiled by Triton 3.8 and launched from their cubins" if t38 else "")
            + "):",
            "",
            "| s_q | H | B | ours native graph | ours sm_89 graph | "
            + "".join(f"{T38_PROVIDERS[p]} | {T38_PROVIDERS[p]} / FlashMLA | " for p in t38)
            + "FlashMLA graph | floor | native / FlashMLA | sm_89 / FlashMLA | ours eager | FlashMLA eager "
            "| reference |",
            "|---|---|---|---|---|" + "---|---|" * len(t38) + "---|---|---|---|---|---|---|",
        ]
        for key in sorted(k for k in cells if k[0] == fmt):
            v = cells[key]
            r_nat = ratios.get((key, "sparsemla_graph"))
            r_89 = ratios.get((key, "sparsemla_sm89path_graph"))
            extra = "".join(f"{fmt_us(v.get(p))} | {_ratio(ratios.get((key, p)))} | " for p in t38)
            out.append(
                f"| {key[1]} | {key[2]} | {key[3]} | {fmt_us(v.get('sparsemla_graph'))} "
                f"| {fmt_us(v.get('sparsemla_sm89path_graph'))} | {extra}{fmt_us(v.get(base + '_graph'))} "
                f"| {fmt_us(v.get('floor'))} | {_ratio(r_nat)} | {_ratio(r_89)} | {fmt_us(v.get('sparsemla'))} "
                f"| {fmt_us(v.get(base))} | {fmt_us(v.get('reference'))} |"
            )
    out += _check_lines(data.get("checks", []))
    return "\n".join(out) + "\n" + (followup_section(data, explore) if explore else "")


def followup_section(data: dict, explore: Path) -> str:
    """The newest ``results/bench/explore/decode_v32_opaque-*.json`` (a `benchmarks.decode_v32` run over a subset of
    shapes, made after the formal one) when it is newer than ``data``: its tables and targets, under a sub-heading."""
    files = sorted(explore.glob("decode_v32_opaque-*.json"))
    if not files:
        return ""
    sub = json.loads(files[-1].read_text())
    if sub.get("date", "") <= data.get("date", ""):
        return ""
    body = decode_v32_section(sub, explore=None).split("\n", 1)[1]  # its own follow-up would be itself
    return (
        f"\n**After the opaque K move** (`V32Config.opaque_k` on every fp8_656 mma.sync tile, and the 16-head "
        f"mma.sync tile instead of wgmma's 64-head one for <= 16 heads on sm_90; "
        f"`{files[-1].relative_to(explore.parents[2])}`, the same script on a subset of the shapes):\n{body}"
    )


T38_PROVIDERS = {"sparsemla_t38_graph": "ours native 3.8", "sparsemla_sm89path_t38_graph": "ours sm_89 3.8"}


def _ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}x"


def _check_lines(checks: list[dict]) -> list[str]:
    """The largest errors of each provider (per code path) against the reference and against ours."""
    worst: dict[tuple[str, str, str], float] = {}
    for c in checks:
        for what in ("rel_err_vs_reference", "lse_err_vs_reference", "rel_err_vs_sparsemla"):
            for provider, e in c.get(what, {}).items():
                k = (what, provider, c.get("code_path", "native"))
                worst[k] = max(worst.get(k, 0.0), e)
    if not worst:
        return []
    names = {"rel_err_vs_reference": "out rel. error vs the fp32 reference", "lse_err_vs_reference": "max |lse| "
             "error vs the reference", "rel_err_vs_sparsemla": "out rel. error vs ours"}  # fmt: skip
    parts = [f"{names[w]}: `{p}` ({path}) {e:.1e}" for (w, p, path), e in worst.items()]
    return ["", "Largest errors on the measured inputs: " + "; ".join(parts) + "."]


def main(argv: list[str]) -> None:
    print(decode_v32_section(json.loads(Path(argv[0]).read_text())))


if __name__ == "__main__":
    main(sys.argv[1:])
