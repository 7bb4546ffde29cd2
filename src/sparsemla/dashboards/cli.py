"""`sparsemla dashboards` (regenerate / check the committed Grafana JSON) and `sparsemla snapshot` (render panels to
PNG, :mod:`sparsemla.dashboards.render`)."""

from __future__ import annotations

from pathlib import Path

import typer

from sparsemla.console import console, fail
from sparsemla.ports import PORT_PROMETHEUS

app = typer.Typer()


@app.command("dashboards")
def dashboards(
    check: bool = typer.Option(False, "--check", help="Do not write; exit 1 if the committed JSON is stale or lints."),
) -> None:
    """Regenerate src/sparsemla/dashboards/generated/*.json from src/sparsemla/dashboards/build.py and lint them."""
    from sparsemla.dashboards import build, lint

    if check:
        stale = build.stale()
        if stale:
            console.print(f"[red]stale:[/] {', '.join(stale)} — run `make dashboards` and commit the result")
    else:
        stale = []
        for path in build.write_all():
            console.print(f"wrote {path}")
    findings = lint.lint_files(sorted(build.GENERATED_DIR.glob("*.json")))
    for finding in findings:
        console.print(f"[red]lint[/] {finding}")
    if stale or findings:
        raise typer.Exit(1)
    console.print(f"[green]ok[/]: {len(build.DASHBOARDS)} dashboard(s) up to date, lint clean")


def _overrides(values: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for item in values:
        name, sep, value = item.partition("=")
        if not sep or not name:
            fail(f"--var {item!r} is not NAME=VALUE", "e.g. --var variant=baseline (repeat for several values)")
        out.setdefault(name, []).append(value)
    return out


@app.command("snapshot")
def snapshot_cmd(
    from_: str = typer.Option("now-15m", "--from", help="Start: now-15m, unix seconds or ISO 8601 (UTC)."),
    to: str = typer.Option("now", "--to", help="End, same forms as --from."),
    prometheus: str = typer.Option(f"http://127.0.0.1:{PORT_PROMETHEUS}", "--prometheus", help="Prometheus base URL."),
    out: Path = typer.Option(None, "--out", help="Output folder (default results/snapshots/<UTC time>/)."),
    var: list[str] = typer.Option([], "--var", help="Pin a dashboard variable: NAME=VALUE (repeatable)."),
) -> None:
    """Render every dashboard panel to PNG from Prometheus query_range (no Grafana needed)."""
    from rich.progress import Progress

    from sparsemla import flags
    from sparsemla.dashboards import build, grafana_eval, render
    from sparsemla.dashboards.panels import iter_panels

    try:
        start, end = grafana_eval.parse_time(from_), grafana_eval.parse_time(to)
    except ValueError as exc:
        fail(str(exc))
    if end <= start:
        fail(f"--from ({from_}) must be before --to ({to})")
    out_dir = out or render.default_out_dir(Path(flags.SPARSEMLA_RESULTS_DIR.get()))
    total = sum(1 for name in build.DASHBOARDS for _ in iter_panels(build.load(name)))
    try:
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task("rendering panels", total=total)
            result = render.render_panels(
                prometheus, start, end, out_dir, _overrides(var), progress=lambda _t: progress.advance(task)
            )
    except grafana_eval.PrometheusError as exc:
        fail(str(exc), f"is Prometheus running at {prometheus}? (`make up` starts one)")
    empty = result.empty_panels()
    console.print(f"{len(result.panels)} panels -> {out_dir}  ({len(result.panels) - len(empty)} with data)")
    if empty:
        console.print(f"[yellow]no data:[/] {', '.join(empty)}")
