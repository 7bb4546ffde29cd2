"""The report of a whole campaign (:mod:`sparsemla.loadtest.campaign`): every step on one page.

``report.md`` / ``report.html`` / ``campaign.json`` in the campaign's directory: output tok/s of every variant at
every point with the ratio each step bought, on the simulator what flags off is (sglang's fallback) and flags on vs
sglang's fast path from the calibration the server reported (:func:`comparison`), the categories of GPU time each
step moved (from the kernel-share snapshots), the flag flips (what the Grafana annotations say), the caller's checks
(the demo's calibration check), and then each step's own A/B report embedded (:func:`sparsemla.loadtest.report.body_md`:
runs, table with CIs, plots, kernel shares before/after, dashboard panels), its files linked from the step's folder.
"""

from __future__ import annotations

import html
import json
import math
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sparsemla.loadtest.calibration_label import comparison_lines
from sparsemla.loadtest.campaign import CampaignResult, StepResult
from sparsemla.loadtest.report import METRICS, body_html, body_md, estimate, html_page, table_rows
from sparsemla.loadtest.report_cells import no_value_reason
from sparsemla.loadtest.report_panels import PanelRenders
from sparsemla.loadtest.summary import write_json_atomic

TOK = METRICS[0]  # output tok/s, the campaign's headline metric


def _tok_cell(result: CampaignResult, name: str, concurrency: int) -> str:
    summaries = result.variants[name].run.points.get(concurrency, [])
    est = estimate(summaries, TOK)
    if not math.isfinite(est.value):
        return no_value_reason(TOK.key, summaries)
    text = f"{est.value:.1f}"
    if est.has_interval:
        text += f" [{est.lo:.1f}, {est.hi:.1f}]"
    return text


def _step_ratio(step: StepResult, concurrency: int) -> str:
    row = next((r for r in step.rows if r.concurrency == concurrency and r.metric.key == TOK.key), None)
    if row is None:
        return "not compared: the point is missing on one side"
    cell = table_rows([row])[0][4]
    return f"× {cell}" if math.isfinite(row.ratio.value) else cell  # words say why there is no ratio


def glance_rows(result: CampaignResult) -> tuple[list[str], list[list[str]]]:
    """Headers and rows of the at-a-glance table: per point, each variant's output tok/s (95 % CI) and, from the
    second variant on, the B/A ratio of the step that introduced it."""
    names = list(result.variants)
    headers = ["C", f"{names[0]} tok/s"]
    for step in result.steps:
        headers += [f"{step.step.b} tok/s", f"step {step.step.index} B/A"]
    rows = []
    for c in result.points:
        cells = [str(c), _tok_cell(result, names[0], c)]
        for step in result.steps:
            cells += [_tok_cell(result, step.step.b, c), _step_ratio(step, c)]
        rows.append(cells)
    return headers, rows


def comparison(result: CampaignResult) -> list[str]:
    """vs sglang's fallback (what flags off is) and vs sglang's fast path (flags on's decode-step speed-up over it,
    measured in the decode-step benchmark, or why there is none), from the calibration every variant's server
    reported in ``/server_info``; [] against a real server."""
    return comparison_lines(s for v in result.variants.values() for s in v.run.summaries)


def flip_rows(result: CampaignResult) -> list[list[str]]:
    """One row per flip annotation: when the restart began (UTC), flag=value, the variant served after, how long."""
    rows = []
    for body in result.flips():
        tags = dict(t.split("=", 1) for t in body.get("tags", []) if "=" in t)
        began, ready = body["time"] / 1000, body["timeEnd"] / 1000
        flag = tags.get("flag", "")
        value = body.get("text", "").split(" ", 1)[0].partition("=")[2]
        rows.append([time.strftime("%H:%M:%S", time.gmtime(began)), f"{flag}={value}", tags.get("variant", ""),
                     f"{ready - began:.1f} s"])  # fmt: skip
    return rows


def _step_panels(step: StepResult) -> PanelRenders | None:
    try:
        data = json.loads((step.report_dir / "compare.json").read_text()).get("panels")
    except (OSError, ValueError):
        return None
    return PanelRenders.from_json(data) if data else None


def _step_pngs(step: StepResult) -> list[Path]:
    return [p for p in step.report.values() if p.suffix == ".png"]


def _md_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    return [
        "| " + " | ".join(headers) + " |",
        "|" + "---|" * len(headers),
        *["| " + " | ".join(r) + " |" for r in rows],
    ]


def _html_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def _flips_note(result: CampaignResult, grafana_url: str | None) -> str:
    first = next(iter(result.variants))
    started = "" if result.variants[first].flips else f"The target was started serving {first}; after that, "
    each = "each" if started else "Each"
    if grafana_url:
        return f"{started}{each} restart was posted to Grafana ({grafana_url}) as an `ab` annotation (variant=, flag=)."
    return (
        f"{started}{each} restart is a flag-flip annotation (tags `ab`, `variant=`, `flag=`): posted to Grafana when "
        "`GRAFANA_URL` is set, listed here."
    )


def write_campaign_report(
    result: CampaignResult,
    *,
    title: str,
    intro: Sequence[str] = (),
    notes: Sequence[str] = (),
    grafana_url: str | None = None,
) -> dict[str, Path]:
    """report.md, report.html and campaign.json in ``result.out_dir``; returns their paths. ``intro`` lines go under
    the title, ``notes`` (the caller's checks) into their own section."""
    out = result.out_dir
    headers, glance = glance_rows(result)
    flips = flip_rows(result)
    flip_headers = ["restart began (UTC)", "flag", "now serving", "restart took"]
    shifts = [f"Step {s.step.index} ({s.step.flag}): {s.kernels.headline()}" for s in result.steps]
    compared = comparison(result)
    md = [f"# {title}", "", *intro, "", "## Output tok/s by variant (95 % CI) and what each step bought", ""]
    md += [*_md_table(headers, glance), ""]
    md += [*[f"- {line}" for line in compared], ""] if compared else []
    md += ["## Where the GPU time moved (kernel-share snapshots)", ""]
    md += [*[f"- {line}" for line in shifts], "", "## Flag flips", "", _flips_note(result, grafana_url), ""]
    md += [*_md_table(flip_headers, flips), ""]
    if notes:
        md += ["## Checks", "", *[f"- {line}" for line in notes], ""]
    page = [
        *[f"<p>{html.escape(line)}</p>" for line in intro],
        "<h2>Output tok/s by variant (95 % CI) and what each step bought</h2>", _html_table(headers, glance),
        "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in compared) + "</ul>" if compared else "",
        "<h2>Where the GPU time moved (kernel-share snapshots)</h2>",
        "<ul>" + "".join(f"<li>{html.escape(line)}</li>" for line in shifts) + "</ul>",
        f"<h2>Flag flips</h2><p>{html.escape(_flips_note(result, grafana_url))}</p>", _html_table(flip_headers, flips),
    ]  # fmt: skip
    if notes:
        page.append("<h2>Checks</h2><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>")
    for step in result.steps:
        prefix = os.path.relpath(step.report_dir, out) + "/"
        a, b = result.variants[step.step.a].run, result.variants[step.step.b].run
        pngs, panels = _step_pngs(step), _step_panels(step)
        md += [f"## {step.step.title}", "", f"Step report: [{prefix}report.html]({prefix}report.html)", ""]
        md += body_md(a, b, step.rows, pngs, panels, step.kernels, prefix=prefix, level=3, references=False)
        page.append(f"<h2>{html.escape(step.step.title)}</h2>")
        page.append(
            f'<p>Step report: <a href="{html.escape(prefix)}report.html">{html.escape(prefix)}report.html</a></p>'
        )
        page.append(body_html(a, b, step.rows, pngs, panels, step.kernels, prefix=prefix, level=3, references=False))
    (out / "report.md").write_text("\n".join(md))
    (out / "report.html").write_text(html_page(title, "\n".join(page)))
    write_json_atomic(
        out / "campaign.json", campaign_json(result, glance=(headers, glance), notes=notes) | {"comparison": compared}
    )
    return {"md": out / "report.md", "html": out / "report.html", "json": out / "campaign.json"}


def campaign_json(
    result: CampaignResult, *, glance: tuple[list[str], list[list[str]]], notes: Sequence[str]
) -> dict[str, Any]:
    """What campaign.json holds: the variants (run, snapshot, flips), the steps (table cells, kernel shares)."""
    return {
        "points": result.points,
        "glance": {"headers": glance[0], "rows": glance[1]},
        "variants": {
            name: {
                "run": str(v.run.path),
                "variant": v.run.variant(),
                "snapshot": v.snapshot.to_json(),
                "flips": v.flips,
            }
            for name, v in result.variants.items()
        },
        "steps": [s.summary() | {"cells": table_rows(s.rows), "kernels": s.kernels.to_json()} for s in result.steps],
        "notes": list(notes),
    }
