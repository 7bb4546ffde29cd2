"""docs/performance.md section of the sparse-prefill benchmark (``benchmarks/prefill.py``)."""

from __future__ import annotations

from typing import Any

from benchmarks.report import fmt_us

PROVIDERS = (("sparsemla", "ours native"), ("sparsemla_sm89path", "ours sm_89 path"), ("flashmla", "FlashMLA"))


def prefill_section(doc: dict[str, Any]) -> str:
    """One table per result: µs (and TFLOP/s) per (s_q, H, top-k, s_kv) and provider, ours / FlashMLA."""
    cells: dict[tuple, dict[str, dict]] = {}
    for r in doc["rows"]:
        cells.setdefault((r["s_q"], r["H"], r["topk"], r["s_kv"]), {})[r["provider"]] = r
    names = [label for p, label in PROVIDERS if any(p in c for c in cells.values())]
    head = "| s_q | H | top-k | s_kv | " + " | ".join(f"{n} µs (TFLOP/s)" for n in names) + " | ours / FlashMLA |"
    lines = [
        "## Sparse-MLA prefill (DeepSeek-V3.2, `flash_mla_sparse_fwd`'s contract)",
        "",
        f"{doc['gpu']}, torch {doc['torch']}, Triton {doc['triton']}, commit `{doc['git_sha']}`, {doc['date'][:10]}. "
        f"`make bench-prefill` (`benchmarks/prefill.py`). Method: {doc['method']}. FlashMLA = sgl-flash-mla's "
        "`flash_mla_sparse_fwd` as sglang 0.5.23 calls it (H < 64 padded to 64 heads, the padded call timed).",
        "",
        head,
        "|" + "---|" * (5 + len(names)),
    ]
    for key in sorted(cells):
        row = cells[key]
        vals = [
            f"{fmt_us(row[p]['us'])} ({row[p]['tflops']:.0f})" if p in row else "not run"
            for p, label in PROVIDERS
            if label in names
        ]
        ratio = (
            f"{row['sparsemla']['us'] / row['flashmla']['us']:.2f}x"
            if "sparsemla" in row and "flashmla" in row
            else "no FlashMLA row"
        )
        lines.append("| " + " | ".join(map(str, key)) + " | " + " | ".join(vals) + f" | {ratio} |")
    checks = [c for c in doc.get("checks", []) if "flashmla" in c.get("rel_err_vs_sparsemla", {})]
    if checks:
        worst = max(c["rel_err_vs_sparsemla"]["flashmla"] for c in checks)
        lines += ["", f"FlashMLA's output vs ours on the same inputs: rel. error at most {worst:.1e}."]
    return "\n".join(lines) + "\n"
