"""`sparsemla ab`: sweep with a flag off, restart the target with it on, sweep again, compare.

How the target is restarted (``--restart``):
- ``sim`` (default): the simulator started by `make up` / the demo, through ``sparsemla.ops.stack.restart_server``;
- ``compose``: ``docker compose up -d --force-recreate sglang`` with the flag in the environment (compose passes it to
  the container when the service lists it under ``environment:``);
- anything else: a shell command run with the flag in its environment (``SPARSEMLA_MMA_DECODE=1`` or ``=0``).
After each restart the target must answer ``/health`` and, when it exports ``sparsemla_kernel_flags_info``, report the
new flag value before the sweep starts. The comparison refuses runs whose ``server_flags`` do not differ in the flag.

When ``GRAFANA_URL`` is set, every flip (A, B and the restore) is posted as a Grafana annotation tagged ``ab``,
``variant=<v>`` and ``flag=<FLAG>`` (:mod:`sparsemla.loadtest.annotations`), and both runs as ``loadtest`` regions.

:func:`run_ab` is the whole loop for `sparsemla ab` and for the demo (which only starts the stack around it and checks
the ratios against the simulator's calibration); its hooks (``on_phase``, ``on_point``, ``on_sweep``) are where the
front ends print.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sparsemla import flags
from sparsemla.loadtest.annotations import Grafana, flag_flip_body, post_run_annotations
from sparsemla.loadtest.report import Row, Run, check_flag_flipped, compare_runs, load_run, write_report
from sparsemla.loadtest.runner import LoadTestConfig, results_root
from sparsemla.loadtest.sweep import PointCallback, run_sweep
from sparsemla.loadtest.target import TargetError, TargetInfo, probe

COMPOSE_RESTART = ("docker", "compose", "up", "-d", "--force-recreate", "sglang")
SweepCallback = Callable[[str, list[dict[str, Any]]], None]  # (side "A"/"B", the side's point summaries)


class ABError(RuntimeError):
    """The A/B run cannot proceed (restart failed, flag not applied, ...)."""


def require_kernel_flag(flag: str) -> None:
    """Raise ABError unless ``flag`` is a boolean flag of the kernels (the only kind an A/B run can flip)."""
    known = flags.REGISTRY.get(flag)
    if known is None or not isinstance(known.default, bool) or known.group != "kernels":
        raise ABError(f"{flag} is not a boolean kernel flag")


def flag_label(value: str) -> str:
    """The label value a server reports for a boolean flag set to ``value`` ("on"/"off")."""
    return "on" if flags.is_true(value) else "off"


def restart_target(
    mode: str, flag: str, value: str, *, target: str, run_dir: Path = Path(".run"), timeout_s: float = 180.0
) -> TargetInfo:
    """Restart the target with ``flag=value`` and wait until it serves with it (see the module docstring); returns
    what the target then says about itself (its ``variant`` included)."""
    overrides = {flag: value}
    if mode == "sim":
        from sparsemla.ops import stack

        stack.restart_server(overrides, run_dir=run_dir)
    else:
        argv: list[str] | str = list(COMPOSE_RESTART) if mode == "compose" else mode
        result = subprocess.run(
            argv, shell=isinstance(argv, str), env=flags.child_env(overrides), capture_output=True, text=True
        )
        if result.returncode != 0:
            raise ABError(f"restart command {argv!r} failed ({result.returncode}): {result.stderr.strip()[-500:]}")
    return wait_for_flag(target, flag, flag_label(value), timeout_s=timeout_s)


def flip_flag(
    mode: str,
    flag: str,
    value: str,
    *,
    target: str,
    run_dir: Path = Path(".run"),
    grafana: Grafana | None = None,
    say: Callable[[str], None] | None = None,
    timeout_s: float = 180.0,
) -> TargetInfo:
    """:func:`restart_target`, then (when ``grafana`` is given) post the flip as an ``ab`` annotation covering the
    restart. A Grafana that cannot be reached is reported through ``say`` and never stops the A/B run."""
    began = time.time()
    info = restart_target(mode, flag, value, target=target, run_dir=run_dir, timeout_s=timeout_s)
    if grafana is not None:
        body = flag_flip_body(flag, value, info.variant, began, time.time(), target)
        try:
            grafana.post(body)
        except Exception as exc:  # noqa: BLE001 (annotations are a bonus; the A/B run goes on)
            (say or (lambda _m: None))(f"could not post the flip annotation to {grafana.url}: {exc}")
    return info


def wait_for_flag(target: str, flag: str, expected: str, *, timeout_s: float = 180.0) -> TargetInfo:
    """Poll the target until it is up and (when it exports kernel flags) reports ``flag`` = ``expected``; returns
    the target's description at that moment."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            info = probe(target, timeout=5)
        except TargetError as exc:
            last = str(exc)
        else:
            value = info.server_flags.get(flag.lower())
            if value is None or value == expected:
                return info
            last = f"{flag.lower()}={value}"
        time.sleep(1.0)
    raise ABError(f"{target} did not come back with {flag.lower()}={expected} within {timeout_s:.0f}s ({last})")


@dataclass
class ABResult:
    """Both runs (A: flag off, B: flag on), the comparison rows and the report's files (``html``, ``md``, PNGs)."""

    a: Run
    b: Run
    rows: list[Row]
    report: dict[str, Path]


def run_ab(
    flag: str,
    concurrencies: list[int],
    repeat: int,
    base: LoadTestConfig,
    *,
    restart: str = "sim",
    run_id: str,
    run_dirs: tuple[Path, Path] | None = None,
    report_dir: Path | None = None,
    title: str | None = None,
    stack_run_dir: Path = Path(".run"),
    restore: bool = True,
    extra_meta: dict[str, Any] | None = None,
    on_point: PointCallback | None = None,
    on_phase: Callable[[str], None] | None = None,
    on_sweep: SweepCallback | None = None,
    grafana: Grafana | None = None,
    prometheus: str | None = None,
) -> ABResult:
    """Sweep A (flag off) and B (flag on), then compare; returns both runs, the table rows and the report files.

    Both sides start from a restart with the flag set (:func:`flip_flag`), so both measure a freshly started target.
    ``run_dirs`` (A, B) default to ``results/loadtest/<run_id>-<flag>-off|on`` and ``report_dir`` to
    ``results/ab/<run_id>``; ``extra_meta`` goes into every point summary (with ``ab_flag``). ``on_phase`` hears
    each step, ``on_point`` each sweep point and ``on_sweep`` each finished side with its summaries. ``grafana``
    receives the flip and run annotations; ``prometheus`` (base URL) is where the report's dashboard panel snapshots
    come from (None: no snapshots). ``restore`` restarts the target with the flag off at the end, also on errors."""
    say = on_phase or (lambda _msg: None)
    dirs = run_dirs or _default_run_dirs(run_id, flag)
    meta = {"ab_flag": flag, **(extra_meta or {})}
    runs = {}
    try:
        for side, value, run_dir in (("A", "0", dirs[0]), ("B", "1", dirs[1])):
            say(f"{side}: restarting the target with {flag}={value} ({restart})")
            flip_flag(restart, flag, value, target=base.target, run_dir=stack_run_dir, grafana=grafana, say=say)
            say(f"{side}: sweep C={concurrencies} x{repeat} -> {run_dir}")
            summaries = run_sweep(base, concurrencies, repeat, run_dir, on_point=on_point, extra_meta=meta)
            if on_sweep is not None:
                on_sweep(side, summaries)
            runs[side] = load_run(run_dir)
    finally:
        if restore and "A" in runs:
            say(f"restoring the target with {flag}=0")
            try:
                flip_flag(restart, flag, "0", target=base.target, run_dir=stack_run_dir, grafana=grafana, say=say)
            except (ABError, OSError, RuntimeError) as exc:
                say(f"could not restore {flag}=0: {exc}")
    check_flag_flipped(runs["A"], runs["B"], flag)
    rows = compare_runs(runs["A"], runs["B"])
    out = report_dir or Path(flags.SPARSEMLA_RESULTS_DIR.get()) / "ab" / run_id
    if prometheus:
        say(f"writing the report, with the dashboard's compare panels from {prometheus} ...")
    report = write_report(
        runs["A"], runs["B"], rows, out, title=title or f"A/B: {flag} off (A) vs on (B)", prometheus=prometheus
    )
    if grafana is not None:
        _annotate_runs([runs["A"], runs["B"]], grafana, say)
    return ABResult(runs["A"], runs["B"], rows, report)


def _default_run_dirs(run_id: str, flag: str) -> tuple[Path, Path]:
    root = results_root()
    return root / f"{run_id}-{flag.lower()}-off", root / f"{run_id}-{flag.lower()}-on"


def _annotate_runs(runs: Sequence[Run], grafana: Grafana, say: Callable[[str], None]) -> None:
    try:
        post_run_annotations(runs, grafana)
    except Exception as exc:  # noqa: BLE001 (the report is written; annotations are a bonus)
        say(f"could not post the run annotations to {grafana.url}: {exc}")
