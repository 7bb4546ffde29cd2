"""Render every panel of the committed dashboards to PNG from Prometheus, with matplotlib (no Grafana needed).

Each panel is evaluated as Grafana would (:mod:`sparsemla.dashboards.grafana_eval`: variables, ``$__rate_interval``,
repeats, legends) and drawn with the same title, unit and legend: timeseries as lines (stacked where the panel
stacks) with dashed threshold lines, stat as the last value over a sparkline, heatmap as bucket counts over time,
bar gauge as horizontal bars, pie chart as a donut, table as a table. Output: ``<out>/<NN>-<slug>.png`` plus
``index.json`` (panel, row, file, the exact queries sent, whether each returned data).

The ``sparsemla snapshot`` command (and ``make snapshot``) drives :func:`render_panels`. ("Snapshot" alone means the
exporter's kernel-share snapshot, :mod:`sparsemla.ops.exporter`; this module only renders.)
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from sparsemla.dashboards import build
from sparsemla.dashboards.grafana_eval import (
    PrometheusAPI,
    Resolved,
    TargetResult,
    expand_repeats,
    has_data,
    panel_series,
    resolve_variables,
)
from sparsemla.dashboards.panels import PanelRef, iter_panels

DPI = 100
GRID_PX = 60  # one Grafana grid column/row unit in pixels at our DPI (a 12-wide panel is 720 px)


@dataclass
class RenderedPanel:
    title: str
    row: str
    kind: str
    file: str
    queries: list[str]
    data: list[bool]  # per target: returned at least one finite sample


@dataclass
class RenderResult:
    out_dir: Path
    start: float
    end: float
    variables: dict[str, list[str]]
    panels: list[RenderedPanel]

    def empty_panels(self) -> list[str]:
        return [p.title for p in self.panels if not any(p.data)]


# -- units ----------------------------------------------------------------------------------------------------------


def format_value(value: float, unit: str | None) -> str:
    """A value as Grafana would print it for ``unit`` (close enough for a rendered panel)."""
    if value is None or not math.isfinite(value):
        return "–"
    unit = unit or "short"
    if unit.startswith("suffix:"):
        return f"{_short(value)}{unit[len('suffix:') :]}"
    if unit == "s":
        for scale, name in ((1, "s"), (1e-3, "ms"), (1e-6, "µs")):
            if abs(value) >= scale or scale == 1e-6:
                return f"{value / scale:.3g} {name}"
    if unit == "percentunit":
        return f"{value * 100:.3g}%"
    if unit == "percent":
        return f"{value:.3g}%"
    if unit == "reqps":
        return f"{_short(value)} req/s"
    if unit == "watt":
        return f"{_short(value)} W"
    if unit == "joule":
        return f"{_short(value)} J"
    return _short(value)


def _short(value: float) -> str:
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _threshold_color(panel: dict, value: float) -> str:
    steps = panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps", [])
    color = "green"
    for step in steps:
        if step.get("value") is None or (math.isfinite(value) and value >= step["value"]):
            color = step["color"]
    return {"green": "#2e9e44", "red": "#d62728", "orange": "#ff7f0e", "yellow": "#d4b000", "blue": "#1f77b4"}.get(
        color, color
    )


def _thresholds(panel: dict) -> list[tuple[float, str]]:
    steps = panel.get("fieldConfig", {}).get("defaults", {}).get("thresholds", {}).get("steps", [])
    return [(s["value"], s["color"]) for s in steps if s.get("value") is not None]


# -- drawing ---------------------------------------------------------------------------------------------------------


def _figure(panel: dict):  # noqa: ANN202 - (Figure, Axes)
    import matplotlib.pyplot as plt

    pos = panel.get("gridPos", {})
    width = max(4.0, pos.get("w", 12) * GRID_PX / DPI)
    height = max(3.0, pos.get("h", 8) * GRID_PX * 0.75 / DPI)
    fig, ax = plt.subplots(figsize=(width, height), dpi=DPI)
    return fig, ax


def _unit_formatter(unit: str | None):  # noqa: ANN202
    from matplotlib.ticker import FuncFormatter

    return FuncFormatter(lambda v, _pos: format_value(v, unit))


def _time_axis(ax) -> None:  # noqa: ANN001
    import matplotlib.dates as mdates

    ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S", tz=timezone.utc))
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlabel("time (UTC)", fontsize=7)


def _to_dt(ts: list[float]) -> list[datetime]:
    return [datetime.fromtimestamp(t, tz=timezone.utc) for t in ts]


def _draw_timeseries(ax, panel: dict, results: list[TargetResult], unit: str | None) -> None:  # noqa: ANN001
    stacked = panel.get("fieldConfig", {}).get("defaults", {}).get("custom", {}).get("stacking", {}).get("mode")
    series = [s for r in results for s in r.series]
    if stacked == "normal" and series:
        grid = sorted({t for s in series for t, _ in s.points})
        ys = [[dict(s.points).get(t, 0.0) for t in grid] for s in series]
        ys = [[v if math.isfinite(v) else 0.0 for v in row] for row in ys]
        ax.stackplot(_to_dt(grid), ys, labels=[s.legend for s in series], alpha=0.7)
    else:
        for s in series:
            ts, vs = zip(*s.points, strict=True) if s.points else ((), ())
            ax.plot(_to_dt(list(ts)), vs, label=s.legend, linewidth=1.2)
    for value, color in _thresholds(panel):
        ax.axhline(value, linestyle="--", linewidth=1, color=color, alpha=0.8)
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    if defaults.get("min") is not None:
        ax.set_ylim(bottom=defaults["min"])
    if defaults.get("max") is not None:
        ax.set_ylim(top=defaults["max"])
    ax.yaxis.set_major_formatter(_unit_formatter(unit))
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(alpha=0.3)
    _time_axis(ax)
    if series:
        ax.legend(fontsize=6, loc="upper left", ncol=max(1, min(4, len(series) // 6 + 1)), framealpha=0.6)


def _draw_stat(ax, panel: dict, results: list[TargetResult], unit: str | None) -> None:  # noqa: ANN001
    series = [s for r in results for s in r.series]
    ax.axis("off")
    if not series:
        ax.text(0.5, 0.5, "No data", ha="center", va="center", fontsize=14, color="grey", transform=ax.transAxes)
        return
    n = len(series)
    for i, s in enumerate(series):
        finite = [(t, v) for t, v in s.points if math.isfinite(v)]
        last = finite[-1][1] if finite else float("nan")
        x = (i + 0.5) / n
        ax.text(x, 0.55, format_value(last, unit), ha="center", va="center", fontsize=18 if n < 3 else 12,
                color=_threshold_color(panel, last), weight="bold", transform=ax.transAxes)  # fmt: skip
        if n > 1 or s.legend:
            ax.text(x, 0.22, s.legend, ha="center", va="center", fontsize=8, transform=ax.transAxes)
        if len(finite) > 1:
            inset = ax.inset_axes([i / n + 0.02, 0.0, 1 / n - 0.04, 0.15])
            inset.fill_between(range(len(finite)), [v for _, v in finite], alpha=0.4)
            inset.axis("off")


def _draw_heatmap(ax, panel: dict, results: list[TargetResult], unit: str | None) -> None:  # noqa: ANN001
    import numpy as np

    series = [s for r in results for s in r.series]
    buckets = sorted(series, key=lambda s: float(s.labels.get("le", "inf")))
    if not buckets:
        ax.text(0.5, 0.5, "No data", ha="center", va="center", transform=ax.transAxes)
        return
    grid = sorted({t for s in buckets for t, _ in s.points})
    cumulative = np.array([[dict(s.points).get(t, 0.0) for t in grid] for s in buckets])
    cumulative = np.nan_to_num(cumulative)
    counts = np.diff(np.vstack([np.zeros(len(grid)), cumulative]), axis=0).clip(min=0)  # de-cumulate like Grafana
    labels = [format_value(float(s.labels["le"]), unit) if s.labels.get("le") != "+Inf" else "+Inf" for s in buckets]
    step = grid[1] - grid[0] if len(grid) > 1 else 1.0
    x_edges = _to_dt([grid[0] - step, *grid])  # each point covers the interval that ends at its timestamp
    mesh = ax.pcolormesh(x_edges, np.arange(len(buckets) + 1), counts, cmap="Oranges", shading="flat")
    ax.set_yticks(np.arange(len(buckets)) + 0.5, labels, fontsize=6)
    ax.figure.colorbar(mesh, ax=ax, label="requests / interval")
    _time_axis(ax)


def _draw_bars(ax, panel: dict, results: list[TargetResult], unit: str | None) -> None:  # noqa: ANN001
    series = [s for r in results for s in r.series]
    values = [s.points[-1][1] if s.points else float("nan") for s in series]
    order = sorted(range(len(series)), key=lambda i: values[i] if math.isfinite(values[i]) else -math.inf)
    names = [series[i].legend for i in order]
    vals = [values[i] for i in order]
    ax.barh(names, vals, color=[_threshold_color(panel, v) for v in vals])
    for y, v in enumerate(vals):
        ax.text(v, y, " " + format_value(v, unit), va="center", fontsize=7)
    defaults = panel.get("fieldConfig", {}).get("defaults", {})
    hi = max([v for v in vals if math.isfinite(v)] or [1.0])
    ax.set_xlim(defaults.get("min", 0), defaults.get("max") or hi * 1.25)
    ax.xaxis.set_major_formatter(_unit_formatter(unit))
    ax.tick_params(labelsize=7)


def _draw_pie(ax, panel: dict, results: list[TargetResult], unit: str | None) -> None:  # noqa: ANN001
    series = [s for r in results for s in r.series if s.points and math.isfinite(s.points[-1][1])]
    vals = [max(0.0, s.points[-1][1]) for s in series]
    if not series or sum(vals) <= 0:
        ax.axis("off")
        ax.text(0.5, 0.5, "No data", ha="center", va="center", transform=ax.transAxes)
        return
    total = sum(vals)
    labels = [f"{s.legend} {v / total:.1%}" for s, v in zip(series, vals, strict=True)]
    wedges, _ = ax.pie(vals, wedgeprops={"width": 0.45})
    ax.legend(wedges, labels, fontsize=7, loc="center left", bbox_to_anchor=(1.0, 0.5))
    ax.set_aspect("equal")


def _draw_table(ax, panel: dict, results: list[TargetResult], unit: str | None) -> None:  # noqa: ANN001
    rename = {}
    for tr in panel.get("transformations", []):
        if tr.get("id") == "organize":
            rename = tr.get("options", {}).get("renameByName", {})
    label_cols = sorted({k for r in results for s in r.series for k in s.labels if k != "__name__"},
                        key=lambda k: (k != "kernel", k))  # fmt: skip
    rows: dict[tuple, dict[str, float]] = {}
    for r in results:
        for s in r.series:
            key = tuple(s.labels.get(k, "") for k in label_cols)
            rows.setdefault(key, {})[r.ref] = s.points[-1][1] if s.points else float("nan")
    value_cols = [r.ref for r in results]
    headers = label_cols + [rename.get(f"Value #{ref}", ref) for ref in value_cols]
    sort_col = next(iter(panel.get("options", {}).get("sortBy", [])), {}).get("displayName")
    keyed = list(rows.items())
    if sort_col in headers[len(label_cols) :]:
        ref = value_cols[headers.index(sort_col) - len(label_cols)]
        keyed.sort(key=lambda kv: kv[1].get(ref, -math.inf), reverse=True)
    cells = [[*key, *(format_value(vals.get(ref, float("nan")), unit) for ref in value_cols)] for key, vals in keyed]
    ax.axis("off")
    if not cells:
        ax.text(0.5, 0.5, "No data", ha="center", va="center", transform=ax.transAxes)
        return
    table = ax.table(cellText=cells[:40], colLabels=headers, loc="upper center", cellLoc="left")
    table.auto_set_font_size(False)
    table.set_fontsize(7)
    table.auto_set_column_width(list(range(len(headers))))


DRAW: dict[str, Callable] = {
    "timeseries": _draw_timeseries,
    "stat": _draw_stat,
    "heatmap": _draw_heatmap,
    "bargauge": _draw_bars,
    "piechart": _draw_pie,
    "table": _draw_table,
}


def render_panel(ref: PanelRef, results: list[TargetResult], path: Path, start: float, end: float) -> None:
    """Draw one evaluated panel over [start, end] (unix seconds) to ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = _figure(ref.panel)
    try:
        draw = DRAW.get(ref.kind)
        if draw is None:
            raise ValueError(f"panel {ref.title!r}: no renderer for type {ref.kind!r}")
        draw(ax, ref.panel, results, ref.unit)
        if ref.kind in ("timeseries", "heatmap"):
            ax.set_xlim(*_to_dt([start, end]))
        fig.suptitle(ref.title, fontsize=10, x=0.01, ha="left")
        if not any(has_data(r) for r in results):
            fig.text(0.99, 0.98, "no data", ha="right", va="top", color="grey", fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=DPI)
    finally:
        plt.close(fig)


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:60] or "panel"


def render_panels(
    prometheus_url: str,
    start: float,
    end: float,
    out_dir: Path,
    overrides: Mapping[str, str | list[str]] | None = None,
    dashboards: Mapping[str, dict] | None = None,
    progress: Callable[[str], None] | None = None,
    titles: Collection[str] | None = None,
) -> RenderResult:
    """Render every panel of ``dashboards`` (default: the committed ones) over [start, end] into ``out_dir``.

    ``overrides`` pin variables (e.g. ``{"variant_a": "baseline", "variant_b": "mma_decode"}``); ``titles`` renders
    only those panels (e.g. :data:`build.COMPARE_PANELS` for an A/B report). Raises PrometheusError when Prometheus
    fails, ValueError on an empty range or an unknown title."""
    if end <= start:
        raise ValueError(f"empty time range: from {start} is not before to {end}")
    dashboards = dict(dashboards or {name: build.load(name) for name in build.DASHBOARDS})
    if titles is not None:
        known = {ref.title for dash in dashboards.values() for ref in iter_panels(dash)}
        unknown = sorted(set(titles) - known)
        if unknown:
            raise ValueError(f"no panel titled {', '.join(map(repr, unknown))}")
    out_dir.mkdir(parents=True, exist_ok=True)
    api = PrometheusAPI(prometheus_url)
    rendered: list[RenderedPanel] = []
    resolved_all: dict[str, list[str]] = {}
    try:
        for dash in dashboards.values():
            resolved = resolve_variables(dash, api, start, end, overrides)
            resolved_all.update(resolved.selected)
            for ref in iter_panels(dash):
                if titles is not None and ref.title not in titles:
                    continue
                for panel_ref, extra in expand_repeats(ref, resolved):
                    rendered.append(_render_one(panel_ref, api, resolved, extra, start, end, out_dir, len(rendered)))
                    if progress:
                        progress(panel_ref.title)
    finally:
        api.close()
    result = RenderResult(out_dir, start, end, resolved_all, rendered)
    index = {"from": start, "to": end, "variables": resolved_all, "panels": [asdict(p) for p in rendered]}
    (out_dir / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    return result


def _render_one(
    ref: PanelRef, api: PrometheusAPI, resolved: Resolved, extra: dict[str, str], start: float, end: float,
    out_dir: Path, n: int,
) -> RenderedPanel:  # fmt: skip
    results = panel_series(ref, api, {**resolved.text, **extra}, start, end)
    path = out_dir / f"{n + 1:02d}-{_slug(ref.title)}.png"
    render_panel(ref, results, path, start, end)
    return RenderedPanel(
        ref.title, ref.row, ref.kind, path.name, [r.expr for r in results], [has_data(r) for r in results]
    )


def default_out_dir(results_dir: Path, now: datetime | None = None) -> Path:
    """``<results>/snapshots/<UTC time>/``."""
    now = now or datetime.now(tz=timezone.utc)
    return results_dir / "snapshots" / now.strftime("%Y%m%dT%H%M%SZ")
