"""A campaign: kernel flips one after another, each step an A/B of two variants, each variant swept once.

The campaign this project comes from went baseline -> ``SPARSEMLA_MMA_DECODE`` (the head-batched tensor-core decode:
C=64 29.7 -> 59.6 tok/s) -> ``SPARSEMLA_TRITON_INDEXER`` (the indexer's O(max_context) work: ~17x), each step found
by a kernel-share profile of the variant before it. :func:`run_campaign` replays that loop on any target that
`sparsemla ab` can restart. For each variant of the list it restarts the target with exactly that variant's kernel
switches (:func:`variant_env`), sweeps the concurrency points, and takes a kernel-share snapshot under load
(:mod:`sparsemla.loadtest.profile_load`). After every variant but the first it compares it with the variant before
(one step: the two differ in one switch, which B turns on) and writes that step's A/B report with both snapshots.

Directory layout under ``out_dir``: ``runs/<variant>/`` (the sweeps), ``profiles/<variant>/`` (the snapshot and the
load it was taken under), ``steps/<k>-<flag>/`` (each step's A/B report: report.md/html, compare.json, PNGs, panels).
The pieces are `sparsemla ab`'s (:func:`sparsemla.loadtest.ab.sweep_side`, :func:`sparsemla.loadtest.ab.compare_sides`);
the report over all steps is :mod:`sparsemla.loadtest.report_campaign`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparsemla import variant
from sparsemla.loadtest.ab import SweepCallback, compare_sides, sweep_side
from sparsemla.loadtest.annotations import Grafana, post_run_annotations
from sparsemla.loadtest.kernel_shares import KernelComparison, ProfileSnapshot
from sparsemla.loadtest.profile_load import profile_concurrency, snapshot_under_load
from sparsemla.loadtest.report import Row, Run
from sparsemla.loadtest.runner import LoadTestConfig
from sparsemla.loadtest.sweep import PointCallback


class CampaignError(ValueError):
    """The variants do not make a campaign (unknown name, a step that is not one switch turned on), or the target
    served another variant than the one asked for; the message says which."""


@dataclass(frozen=True)
class Step:
    """One flip of a campaign: variant ``a`` -> ``b``, where ``b`` turns on the one kernel switch ``flag``."""

    index: int  # 1-based
    a: str
    b: str
    flag: str

    @property
    def slug(self) -> str:
        return f"{self.index}-{self.flag.lower()}"

    @property
    def title(self) -> str:
        return f"Step {self.index}: {self.flag} — A = {self.a}, B = {self.b}"


def parse_variants(text: str) -> list[str]:
    """``"baseline mma_decode mma_decode+triton_indexer"`` (spaces or commas) -> the names, each checked."""
    names = [p for p in text.replace(",", " ").split() if p]
    try:
        return [variant.parse(name).name for name in names]
    except variant.VariantError as exc:
        raise CampaignError(str(exc)) from None


def switch_flag(part: str) -> str:
    """The flag of a switch part name: ``mma_decode`` -> ``SPARSEMLA_MMA_DECODE``."""
    return next(s.name for s in variant.SWITCHES if variant.part_name(s) == part)


def plan_steps(variants: Sequence[str]) -> list[Step]:
    """The steps between consecutive variants. Each must turn on exactly one more switch: a step that turns a kernel
    off, or two on, cannot be read as "what this kernel did"."""
    if len(variants) < 2:
        raise CampaignError(f"a campaign needs at least two variants, got {list(variants)}")
    steps = []
    for index, (a, b) in enumerate(zip(variants, variants[1:], strict=False), 1):
        on_a, on_b = variant.parse(a).on, variant.parse(b).on
        added = on_b - on_a
        if not on_a <= on_b or len(added) != 1:
            raise CampaignError(f"step {index} ({a} -> {b}) must turn on exactly one kernel switch and keep the others")
        steps.append(Step(index, a, b, switch_flag(next(iter(added)))))
    return steps


def variant_env(name: str) -> dict[str, str]:
    """Every kernel switch set for ``name``: ``mma_decode`` -> ``SPARSEMLA_MMA_DECODE=1, SPARSEMLA_TRITON_INDEXER=0``
    (all of them, so what the target ran before cannot leak into the variant)."""
    parsed = variant.parse(name)
    return {s.name: "1" if parsed.is_on(s) else "0" for s in variant.SWITCHES}


def slug(name: str) -> str:
    """A variant as a directory and run-id name (``+`` is a regex operator in the dashboards' run_id filter)."""
    return name.replace(variant.SEPARATOR, "_and_")


@dataclass
class VariantResult:
    """One variant of the campaign: its sweep, its kernel-share snapshot, the flip annotations of its restart."""

    name: str
    run: Run
    snapshot: ProfileSnapshot
    flips: list[dict[str, Any]] = field(default_factory=list)


@dataclass
class StepResult:
    """One step: the A/B rows, the step report's files and the kernel shares before (A) and after (B)."""

    step: Step
    rows: list[Row]
    report: dict[str, Path]
    kernels: KernelComparison

    @property
    def report_dir(self) -> Path:
        return self.report["html"].parent

    def summary(self) -> dict[str, Any]:
        """The step's entry in campaign.json and demo.json: index, flipped flag, A and B, the report's HTML."""
        s = self.step
        return {"index": s.index, "flag": s.flag, "a": s.a, "b": s.b, "report": str(self.report["html"])}


@dataclass
class CampaignResult:
    """Every variant and step of a finished campaign, in order."""

    out_dir: Path
    points: list[int]
    variants: dict[str, VariantResult]
    steps: list[StepResult]

    def flips(self) -> list[dict[str, Any]]:
        return [body for v in self.variants.values() for body in v.flips]


StepCallback = Callable[[StepResult], None]


def run_campaign(
    variants: Sequence[str],
    concurrencies: list[int],
    repeat: int,
    base: LoadTestConfig,
    *,
    out_dir: Path,
    exporter: str | None,
    restart: str = "sim",
    fresh_start: bool = False,
    stack_run_dir: Path = Path(".run"),
    profile_at: int | None = None,
    prometheus: str | None = None,
    grafana: Grafana | None = None,
    extra_meta: dict[str, Any] | None = None,
    on_phase: Callable[[str], None] | None = None,
    on_point: PointCallback | None = None,
    on_sweep: SweepCallback | None = None,
    on_step: StepCallback | None = None,
) -> CampaignResult:
    """Sweep and profile every variant in turn, comparing each with the one before (see the module docstring).

    ``fresh_start``: the target was just started with the first variant's flags (the demo's stack), so it is not
    restarted for it, only checked. ``exporter`` is the kernel-share exporter's base URL (None: no snapshots; the
    reports say so); snapshots are taken under ``profile_at`` users (default: the middle point). ``prometheus``
    renders each step report's dashboard panels, ``grafana`` receives the flip and run annotations. ``on_step`` hears
    each step as soon as its report is written; ``on_phase``, ``on_point`` and ``on_sweep`` as in
    :func:`sparsemla.loadtest.ab.run_ab`."""
    steps = plan_steps(variants)
    say = on_phase or (lambda _msg: None)
    load_at = profile_at or profile_concurrency(concurrencies)
    meta = {"campaign": list(variants), **(extra_meta or {})}
    done: dict[str, VariantResult] = {}
    step_results: list[StepResult] = []
    previous: dict[str, str] | None = None
    for index, name in enumerate(variants):
        env = variant_env(name)
        changed = [flag for flag, value in env.items() if previous is None or previous[flag] != value]
        run, flips = sweep_side(
            name, env, concurrencies, repeat, base, out_dir / "runs" / slug(name),
            restart=None if fresh_start and index == 0 else restart,
            stack_run_dir=stack_run_dir, annotate=changed, grafana=grafana, say=say, on_point=on_point,
            on_sweep=on_sweep, extra_meta={**meta, "campaign_variant": name},
        )  # fmt: skip
        if run.variant() != name:
            raise CampaignError(
                f"asked for variant {name} ({env}), the target served {run.variant()}: a kernel whose hook did not "
                "apply, or a server without sparsemla_kernel_flags_info"
            )
        if grafana is not None:
            _annotate(run, grafana, say)
        snapshot = _snapshot(exporter, base, load_at, out_dir / "profiles" / slug(name), name, say)
        done[name] = VariantResult(name, run, snapshot, flips)
        if index > 0:
            result = _step(steps[index - 1], done, out_dir, prometheus, say)
            step_results.append(result)
            if on_step is not None:
                on_step(result)
        previous = env
    return CampaignResult(out_dir, list(concurrencies), done, step_results)


def _snapshot(
    exporter: str | None, base: LoadTestConfig, load_at: int, out: Path, name: str, say: Callable[[str], None]
) -> ProfileSnapshot:
    if exporter is None:
        return ProfileSnapshot(name, load_at, error="no kernel-share exporter was running")
    return snapshot_under_load(exporter, base, load_at, out, variant=name, run_id=f"profile-{slug(name)}", say=say)


def _step(
    step: Step, done: dict[str, VariantResult], out_dir: Path, prometheus: str | None, say: Callable[[str], None]
) -> StepResult:
    a, b = done[step.a], done[step.b]
    kernels = KernelComparison(a.snapshot, b.snapshot)
    say(f"{step.title}: comparing, report -> {out_dir / 'steps' / step.slug}")
    rows, report = compare_sides(
        a.run, b.run, step.flag, out_dir / "steps" / step.slug, title=step.title, prometheus=prometheus, say=say,
        kernels=kernels, panels_until=b.snapshot.taken_at,
    )  # fmt: skip
    return StepResult(step, rows, report, kernels)


def _annotate(run: Run, grafana: Grafana, say: Callable[[str], None]) -> None:
    try:
        post_run_annotations([run], grafana)
    except Exception as exc:  # noqa: BLE001 (annotations are a bonus; the campaign goes on)
        say(f"could not post the run annotation to {grafana.url}: {exc}")
