"""`make demo`: the whole loop on the simulator, no GPU, no Docker, a few minutes.

1. start the simulator with the kernel flag off (and Prometheus when available; the stack installs Debian's package
   when it can, otherwise the demo runs without it and says so) through :mod:`sparsemla.ops.stack`;
2. run :func:`sparsemla.loadtest.ab.run_ab`, the loop of `sparsemla ab`: restart with the flag off, sweep C = 1, 16,
   64 (short points), restart with ``SPARSEMLA_MMA_DECODE=1``, sweep again, check the flag flipped, compare, and write
   ``results/demo/report.html`` (+ report.md, PNG plots, and the dashboard's compare panels rendered from the demo's
   Prometheus when it runs);
3. print the A/B table and how the measured tok/s ratios compare with the simulator's calibrated decode-step ratios
   (:func:`calibrated_ratios`), also into ``results/demo/demo.json``;
4. stop everything it started (by PID, through the stack's PID files), also on Ctrl-C, SIGTERM and errors.

The default workload is :data:`sparsemla.loadtest.workload.DEMO_WORKLOAD` (short prompts, few output tokens,
``ignore_eos``; why is written there, next to the load-test default); durations and points are options so CI can run
a short version (``sparsemla demo --point-seconds 4 --concurrency "1 8"``).
"""

from __future__ import annotations

import shutil
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from sparsemla import flags, ports, procs, variant
from sparsemla.console import UsageError, console, fail
from sparsemla.loadtest.workload import DEMO_WORKLOAD

if TYPE_CHECKING:
    from sparsemla.loadtest.report import Row

app = typer.Typer()


def _pick_port(preferred: int) -> int:
    return preferred if preferred and not procs.port_in_use(preferred) else procs.free_port()


def calibrated_ratios(flag_variant: str, concurrencies: list[int], context: float = 100.0) -> dict[int, float]:
    """Decode-step time ratio baseline / ``flag_variant`` at batch = C from the simulator's calibration (tok/s B/A)."""
    from sparsemla.ops.sim.calibration import load_calibration

    cal = load_calibration()
    base, other = cal.state(variant.BASELINE), cal.state(flag_variant)
    return {c: base.step_seconds(c, context) / other.step_seconds(c, context) for c in concurrencies}


def ratio_checks(rows: Sequence[Row], variant: str, points: list[int]) -> list[dict[str, float]]:
    """Measured tok/s ratio B/A per concurrency against :func:`calibrated_ratios`, printed one line each."""
    expected = calibrated_ratios(variant, points)
    checks = []
    for c in points:
        row = next(r for r in rows if r.concurrency == c and r.metric.key == "output_tok_per_s")
        deviation = row.ratio.value / expected[c] - 1
        checks.append({"concurrency": c, "measured_ratio": row.ratio.value, "calibrated_ratio": expected[c],
                       "deviation": deviation})  # fmt: skip
        console.print(
            f"C={c:<3} tok/s ratio B/A measured {row.ratio.value:.2f}, calibrated decode-step ratio "
            f"{expected[c]:.2f} ({deviation:+.1%})"
        )
    return checks


DEMO_MARKER = ".sparsemla-demo"  # written first into every demo report directory: what makes it ours to replace


def clear_report_dir(out: Path) -> None:
    """Make ``out`` an empty demo report directory. It is deleted only when it is a demo's own (the marker, or the
    ``demo.json`` of a finished earlier demo); any other non-empty path is refused (UsageError): a typed ``--out``
    never deletes someone else's data."""
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UsageError(f"--out {out} is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not ((out / DEMO_MARKER).is_file() or (out / "demo.json").is_file()):
            raise UsageError(f"--out {out} is not empty and was not written by a demo; nothing was deleted")
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / DEMO_MARKER).write_text("written by `sparsemla demo`; the next demo with this --out replaces the folder\n")


def _raise_interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@app.command("demo")
def demo(
    point_seconds: float = typer.Option(12.0, "--point-seconds", min=1.0, help="Measured seconds per sweep point."),
    concurrency: str = typer.Option("1 16 64", "--concurrency", "-c", help="Sweep points."),
    workload: str = typer.Option(DEMO_WORKLOAD, "--workload", help="Workload spec (see `sparsemla loadtest`)."),
    flag: str = typer.Option("SPARSEMLA_MMA_DECODE", "--flag", help="Kernel flag flipped between the sweeps."),
    port: int = typer.Option(ports.PORT_SERVER, "--port", help="Simulator port (a free one is used when taken)."),
    prometheus: bool = typer.Option(None, "--prometheus/--no-prometheus", help="Default: use it when available."),
    run_dir: Path = typer.Option(Path(".run/demo"), "--run-dir", help="PID files and logs of what the demo starts."),
    out: Path = typer.Option(None, "--out", help="Report directory (default: $SPARSEMLA_RESULTS_DIR/demo)."),
) -> None:
    """The whole loop without a GPU: simulator, sweep flag off, flip, sweep flag on, A/B report."""
    from sparsemla.loadtest import display
    from sparsemla.loadtest.ab import ABError, require_kernel_flag, run_ab
    from sparsemla.loadtest.annotations import Grafana
    from sparsemla.loadtest.options import LoadOptions
    from sparsemla.loadtest.runner import auto_warmup
    from sparsemla.loadtest.summary import write_json_atomic
    from sparsemla.loadtest.sweep import parse_concurrency_list
    from sparsemla.ops import stack

    started = time.monotonic()
    try:
        points = parse_concurrency_list(concurrency)
        require_kernel_flag(flag)
    except ValueError as exc:
        fail(str(exc))
    except ABError as exc:
        fail(str(exc), "see `sparsemla flags`")
    out = out or Path(flags.SPARSEMLA_RESULTS_DIR.get()) / "demo"
    try:
        clear_report_dir(out)
    except UsageError as exc:
        fail(str(exc), "pass --out a new or empty directory, or one an earlier demo wrote")
    port = _pick_port(port)
    old_handler = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        console.rule("[bold]sparsemla demo")
        console.print(f"1/3 starting the simulator ({flag}=0) on :{port} ...")
        locust_metrics_port = _pick_port(ports.PORT_LOCUST_METRICS)  # Prometheus scrapes the load generator there
        urls = stack.up(
            server="sim",
            sim_env={flag: "0"},
            prometheus=prometheus,
            exporter=False,
            run_dir=run_dir,
            port=port,
            prometheus_port=_pick_port(ports.PORT_PROMETHEUS),
            locust_metrics_port=locust_metrics_port,
            tied=True,  # a SIGKILL of the demo (no handler runs) takes its simulator and Prometheus down too
        )
        console.print(f"    simulator {urls.server}")
        if urls.prometheus:
            console.print(f"    prometheus {urls.prometheus} (scraping the simulator and the load generator)")
        else:
            console.print(
                "    [yellow]prometheus not available (not installed and apt unusable): running without it[/]"
            )
        opts = LoadOptions(
            target=urls.server,
            duration=f"{point_seconds}s",
            workload=workload,
            warmup=f"{min(auto_warmup(point_seconds), 3.0)}s",
            metrics_port=locust_metrics_port,
            request_timeout=120.0,
        )
        try:
            base = opts.config(points[0])
        except ValueError as exc:  # a bad --workload (WorkloadError is a ValueError)
            raise UsageError(str(exc)) from None
        console.print(f"2/3 A/B {flag}: sweep C={points} with {flag}=0 and =1, {point_seconds:g}s per point ...")

        def on_point(name: str, index: int, total: int) -> None:
            console.print(f"      {name} ({index + 1}/{total})")

        result = run_ab(
            flag, points, 1, base, restart="sim", run_id="demo", run_dirs=(out / "a-flag-off", out / "b-flag-on"),
            report_dir=out, title=f"sparsemla demo: {flag} off (A) vs on (B) on the simulator",
            stack_run_dir=run_dir, restore=False, extra_meta={"demo": True}, on_point=on_point,
            on_phase=lambda msg: console.print(f"    {msg}"),
            on_sweep=lambda _side, summaries: display.print_sweep(summaries),
            grafana=Grafana.from_flags(), prometheus=urls.prometheus,
        )  # fmt: skip
        display.print_table(result.rows, f"A/B {flag}: A = off, B = on (simulator)")
        display.print_panels(out)
        variant = result.b.variant()
        checks = ratio_checks(result.rows, variant, points)
        elapsed = time.monotonic() - started
        write_json_atomic(
            out / "demo.json",
            {"flag": flag, "variant_b": variant, "points": points, "point_seconds": point_seconds,
             "workload": workload, "ratios": checks, "elapsed_s": elapsed, "prometheus": urls.prometheus},
        )  # fmt: skip
        console.print(f"3/3 report: {result.report['html']} (+ report.md, PNGs) — {elapsed:.0f}s")
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping what the demo started[/]")
        raise typer.Exit(130) from None
    except Exception as exc:
        if isinstance(exc, display.load_errors()):
            fail(str(exc), f"logs under {run_dir}")
        raise
    finally:
        stopped = stack.down(run_dir)
        signal.signal(signal.SIGTERM, old_handler)
        if stopped:
            console.print(f"stopped: {', '.join(stopped)}")
