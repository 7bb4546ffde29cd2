"""`sparsemla up`, `down`, `exporter`, `profile`: the deployment commands the Makefile calls."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from sparsemla.console import UsageError, console, fail
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


@app.command("profile")
def profile_cmd(
    target: str = typer.Option(..., "--target", help="Server base URL."),
    exporter: str = typer.Option(
        f"http://127.0.0.1:{PORT_EXPORTER}", "--exporter", help="Exporter to ask first (its gauges then update)."
    ),
    num_steps: int = typer.Option(10, "--num-steps", help="Forward steps to profile."),
    timeout: float = typer.Option(120.0, "--timeout", help="Seconds to wait for the traces."),
    trace_dir: Path = typer.Option(None, "--trace-dir", help="Trace directory when profiling directly."),
    top_n: int = typer.Option(15, "--top-n"),
    as_json: bool = typer.Option(False, "--json", help="Print the snapshot as JSON."),
    api_key: str = typer.Option("", "--api-key", help=_API_KEY_HELP + " Used when profiling directly."),
    max_trace_mib: int = typer.Option(512, "--max-trace-mib", help=_MAX_TRACE_MIB_HELP),
) -> None:
    """Take one kernel-share snapshot: through the running exporter if there is one, else directly; print the table."""
    from sparsemla.ops.exporter import KernelShareExporter, Snapshot, SnapshotBusy, _http

    snap: Snapshot | None = None
    via = "exporter " + exporter
    try:
        status, body = _http("POST", exporter.rstrip("/") + "/snapshot", timeout=timeout + 60)
        if status == 409:
            fail("the exporter is already taking a snapshot", "wait for it and retry")
        snap = Snapshot(**json.loads(body))
    except (OSError, ValueError, TypeError):
        snap = None
    if snap is None:
        via = "direct"
        cfg = _config(
            target, num_steps=num_steps, timeout_s=timeout, trace_dir=trace_dir, top_n=top_n, api_key=api_key,
            max_trace_bytes=max_trace_mib * 2**20,
        )  # fmt: skip
        with console.status(f"profiling {cfg.target} for {num_steps} steps ..."):
            try:
                snap = KernelShareExporter(cfg).take_snapshot()
            except SnapshotBusy as exc:
                fail(str(exc))
    if as_json:
        print(json.dumps(asdict(snap), indent=1))
    if snap.outcome != "ok" or not snap.summary:
        fail(f"snapshot {snap.outcome} ({via}): {snap.error}", "the server must be generating while it is profiled")
    if not as_json:
        _print_summary(snap, via)


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
