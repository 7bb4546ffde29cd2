"""`sparsemla up`, `down`, `exporter`, `profile`, `export`: the deployment commands the Makefile calls."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sparsemla.console import UsageError, console, err_console, fail
from sparsemla.ports import PORT_EXPORTER, PORT_LOCUST_METRICS, PORT_PROMETHEUS, PORT_SERVER

if TYPE_CHECKING:
    from sparsemla.ops.exporter import ExporterConfig, Snapshot

app = typer.Typer()

_RUN_DIR = typer.Option(Path(".run"), "--run-dir", help="Where PID files, logs and generated configs go.")


@app.command("up")
def up_cmd(
    server: str = typer.Option("sim", "--server", help="sim (the simulator) | sglang (SPARSEMLA_SGLANG_COMMAND)."),
    port: int = typer.Option(PORT_SERVER, "--port", help="Server port."),
    prometheus: bool = typer.Option(
        None, "--prometheus/--no-prometheus", help="Default: run it if installed or installable with apt."
    ),
    exporter: bool = typer.Option(True, "--exporter/--no-exporter", help="Start the kernel-share exporter."),
    prometheus_port: int = typer.Option(PORT_PROMETHEUS, "--prometheus-port"),
    exporter_port: int = typer.Option(PORT_EXPORTER, "--exporter-port"),
    locust_metrics_port: int = typer.Option(
        PORT_LOCUST_METRICS, "--locust-metrics-port", help="Port Prometheus scrapes for `loadtest --metrics-port`."
    ),
    run_dir: Path = _RUN_DIR,
) -> None:
    """Start the server (simulator or local sglang), Prometheus and the exporter as background processes."""
    from sparsemla.ops import stack

    with console.status(f"starting {server}, exporter and Prometheus ..."):
        try:
            urls = stack.up(
                server=server,
                prometheus=prometheus,
                exporter=exporter,
                run_dir=run_dir,
                port=port,
                prometheus_port=prometheus_port,
                exporter_port=exporter_port,
                locust_metrics_port=locust_metrics_port,
            )
        except UsageError as exc:
            fail(str(exc), "`make down` stops a half-started stack; logs are in " + str(run_dir))
    for line in stack.describe(urls):
        console.print(line)
    console.print(f"[dim]logs and PIDs: {run_dir}/   stop everything: make down[/]")


@app.command("down")
def down_cmd(run_dir: Path = _RUN_DIR) -> None:
    """Stop everything `sparsemla up` started (no process is left behind); exit 1 if something could not be stopped."""
    from sparsemla.ops import stack

    report = stack.down_report(run_dir)
    for line in report.lines():
        console.print(line)
    if report.failed:
        raise typer.Exit(1)


_API_KEY_HELP = "Bearer token of the server (its --api-key), sent as `Authorization: Bearer ...`; empty: none."
_MAX_TRACE_MIB_HELP = "Most MiB one trace may decompress to (larger: an error outcome, e.g. a gzip bomb)."


def _config(target: str, **kwargs: object) -> ExporterConfig:
    from sparsemla.ops.exporter import ExporterConfig

    try:
        return ExporterConfig(target=target, **kwargs)  # type: ignore[arg-type]
    except ValueError as exc:
        fail(str(exc), "e.g. --target http://127.0.0.1:30000")


@app.command("exporter")
def exporter_cmd(
    target: str = typer.Option(..., "--target", help="Server base URL (sglang or the simulator)."),
    port: int = typer.Option(PORT_EXPORTER, "--port", help="Port of /metrics and POST /snapshot."),
    host: str = typer.Option("127.0.0.1", "--host", help="Bind address (0.0.0.0 in a container)."),
    interval: float = typer.Option(0.0, "--interval", help="Seconds between scheduled snapshots (0: on demand only)."),
    num_steps: int = typer.Option(10, "--num-steps", help="Forward steps per profile."),
    timeout: float = typer.Option(120.0, "--timeout", help="Seconds to wait for the traces before /stop_profile."),
    trace_dir: Path = typer.Option(None, "--trace-dir", help="Trace directory (default SGLANG_TORCH_PROFILER_DIR)."),
    snapshot_dir: Path = typer.Option(None, "--snapshot-dir", help="Snapshot JSON (default <results>/profiles)."),
    keep: int = typer.Option(20, "--keep", help="Snapshots (JSON and traces) kept."),
    top_n: int = typer.Option(15, "--top-n", help="Kernels exported individually; the rest is `other`."),
    api_key: str = typer.Option("", "--api-key", help=_API_KEY_HELP),
    max_trace_mib: int = typer.Option(512, "--max-trace-mib", help=_MAX_TRACE_MIB_HELP),
) -> None:
    """Run the kernel-share exporter in the foreground (GET /metrics, POST /snapshot)."""
    import logging
    import threading

    from sparsemla import flags
    from sparsemla.ops.exporter import KernelShareExporter

    logging.basicConfig(level=flags.SPARSEMLA_LOG_LEVEL.get().upper(), format="%(asctime)s %(levelname)s %(message)s")
    cfg = _config(
        target, port=port, host=host, interval_s=interval, num_steps=num_steps, timeout_s=timeout,
        trace_dir=trace_dir, snapshot_dir=snapshot_dir, keep=keep, top_n=top_n, api_key=api_key,
        max_trace_bytes=max_trace_mib * 2**20,
    )  # fmt: skip
    exp = KernelShareExporter(cfg)
    try:
        server = exp.serve()
    except OSError as exc:
        fail(f"cannot listen on {host}:{port}: {exc.strerror or exc}", "pass another --port")
    stop = threading.Event()
    exp.start_schedule(stop)
    schedule = f"every {interval:g}s" if interval > 0 else "on demand (POST /snapshot)"
    console.print(f"exporter: http://{host}:{port}/metrics  target {cfg.target}  traces {cfg.trace_dir}  {schedule}")
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        stop.set()
        server.server_close()


PROFILE_FAILED = 1  # the snapshot failed: no trace although the server ran steps, a refused profile, a bad trace
PROFILE_IDLE = 3  # the server ran no forward step before the timeout: nothing to profile


@app.command("profile")
def profile_cmd(
    target: str = typer.Option(..., "--target", help="Server base URL."),
    exporter: str = typer.Option(
        f"http://127.0.0.1:{PORT_EXPORTER}", "--exporter", help="Exporter to ask first (its gauges then update)."
    ),
    num_steps: int = typer.Option(10, "--num-steps", help="Forward steps to profile."),
    timeout: float = typer.Option(120.0, "--timeout", help="Seconds to wait for the decode steps and their traces."),
    trace_dir: Path = typer.Option(None, "--trace-dir", help="Trace directory when profiling directly."),
    top_n: int = typer.Option(15, "--top-n"),
    as_json: bool = typer.Option(False, "--json", help="Print the snapshot as JSON."),
    api_key: str = typer.Option("", "--api-key", help=_API_KEY_HELP + " Used when profiling directly."),
    max_trace_mib: int = typer.Option(512, "--max-trace-mib", help=_MAX_TRACE_MIB_HELP),
) -> None:
    """Take one kernel-share snapshot: through the running exporter if there is one, else directly; print the table.

    The profiler records forward steps, so it waits for the server to run some (progress shown) and gives up after
    --timeout. Exit status: 0 snapshot taken; 1 it failed (the server ran steps but no usable trace came, or the
    profile was refused); 2 bad options or a snapshot already running; 3 the server was idle (no forward step in
    --timeout: profile while load runs)."""
    import logging

    logging.getLogger("sparsemla").addHandler(logging.NullHandler())  # the outcome is printed below, not logged twice
    cfg = _config(
        target, num_steps=num_steps, timeout_s=timeout, trace_dir=trace_dir, top_n=top_n, api_key=api_key,
        max_trace_bytes=max_trace_mib * 2**20,
    )  # fmt: skip
    console.print(
        f"waiting for {num_steps} decode steps on {cfg.target}: the profiler records forward steps, an idle server "
        f"runs none (giving up after {timeout:g}s)"
    )
    snap, via = _snapshot_with_progress(cfg, exporter, timeout)
    if as_json:
        print(json.dumps(asdict(snap), indent=1))
    if snap.idle:
        err_console.print(f"[bold red]error:[/] snapshot {snap.outcome} ({via}): {snap.error}")
        raise typer.Exit(PROFILE_IDLE)
    if snap.outcome != "ok" or not snap.summary:
        err_console.print(f"[bold red]error:[/] snapshot {snap.outcome} ({via}): {snap.error}")
        err_console.print("[yellow]hint:[/] the server must be generating while it is profiled")
        raise typer.Exit(PROFILE_FAILED)
    if not as_json:
        _print_summary(snap, via)


def _snapshot_with_progress(cfg: ExporterConfig, exporter: str, timeout: float) -> tuple[Snapshot, str]:
    """Take the snapshot in a worker thread (through the exporter, else directly) while a progress bar shows the
    elapsed time against ``timeout`` and what the server is doing (read from its /metrics)."""
    import threading
    import time

    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    from sparsemla.ops.exporter import KernelShareExporter, SnapshotBusy, read_activity

    result: dict[str, object] = {}

    def work() -> None:
        try:
            snap = _via_exporter(exporter, timeout)
            via = "exporter " + exporter
            if snap is None:
                snap, via = KernelShareExporter(cfg).take_snapshot(), "direct"
            result["snap"], result["via"] = snap, via
        except (SnapshotBusy, UsageError) as exc:
            result["busy"] = str(exc)
        except Exception as exc:  # noqa: BLE001 (reported below, on the main thread)
            result["error"] = exc

    worker = threading.Thread(target=work, daemon=True, name="snapshot")
    started = time.monotonic()
    first = read_activity(cfg.target, cfg.api_key, timeout=5.0)
    columns = (SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task("waiting for decode steps", total=timeout)
        worker.start()
        while worker.is_alive():
            worker.join(1.0)
            now = read_activity(cfg.target, cfg.api_key, timeout=2.0)
            if now is None or first is None:
                state = "server activity unknown (no sglang metrics)"
            elif now.ran_since(first):
                state = f"server busy: {now.running:g} running, {now.queued:g} queued; profiling"
            else:
                state = "server idle so far: waiting for decode steps"
            progress.update(task, completed=min(time.monotonic() - started, timeout), description=state)
    if "busy" in result:
        fail(str(result["busy"]), "wait for it and retry")
    if "error" in result:
        raise result["error"]  # type: ignore[misc]
    return result["snap"], str(result["via"])  # type: ignore[return-value]


def _via_exporter(exporter: str, timeout: float) -> Snapshot | None:
    """The snapshot the running exporter takes (with this ``timeout``), or None when no exporter answers there."""
    from sparsemla.ops.exporter import Snapshot, _http

    try:
        status, body = _http("POST", exporter.rstrip("/") + "/snapshot", {"timeout_s": timeout}, timeout=timeout + 60)
    except OSError:
        return None
    if status == 409:
        raise UsageError("the exporter is already taking a snapshot")
    try:
        return Snapshot(**json.loads(body))
    except (ValueError, TypeError):
        return None


@app.command("export")
def export_cmd(
    runs: list[str] = typer.Argument(..., help="RUN, or RUN_A RUN_B for an A/B pair (run ids or run directories)."),
    fmt: str = typer.Option("llm-d", "--format", help="Output format: llm-d (llm-d Benchmark Report v0.2.1)."),
    out: Path = typer.Option(
        None, "--out", help="Directory for the reports (default: <results>/export/llm-d/<RUN> or <A>_vs_<B>)."
    ),
) -> None:
    """Write a load-test run (or an A/B pair) as llm-d Benchmark Report v0.2.1 JSON, one document per point."""
    from sparsemla import flags
    from sparsemla.loadtest.export_llmd import FORMATS, VERSION, ExportError, export_pair, export_run, load_run

    if fmt not in FORMATS:
        fail(f"unknown format {fmt!r}", f"use --format {' | '.join(FORMATS)}")
    if len(runs) not in (1, 2):
        fail(f"got {len(runs)} runs", "pass one run, or two (A then B) for an A/B pair")
    try:
        loaded = [load_run(r) for r in runs]
    except ExportError as exc:
        fail(str(exc))
    name = loaded[0].label if len(loaded) == 1 else f"{loaded[0].label}_vs_{loaded[1].label}"
    out_dir = out or Path(flags.SPARSEMLA_RESULTS_DIR.get()) / "export" / "llm-d" / name
    written = export_run(loaded[0], out_dir) if len(loaded) == 1 else export_pair(loaded[0], loaded[1], out_dir)
    for path in written:
        console.print(f"wrote {path}")
    console.print(f"{len(written)} llm-d Benchmark Report v{VERSION} document(s) in {out_dir}")


def _print_summary(snap: Snapshot, via: str) -> None:
    from rich.table import Table

    summary = snap.summary or {}
    table = Table(title=f"kernel shares, variant {snap.variant} ({via}, {len(snap.files)} trace files)")
    for col in ("share", "time ms", "calls", "category", "kernel"):
        table.add_column(col, justify="right" if col in ("share", "time ms", "calls") else "left")
    for k in summary["kernels"]:
        table.add_row(f"{k['share']:.1%}", f"{k['time_us'] / 1e3:.3f}", str(k["calls"]), k["category"], k["name"])
    console.print(table)
    console.print("  ".join(f"{c} {s:.1%}" for c, s in summary["categories"].items()))
