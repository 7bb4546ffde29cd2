"""The indexer top-k section of ``docs/performance.md``, rendered from one ``results/bench/topk-*.json``
(``make bench-topk``), or a "not measured yet" note while none is committed.

``topk_section(data)`` is what ``benchmarks/report.py`` calls; ``python -m benchmarks.report_topk
results/bench/topk-h200-<date>.json`` prints the section on its own."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from benchmarks.report import fmt_us

TITLE = "## Indexer top-k: every provider, both code paths"
# top-k columns of the per-k tables: (provider, path, header)
COLUMNS = (
    ("sparsemla_split", "native", "ours split (native)"),
    ("sparsemla_split", "sm89", "ours split (sm_89 path)"),
    ("sparsemla_split_t38", "native", "ours split, Triton 3.8 (native)"),
    ("sparsemla_split_t38", "sm89", "ours split, Triton 3.8 (sm_89 path)"),
    ("sparsemla_split_sorted", "native", "ours split sorted (native)"),
    ("sparsemla_split_sorted", "sm89", "ours split sorted (sm_89 path)"),
    ("torch_topk", "native", "torch.topk"),
    ("sglang_jit_v1", "native", "sglang JIT v1"),
    ("sglang_jit_v2", "native", "sglang JIT v2"),
)
LOGITS_COLUMNS = ("sparsemla_fused", "sparsemla_fused_t38", "sparsemla_logits_topk", "sparsemla_logits")
MARK = {True: "pass", False: "**fail**", None: "n/a"}


def pending_section() -> str:
    """The section while no top-k JSON is committed."""
    return (
        f"{TITLE}\n\nNot measured yet: `make bench-topk` on the GPU machine (after `benchmarks/gpu-sglang-jit.sh` "
        "here, carrying `.gpu`) writes `results/bench/topk-<gpu>-<date>.json`: our split top-k (by position and by "
        "value), the fused logits + top-k, `torch.topk` and sglang 0.5.23's JIT top-k kernels, B in {1, 8, 64}, "
        "real length 1k..256k, k in {512, 2048}, native and sm_89 code paths, two CUDA-graph timing methods, and the "
        "issue's targets evaluated from the measured rows.\n"
    )


def _cell(row: dict | None) -> str:
    """``graph / graph20`` in µs; ``err`` for a failed row; a trailing ``≠`` when the set differs from torch.topk."""
    if row is None:
        return "-"
    if row.get("error"):
        return "err"
    mark = "" if row.get("exact", True) else " ≠"
    return f"{fmt_us(row.get('us_graph'))} / {fmt_us(row.get('us_graph20'))}{mark}"


def topk_section(data: dict) -> str:
    """The section for one formal run. (The wide launch's A/B, shown here while the formal run predated it, went when
    the formal run of 41beb73 timed that launch as the default.)"""
    return _formal_section(data)


def _formal_section(data: dict) -> str:
    rows = data["rows"]
    index = {(r["provider"], r["path"], r["B"], r["length"], r["k"]): r for r in rows}
    methods = data.get("methods", {})
    out = [
        TITLE,
        "",
        f"{data['gpu']}, torch {data['torch']}, Triton {data['triton']}, CUDA {data.get('cuda')}, nvcc "
        f"{data.get('nvcc')}, commit `{data['git_sha'][:10]}`, {data.get('date', '')}. Real indexer logits, page-table "
        f"width {data.get('shapes', {}).get('cap', 'max(length, 64k)')}; each cell is `graph / graph20` in µs:",
        "",
    ]
    out += [f"- `{name}`: {text}." for name, text in methods.items()]
    out += ["", "`≠`: not the same set as `torch.topk` (see `values_match` in the JSON); `err`: the row's error."]
    if t38 := data.get("triton38_cubins"):
        versions, targets = ", ".join(t38.get("triton", [])), ", ".join(t38.get("targets", []))
        out += ["", f"`ours split, Triton 3.8`: the same launches as `ours split`, compiled by Triton {versions} "
                f"(production's) for {targets} on the build machine and launched here from their cubins "
                f"(`benchmarks/prod_cubins.py`); every other column is Triton {data['triton']}."]  # fmt: skip
    if "merged_from" in data:  # runs made path by path (one device call each) and joined by `benchmarks.topk --merge`
        shapes = data["shapes"].items()
        per_path = "; ".join(f"{p}: B {s['B']}, lengths {s['lengths']}, k {s['k']}" for p, s in shapes)
        out += ["", f"Measured path by path in one commit and joined ({per_path}); `-`: not measured in that path."]
    out.append("")
    cols = [c for c in COLUMNS if any((c[0], c[1]) == (r["provider"], r["path"]) for r in rows)]
    for k in sorted({r["k"] for r in rows if r.get("k")}):
        out += [f"**k = {k}**", "", "| B | length | " + " | ".join(c[2] for c in cols) + " |"]
        out.append("|---|---|" + "---|" * len(cols))
        for b, length in sorted({(r["B"], r["length"]) for r in rows if r.get("k") == k}):
            cells = [_cell(index.get((p, path, b, length, k))) for p, path, _ in cols]
            out.append(f"| {b} | {length} | " + " | ".join(cells) + " |")
        out.append("")
    logits = [r for r in rows if r["provider"] in LOGITS_COLUMNS]
    if logits:
        out += ["**Logits + top-k at length 4k** (`graph / graph20` µs; the logits alone beside them):", ""]
        paths = list(dict.fromkeys(r["path"] for r in logits))
        present = {(r["provider"], r["path"]) for r in logits}
        cols = [(p, path) for path in paths for p in LOGITS_COLUMNS if (p, path) in present]
        heads = [f"{p} ({path})" for p, path in cols]
        out += ["| B | k | " + " | ".join(heads) + " |", "|---|---|" + "---|" * len(heads)]
        for b, k in sorted({(r["B"], r["k"]) for r in logits if r.get("k")}):
            cells = [_cell(index.get((p, path, b, 4096, None if p == "sparsemla_logits" else k))) for p, path in cols]
            out.append(f"| {b} | {k} | " + " | ".join(cells) + " |")
        out.append("")
    out += ["**Targets** (issue #15 item 4; evaluated from the rows above per code path and method):", ""]
    out += [
        "| target | path | method | measured (µs) | provider | conditions | verdict |",
        "|---|---|---|---|---|---|---|",
    ]
    for v in data.get("target_results", []):
        conds = "; ".join(
            f"{c['what']}"
            + (f" ({fmt_us(c['ref_us'])})" if c.get("ref_us") is not None else "")
            + f": {MARK[c['pass']]}"
            for c in v["conditions"]
        )
        if v.get("exact") is False:
            conds += "; not exact"
        out.append(
            f"| {v['target']} | {v['path']} | {v['method']} | {fmt_us(v['measured_us'])} | {v['provider'] or '-'} | "
            f"{conds or v.get('why', '')} | {MARK[v['pass']]} |"
        )
    out += ["", _sglang_line(data)]
    return "\n".join(out) + "\n"


def _sglang_line(data: dict) -> str:
    sgl = data.get("sglang_jit", {})
    pub = data.get("sglang_published", {})
    figures = ", ".join(f"{v} µs at {k}" for k, v in pub.get("ranges_us", {}).items())
    built = [v for v in ("v1", "v2") if sgl.get(v, {}).get("built")]
    failed = {v: sgl[v]["error"] for v in ("v1", "v2") if "error" in sgl.get(v, {})}
    parts = ["**sglang's JIT top-k**:"]
    if built:
        times = ", ".join(f"{v} in {sgl[v].get('build_s')} s" for v in built)
        parts.append(
            f"built on the GPU machine ({times}; nvcc {sgl.get('nvcc')}, apache-tvm-ffi {sgl.get('tvm_ffi')})."
        )
    for v, err in failed.items():
        parts.append(f"{v} not built: `{err.splitlines()[0][:300]}` (nvcc {sgl.get('nvcc')}).")
    if failed:
        parts.append(_last_jit_run())
    if pub:
        parts.append(f"Published figures ({pub.get('source')}): `{pub.get('kernel')}`, k = {pub.get('k')}: {figures}.")
    return " ".join(parts)


def _last_jit_run(results: Path = Path("results/bench")) -> str:
    """Where a run without sglang's JIT top-k points: the newest committed run (results/bench and explore/) that timed
    it next to ours, with its v2 times at k = 2048, B = 64."""
    runs = []
    for f in results.rglob("topk*.json"):
        data = json.loads(f.read_text())
        if isinstance(data, dict) and data.get("sglang_jit", {}).get("v2", {}).get("built"):
            runs.append((data.get("date", ""), f, data))
    if not runs:
        return "No committed run has timed it."
    _, f, data = max(runs, key=lambda r: (r[0], str(r[1])))
    cells = sorted(
        (r["length"], r["us_graph20"])
        for r in data["rows"]
        if r.get("provider") == "sglang_jit_v2"
        and r.get("B") == 64
        and r.get("k") == 2048
        and r.get("path") == "native"
    )
    times = " / ".join(fmt_us(us) for _, us in cells)
    lengths = " / ".join(f"{n // 1024}k" for n, _ in cells)
    where = f"`{f}` (commit `{data.get('git_sha')}`"
    return (
        f"The newest run that timed it next to ours: {where}; v2, k = 2048, B = 64: {times} µs graph20 at {lengths})."
    )


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m benchmarks.report_topk results/bench/topk-<gpu>-<date>.json")
        return 2
    print(topk_section(json.loads(Path(argv[0]).read_text())))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
