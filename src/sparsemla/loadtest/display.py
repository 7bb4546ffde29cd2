"""What the load-test commands show on the console: progress bars, point summaries, the A/B table, panel lines.

Public so that every front end of the load-test tools (`sparsemla loadtest | sweep | compare | ab` and the demo)
prints the same thing the same way; heavy imports (the report's matplotlib and scipy) stay inside the functions.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparsemla import flags
from sparsemla.console import UsageError, console

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

    from sparsemla.loadtest.kernel_shares import KernelComparison
    from sparsemla.loadtest.report import Row
    from sparsemla.loadtest.sweep import PointCallback


def load_errors() -> tuple[type[BaseException], ...]:
    """The exceptions a load-test command turns into a one-line message (not a traceback): user mistakes and a
    target, sweep, report or A/B run that cannot go on."""
    from sparsemla.loadtest.ab import ABError
    from sparsemla.loadtest.report import ReportError
    from sparsemla.loadtest.runner import LoadTestError
    from sparsemla.loadtest.sweep import SweepError
    from sparsemla.loadtest.target import TargetError

    return (ABError, ReportError, LoadTestError, SweepError, TargetError, UsageError, flags.FlagError)


@contextmanager
def progress() -> Iterator[Progress]:
    """Rich progress bars on the shared console (kept on screen when done)."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    ) as bars:
        yield bars


def point_callback(bars: Progress, overall: TaskID | None = None) -> PointCallback:
    """A sweep's per-point callback: one bar per point (time-based), plus the overall bar when given."""

    def on_point(name: str, index: int, total: int) -> Any:
        if overall is not None:
            bars.update(overall, completed=index, description=f"sweep {index + 1}/{total}")
        if "skipped" in name:
            bars.console.print(f"  {name}")
            return None
        task = bars.add_task(name, total=1.0, status="")

        def on_progress(phase: str, elapsed: float, total_s: float, requests: int) -> None:
            bars.update(task, completed=min(elapsed / total_s, 1.0), status=f"{phase}, {requests} req")

        return on_progress

    return on_point


def print_summary(summary: dict[str, Any], path: Path) -> None:
    """One point's latency table and totals (`sparsemla loadtest`)."""
    from rich.table import Table

    table = Table(title=f"C={summary['concurrency']}  {summary['duration_s']:.1f}s measured  ({path})")
    for col in ("metric", "p50", "p90", "p99", "mean"):
        table.add_column(col, justify="right")
    for key in ("ttft_s", "itl_s", "tpot_s", "e2e_s"):
        d = summary[key]
        table.add_row(
            key, *[f"{d[k] * 1000:.1f} ms" if d[k] is not None else "none" for k in ("p50", "p90", "p99", "mean")]
        )
    console.print(table)
    fails = summary["failures"]
    mark = " [bold red](> 1 % failed: marked)[/]" if summary["failures_marked"] else ""
    console.print(
        f"requests {summary['requests']}, {summary['req_per_s']:.2f} req/s, output {summary['output_tok_per_s']:.1f} "
        f"tok/s (peak {summary['peak_output_tok_per_s']:.0f}), goodput {summary['goodput']['share'] or 0:.1%}, "
        f"failures {fails['total']} { ({k: v for k, v in fails.items() if v and k != 'total'}) }{mark}; "
        f"variant {summary.get('variant')}"
    )


def _ms(value: float | None, width: int) -> str:
    """Seconds as ``   84.7 ms``; a point without the value says "none" (a 0.0 ms there would be a made-up number)."""
    return f"{value * 1000:{width}.1f} ms" if value is not None else f"{'none':>{width + 3}}"


def print_sweep(summaries: Sequence[dict[str, Any]]) -> None:
    """One line per sweep point, by concurrency then repeat: tok/s, TTFT and ITL medians, failures; a median the
    point could not measure is "none" and the line ends with why (:mod:`sparsemla.loadtest.report_cells`)."""
    from sparsemla.loadtest.report_cells import no_value_reason

    for s in sorted(summaries, key=lambda s: (s["concurrency"], s.get("repeat", 1))):
        ttft, itl = s["ttft_s"]["p50"], s["itl_s"]["p50"]
        why = (
            no_value_reason("ttft_p50", [s]) if ttft is None else no_value_reason("itl_p50", [s]) if itl is None else ""
        )
        console.print(
            f"C={s['concurrency']:<4} r{s.get('repeat', 1)}  {s['output_tok_per_s']:9.1f} tok/s  "
            f"TTFT p50 {_ms(ttft, 7)}  ITL p50 {_ms(itl, 6)}  failures {s['failures']['total']}"
            + (f"  ({why.removeprefix('none: ')})" if why else "")
        )


def print_table(rows: Sequence[Row], title: str) -> None:
    """The A/B table on the console (B better in green, B worse in red)."""
    from rich.table import Table

    from sparsemla.loadtest.report import HEADERS, table_rows

    table = Table(title=title)
    for header in HEADERS:
        table.add_column(header, justify="right" if header != "verdict" else "left")
    for cells in table_rows(rows):
        style = "green" if cells[-1].startswith("B better") else "red" if cells[-1].startswith("B worse") else None
        table.add_row(*cells, style=style)
    console.print(table)


def print_grid(headers: Sequence[str], rows: Sequence[Sequence[str]], title: str) -> None:
    """A plain table of strings (the campaign's at-a-glance and kernel-share tables)."""
    from rich.table import Table

    table = Table(title=title)
    for i, header in enumerate(headers):
        table.add_column(header, justify="left" if i == 0 else "right")
    for cells in rows:
        table.add_row(*cells)
    console.print(table)


def print_kernels(kernels: KernelComparison, title: str) -> None:
    """A step's kernel-share categories before (A) and after (B), or why there are none."""
    rows = kernels.category_rows()
    if not rows:
        console.print(f"[yellow]{kernels.headline()}[/]")
        return
    print_grid(["category", f"A {kernels.a.variant}", f"B {kernels.b.variant}", "B − A"], rows, title)


def print_panels(report_dir: Path) -> None:
    """One line on the dashboard panels the report embeds (from its compare.json), or why there are none."""
    try:
        panels = json.loads((report_dir / "compare.json").read_text()).get("panels")
    except (OSError, ValueError):
        return
    if not panels:
        return
    images = [p for w in panels["windows"] for p in w["panels"]]
    if images:
        empty = [p["title"] for p in images if not p["has_data"]]
        console.print(
            f"dashboard panels: {len(images)} from {panels['prometheus']} in {report_dir / 'panels'}"
            + (f"; without data: {', '.join(empty)}" if empty else ", every one with data")
        )
    if panels.get("error"):
        console.print(f"[yellow]{panels['error']}[/]")
