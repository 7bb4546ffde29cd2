"""`make demo`: the whole loop on the simulator, no GPU, no Docker, a few minutes.

1. start the simulator with the kernel flag off (and Prometheus when available; the stack installs Debian's package
   when it can, otherwise the demo runs without it and says so);
2. sweep C = 1, 16, 64 (short points);
3. restart the simulator with ``SPARSEMLA_MMA_DECODE=1``;
4. sweep again;
5. write ``results/demo/report.html`` (+ report.md, PNG plots, and the dashboard's compare panels rendered from the
   demo's Prometheus when it runs), print the A/B table and how the measured tok/s ratios compare with the
   simulator's calibrated decode-step ratios;
6. stop everything it started (by PID, through the stack's PID files), also on Ctrl-C, SIGTERM and errors.

The default workload (``random:64:24``: short prompts, 24 output tokens, ``ignore_eos``) keeps prefill a small share of
the time, so the tok/s ratio tracks the calibrated decode-step ratio; durations and points are options so CI can run a
short version (``sparsemla demo --point-seconds 4 --concurrency "1 8"``).
"""

from __future__ import annotations

import shutil
import signal
import time
from pathlib import Path
from typing import Any

import typer

from sparsemla import flags, procs
from sparsemla import metric_names as mn
from sparsemla.console import UsageError, console, fail

app = typer.Typer()


def _pick_port(preferred: int) -> int:
    return preferred if preferred and not procs.port_in_use(preferred) else procs.free_port()


def calibrated_ratios(flag_variant: str, concurrencies: list[int], context: float = 100.0) -> dict[int, float]:
    """Decode-step time ratio baseline / ``flag_variant`` at batch = C from the simulator's calibration (tok/s B/A)."""
    from sparsemla.ops.sim.calibration import load_calibration

    cal = load_calibration()
    base, other = cal.state("baseline"), cal.state(flag_variant)
    return {c: base.step_seconds(c, context) / other.step_seconds(c, context) for c in concurrencies}


def _raise_interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


@app.command("demo")
def demo(
    point_seconds: float = typer.Option(12.0, "--point-seconds", min=1.0, help="Measured seconds per sweep point."),
    concurrency: str = typer.Option("1 16 64", "--concurrency", "-c", help="Sweep points."),
    workload: str = typer.Option("random:64:24", "--workload", help="Workload spec (see `sparsemla loadtest`)."),
    flag: str = typer.Option("SPARSEMLA_MMA_DECODE", "--flag", help="Kernel flag flipped between the sweeps."),
    port: int = typer.Option(mn.PORT_SERVER, "--port", help="Simulator port (a free one is used when taken)."),
    prometheus: bool = typer.Option(None, "--prometheus/--no-prometheus", help="Default: use it when available."),
    run_dir: Path = typer.Option(Path(".run/demo"), "--run-dir", help="PID files and logs of what the demo starts."),
    out: Path = typer.Option(None, "--out", help="Report directory (default: $SPARSEMLA_RESULTS_DIR/demo)."),
) -> None:
    """The whole loop without a GPU: simulator, sweep flag off, flip, sweep flag on, A/B report."""
    from sparsemla.loadtest.ab import flip_flag, wait_for_flag
    from sparsemla.loadtest.annotations import Grafana
    from sparsemla.loadtest.cli import _print_panels, print_table
    from sparsemla.loadtest.report import check_flag_flipped, compare_runs, load_run, write_report
    from sparsemla.loadtest.runner import LoadTestConfig, auto_warmup
    from sparsemla.loadtest.summary import write_json_atomic
    from sparsemla.loadtest.sweep import parse_concurrency_list, run_sweep
    from sparsemla.ops import stack

    started = time.monotonic()
    try:
        points = parse_concurrency_list(concurrency)
    except ValueError as exc:
        fail(str(exc))
    known = flags.REGISTRY.get(flag)
    if known is None or known.group != "kernels" or not isinstance(known.default, bool):
        fail(f"{flag} is not a boolean kernel flag", "see `sparsemla flags`")
    out = out or Path(flags.SPARSEMLA_RESULTS_DIR.get()) / "demo"
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    port = _pick_port(port)
    old_handler = signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        console.rule("[bold]sparsemla demo")
        console.print(f"1/5 starting the simulator ({flag}=0) on :{port} ...")
        locust_metrics_port = _pick_port(mn.PORT_LOCUST_METRICS)  # Prometheus scrapes the load generator there
        urls = stack.up(
            server="sim",
            sim_env={flag: "0"},
            prometheus=prometheus,
            exporter=False,
            run_dir=run_dir,
            port=port,
            prometheus_port=_pick_port(mn.PORT_PROMETHEUS),
            locust_metrics_port=locust_metrics_port,
        )
        console.print(f"    simulator {urls.server}")
        if urls.prometheus:
            console.print(f"    prometheus {urls.prometheus} (scraping the simulator and the load generator)")
        else:
            console.print(
                "    [yellow]prometheus not available (not installed and apt unusable): running without it[/]"
            )
        base = LoadTestConfig(
            target=urls.server,
            concurrency=points[0],
            duration_s=point_seconds,
            workload=workload,
            warmup_s=min(auto_warmup(point_seconds), 3.0),
            metrics_port=locust_metrics_port,
            request_timeout_s=120.0,
        )
        runs = {}
        for step, (side, value) in enumerate((("a-flag-off", "0"), ("b-flag-on", "1"))):
            if value == "1":
                console.print(f"3/5 restarting the simulator with {flag}=1 ...")
                flip_flag("sim", flag, "1", target=urls.server, run_dir=run_dir, grafana=Grafana.from_flags(),
                          say=console.print)  # fmt: skip
            else:
                wait_for_flag(urls.server, flag, "off", timeout_s=30)
            console.print(f"{2 + 2 * step}/5 sweep {side}: C={points}, {point_seconds:g}s per point ...")
            run_path = out / side

            def on_point(name: str, index: int, total: int, side: str = side) -> None:
                console.print(f"    {side} {name} ({index + 1}/{total})")

            summaries = run_sweep(base, points, 1, run_path, on_point=on_point, extra_meta={"demo": True})
            for s in summaries:
                console.print(
                    f"      C={s['concurrency']:<3} {s['output_tok_per_s']:8.1f} tok/s  "
                    f"ITL p50 {(s['itl_s']['p50'] or 0) * 1000:6.1f} ms  failures {s['failures']['total']}"
                )
            runs[side] = load_run(run_path)
        a, b = runs["a-flag-off"], runs["b-flag-on"]
        check_flag_flipped(a, b, flag)
        rows = compare_runs(a, b)
        if urls.prometheus:
            console.print("    rendering the dashboard's compare panels from Prometheus ...")
        files = write_report(
            a, b, rows, out, title=f"sparsemla demo: {flag} off (A) vs on (B) on the simulator",
            prometheus=urls.prometheus,
        )  # fmt: skip
        print_table(rows, f"A/B {flag}: A = off, B = on (simulator)")
        _print_panels(out)
        variant = b.variant()
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
        elapsed = time.monotonic() - started
        write_json_atomic(
            out / "demo.json",
            {"flag": flag, "variant_b": variant, "points": points, "point_seconds": point_seconds,
             "workload": workload, "ratios": checks, "elapsed_s": elapsed, "prometheus": urls.prometheus},
        )  # fmt: skip
        console.print(f"5/5 report: {files['html']} (+ report.md, PNGs) — {elapsed:.0f}s")
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping what the demo started[/]")
        raise typer.Exit(130) from None
    except UsageError as exc:
        fail(str(exc))
    except Exception as exc:
        from sparsemla.loadtest.cli import _errors

        if isinstance(exc, _errors()):
            fail(str(exc), f"logs under {run_dir}")
        raise
    finally:
        stopped = stack.down(run_dir)
        signal.signal(signal.SIGTERM, old_handler)
        if stopped:
            console.print(f"stopped: {', '.join(stopped)}")
