"""The DeepSeek-V3.2 decode-step section of ``docs/performance.md``, rendered from one
``results/bench/step_v32-*.json`` (``make bench-step-v32``: the 61-layer step, every layer indexed, on one GPU).

``step_v32_section(data)`` is what ``benchmarks/report.py`` calls; ``python -m benchmarks.report_step_v32
results/bench/step_v32-h200-<date>.json`` prints the section on its own."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from benchmarks.step_report import fmt_ms

TITLE = "## Decode step (DeepSeek-V3.2: 61 layers, every layer indexed, one GPU)"
CATEGORIES = ("attention", "indexer", "gemm", "elementwise", "copy", "communication", "other")


def _step_table(data: dict[str, Any], states: list[str]) -> list[str]:
    cell = {(r["state"], int(r["ctx"]), int(r["B"])): r for r in data["rows"]}
    points = sorted({(int(r["ctx"]), int(r["B"])) for r in data["rows"]})
    head = " | ".join(f"{s} ms" for s in states) + " | " + " | ".join(f"{s} tok/s" for s in states)
    lines = [f"| ctx | B | {head} | flashmla / sparsemla |", "|---|---|" + "---|" * (2 * len(states) + 1)]
    for ctx, b in points:
        rows = [cell.get((s, ctx, b)) for s in states]
        times = " | ".join(fmt_ms(r["us"] if r else None) for r in rows)
        tok = " | ".join(f"{r['tok_s']:,.1f}" if r else "-" for r in rows)
        speedup = data["speedup"].get(str(ctx), {}).get(str(b))
        lines.append(f"| {ctx} | {b} | {times} | {tok} | {'-' if speedup is None else f'{speedup:.3f}x'} |")
    return lines


def _share_table(data: dict[str, Any], states: list[str]) -> list[str]:
    lines = [
        "| state | ctx | B | GPU ms | " + " | ".join(CATEGORIES) + " |",
        "|---|---|---|---|" + "---|" * len(CATEGORIES),
    ]
    for state in states:
        for ctx, by_b in sorted(data["kernel_share"].get(state, {}).items(), key=lambda kv: int(kv[0])):
            for b, entry in sorted(by_b.items(), key=lambda kv: int(kv[0])):
                shares = " | ".join(f"{100 * entry['categories'].get(c, 0.0):.1f} %" for c in CATEGORIES)
                lines.append(f"| {state} | {ctx} | {b} | {fmt_ms(entry['total_gpu_us'])} | {shares} |")
    return lines


def step_v32_section(data: dict[str, Any]) -> str:
    states = [s for s, v in data["states"].items() if v.get("measured")]
    v = data["versions"]
    checks = data["checks"]
    lines = [
        TITLE,
        "",
        f"{data['gpu']}, git `{data['git_sha']}`, {data['date']}; torch {v['torch']}, Triton {v['triton']}, "
        f"FlashMLA {v.get('flash_mla', '-')}; model {data['model']['name']} ({data['model']['num_layers']} layers, "
        f"server context {data['cap']:,}). Method: {data['method']}.",
        "",
        "States: " + "; ".join(f"**{s}**: {data['states'][s]['description']}" for s in states) + ".",
        "",
        f"Flags off: {data['flags_off']}.",
        "",
        *_step_table(data, states),
        "",
        "Marginal cost of one more request (least-squares slope of the step time over B): "
        + "; ".join(
            f"{s} {us:,.0f} µs at ctx {ctx}" for s, by_ctx in data["marginal_us"].items() for ctx, us in by_ctx.items()
        )
        + ".",
        "",
        "Kernel share of the profiled replay (GPU time by category):",
        "",
        *_share_table(data, states),
        "",
        f"Checks at B={checks['B']}, ctx {checks['ctx']}: indexer top-k agreement "
        f"{checks['indexer_topk_agreement']:.4f} with the fp32 reference; decode rel err "
        + ", ".join(f"{s} {checks[f'decode_rel_err_{s}']:.4f}" for s in states if f"decode_rel_err_{s}" in checks)
        + ".",
    ]
    if data.get("skipped"):
        lines += ["", "Not measured (time budget): " + ", ".join(f"B={s['B']} ctx {s['ctx']}" for s in data["skipped"])]
    if data.get("errors"):
        lines += ["", "Errors: " + "; ".join(str(e) for e in data["errors"])]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(step_v32_section(json.loads(Path(sys.argv[1]).read_text())))
