"""A/B comparison of two load-test runs: per-concurrency table with 95 % CIs, plots, report.md + report.html.

A run is a directory of point summaries (a sweep, or a single `loadtest`). Per concurrency C and metric, the estimate
is the mean over repeats with a Student-t interval when the run has >= 2 repeats of C, else the within-run interval
stored in the point's summary (batch means for tok/s, bootstrap for latency percentiles, Wilson for goodput). B/A
ratios carry a propagated interval; a difference is called only when A's and B's intervals do not overlap, otherwise
the report says "no significant difference".
"""

from __future__ import annotations

import html
import json
import math
import re
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparsemla.loadtest import stats
from sparsemla.loadtest.report_panels import PanelRenders, render_compare_panels
from sparsemla.loadtest.runner import results_root, validate_run_id
from sparsemla.loadtest.summary import write_json_atomic

NO_DIFFERENCE = "no significant difference"


class ReportError(RuntimeError):
    """The runs cannot be compared (missing, empty, or incompatible); the message says why."""


@dataclass(frozen=True)
class Metric:
    key: str
    label: str
    unit: str
    higher_is_better: bool
    get: Callable[[dict[str, Any]], float | None]


def _nested(*keys: str) -> Callable[[dict[str, Any]], float | None]:
    def get(summary: dict[str, Any]) -> float | None:
        value: Any = summary
        for key in keys:
            if not isinstance(value, dict):
                return None
            value = value.get(key)
        return float(value) if isinstance(value, (int, float)) and math.isfinite(value) else None

    return get


METRICS = (
    Metric("output_tok_per_s", "Output tok/s", "tok/s", True, _nested("output_tok_per_s")),
    Metric("ttft_p50", "TTFT p50", "s", False, _nested("ttft_s", "p50")),
    Metric("ttft_p99", "TTFT p99", "s", False, _nested("ttft_s", "p99")),
    Metric("itl_p50", "ITL p50", "s", False, _nested("itl_s", "p50")),
    Metric("itl_p99", "ITL p99", "s", False, _nested("itl_s", "p99")),
    Metric("goodput", "Goodput", "share", True, _nested("goodput", "share")),
)


@dataclass
class Run:
    """One side of the comparison: its name, directory and point summaries grouped by concurrency."""

    name: str
    path: Path
    points: dict[int, list[dict[str, Any]]]

    @property
    def summaries(self) -> list[dict[str, Any]]:
        return [s for group in self.points.values() for s in group]

    def flags(self) -> list[dict[str, str]]:
        return [s.get("server_flags") or {} for s in self.summaries]

    def variant(self) -> str:
        names = sorted({s.get("variant") or "unknown" for s in self.summaries})
        return ",".join(names)

    def span(self) -> tuple[float, float]:
        starts = [s.get("test_start") or s["window"]["start"] for s in self.summaries]
        ends = [s["window"]["end"] for s in self.summaries]
        return min(starts), max(ends)


def resolve_run(name: str | Path) -> Path:
    """A run given by path (an existing directory) or by run id (a plain name, under
    ``$SPARSEMLA_RESULTS_DIR/loadtest``): a run id is never taken as a path (``..`` or ``a/../..`` is refused)."""
    path = Path(name)
    if path.is_dir():
        return path
    try:
        run_id = validate_run_id(str(name))
    except ValueError as exc:
        raise ReportError(f"run {name!r} is neither an existing run directory nor a run id: {exc}") from None
    candidate = results_root() / run_id
    if candidate.is_dir():
        return candidate
    raise ReportError(f"run {name!r} not found (neither a directory nor {candidate})")


def run_label(name: str | Path, path: Path) -> str:
    """A run's name in reports and report directory names: its run id, or the name of the directory given (one safe
    path component: characters outside ``[A-Za-z0-9._-]`` become ``_``)."""
    label = str(name) if not Path(name).is_dir() else path.resolve().name
    label = re.sub(r"[^A-Za-z0-9._-]", "_", label).lstrip(".-") or "run"
    return label


def load_run(name: str | Path) -> Run:
    """Load every ``summary.json`` under the run directory."""
    path = resolve_run(name)
    points: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for file in sorted(path.rglob("summary.json")):
        try:
            summary = json.loads(file.read_text())
        except (OSError, ValueError) as exc:
            raise ReportError(f"{file} is not readable JSON: {exc}") from None
        if "concurrency" not in summary:
            raise ReportError(f"{file} is not a load-test summary (no concurrency field)")
        points[int(summary["concurrency"])].append(summary)
    if not points:
        raise ReportError(f"run {path} holds no finished point (no summary.json)")
    return Run(run_label(name, path), path, dict(points))


def estimate(summaries: Sequence[dict[str, Any]], metric: Metric) -> stats.Estimate:
    """The metric at one concurrency point: repeat mean + t-CI, or the single run's stored CI."""
    values = [v for v in (metric.get(s) for s in summaries) if v is not None]
    if len(values) >= 2:
        return stats.t_interval(values)
    if len(values) == 1:
        ci = (summaries[0].get("ci95") or {}).get(metric.key) or {}
        lo, hi = ci.get("lo"), ci.get("hi")
        if isinstance(lo, (int, float)) and isinstance(hi, (int, float)) and math.isfinite(lo) and math.isfinite(hi):
            return stats.Estimate(values[0], float(lo), float(hi), 1, str(ci.get("method", "within-run")))
        return stats.Estimate(values[0], math.nan, math.nan, 1, "none")
    return stats.Estimate(math.nan, math.nan, math.nan, 0, "none")


@dataclass
class Row:
    concurrency: int
    metric: Metric
    a: stats.Estimate
    b: stats.Estimate
    ratio: stats.Estimate
    verdict: str
    significant: bool


def verdict(metric: Metric, a: stats.Estimate, b: stats.Estimate) -> tuple[str, bool]:
    """(text, significant): "no significant difference" when the intervals overlap or one is missing."""
    if not (math.isfinite(a.value) and math.isfinite(b.value)):
        return "missing", False
    if not (a.has_interval and b.has_interval):
        return "no CI (single sample)", False
    if stats.overlaps(a, b):
        return NO_DIFFERENCE, False
    better = (b.value > a.value) == metric.higher_is_better
    change = (b.value / a.value - 1) * 100 if a.value else math.inf
    return f"B {'better' if better else 'worse'} ({change:+.1f} %)", True


def compare_runs(a: Run, b: Run) -> list[Row]:
    """Rows for every concurrency both runs measured."""
    common = sorted(set(a.points) & set(b.points))
    if not common:
        raise ReportError(
            f"runs share no concurrency: A has {sorted(a.points)}, B has {sorted(b.points)}; rerun one of them"
        )
    rows = []
    for c in common:
        for metric in METRICS:
            ea, eb = estimate(a.points[c], metric), estimate(b.points[c], metric)
            text, significant = verdict(metric, ea, eb)
            rows.append(Row(c, metric, ea, eb, stats.ratio(ea, eb), text, significant))
    return rows


def _fmt(value: float, unit: str) -> str:
    if not math.isfinite(value):
        return "–"
    if unit == "s":
        return f"{value * 1000:.1f} ms"
    if unit == "share":
        return f"{value * 100:.1f} %"
    return f"{value:.1f}"


def _fmt_est(est: stats.Estimate, unit: str) -> str:
    text = _fmt(est.value, unit)
    if est.has_interval:
        text += f" [{_fmt(est.lo, unit)}, {_fmt(est.hi, unit)}]"
    return text


def _fmt_ratio(est: stats.Estimate) -> str:
    if not math.isfinite(est.value):
        return "–"
    text = f"{est.value:.3f}"
    if est.has_interval:
        text += f" [{est.lo:.3f}, {est.hi:.3f}]"
    return text


def table_rows(rows: Sequence[Row]) -> list[list[str]]:
    """Rows as strings: C, metric, A, B, B/A, verdict."""
    return [
        [str(r.concurrency), r.metric.label, _fmt_est(r.a, r.metric.unit), _fmt_est(r.b, r.metric.unit),
         _fmt_ratio(r.ratio), r.verdict]
        for r in rows
    ]  # fmt: skip


HEADERS = ["C", "metric", "A (95 % CI)", "B (95 % CI)", "B/A", "verdict"]


def _marked(run: Run) -> list[str]:
    return [
        f"C={s['concurrency']} {s.get('sweep_point', '')}: {s.get('failure_rate', 0) * 100:.1f} % failed "
        f"({json.dumps(s.get('failures', {}))})"
        for s in run.summaries
        if s.get("failures_marked")
    ]


def plot(a: Run, b: Run, out_dir: Path) -> list[Path]:
    """tok/s vs C, latency vs C, tok/s per user vs tok/s (PNG files, returned)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    files = []
    runs = (("A", a, "tab:blue"), ("B", b, "tab:orange"))

    def series(run: Run, metric: Metric) -> tuple[list[int], list[float], list[list[float]]]:
        cs, vals, errs = [], [], [[], []]
        for c in sorted(run.points):
            est = estimate(run.points[c], metric)
            if not math.isfinite(est.value):
                continue
            cs.append(c)
            vals.append(est.value)
            # matplotlib refuses negative error bars; an interval that misses its point shows as zero on that side
            errs[0].append(max(0.0, est.value - est.lo) if est.has_interval else 0.0)
            errs[1].append(max(0.0, est.hi - est.value) if est.has_interval else 0.0)
        return cs, vals, errs

    def finish_axes(ax: Any, xlabel: str, ylabel: str, title: str, legend_size: int, log_c: bool = True) -> None:
        if log_c:  # concurrency points are powers of two
            ax.set_xscale("log", base=2)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=legend_size)

    def save(fig: Any, name: str) -> None:
        fig.tight_layout()
        files.append(out_dir / name)
        fig.savefig(files[-1], dpi=110)
        plt.close(fig)

    tok = METRICS[0]
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for side, run, color in runs:
        cs, vals, errs = series(run, tok)
        ax.errorbar(cs, vals, yerr=errs, marker="o", capsize=3, color=color, label=f"{side}: {run.name}")
    finish_axes(ax, "concurrency (users)", "output tok/s", "Throughput vs concurrency (95 % CI)", 8)
    save(fig, "throughput_vs_concurrency.png")

    fig, axes = plt.subplots(1, 2, figsize=(10, 4.2))
    for ax, (p50, p99, title) in zip(
        axes, ((METRICS[1], METRICS[2], "TTFT"), (METRICS[3], METRICS[4], "ITL")), strict=True
    ):
        for side, run, color in runs:
            for metric, style in ((p50, "-"), (p99, "--")):
                cs, vals, errs = series(run, metric)
                ax.errorbar(
                    cs, [v * 1000 for v in vals], yerr=[[e * 1000 for e in errs[0]], [e * 1000 for e in errs[1]]],
                    marker="o", linestyle=style, capsize=3, color=color, label=f"{side} {metric.label}",
                )  # fmt: skip
        finish_axes(ax, "concurrency (users)", "ms", f"{title} vs concurrency", 7)
    save(fig, "latency_vs_concurrency.png")

    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for side, run, color in runs:
        cs, vals, _ = series(run, tok)
        per_user = [v / c for v, c in zip(vals, cs, strict=True)]
        ax.plot(vals, per_user, marker="o", color=color, label=f"{side}: {run.name}")
        for c, x, y in zip(cs, vals, per_user, strict=True):
            ax.annotate(f"C={c}", (x, y), fontsize=7, textcoords="offset points", xytext=(4, 4))
    finish_axes(
        ax, "output tok/s (total)", "output tok/s per user", "Per-user speed vs total throughput", 8, log_c=False
    )
    save(fig, "per_user_vs_throughput.png")
    return files


def _run_lines(side: str, run: Run) -> list[str]:
    flags = run.flags()
    distinct = {json.dumps(f, sort_keys=True) for f in flags}
    first = run.summaries[0]
    return [
        f"- **{side}**: `{run.name}` ({run.path}) — variant `{run.variant()}`, workload `{first.get('workload')}`, "
        f"api `{first.get('api')}`, points {sorted(run.points)}, repeats "
        f"{max(len(v) for v in run.points.values())}",
        f"  - server_flags: `{' | '.join(sorted(distinct)) or '{}'}`",
    ]


def _panels_md(panels: PanelRenders | None) -> list[str]:
    if panels is None:
        return []
    lines = ["## Dashboard panels", ""]
    if panels.windows:
        pinned = ", ".join(f"{k}={v}" for k, v in panels.variables.items())
        lines += [
            f"Rendered from Prometheus ({panels.prometheus}) query_range with the dashboard's queries ({pinned}).",
            "",
        ]
    for window in panels.windows:
        lines += [f"### {window.caption}", ""]
        lines += [f"![{p.title}]({p.file})" + ("" if p.has_data else " (no data)") for p in window.panels]
        lines.append("")
    if panels.error:
        lines += [f"**Not embedded:** {panels.error}.", ""]
    return lines


def _panels_html(panels: PanelRenders | None) -> str:
    if panels is None:
        return ""
    parts = ["<h2>Dashboard panels</h2>"]
    if panels.windows:
        pinned = ", ".join(f"{k}={v}" for k, v in panels.variables.items())
        parts.append(
            f"<p>Rendered from Prometheus (<code>{html.escape(panels.prometheus)}</code>) query_range with the "
            f"dashboard's queries ({html.escape(pinned)}).</p>"
        )
    for window in panels.windows:
        parts.append(f"<h3>{html.escape(window.caption)}</h3>")
        parts += [
            f'<figure><img src="{html.escape(p.file)}" alt="{html.escape(p.title)}"><figcaption>'
            f"{html.escape(p.title)}{'' if p.has_data else ' (no data)'}</figcaption></figure>"
            for p in window.panels
        ]
    if panels.error:
        parts.append(f"<p class='worse'><b>Not embedded:</b> {html.escape(panels.error)}.</p>")
    return "\n".join(parts)


def write_report(
    a: Run,
    b: Run,
    rows: Sequence[Row],
    out_dir: Path,
    title: str = "A/B comparison",
    prometheus: str | None = None,
) -> dict[str, Path]:
    """report.md, report.html, compare.json and the PNGs in ``out_dir``; returns their paths.

    With ``prometheus`` (base URL) the dashboard's compare panels over the runs' time are rendered into
    ``out_dir/panels/`` and embedded (:mod:`sparsemla.loadtest.report_panels`); when it cannot be reached the report
    says so and everything else is written as usual."""
    out_dir.mkdir(parents=True, exist_ok=True)
    pngs = plot(a, b, out_dir)
    panels = render_compare_panels(a, b, out_dir, prometheus) if prometheus else None
    body = table_rows(rows)
    marks = [f"A {m}" for m in _marked(a)] + [f"B {m}" for m in _marked(b)]
    md = [f"# {title}", "", *_run_lines("A", a), *_run_lines("B", b), ""]
    if marks:
        md += ["**Runs with more than 1 % failed requests:**", "", *[f"- {m}" for m in marks], ""]
    md += ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    md += ["| " + " | ".join(cells) + " |" for cells in body]
    md += [
        "",
        "Intervals are 95 % CIs: over repeats (Student t) when a point has >= 2 repeats, else within the run "
        "(batch means for tok/s, bootstrap for percentiles, Wilson for goodput). A difference is called only when the "
        f'intervals do not overlap; otherwise "{NO_DIFFERENCE}".',
        "",
        *[f"![{p.stem}]({p.name})" for p in pngs],
        "",
        *_panels_md(panels),
    ]
    (out_dir / "report.md").write_text("\n".join(md))

    def cell(text: str, header: bool = False) -> str:
        tag = "th" if header else "td"
        cls = ""
        if text.startswith("B better"):
            cls = ' class="better"'
        elif text.startswith("B worse"):
            cls = ' class="worse"'
        return f"<{tag}{cls}>{html.escape(text)}</{tag}>"

    runs_html = "".join(
        f"<li><b>{side}</b>: <code>{html.escape(run.name)}</code> — variant <code>{html.escape(run.variant())}</code>, "
        f"points {sorted(run.points)}, server_flags <code>{html.escape(json.dumps(run.flags()[0], sort_keys=True))}"
        "</code></li>"
        for side, run in (("A", a), ("B", b))
    )
    marks_html = "".join(f"<li class='worse'>{html.escape(m)}</li>" for m in marks)
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 8px;font-size:13px}}th{{background:#f3f3f3}}
.better{{background:#e5f6e5}}.worse{{background:#fbe3e3}}img{{max-width:100%;margin:8px 0}}
figure{{margin:0 0 12px 0}}figcaption{{font-size:12px;color:#555}}</style></head>
<body><h1>{html.escape(title)}</h1><ul>{runs_html}</ul>
{"<h3>Runs with more than 1 % failed requests</h3><ul>" + marks_html + "</ul>" if marks else ""}
<table><tr>{"".join(cell(h, True) for h in HEADERS)}</tr>
{"".join("<tr>" + "".join(cell(c) for c in cells) + "</tr>" for cells in body)}</table>
<p>95 % CIs over repeats (Student t) or within a run (batch means / bootstrap / Wilson). A difference is called only
when the intervals do not overlap; otherwise: "{NO_DIFFERENCE}".</p>
{"".join(f'<div><img src="{p.name}" alt="{p.stem}"></div>' for p in pngs)}
{_panels_html(panels)}
</body></html>
"""
    (out_dir / "report.html").write_text(page)
    write_json_atomic(
        out_dir / "compare.json",
        {
            "a": {"name": a.name, "path": str(a.path), "variant": a.variant()},
            "b": {"name": b.name, "path": str(b.path), "variant": b.variant()},
            "rows": [
                {
                    "concurrency": r.concurrency,
                    "metric": r.metric.key,
                    "a": r.a.to_json(),
                    "b": r.b.to_json(),
                    "ratio": r.ratio.to_json(),
                    "verdict": r.verdict,
                    "significant": r.significant,
                }
                for r in rows
            ],
            "failures_marked": marks,
            "panels": panels.to_json() if panels is not None else None,
        },
    )
    return {"md": out_dir / "report.md", "html": out_dir / "report.html", **{p.stem: p for p in pngs}}


def flag_values(run: Run, flag: str) -> set[str]:
    """The values the run's servers reported for ``flag`` (label = lower-case flag name; "<absent>" when missing)."""
    key = flag.lower()
    return {f.get(key, "<absent>") for f in run.flags()}


def check_flag_flipped(a: Run, b: Run, flag: str) -> None:
    """Raise ReportError unless A and B each ran with one value of ``flag`` and the values differ."""
    va, vb = flag_values(a, flag), flag_values(b, flag)
    if "<absent>" in va or "<absent>" in vb:
        raise ReportError(
            f"cannot tell whether {flag} was flipped: the target's /metrics has no sparsemla_kernel_flags_info label "
            f"{flag.lower()!r} (A: {sorted(va)}, B: {sorted(vb)})"
        )
    if len(va) != 1 or len(vb) != 1:
        raise ReportError(f"{flag} changed inside a run (A: {sorted(va)}, B: {sorted(vb)}); rerun")
    if va == vb:
        raise ReportError(
            f"A and B both ran with {flag}={next(iter(va))} (server_flags), so there is nothing to compare; "
            "the restart did not apply the flag"
        )
