"""A/B comparison of two load-test runs: per-concurrency table with 95 % CIs, plots, report.md + report.html.

A run is a directory of point summaries (a sweep, or a single `loadtest`). Per concurrency C and metric, the estimate
is the mean over repeats with a Student-t interval when the run has >= 2 repeats of C, else the within-run interval
stored in the point's summary (batch means for tok/s, bootstrap for latency percentiles, Wilson for goodput). B/A
ratios carry a propagated interval; a difference is called only when A's and B's intervals do not overlap, otherwise
the report says "no significant difference". A cell without a number says in words why the point measured none
(:mod:`sparsemla.loadtest.report_cells`), never a bare dash.

:func:`write_report` writes one A/B report; its pieces (:func:`body_md`, :func:`body_html`, :func:`html_page`) are
also what a campaign report (:mod:`sparsemla.loadtest.report_campaign`) embeds once per step.
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
from typing import TYPE_CHECKING, Any

from sparsemla.loadtest import stats
from sparsemla.loadtest.calibration_label import calibration_label, comparison_lines
from sparsemla.loadtest.report_cells import no_value_reason, not_compared, ratio_text
from sparsemla.loadtest.report_panels import PanelImage, PanelRenders, render_compare_panels
from sparsemla.loadtest.runner import results_root, validate_run_id
from sparsemla.loadtest.summary import write_json_atomic

if TYPE_CHECKING:
    from sparsemla.loadtest.kernel_shares import KernelComparison

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
    a_note: str = ""  # why A has no value (report_cells.no_value_reason); "" when it has one
    b_note: str = ""


def verdict(metric: Metric, a: stats.Estimate, b: stats.Estimate) -> tuple[str, bool]:
    """(text, significant): "no significant difference" when the intervals overlap, "not compared: ..." when a side
    has no value. A change is relative, except for shares (goodput), whose change is in percentage points (a share
    that was 0 % has no relative change)."""
    if not (math.isfinite(a.value) and math.isfinite(b.value)):
        return not_compared(a.value, b.value), False
    if not (a.has_interval and b.has_interval):
        return "no CI (single sample)", False
    if stats.overlaps(a, b):
        return NO_DIFFERENCE, False
    better = (b.value > a.value) == metric.higher_is_better
    if metric.unit == "share":
        change = f"{(b.value - a.value) * 100:+.1f} points"
    else:
        change = f"{(b.value / a.value - 1) * 100:+.1f} %" if a.value else "from 0"
    return f"B {'better' if better else 'worse'} ({change})", True


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
            notes = [no_value_reason(metric.key, run.points[c]) if not math.isfinite(e.value) else ""
                     for run, e in ((a, ea), (b, eb))]  # fmt: skip
            rows.append(Row(c, metric, ea, eb, stats.ratio(ea, eb), text, significant, *notes))
    return rows


def _fmt(value: float, unit: str) -> str:
    if not math.isfinite(value):
        return "–"
    if unit == "s":
        return f"{value * 1000:.1f} ms"
    if unit == "share":
        return f"{value * 100:.1f} %"
    return f"{value:.1f}"


def _fmt_est(est: stats.Estimate, unit: str, note: str = "") -> str:
    if not math.isfinite(est.value):
        return note or "none: no value"  # never a bare dash: the note says why (report_cells)
    text = _fmt(est.value, unit)
    if est.has_interval:
        text += f" [{_fmt(est.lo, unit)}, {_fmt(est.hi, unit)}]"
    return text


def _fmt_ratio(row: Row) -> str:
    est = row.ratio
    if not math.isfinite(est.value):
        return ratio_text(row.a.value, row.b.value) or "not computed"
    text = f"{est.value:.3f}"
    if est.has_interval:
        text += f" [{est.lo:.3f}, {est.hi:.3f}]"
    return text


def table_rows(rows: Sequence[Row]) -> list[list[str]]:
    """Rows as strings: C, metric, A, B, B/A, verdict."""
    return [
        [str(r.concurrency), r.metric.label, _fmt_est(r.a, r.metric.unit, r.a_note),
         _fmt_est(r.b, r.metric.unit, r.b_note), _fmt_ratio(r), r.verdict]
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


def _run_lines(side: str, run: Run) -> list[str]:
    flags = run.flags()
    distinct = {json.dumps(f, sort_keys=True) for f in flags}
    first = run.summaries[0]
    return [
        f"- **{side}**: `{run.name}` ({run.path}) — variant `{run.variant()}`, workload `{first.get('workload')}`, "
        f"api `{first.get('api')}`, points {sorted(run.points)}, repeats "
        f"{max(len(v) for v in run.points.values())}",
        f"  - server_flags: `{' | '.join(sorted(distinct)) or '{}'}`",
        *_calibration_lines(run),
    ]


def _calibration_lines(run: Run) -> list[str]:
    """The simulator's calibration of a run (``simulated: ... PROJECTED ...``), none for a real server (#16 item 3)."""
    label = calibration_label(run.summaries)
    return [f"  - calibration: **{label}**"] if label else []


def _comparison_md(a: Run, b: Run) -> list[str]:
    """vs sglang's fallback and vs sglang's fast path, from the calibration the simulator reported (none for a real
    server): one bullet each."""
    return [f"- {line}" for line in comparison_lines([*a.summaries, *b.summaries])]


def _calibration_html(run: Run) -> str:
    label = calibration_label(run.summaries)
    return f"; calibration <b>{html.escape(label)}</b>" if label else ""


def _no_data(image: PanelImage) -> str:
    """What a panel's caption adds when it has no data: DCGM panels are fed only by the GPU compose profile."""
    if image.has_data:
        return ""
    return " (no data: GPU profile only)" if image.profile == "gpu" else " (no data)"


def _panels_md(panels: PanelRenders | None, prefix: str = "", level: int = 2) -> list[str]:
    if panels is None:
        return []
    lines = ["#" * level + " Dashboard panels", ""]
    if panels.windows:
        pinned = ", ".join(f"{k}={v}" for k, v in panels.variables.items())
        lines += [
            f"Rendered from Prometheus ({panels.prometheus}) query_range with the dashboard's queries ({pinned}).",
            "",
        ]
    for window in panels.windows:
        lines += ["#" * (level + 1) + f" {window.caption}", ""]
        lines += [f"![{p.title}]({prefix}{p.file}){_no_data(p)}" for p in window.panels]
        lines.append("")
    if panels.error:
        lines += [f"**Not embedded:** {panels.error}.", ""]
    return lines


def _panels_html(panels: PanelRenders | None, prefix: str = "", level: int = 2) -> str:
    if panels is None:
        return ""
    parts = [f"<h{level}>Dashboard panels</h{level}>"]
    if panels.windows:
        pinned = ", ".join(f"{k}={v}" for k, v in panels.variables.items())
        parts.append(
            f"<p>Rendered from Prometheus (<code>{html.escape(panels.prometheus)}</code>) query_range with the "
            f"dashboard's queries ({html.escape(pinned)}).</p>"
        )
    for window in panels.windows:
        parts.append(f"<h{level + 1}>{html.escape(window.caption)}</h{level + 1}>")
        parts += [
            f'<figure><img src="{html.escape(prefix + p.file)}" alt="{html.escape(p.title)}"><figcaption>'
            f"{html.escape(p.title)}{_no_data(p)}</figcaption></figure>"
            for p in window.panels
        ]
    if panels.error:
        parts.append(f"<p class='worse'><b>Not embedded:</b> {html.escape(panels.error)}.</p>")
    return "\n".join(parts)


CI_NOTE = (
    "Intervals are 95 % CIs: over repeats (Student t) when a point has >= 2 repeats, else within the run "
    "(batch means for tok/s, bootstrap for percentiles, Wilson for goodput). A difference is called only when the "
    f'intervals do not overlap; otherwise "{NO_DIFFERENCE}". A cell without a number says why the point measured '
    "none (e.g. no request sent in the window finished in it)."
)


def failure_marks(a: Run, b: Run) -> list[str]:
    """The points of A and B with more than 1 % failed requests, one line each."""
    return [f"A {m}" for m in _marked(a)] + [f"B {m}" for m in _marked(b)]


def body_md(
    a: Run,
    b: Run,
    rows: Sequence[Row],
    pngs: Sequence[Path],
    panels: PanelRenders | None,
    kernels: KernelComparison | None = None,
    *,
    prefix: str = "",
    level: int = 2,
    references: bool = True,
) -> list[str]:
    """The report below its title, in markdown: runs, what flags off and sglang's fast path are on the simulator's
    calibration (``references``; a campaign report says it once above its steps), failed-run marks, the table, plots,
    kernel shares, dashboard panels. ``prefix`` goes before every file link (a campaign report embeds a step's report
    from the step's folder) and ``level`` is the heading level of its sections."""
    marks = failure_marks(a, b)
    md = [*_run_lines("A", a), *_run_lines("B", b), ""]
    compared = _comparison_md(a, b) if references else []
    md += [*compared, ""] if compared else []
    if marks:
        md += ["**Runs with more than 1 % failed requests:**", "", *[f"- {m}" for m in marks], ""]
    md += ["| " + " | ".join(HEADERS) + " |", "|" + "---|" * len(HEADERS)]
    md += ["| " + " | ".join(cells) + " |" for cells in table_rows(rows)]
    md += ["", CI_NOTE, "", *[f"![{p.stem}]({prefix}{p.name})" for p in pngs], ""]
    if kernels is not None:
        md += kernels.markdown(level)
    return md + _panels_md(panels, prefix, level)


def _cell(text: str, header: bool = False) -> str:
    tag = "th" if header else "td"
    cls = ""
    if text.startswith("B better"):
        cls = ' class="better"'
    elif text.startswith("B worse"):
        cls = ' class="worse"'
    return f"<{tag}{cls}>{html.escape(text)}</{tag}>"


def body_html(
    a: Run,
    b: Run,
    rows: Sequence[Row],
    pngs: Sequence[Path],
    panels: PanelRenders | None,
    kernels: KernelComparison | None = None,
    *,
    prefix: str = "",
    level: int = 2,
    references: bool = True,
) -> str:
    """:func:`body_md` as HTML."""
    marks = failure_marks(a, b)
    lines = comparison_lines([*a.summaries, *b.summaries]) if references else []
    compared = f"<ul>{''.join(f'<li>{html.escape(line)}</li>' for line in lines)}</ul>" if lines else ""
    runs_html = "".join(
        f"<li><b>{side}</b>: <code>{html.escape(run.name)}</code> — variant <code>{html.escape(run.variant())}</code>, "
        f"points {sorted(run.points)}, server_flags <code>{html.escape(json.dumps(run.flags()[0], sort_keys=True))}"
        f"</code>{_calibration_html(run)}</li>"
        for side, run in (("A", a), ("B", b))
    )
    marks_html = "".join(f"<li class='worse'>{html.escape(m)}</li>" for m in marks)
    failed = f"<h{level + 1}>Runs with more than 1 % failed requests</h{level + 1}><ul>{marks_html}</ul>"
    return f"""<ul>{runs_html}</ul>
{compared}
{failed if marks else ""}
<table><tr>{"".join(_cell(h, True) for h in HEADERS)}</tr>
{"".join("<tr>" + "".join(_cell(c) for c in cells) + "</tr>" for cells in table_rows(rows))}</table>
<p>{html.escape(CI_NOTE)}</p>
{"".join(f'<div><img src="{html.escape(prefix + p.name)}" alt="{p.stem}"></div>' for p in pngs)}
{kernels.html(level) if kernels is not None else ""}
{_panels_html(panels, prefix, level)}"""


def html_page(title: str, body: str) -> str:
    """A whole report page around ``body`` (its title as ``<h1>``)."""
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em;max-width:1100px}}table{{border-collapse:collapse;margin:8px 0}}
td,th{{border:1px solid #ccc;padding:4px 8px;font-size:13px}}th{{background:#f3f3f3}}
.better{{background:#e5f6e5}}.worse{{background:#fbe3e3}}img{{max-width:100%;margin:8px 0}}
figure{{margin:0 0 12px 0}}figcaption{{font-size:12px;color:#555}}</style></head>
<body><h1>{html.escape(title)}</h1>
{body}
</body></html>
"""


def write_report(
    a: Run,
    b: Run,
    rows: Sequence[Row],
    out_dir: Path,
    title: str = "A/B comparison",
    prometheus: str | None = None,
    kernels: KernelComparison | None = None,
    panels_until: float | None = None,
) -> dict[str, Path]:
    """report.md, report.html, compare.json and the PNGs in ``out_dir``; returns their paths.

    With ``prometheus`` (base URL) the dashboard's compare panels over the runs' time (and up to ``panels_until``,
    e.g. the time of a kernel-share snapshot taken after the runs) are rendered into ``out_dir/panels/`` and embedded
    (:mod:`sparsemla.loadtest.report_panels`); when it cannot be reached the report says so and everything else is
    written as usual. ``kernels`` adds the two sides' kernel shares (:mod:`sparsemla.loadtest.kernel_shares`)."""
    from sparsemla.loadtest.report_plots import plot

    out_dir.mkdir(parents=True, exist_ok=True)
    pngs = plot(a, b, out_dir)
    panels = render_compare_panels(a, b, out_dir, prometheus, until=panels_until) if prometheus else None
    md = [f"# {title}", "", *body_md(a, b, rows, pngs, panels, kernels)]
    (out_dir / "report.md").write_text("\n".join(md))
    (out_dir / "report.html").write_text(html_page(title, body_html(a, b, rows, pngs, panels, kernels)))
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
                    "cells": cells,
                }
                for r, cells in zip(rows, table_rows(rows), strict=True)
            ],
            "failures_marked": failure_marks(a, b),
            "panels": panels.to_json() if panels is not None else None,
            "kernels": kernels.to_json() if kernels is not None else None,
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
