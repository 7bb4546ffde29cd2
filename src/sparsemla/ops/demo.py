"""`make demo`: the whole loop on the simulator, no GPU, no Docker, a few minutes.

The loop this project comes from, replayed: flags off, flip ``SPARSEMLA_MMA_DECODE``, then ``SPARSEMLA_TRITON_INDEXER``
on top, each step measured by a sweep and explained by a kernel-share profile.

1. start the simulator with every kernel flag off, the kernel-share exporter, and Prometheus when available (the stack
   installs Debian's package when it can, otherwise the demo runs without it and says so) through
   :mod:`sparsemla.ops.stack`;
2. run :func:`sparsemla.loadtest.campaign.run_campaign` over the variants baseline -> mma_decode ->
   mma_decode+triton_indexer: per variant a restart with its flags (a flag-flip annotation), a sweep C = 1, 16, 64
   (short points), a kernel-share snapshot through the exporter under C = 16 (what `sparsemla profile` takes); per
   step (baseline vs mma_decode, mma_decode vs mma_decode+triton_indexer) an A/B report with both snapshots and the
   dashboard's compare panels rendered from the demo's Prometheus;
3. print each step's A/B table and kernel shares, how the measured tok/s ratios compare with the simulator's
   calibrated decode-step ratios (:func:`calibrated_ratios`), what flags off is (sglang's fallback) and flags on vs
   sglang's fast path (the calibration's reference state, as ``/server_info`` reported it), and write
   ``results/demo/report.html`` (+ report.md, campaign.json, demo.json; the steps' reports, PNGs and panels under
   ``steps/``);
4. stop everything it started (by PID, through the stack's PID files), also on Ctrl-C, SIGTERM and errors.

The default workload is :data:`sparsemla.loadtest.workload.DEMO_WORKLOAD` (short prompts, few output tokens,
``ignore_eos``; why is written there, next to the load-test default); durations and points are options so CI can run
a short version (``sparsemla demo --point-seconds 4 --concurrency "1 8"``).
"""

from __future__ import annotations

import math
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
    from sparsemla.loadtest.campaign import CampaignResult
    from sparsemla.loadtest.report import Row
    from sparsemla.ops.stack import StackUrls

# The project's own campaign: flags off, then the MMA decode, then the Triton indexer on top of it.
DEFAULT_VARIANTS: tuple[str, ...] = (variant.BASELINE, variant.compose(["mma_decode"]), variant.ALL_ON)

app = typer.Typer()


def _pick_port(preferred: int) -> int:
    return preferred if preferred and not procs.port_in_use(preferred) else procs.free_port()


def calibrated_ratios(
    variant_a: str, variant_b: str, concurrencies: Sequence[int], context: float = 100.0
) -> dict[int, float]:
    """Decode-step time ratio ``variant_a`` / ``variant_b`` at batch = C from the simulator's calibration: the tok/s
    ratio B/A that a decode-bound point measures (prefill steps, which no kernel flag changes, pull it towards 1)."""
    from sparsemla.ops.sim.calibration import load_calibration

    cal = load_calibration()
    a, b = cal.state(variant_a), cal.state(variant_b)
    return {c: a.step_seconds(c, context) / b.step_seconds(c, context) for c in concurrencies}


def ratio_checks(rows: Sequence[Row], variant_a: str, variant_b: str, points: Sequence[int]) -> list[dict[str, Any]]:
    """Per concurrency, the measured speed-ups against :func:`calibrated_ratios`, with a one-line ``text`` each.

    Two speed-ups: the decode step's (ITL p50 of A / of B: every gap between two tokens is one decode step, so it
    must match the calibration closely) and the output tok/s B/A, which gains less where prefill (which no kernel
    flag changes) takes a large share of a request's time: short requests on the fast variants."""
    expected = calibrated_ratios(variant_a, variant_b, points)
    checks = []
    for c in points:
        tok = next(r for r in rows if r.concurrency == c and r.metric.key == "output_tok_per_s")
        itl = next(r for r in rows if r.concurrency == c and r.metric.key == "itl_p50")
        step = 1 / itl.ratio.value if itl.ratio.value > 0 else math.nan
        deviation, step_deviation = tok.ratio.value / expected[c] - 1, step / expected[c] - 1
        measured_step = f"×{step:.2f} ({step_deviation:+.1%})" if math.isfinite(step) else "not measured (no ITL)"
        text = (
            f"C={c:<3} calibrated decode-step speed-up ×{expected[c]:.2f}; measured decode step (ITL p50) "
            f"{measured_step}, output tok/s ×{tok.ratio.value:.2f} ({deviation:+.1%})"
        )
        checks.append({"concurrency": c, "measured_ratio": tok.ratio.value, "calibrated_ratio": expected[c],
                       "deviation": deviation, "step_ratio": step, "step_deviation": step_deviation,
                       "text": text})  # fmt: skip
    return checks


CHECK_NOTE = (
    "The simulator against its own calibration: the decode step (ITL p50) must speed up by the calibrated ratio; "
    "output tok/s gains less where prefill, which no kernel flag changes, is a large share of a request's time "
    "(the demo's short requests on the fast variants)."
)
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
    variants: str = typer.Option(
        " ".join(DEFAULT_VARIANTS), "--variants", help="The campaign: variants in order, each one more flag on."
    ),
    port: int = typer.Option(ports.PORT_SERVER, "--port", help="Simulator port (a free one is used when taken)."),
    prometheus: bool = typer.Option(None, "--prometheus/--no-prometheus", help="Default: use it when available."),
    run_dir: Path = typer.Option(Path(".run/demo"), "--run-dir", help="PID files and logs of what the demo starts."),
    out: Path = typer.Option(None, "--out", help="Report directory (default: $SPARSEMLA_RESULTS_DIR/demo)."),
) -> None:
    """The whole loop without a GPU: simulator, flags off, flip one kernel flag after another, sweep and profile each,
    A/B report per step."""
    from sparsemla.loadtest import display
    from sparsemla.loadtest.annotations import Grafana
    from sparsemla.loadtest.campaign import (
        CampaignError,
        StepResult,
        parse_variants,
        plan_steps,
        run_campaign,
        variant_env,
    )
    from sparsemla.loadtest.options import LoadOptions
    from sparsemla.loadtest.profile_load import profile_concurrency
    from sparsemla.loadtest.report_campaign import comparison, glance_rows, write_campaign_report
    from sparsemla.loadtest.runner import auto_warmup
    from sparsemla.loadtest.summary import write_json_atomic
    from sparsemla.loadtest.sweep import parse_concurrency_list
    from sparsemla.ops import stack

    started = time.monotonic()
    try:
        points = parse_concurrency_list(concurrency)
        names = parse_variants(variants)
        steps = plan_steps(names)
    except (ValueError, CampaignError) as exc:
        fail(str(exc), f"e.g. --variants {' '.join(DEFAULT_VARIANTS)!r}")
    out = out or Path(flags.SPARSEMLA_RESULTS_DIR.get()) / "demo"
    try:
        clear_report_dir(out)
    except UsageError as exc:
        fail(str(exc), "pass --out a new or empty directory, or one an earlier demo wrote")
    port = _pick_port(port)
    old_handler = signal.signal(signal.SIGTERM, _raise_interrupt)
    grafana = Grafana.from_flags()
    checks: dict[int, list[dict[str, Any]]] = {}

    def on_step(result: StepResult) -> None:
        step = result.step
        display.print_table(result.rows, f"{step.title} (simulator)")
        display.print_kernels(result.kernels, f"{step.title}: share of GPU time per kernel category")
        display.print_panels(result.report_dir)
        checks[step.index] = ratio_checks(result.rows, step.a, step.b, points)
        for check in checks[step.index]:
            console.print(check["text"])

    try:
        console.rule("[bold]sparsemla demo")
        console.print(f"1/3 starting the simulator ({names[0]}) and the kernel-share exporter on :{port} ...")
        locust_metrics_port = _pick_port(ports.PORT_LOCUST_METRICS)  # Prometheus scrapes the load generator there
        urls = stack.up(
            server="sim",
            sim_env=variant_env(names[0]),
            prometheus=prometheus,
            exporter=True,
            run_dir=run_dir,
            port=port,
            prometheus_port=_pick_port(ports.PORT_PROMETHEUS),
            exporter_port=_pick_port(ports.PORT_EXPORTER),
            locust_metrics_port=locust_metrics_port,
            tied=True,  # a SIGKILL of the demo (no handler runs) takes its simulator, exporter and Prometheus down too
        )
        console.print(f"    simulator {urls.server}, kernel-share exporter {urls.exporter}")
        if urls.prometheus:
            console.print(f"    prometheus {urls.prometheus} (scraping simulator, exporter and load generator)")
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
        flips = " -> ".join(f"+{s.flag}" for s in steps)
        console.print(
            f"2/3 campaign {names[0]} {flips}: per variant a sweep C={points} ({point_seconds:g}s per point) and a "
            f"kernel-share snapshot under C={profile_concurrency(points)} ..."
        )

        def on_point(name: str, index: int, total: int) -> None:
            console.print(f"      {name} ({index + 1}/{total})")

        result = run_campaign(
            names, points, 1, base, out_dir=out, exporter=urls.exporter, restart="sim", fresh_start=True,
            stack_run_dir=run_dir, prometheus=urls.prometheus, grafana=grafana, extra_meta={"demo": True},
            on_phase=lambda msg: console.print(f"    {msg}"), on_point=on_point,
            on_sweep=lambda _name, summaries: display.print_sweep(summaries), on_step=on_step,
        )  # fmt: skip
        headers, glance = glance_rows(result)
        display.print_grid(headers, glance, "output tok/s by variant (simulator)")
        for line in comparison(result):  # vs sglang's fallback / fast path, from the calibration /server_info reported
            console.print(line, markup=False)
        notes = [CHECK_NOTE, *[f"Step {i}: {c['text']}" for i, step_checks in checks.items() for c in step_checks]]
        files = write_campaign_report(
            result, title=f"sparsemla demo: {' → '.join(names)} on the simulator", intro=demo_intro(points, workload),
            notes=notes, grafana_url=grafana.url if grafana else None,
        )  # fmt: skip
        elapsed = time.monotonic() - started
        write_json_atomic(out / "demo.json", demo_summary(result, checks, point_seconds, workload, elapsed, urls))
        console.print(f"3/3 report: {files['html']} (+ report.md, campaign.json, steps/) — {elapsed:.0f}s")
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping what the demo started[/]")
        raise typer.Exit(130) from None
    except Exception as exc:
        if isinstance(exc, (*display.load_errors(), CampaignError)):
            fail(str(exc), f"logs under {run_dir}")
        raise
    finally:
        stopped = stack.down(run_dir)
        signal.signal(signal.SIGTERM, old_handler)
        if stopped:
            console.print(f"stopped: {', '.join(stopped)}")


def demo_intro(points: Sequence[int], workload: str) -> list[str]:
    """The lines under the report's title: what ran, on which calibration."""
    from sparsemla.ops.sim.calibration import load_calibration

    cal = load_calibration()
    return [
        f"A simulated sglang server ({cal.label()}: {cal.path}); workload `{workload}`, points C={list(points)}. "
        "Every variant is swept once and profiled once (the kernel-share exporter, under load); each step compares "
        "two neighbouring variants, which differ in one kernel flag."
    ]


def demo_summary(
    result: CampaignResult,
    checks: dict[int, list[dict[str, Any]]],
    point_seconds: float,
    workload: str,
    elapsed: float,
    urls: StackUrls,
) -> dict[str, Any]:
    """demo.json: the campaign's variants, steps (with the calibration check), snapshots and where everything is."""
    return {
        "variants": list(result.variants),
        "points": result.points,
        "point_seconds": point_seconds,
        "workload": workload,
        "steps": [s.summary() | {"ratios": checks.get(s.step.index, [])} for s in result.steps],
        # where each snapshot is and whether it worked; the kernel tables themselves are in campaign.json
        "snapshots": {name: v.snapshot.to_json() | {"snapshot": None} for name, v in result.variants.items()},
        "elapsed_s": elapsed,
        "prometheus": urls.prometheus,
        "exporter": urls.exporter,
        "report": str(result.out_dir / "report.html"),
    }
