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

:func:`run_ab` is the whole loop of `sparsemla ab`, built from two pieces that a campaign of several flips
(:mod:`sparsemla.loadtest.campaign`, the demo's loop) reuses: :func:`sweep_side` (restart with the flags set, sweep)
and :func:`compare_sides` (refuse an unflipped pair, compare, report). The hooks (``on_phase``, ``on_point``,
``on_sweep``) are where the front ends print.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparsemla import flags
from sparsemla.loadtest.annotations import Grafana, flag_flip_body, post_run_annotations
from sparsemla.loadtest.report import Row, Run, check_flag_flipped, compare_runs, load_run, write_report
from sparsemla.loadtest.runner import LoadTestConfig, results_root
from sparsemla.loadtest.sweep import PointCallback, run_sweep
from sparsemla.loadtest.target import TargetError, TargetInfo, probe

if TYPE_CHECKING:
    from sparsemla.loadtest.kernel_shares import KernelComparison

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
    return restart_with(mode, {flag: value}, target=target, run_dir=run_dir, timeout_s=timeout_s)


def restart_with(
    mode: str, overrides: Mapping[str, str], *, target: str, run_dir: Path = Path(".run"), timeout_s: float = 180.0
) -> TargetInfo:
    """:func:`restart_target` for several flags at once (a campaign's variant sets every kernel switch)."""
    if mode == "sim":
        from sparsemla.ops import stack

        stack.restart_server(dict(overrides), run_dir=run_dir)
    else:
        argv: list[str] | str = list(COMPOSE_RESTART) if mode == "compose" else mode
        result = subprocess.run(
            argv, shell=isinstance(argv, str), env=flags.child_env(dict(overrides)), capture_output=True, text=True
        )
        if result.returncode != 0:
            raise ABError(f"restart command {argv!r} failed ({result.returncode}): {result.stderr.strip()[-500:]}")
    expected = {flag: flag_label(value) for flag, value in overrides.items()}
    return wait_for_flags(target, expected, timeout_s=timeout_s)


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
    info, _ = flip_flags(
        mode, {flag: value}, target=target, run_dir=run_dir, grafana=grafana, say=say, timeout_s=timeout_s
    )
    return info


def flip_flags(
    mode: str,
    overrides: Mapping[str, str],
    *,
    target: str,
    annotate: Sequence[str] | None = None,
    run_dir: Path = Path(".run"),
    grafana: Grafana | None = None,
    say: Callable[[str], None] | None = None,
    timeout_s: float = 180.0,
) -> tuple[TargetInfo, list[dict[str, Any]]]:
    """:func:`restart_with`, then one flip annotation per flag of ``annotate`` (default: every flag set), posted when
    ``grafana`` is given; returns the target's description and the annotation bodies (posted or not: the campaign
    report lists them). A Grafana that cannot be reached is reported through ``say`` and never stops the run."""
    began = time.time()
    info = restart_with(mode, overrides, target=target, run_dir=run_dir, timeout_s=timeout_s)
    ready = time.time()
    bodies = [
        flag_flip_body(flag, overrides[flag], info.variant, began, ready, target)
        for flag in (overrides if annotate is None else annotate)
    ]
    if grafana is not None and bodies:
        try:
            grafana.post_many(bodies)
        except Exception as exc:  # noqa: BLE001 (annotations are a bonus; the A/B run goes on)
            (say or (lambda _m: None))(f"could not post the flip annotation to {grafana.url}: {exc}")
    return info, bodies


def wait_for_flag(target: str, flag: str, expected: str, *, timeout_s: float = 180.0) -> TargetInfo:
    """Poll the target until it is up and (when it exports kernel flags) reports ``flag`` = ``expected``; returns
    the target's description at that moment."""
    return wait_for_flags(target, {flag: expected}, timeout_s=timeout_s)


def wait_for_flags(target: str, expected: Mapping[str, str], *, timeout_s: float = 180.0) -> TargetInfo:
    """:func:`wait_for_flag` for several flags: every one must report its expected label value ("on"/"off")."""
    deadline = time.monotonic() + timeout_s
    last = "no answer"
    wanted = {flag.lower(): value for flag, value in expected.items()}
    while time.monotonic() < deadline:
        try:
            info = probe(target, timeout=5)
        except TargetError as exc:
            last = str(exc)
        else:
            wrong = {
                k: info.server_flags.get(k) for k, v in wanted.items() if info.server_flags.get(k) not in (None, v)
            }
            if not wrong:
                return info
            last = ", ".join(f"{k}={v}" for k, v in wrong.items())
        time.sleep(1.0)
    want = ", ".join(f"{k}={v}" for k, v in wanted.items())
    raise ABError(f"{target} did not come back with {want} within {timeout_s:.0f}s ({last})")


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
            runs[side], _ = sweep_side(
                side, {flag: value}, concurrencies, repeat, base, run_dir, restart=restart,
                stack_run_dir=stack_run_dir, grafana=grafana, say=say, on_point=on_point, on_sweep=on_sweep,
                extra_meta=meta,
            )  # fmt: skip
    finally:
        if restore and "A" in runs:
            say(f"restoring the target with {flag}=0")
            try:
                flip_flag(restart, flag, "0", target=base.target, run_dir=stack_run_dir, grafana=grafana, say=say)
            except (ABError, OSError, RuntimeError) as exc:
                say(f"could not restore {flag}=0: {exc}")
    out = report_dir or Path(flags.SPARSEMLA_RESULTS_DIR.get()) / "ab" / run_id
    rows, report = compare_sides(
        runs["A"], runs["B"], flag, out, title=title or f"A/B: {flag} off (A) vs on (B)", prometheus=prometheus,
        say=say,
    )  # fmt: skip
    if grafana is not None:
        _annotate_runs([runs["A"], runs["B"]], grafana, say)
    return ABResult(runs["A"], runs["B"], rows, report)


def sweep_side(
    side: str,
    overrides: Mapping[str, str],
    concurrencies: list[int],
    repeat: int,
    base: LoadTestConfig,
    run_dir: Path,
    *,
    restart: str | None = "sim",
    stack_run_dir: Path = Path(".run"),
    annotate: Sequence[str] | None = None,
    grafana: Grafana | None = None,
    say: Callable[[str], None] | None = None,
    on_point: PointCallback | None = None,
    on_sweep: SweepCallback | None = None,
    extra_meta: dict[str, Any] | None = None,
) -> tuple[Run, list[dict[str, Any]]]:
    """One side of an A/B run, or one variant of a campaign: restart the target with ``overrides`` (a freshly started
    target for every side), sweep into ``run_dir``, load the run. Returns the run and the flip annotation bodies
    (:func:`flip_flags`; ``annotate`` names the flags they describe). ``on_sweep`` hears ``side`` and the summaries.
    ``restart=None``: the target was just started with ``overrides``; it is only checked to serve them (no flip)."""
    say = say or (lambda _msg: None)
    settings = " ".join(f"{k}={v}" for k, v in overrides.items())
    flips: list[dict[str, Any]] = []
    if restart is None:
        wait_for_flags(base.target, {flag: flag_label(value) for flag, value in overrides.items()})
    else:
        say(f"{side}: restarting the target with {settings} ({restart})")
        _, flips = flip_flags(
            restart, overrides, target=base.target, annotate=annotate, run_dir=stack_run_dir, grafana=grafana, say=say
        )
    say(f"{side}: sweep C={concurrencies} x{repeat} -> {run_dir}")
    summaries = run_sweep(base, concurrencies, repeat, run_dir, on_point=on_point, extra_meta=extra_meta)
    if on_sweep is not None:
        on_sweep(side, summaries)
    return load_run(run_dir), flips


def compare_sides(
    a: Run,
    b: Run,
    flag: str,
    out: Path,
    *,
    title: str,
    prometheus: str | None = None,
    say: Callable[[str], None] | None = None,
    kernels: KernelComparison | None = None,
    panels_until: float | None = None,
) -> tuple[list[Row], dict[str, Path]]:
    """Refuse runs that did not flip ``flag`` (:func:`check_flag_flipped`), compare them and write the report into
    ``out``; ``kernels`` (the two sides' kernel-share snapshots) and ``panels_until`` (the last snapshot's time, so
    the dashboard's kernel-share panels see it) go to :func:`write_report`."""
    check_flag_flipped(a, b, flag)
    rows = compare_runs(a, b)
    if prometheus and say is not None:
        say(f"writing the report, with the dashboard's compare panels from {prometheus} ...")
    report = write_report(
        a, b, rows, out, title=title, prometheus=prometheus, kernels=kernels, panels_until=panels_until
    )
    return rows, report


def _default_run_dirs(run_id: str, flag: str) -> tuple[Path, Path]:
    root = results_root()
    return root / f"{run_id}-{flag.lower()}-off", root / f"{run_id}-{flag.lower()}-on"


def _annotate_runs(runs: Sequence[Run], grafana: Grafana, say: Callable[[str], None]) -> None:
    try:
        post_run_annotations(runs, grafana)
    except Exception as exc:  # noqa: BLE001 (the report is written; annotations are a bonus)
        say(f"could not post the run annotations to {grafana.url}: {exc}")
