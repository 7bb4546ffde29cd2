"""`sparsemla loadtest | sweep | compare | ab`: the load-test commands the Makefile calls (heavy imports inside)."""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path
from typing import Any

import typer

from sparsemla import flags
from sparsemla import metric_names as mn
from sparsemla.console import UsageError, console, fail

app = typer.Typer()

_TARGET = typer.Option(f"http://127.0.0.1:{mn.PORT_SERVER}", "--target", help="Base URL of the server under test.")
_WORKLOAD = typer.Option(
    "random:512:256", "--workload", help="random:IN:OUT[:R] | sharegpt:PATH[:OUT] | shared-prefix:G:P:Q:O"
)
_DURATION = typer.Option("60s", "--duration", help="Measured time per point (warmup comes on top), e.g. 60s, 2m.")
_RUN_ID = typer.Option(None, "--run-id", help="Name of the run directory (default: a timestamp). Reuse to resume.")
_API = typer.Option("chat", "--api", help="chat (/v1/chat/completions) | completions (/v1/completions) | generate.")
_WARMUP = typer.Option(None, "--warmup", help="Warmup excluded from the numbers (default: 15 % of duration, 1-10 s).")
_SEED = typer.Option(0, "--seed", help="Workload seed.")
_PROCESSES = typer.Option(1, "--processes", min=1, help="Locust processes (use >1 when one core cannot keep up).")
_API_KEY = typer.Option("", "--api-key", help="Bearer token for the target.")
_MAX_TOKENS = typer.Option(0, "--max-tokens", min=0, help="Override the workload's output length (0: workload's).")
_IGNORE_EOS = typer.Option(True, "--ignore-eos/--no-ignore-eos", help="Always generate max_tokens (comparable runs).")
_TTFT_SLO = typer.Option(2.0, "--ttft-slo", help="Goodput SLO on time to first token (s).")
_TPOT_SLO = typer.Option(0.1, "--tpot-slo", help="Goodput SLO on time per output token (s).")
_METRICS_PORT = typer.Option(mn.PORT_LOCUST_METRICS, "--metrics-port", help="Client Prometheus metrics port (0: off).")
_TIMEOUT = typer.Option(600.0, "--request-timeout", help="Seconds before a request counts as a timeout.")
_PROMETHEUS = typer.Option(
    f"http://127.0.0.1:{mn.PORT_PROMETHEUS}",
    "--prometheus",
    help="Prometheus to render the dashboard's compare panels from into the report ('off': none). "
    "When it cannot be reached the report says so.",
)


def _prometheus_url(value: str) -> str | None:
    return None if value.strip().lower() in ("", "off", "none") else value.strip()


def _print_panels(report_dir: Path) -> None:
    """One line on the dashboard panels the report embeds (from its compare.json), or why there are none."""
    import json

    try:
        panels = json.loads((report_dir / "compare.json").read_text()).get("panels")
    except (OSError, ValueError):
        return
    if not panels:
        return
    count = sum(len(w["panels"]) for w in panels["windows"])
    if count:
        console.print(f"dashboard panels: {count} from {panels['prometheus']} in {report_dir / 'panels'}")
    if panels.get("error"):
        console.print(f"[yellow]{panels['error']}[/]")


def _config(target: str, concurrency: int, duration: str, workload: str, **kw: Any) -> Any:
    from sparsemla.loadtest.runner import LoadTestConfig, parse_duration
    from sparsemla.loadtest.workload import WorkloadError

    try:
        warmup = kw.pop("warmup")
        cfg = LoadTestConfig(
            target=target,
            concurrency=concurrency,
            duration_s=parse_duration(duration),
            workload=workload,
            warmup_s=parse_duration(warmup) if warmup not in (None, "0", "0s") else (0.0 if warmup else None),
            **kw,
        )
        cfg.validate()
    except (ValueError, WorkloadError) as exc:
        fail(str(exc), "see `sparsemla loadtest --help`")
    return cfg


@contextmanager
def _progress():
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    with Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[status]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=console,
        transient=False,
    ) as progress:
        yield progress


def _point_callback(progress: Any, overall: Any = None) -> Any:
    """A sweep's per-point callback: one bar per point (time-based), plus the overall bar."""

    def on_point(name: str, index: int, total: int) -> Any:
        if overall is not None:
            progress.update(overall, completed=index, description=f"sweep {index + 1}/{total}")
        if "skipped" in name:
            progress.console.print(f"  {name}")
            return None
        task = progress.add_task(name, total=1.0, status="")

        def on_progress(phase: str, elapsed: float, total_s: float, requests: int) -> None:
            progress.update(task, completed=min(elapsed / total_s, 1.0), status=f"{phase}, {requests} req")

        return on_progress

    return on_point


def _print_summary(summary: dict[str, Any], path: Path) -> None:
    from rich.table import Table

    table = Table(title=f"C={summary['concurrency']}  {summary['duration_s']:.1f}s measured  ({path})")
    for col in ("metric", "p50", "p90", "p99", "mean"):
        table.add_column(col, justify="right")
    for key in ("ttft_s", "itl_s", "tpot_s", "e2e_s"):
        d = summary[key]
        table.add_row(
            key, *[f"{d[k] * 1000:.1f} ms" if d[k] is not None else "–" for k in ("p50", "p90", "p99", "mean")]
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


def _errors() -> tuple[type[BaseException], ...]:
    from sparsemla.loadtest.ab import ABError
    from sparsemla.loadtest.report import ReportError
    from sparsemla.loadtest.runner import LoadTestError
    from sparsemla.loadtest.sweep import SweepError
    from sparsemla.loadtest.target import TargetError

    return (ABError, ReportError, LoadTestError, SweepError, TargetError, UsageError, flags.FlagError)


@app.command("loadtest")
def loadtest_cmd(
    concurrency: int = typer.Option(64, "--concurrency", "-c", min=1, help="Fixed number of concurrent users."),
    duration: str = _DURATION,
    target: str = _TARGET,
    workload: str = _WORKLOAD,
    run_id: str = _RUN_ID,
    api: str = _API,
    warmup: str = _WARMUP,
    seed: int = _SEED,
    processes: int = _PROCESSES,
    api_key: str = _API_KEY,
    max_tokens: int = _MAX_TOKENS,
    ignore_eos: bool = _IGNORE_EOS,
    ttft_slo: float = _TTFT_SLO,
    tpot_slo: float = _TPOT_SLO,
    metrics_port: int = _METRICS_PORT,
    request_timeout: float = _TIMEOUT,
) -> None:
    """One headless Locust run at fixed concurrency -> results/loadtest/<run_id>/summary.json (+ Locust CSV/HTML)."""
    from sparsemla.loadtest.runner import new_run_id, results_root, run_point

    cfg = _config(
        target, concurrency, duration, workload, api=api, warmup=warmup, seed=seed, processes=processes,
        api_key=api_key, max_tokens=max_tokens, ignore_eos=ignore_eos, ttft_slo_s=ttft_slo, tpot_slo_s=tpot_slo,
        metrics_port=metrics_port, request_timeout_s=request_timeout,
    )  # fmt: skip
    run_id = run_id or new_run_id(f"c{concurrency}")
    out = results_root() / run_id
    try:
        with _progress() as progress:
            callback = _point_callback(progress)(f"C={concurrency}", 0, 1)
            summary = run_point(cfg, out, run_id, on_progress=callback)
    except _errors() as exc:
        fail(str(exc), f"is the server up at {target}? (`make up` or `make sim`)")
    _print_summary(summary, out / "summary.json")


@app.command("sweep")
def sweep_cmd(
    concurrency: str = typer.Option("1 16 32 64", "--concurrency", "-c", help='Points, e.g. "1 16 32 64".'),
    repeat: int = typer.Option(1, "--repeat", min=1, help="Repeats of every point (>= 2 gives CIs over repeats)."),
    duration: str = _DURATION,
    target: str = _TARGET,
    workload: str = _WORKLOAD,
    run_id: str = _RUN_ID,
    api: str = _API,
    warmup: str = _WARMUP,
    seed: int = _SEED,
    processes: int = _PROCESSES,
    api_key: str = _API_KEY,
    max_tokens: int = _MAX_TOKENS,
    ignore_eos: bool = _IGNORE_EOS,
    ttft_slo: float = _TTFT_SLO,
    tpot_slo: float = _TPOT_SLO,
    metrics_port: int = _METRICS_PORT,
    request_timeout: float = _TIMEOUT,
) -> None:
    """Concurrency sweep with repeats into results/loadtest/<run_id>/ (resumable: finished points are skipped)."""
    from sparsemla.loadtest.runner import new_run_id, results_root
    from sparsemla.loadtest.sweep import parse_concurrency_list, run_sweep

    try:
        points = parse_concurrency_list(concurrency)
    except ValueError as exc:
        fail(str(exc))
    cfg = _config(
        target, points[0], duration, workload, api=api, warmup=warmup, seed=seed, processes=processes,
        api_key=api_key, max_tokens=max_tokens, ignore_eos=ignore_eos, ttft_slo_s=ttft_slo, tpot_slo_s=tpot_slo,
        metrics_port=metrics_port, request_timeout_s=request_timeout,
    )  # fmt: skip
    run_id = run_id or new_run_id("sweep")
    run_dir = results_root() / run_id
    try:
        with _progress() as progress:
            overall = progress.add_task("sweep", total=len(points) * repeat, status="")
            summaries = run_sweep(cfg, points, repeat, run_dir, on_point=_point_callback(progress, overall))
            progress.update(overall, completed=len(points) * repeat)
    except _errors() as exc:
        fail(str(exc), f"resume with --run-id {run_id}")
    for s in sorted(summaries, key=lambda s: (s["concurrency"], s.get("repeat", 1))):
        console.print(
            f"C={s['concurrency']:<4} r{s.get('repeat', 1)}  {s['output_tok_per_s']:9.1f} tok/s  "
            f"TTFT p50 {(s['ttft_s']['p50'] or 0) * 1000:7.1f} ms  ITL p50 {(s['itl_s']['p50'] or 0) * 1000:6.1f} ms  "
            f"failures {s['failures']['total']}"
        )
    console.print(f"run [bold]{run_id}[/] in {run_dir}")


def print_table(rows: Any, title: str) -> None:
    """The A/B table on the console."""
    from rich.table import Table

    from sparsemla.loadtest.report import HEADERS, table_rows

    table = Table(title=title)
    for header in HEADERS:
        table.add_column(header, justify="right" if header != "verdict" else "left")
    for cells in table_rows(rows):
        style = "green" if cells[-1].startswith("B better") else "red" if cells[-1].startswith("B worse") else None
        table.add_row(*cells, style=style)
    console.print(table)


@app.command("compare")
def compare_cmd(
    a: str = typer.Argument(..., help="Run A (run id under results/loadtest, or a directory)."),
    b: str = typer.Argument(..., help="Run B."),
    out: Path = typer.Option(None, "--out", help="Report directory (default: results/compare/<A>_vs_<B>)."),
    prometheus: str = _PROMETHEUS,
) -> None:
    """A/B report of two runs: per-C table with 95 % CIs and ratios, plots, dashboard panels, report.html + .md."""
    from sparsemla.loadtest.report import compare_runs, load_run, post_grafana_annotations, write_report

    try:
        run_a, run_b = load_run(a), load_run(b)
        rows = compare_runs(run_a, run_b)
        out = out or Path(flags.SPARSEMLA_RESULTS_DIR.get()) / "compare" / f"{run_a.name}_vs_{run_b.name}"
        with console.status("writing the report (plots, dashboard panels) ..."):
            files = write_report(run_a, run_b, rows, out, prometheus=_prometheus_url(prometheus))
    except _errors() as exc:
        fail(str(exc), "list runs with `ls results/loadtest`")
    print_table(rows, f"A = {run_a.name} ({run_a.variant()})   B = {run_b.name} ({run_b.variant()})")
    _print_panels(out)
    grafana = flags.GRAFANA_URL.get()
    if grafana:
        try:
            n = post_grafana_annotations([run_a, run_b], grafana, flags.GRAFANA_API_TOKEN.get())
            console.print(f"posted {n} annotations to {grafana}")
        except Exception as exc:  # noqa: BLE001 (the report is written; annotations are a bonus)
            console.print(f"[yellow]could not post Grafana annotations to {grafana}: {exc}[/]")
    console.print(f"report: {files['html']}  {files['md']}")


@app.command("ab")
def ab_cmd(
    flag: str = typer.Option("SPARSEMLA_MMA_DECODE", "--flag", help="Boolean kernel flag to flip."),
    concurrency: str = typer.Option("1 16 64", "--concurrency", "-c", help='Points, e.g. "1 16 64".'),
    repeat: int = typer.Option(1, "--repeat", min=1, help="Repeats per point."),
    duration: str = _DURATION,
    target: str = _TARGET,
    workload: str = _WORKLOAD,
    restart: str = typer.Option(
        "sim", "--restart", help="sim (stack restart) | compose (docker compose ... sglang) | a shell command."
    ),
    run_id: str = _RUN_ID,
    api: str = _API,
    warmup: str = _WARMUP,
    seed: int = _SEED,
    processes: int = _PROCESSES,
    ttft_slo: float = _TTFT_SLO,
    tpot_slo: float = _TPOT_SLO,
    metrics_port: int = _METRICS_PORT,
    restore: bool = typer.Option(True, "--restore/--no-restore", help="Restart with the flag off at the end."),
    prometheus: str = _PROMETHEUS,
) -> None:
    """Flag off vs on: sweep, restart the target with the flag on, sweep again, compare (refuses if not flipped)."""
    from sparsemla.loadtest.ab import run_ab
    from sparsemla.loadtest.annotations import Grafana
    from sparsemla.loadtest.runner import new_run_id
    from sparsemla.loadtest.sweep import parse_concurrency_list

    known = flags.REGISTRY.get(flag)
    if known is None or not isinstance(known.default, bool) or known.group != "kernels":
        fail(f"{flag} is not a boolean kernel flag", "see `sparsemla flags`")
    try:
        points = parse_concurrency_list(concurrency)
    except ValueError as exc:
        fail(str(exc))
    cfg = _config(
        target, points[0], duration, workload, api=api, warmup=warmup, seed=seed, processes=processes,
        ttft_slo_s=ttft_slo, tpot_slo_s=tpot_slo, metrics_port=metrics_port,
    )  # fmt: skip
    run_id = run_id or new_run_id("ab")
    try:
        with _progress() as progress:
            result = run_ab(
                flag, points, repeat, cfg, restart=restart, run_id=run_id, restore=restore,
                on_point=_point_callback(progress), on_phase=progress.console.print, grafana=Grafana.from_flags(),
                prometheus=_prometheus_url(prometheus),
            )  # fmt: skip
    except _errors() as exc:
        fail(str(exc), f"rerun with --run-id {run_id} to reuse the finished points")
    print_table(result.rows, f"A/B {flag}: A = off ({result.a.name})  B = on ({result.b.name})")
    _print_panels(result.report["html"].parent)
    console.print(f"report: {result.report['html']}")
