"""`sparsemla loadtest | sweep | compare | ab`: the load-test commands the Makefile calls (heavy imports inside).

The options the commands share are declared once, in :mod:`sparsemla.loadtest.options` (:func:`with_load_options`
adds them to a command and hands it one :class:`LoadOptions`); what they print is :mod:`sparsemla.loadtest.display`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer

from sparsemla import flags, ports
from sparsemla.console import console, err_console, fail
from sparsemla.loadtest.options import MAX_CONCURRENCY, LoadOptions, with_load_options
from sparsemla.procs import Terminated, sigterm_as_interrupt

ERROR_RATE_EXIT = 1  # a run that measured, but with more failed requests than --max-error-rate allows

app = typer.Typer()

_PROMETHEUS = typer.Option(
    f"http://127.0.0.1:{ports.PORT_PROMETHEUS}",
    "--prometheus",
    help="Prometheus to render the dashboard's compare panels from into the report ('off': none). "
    "When it cannot be reached the report says so.",
)


def prometheus_url(value: str) -> str | None:
    """``--prometheus``: the base URL, or None for ``off`` / ``none`` / empty (no panel snapshots)."""
    return None if value.strip().lower() in ("", "off", "none") else value.strip()


def config_or_fail(opts: LoadOptions, concurrency: int) -> Any:
    """:meth:`LoadOptions.config`, with a bad value turned into the CLI's one-line error."""
    from sparsemla.loadtest.workload import WorkloadError

    try:
        return opts.config(concurrency)
    except (ValueError, WorkloadError) as exc:
        fail(str(exc), "see `sparsemla loadtest --help`")


@contextmanager
def interruptible(where: Path, run_id: str) -> Iterator[None]:
    """Run a load test so that SIGTERM is handled like Ctrl-C: Locust is stopped (the runner's cleanup), finished
    points stay on disk, and the command exits 143 (SIGTERM) or 130 (Ctrl-C) saying how to resume."""
    try:
        with sigterm_as_interrupt():
            yield
    except KeyboardInterrupt as exc:
        signal_name = "SIGTERM" if isinstance(exc, Terminated) else "Ctrl-C"
        err_console.print(
            f"[yellow]stopped by {signal_name}:[/] Locust is stopped; finished points are kept in {where} "
            f"(resume with --run-id {run_id})"
        )
        raise typer.Exit(143 if isinstance(exc, Terminated) else 130) from None


def check_error_rate(summaries: Iterable[dict[str, Any]], max_error_rate: float) -> None:
    """Exit 1 (after the results were written and printed) when a point failed more requests than allowed."""
    over = [s for s in summaries if float(s.get("failure_rate") or 0.0) > max_error_rate]
    if not over:
        return
    worst = max(over, key=lambda s: float(s["failure_rate"]))
    err_console.print(
        f"[bold red]error rate too high:[/] {len(over)} point(s) above --max-error-rate {max_error_rate:g}; worst "
        f"C={worst.get('concurrency')}: {worst['failure_rate']:.1%} of requests failed "
        f"({(worst.get('failure_examples') or ['?'])[0]})"
    )
    raise typer.Exit(ERROR_RATE_EXIT)


def run_dir_or_fail(run_id: str | None, prefix: str) -> tuple[str, Path]:
    """The run id (``--run-id`` or a new timestamped one) and its directory under the results root."""
    from sparsemla.loadtest.runner import new_run_id, results_root, validate_run_id

    name = run_id or new_run_id(prefix)
    try:
        validate_run_id(name)
    except ValueError as exc:
        fail(str(exc))
    return name, results_root() / name


def _points_or_fail(concurrency: str) -> list[int]:
    from sparsemla.loadtest.sweep import parse_concurrency_list

    try:
        return parse_concurrency_list(concurrency)
    except ValueError as exc:
        fail(str(exc))


@app.command("loadtest")
@with_load_options
def loadtest_cmd(
    concurrency: int = typer.Option(
        64, "--concurrency", "-c", min=1, max=MAX_CONCURRENCY, help="Fixed number of concurrent users."
    ),
    opts: LoadOptions = LoadOptions(),
) -> None:
    """One headless Locust run at fixed concurrency -> results/loadtest/<run_id>/summary.json (+ Locust CSV/HTML)."""
    from sparsemla.loadtest import display
    from sparsemla.loadtest.runner import run_point

    cfg = config_or_fail(opts, concurrency)
    run_id, out = run_dir_or_fail(opts.run_id, f"c{concurrency}")
    if (out / "sweep.json").exists():
        fail(f"run {run_id} is a sweep ({out / 'sweep.json'}); a single point would mix into it", "pick a new --run-id")
    try:
        with interruptible(out, run_id), display.progress() as bars:
            callback = display.point_callback(bars)(f"C={concurrency}", 0, 1)
            summary = run_point(cfg, out, run_id, on_progress=callback)
    except display.load_errors() as exc:
        fail(str(exc), f"is the server up at {opts.target}? (`make up` or `make sim`)")
    display.print_summary(summary, out / "summary.json")
    check_error_rate([summary], opts.max_error_rate)


@app.command("sweep")
@with_load_options
def sweep_cmd(
    concurrency: str = typer.Option("1 16 32 64", "--concurrency", "-c", help='Points, e.g. "1 16 32 64".'),
    repeat: int = typer.Option(
        1, "--repeat", min=1, max=1000, help="Repeats of every point (>= 2 gives CIs over repeats)."
    ),
    opts: LoadOptions = LoadOptions(),
) -> None:
    """Concurrency sweep with repeats into results/loadtest/<run_id>/ (resumable: finished points are skipped)."""
    from sparsemla.loadtest import display
    from sparsemla.loadtest.sweep import run_sweep

    points = _points_or_fail(concurrency)
    cfg = config_or_fail(opts, points[0])
    run_id, run_dir = run_dir_or_fail(opts.run_id, "sweep")
    if (run_dir / "summary.json").exists() and not (run_dir / "sweep.json").exists():
        fail(f"run {run_id} is a single-point `loadtest` run ({run_dir / 'summary.json'})", "pick a new --run-id")
    try:
        with interruptible(run_dir, run_id), display.progress() as bars:
            overall = bars.add_task("sweep", total=len(points) * repeat, status="")
            summaries = run_sweep(cfg, points, repeat, run_dir, on_point=display.point_callback(bars, overall))
            bars.update(overall, completed=len(points) * repeat)
    except display.load_errors() as exc:
        fail(str(exc), f"resume with --run-id {run_id}")
    display.print_sweep(summaries)
    console.print(f"run [bold]{run_id}[/] in {run_dir}")
    check_error_rate(summaries, opts.max_error_rate)


@app.command("compare")
def compare_cmd(
    a: str = typer.Argument(..., help="Run A (run id under results/loadtest, or a directory)."),
    b: str = typer.Argument(..., help="Run B."),
    out: Path = typer.Option(None, "--out", help="Report directory (default: results/compare/<A>_vs_<B>)."),
    prometheus: str = _PROMETHEUS,
) -> None:
    """A/B report of two runs: per-C table with 95 % CIs and ratios, plots, dashboard panels, report.html + .md."""
    from sparsemla.loadtest import display
    from sparsemla.loadtest.annotations import Grafana, post_run_annotations
    from sparsemla.loadtest.report import compare_runs, load_run, write_report

    try:
        run_a, run_b = load_run(a), load_run(b)
        rows = compare_runs(run_a, run_b)
        out = out or Path(flags.SPARSEMLA_RESULTS_DIR.get()) / "compare" / f"{run_a.name}_vs_{run_b.name}"
        with console.status("writing the report (plots, dashboard panels) ..."):
            files = write_report(run_a, run_b, rows, out, prometheus=prometheus_url(prometheus))
    except display.load_errors() as exc:
        fail(str(exc), "list runs with `ls results/loadtest`")
    display.print_table(rows, f"A = {run_a.name} ({run_a.variant()})   B = {run_b.name} ({run_b.variant()})")
    display.print_panels(out)
    grafana = Grafana.from_flags()
    if grafana is not None:
        try:
            n = post_run_annotations([run_a, run_b], grafana)
            console.print(f"posted {n} annotations to {grafana.url}")
        except Exception as exc:  # noqa: BLE001 (the report is written; annotations are a bonus)
            console.print(f"[yellow]could not post Grafana annotations to {grafana.url}: {exc}[/]")
    console.print(f"report: {files['html']}  {files['md']}")


@app.command("ab")
@with_load_options
def ab_cmd(
    flag: str = typer.Option("SPARSEMLA_MMA_DECODE", "--flag", help="Boolean kernel flag to flip."),
    concurrency: str = typer.Option("1 16 64", "--concurrency", "-c", help='Points, e.g. "1 16 64".'),
    repeat: int = typer.Option(1, "--repeat", min=1, max=1000, help="Repeats per point."),
    opts: LoadOptions = LoadOptions(),
    restart: str = typer.Option(
        "sim", "--restart", help="sim (stack restart) | compose (docker compose ... sglang) | a shell command."
    ),
    restore: bool = typer.Option(True, "--restore/--no-restore", help="Restart with the flag off at the end."),
    prometheus: str = _PROMETHEUS,
) -> None:
    """Flag off vs on: sweep, restart the target with the flag on, sweep again, compare (refuses if not flipped)."""
    from sparsemla.loadtest import display
    from sparsemla.loadtest.ab import ABError, require_kernel_flag, run_ab
    from sparsemla.loadtest.annotations import Grafana
    from sparsemla.loadtest.runner import results_root

    try:
        require_kernel_flag(flag)
    except ABError as exc:
        fail(str(exc), "see `sparsemla flags`")
    points = _points_or_fail(concurrency)
    cfg = config_or_fail(opts, points[0])
    run_id, _ = run_dir_or_fail(opts.run_id, "ab")
    try:
        with interruptible(results_root(), run_id), display.progress() as bars:
            result = run_ab(
                flag, points, repeat, cfg, restart=restart, run_id=run_id, restore=restore,
                on_point=display.point_callback(bars), on_phase=bars.console.print, grafana=Grafana.from_flags(),
                prometheus=prometheus_url(prometheus),
            )  # fmt: skip
    except display.load_errors() as exc:
        fail(str(exc), f"rerun with --run-id {run_id} to reuse the finished points")
    display.print_table(result.rows, f"A/B {flag}: A = off ({result.a.name})  B = on ({result.b.name})")
    display.print_panels(result.report["html"].parent)
    console.print(f"report: {result.report['html']}")
    check_error_rate(result.a.summaries + result.b.summaries, opts.max_error_rate)
