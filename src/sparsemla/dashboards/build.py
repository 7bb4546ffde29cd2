"""The "sparsemla / Serving" Grafana dashboard as code (grafana-foundation-sdk==0.0.21), written to ``generated/``.

Panels are declared as small :class:`Panel` specs (title, description, unit, PromQL targets), then turned into
foundation-sdk builders; the committed JSON under ``dashboards/generated/`` is what Grafana provisions
(``ops/grafana/provisioning``), what ``sparsemla snapshot`` renders and what the tests execute against Prometheus.
``sparsemla dashboards`` regenerates it; ``sparsemla dashboards --check`` fails when it is stale.

Rows: KPIs · latency · throughput (+ B/A ratio) · engine step · kernel share · saturation · load generator · GPU.
Panels that need the ``gpu`` compose profile (DCGM) have ``profile="gpu"``; only they may be empty without a GPU.

This module assembles the dashboard and writes / checks / loads the committed JSON. The pieces: the spec and shared
constants (:mod:`~sparsemla.dashboards.spec`), the rows (:mod:`~sparsemla.dashboards.rows_serving`: KPIs, latency,
throughput; :mod:`~sparsemla.dashboards.rows_engine`: engine step, kernel share, saturation;
:mod:`~sparsemla.dashboards.rows_exporters`: load generator, GPU), spec -> foundation-sdk panels
(:mod:`~sparsemla.dashboards.builders`) and the variables and annotations (:mod:`~sparsemla.dashboards.templating`).
"""

from __future__ import annotations

import json
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as db
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

from sparsemla.dashboards import builders, templating
from sparsemla.dashboards.rows_engine import engine_step_row, kernel_share_row, saturation_row
from sparsemla.dashboards.rows_exporters import gpu_row, loadgen_row
from sparsemla.dashboards.rows_serving import kpi_row, latency_row, throughput_row
from sparsemla.dashboards.spec import (
    DATASOURCE_UID,
    TPOT_SLO_CHOICES,
    TPOT_SLO_DEFAULT,
    TTFT_SLO_CHOICES,
    TTFT_SLO_DEFAULT,
    Panel,
    Row,
    Target,
)
from sparsemla.dashboards.templating import ANNOTATION_TAGS

GENERATED_DIR = Path(__file__).resolve().parent / "generated"

ROWS = (kpi_row, latency_row, throughput_row, engine_step_row, kernel_share_row, saturation_row, loadgen_row, gpu_row)


def serving_spec() -> list[Row]:
    """The rows and panel specs of the serving dashboard (what the tests iterate over)."""
    return [make() for make in ROWS]


def serving_dashboard() -> dict:
    """The "sparsemla / Serving" dashboard as Grafana JSON (a dict)."""
    dash = (
        db.Dashboard("sparsemla / Serving")
        .uid("sparsemla-serving")
        .description("sglang + sparsemla kernels: throughput, latency, per-step time, kernel share and A/B by variant.")
        .tags(["sparsemla", "sglang", "llm-serving"])
        .readonly()
        .tooltip(dm.DashboardCursorSync.CROSSHAIR)
        .time("now-30m", "now")
        .refresh("10s")
        .timezone("browser")
        .variables(templating.variables())
        .annotations(templating.annotations())
    )
    panel_id = 1
    for row in serving_spec():
        dash = dash.with_row(db.Row(row.title).id(panel_id))
        panel_id += 1
        for p in row.panels:
            dash = dash.with_panel(builders.panel(p, panel_id))
            panel_id += 1
    return _layout(json.loads(JSONEncoder(sort_keys=True).encode(dash.build())))


def _layout(dashboard: dict) -> dict:
    """Place panels left to right, wrapping at Grafana's 24 columns; a row header starts a new line.

    (The sdk's own placement lets a wide panel overflow the grid after a short one.)"""
    x = y = line_h = 0
    for panel in dashboard["panels"]:
        pos = panel["gridPos"]
        if panel["type"] == "row" or x + pos["w"] > 24:
            x, y, line_h = 0, y + line_h, 0
        pos["x"], pos["y"] = x, y
        x += pos["w"]
        line_h = max(line_h, pos["h"])
        if panel["type"] == "row":
            x, y, line_h = 0, y + pos["h"], 0
    return dashboard


DASHBOARDS = {"sparsemla-serving.json": serving_dashboard}
# The panels an A/B report (`make compare`) embeds: render them with variant_a/variant_b pinned to the two runs'.
COMPARE_PANELS = (
    "Token throughput by variant",
    "B/A output tok/s",
    "B/A client tok/s by concurrency",
    "Inter-token latency",
    "Time to first token",
    "Decode step latency by batch bucket",
    "Kernel share A − B",
    "Top kernels by GPU time",
)


def render(builder) -> str:  # noqa: ANN001
    """The committed text of one dashboard: stable key order, 2-space indent, trailing newline."""
    return json.dumps(builder(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def write_all(out_dir: Path = GENERATED_DIR) -> list[Path]:
    """Regenerate every dashboard JSON into ``out_dir``; returns the paths written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, builder in DASHBOARDS.items():
        path = out_dir / name
        path.write_text(render(builder))
        written.append(path)
    return written


def stale(out_dir: Path = GENERATED_DIR) -> list[str]:
    """Names of committed dashboards that differ from what the code generates (or are missing, or unexpected)."""
    problems = [
        name
        for name, builder in DASHBOARDS.items()
        if not (out_dir / name).is_file() or (out_dir / name).read_text() != render(builder)
    ]
    extra = sorted(p.name for p in out_dir.glob("*.json") if p.name not in DASHBOARDS) if out_dir.is_dir() else []
    return problems + extra


def load(name: str = "sparsemla-serving.json", out_dir: Path = GENERATED_DIR) -> dict:
    """A committed dashboard JSON as a dict."""
    return json.loads((out_dir / name).read_text())


if __name__ == "__main__":
    for written in write_all():
        print(written)


# What other modules and the tests read from here (spec constants live in spec.py, annotations in templating.py).
__all__ = [
    "ANNOTATION_TAGS",
    "COMPARE_PANELS",
    "DASHBOARDS",
    "DATASOURCE_UID",
    "GENERATED_DIR",
    "ROWS",
    "TPOT_SLO_CHOICES",
    "TPOT_SLO_DEFAULT",
    "TTFT_SLO_CHOICES",
    "TTFT_SLO_DEFAULT",
    "Panel",
    "Row",
    "Target",
    "load",
    "render",
    "serving_dashboard",
    "serving_spec",
    "stale",
    "write_all",
]
