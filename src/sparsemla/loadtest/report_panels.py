"""Dashboard panels for an A/B report: the serving dashboard's ``COMPARE_PANELS`` rendered to PNG from Prometheus over
the time the runs A and B ran (issue 9: "`make compare` embeds the relevant ones").

Time ranges come from the runs' ``summary.json`` files (``test_start`` .. ``window.end``, so warmup included). When
A and B ran close together (at most :data:`JOIN_GAP_S` apart, as in `make ab` and the demo) one range covers both,
which is what the B/A panels are built for ("averaged over the range while it had load"); runs far apart get a range
each. Dashboard variables are pinned to the runs: ``variant_a`` / ``variant_b`` to A's and B's variants,
``variant`` to both, ``run_id`` to both runs' ids.

Talks to Prometheus over HTTP only (the dashboards' renderer, :mod:`sparsemla.dashboards.render`); a Prometheus
that is down or fails is reported in :attr:`PanelRenders.error` and never stops the report.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparsemla.loadtest.report import Run

JOIN_GAP_S = 1800.0  # runs at most 30 min apart share one range (the B/A panels need both in view)
PAD_S = 15.0  # context before the first and after the last request
PANELS_DIR = "panels"


@dataclass
class PanelImage:
    title: str
    file: str  # relative to the report directory
    has_data: bool
    profile: str | None = None  # the compose profile that feeds the panel ("gpu": DCGM), None: always fed


@dataclass
class PanelWindow:
    """One time range and the panels rendered over it."""

    label: str  # "A and B", "A" or "B"
    start: float  # unix seconds
    end: float
    panels: list[PanelImage] = field(default_factory=list)

    @property
    def caption(self) -> str:
        def fmt(t: float) -> str:
            return datetime.fromtimestamp(t, tz=timezone.utc).strftime("%Y-%m-%d %H:%M:%S")

        return f"{self.label}: {fmt(self.start)} – {fmt(self.end)} UTC ({self.end - self.start:.0f} s)"


@dataclass
class PanelRenders:
    """What the report embeds: the Prometheus used, the windows rendered, and why something is missing (or None)."""

    prometheus: str
    windows: list[PanelWindow] = field(default_factory=list)
    error: str | None = None
    variables: dict[str, Any] = field(default_factory=dict)

    def images(self) -> list[PanelImage]:
        return [p for w in self.windows for p in w.panels]

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PanelRenders:
        """What :meth:`to_json` wrote (a report's compare.json), for a report that embeds another's panels."""
        windows = [
            PanelWindow(w["label"], w["start"], w["end"], [PanelImage(**image) for image in w.get("panels", [])])
            for w in data.get("windows", [])
        ]
        return cls(data["prometheus"], windows, data.get("error"), data.get("variables") or {})

    def to_json(self) -> dict[str, Any]:
        return {
            "prometheus": self.prometheus,
            "error": self.error,
            "variables": self.variables,
            "windows": [{**asdict(w), "caption": w.caption} for w in self.windows],
        }


def _one(values: set[str], fallback: str) -> str:
    known = sorted(v for v in values if v)
    return known[0] if known else fallback


def windows_for(
    a: Run, b: Run, join_gap_s: float = JOIN_GAP_S, pad_s: float = PAD_S, until: float | None = None
) -> list[tuple[str, float, float]]:
    """(label, start, end) ranges to render: one covering both runs when they ran close together, else one each.

    ``until`` (unix seconds) extends the last range to that moment: a kernel-share snapshot taken after run B is
    then inside it (the kernel-share panels are instant queries at the range's end)."""
    (a0, a1), (b0, b1) = a.span(), b.span()
    gap = max(a0, b0) - min(a1, b1)  # negative when the runs overlap
    if gap <= join_gap_s:
        windows = [("A and B", min(a0, b0) - pad_s, max(a1, b1) + pad_s)]
    else:
        windows = [("A", a0 - pad_s, a1 + pad_s), ("B", b0 - pad_s, b1 + pad_s)]
    if until is not None:
        label, start, end = windows[-1]
        windows[-1] = (label, start, max(end, until + pad_s))
    return windows


def panel_profiles() -> dict[str, str | None]:
    """Panel title -> the compose profile it needs (``gpu`` for DCGM panels), from the dashboard spec."""
    from sparsemla.dashboards import build

    return {panel.title: panel.profile for row in build.serving_spec() for panel in row.panels}


def pinned_variables(a: Run, b: Run) -> dict[str, str | list[str]]:
    """Dashboard variables pinned to the two runs (variants from the servers' flag info, run ids from Locust)."""
    va = _one({s.get("variant") or "" for s in a.summaries}, "unknown")
    vb = _one({s.get("variant") or "" for s in b.summaries}, "unknown")
    run_ids = sorted({str(s.get("run_id")) for s in a.summaries + b.summaries if s.get("run_id")})
    pinned: dict[str, str | list[str]] = {"variant_a": va, "variant_b": vb, "variant": sorted({va, vb})}
    if run_ids:
        pinned["run_id"] = run_ids
    return pinned


def unreachable(prometheus: str, timeout_s: float = 3.0) -> str | None:
    """None when Prometheus answers ``/-/ready``; else a short reason."""
    import httpx

    try:
        resp = httpx.get(f"{prometheus.rstrip('/')}/-/ready", timeout=timeout_s)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"
    if resp.status_code != 200:
        return f"/-/ready answered HTTP {resp.status_code}"
    return None


def render_compare_panels(
    a: Run,
    b: Run,
    out_dir: Path,
    prometheus: str,
    *,
    settle_s: float | None = None,
    titles: tuple[str, ...] | None = None,
    until: float | None = None,
) -> PanelRenders:
    """Render the compare panels for runs A and B into ``out_dir/panels/<window>/``; never raises for Prometheus.

    When a window ends less than one scrape ago, waits until Prometheus has scraped past it (``settle_s``, default the
    scrape interval + 1 s), so the last seconds of run B are in the panels. ``until``: see :func:`windows_for`."""
    from sparsemla.dashboards import build, grafana_eval, render

    result = PanelRenders(prometheus.rstrip("/"))
    reason = unreachable(result.prometheus)
    if reason is not None:
        result.error = f"Prometheus at {result.prometheus} is not reachable ({reason}); no dashboard panels embedded"
        return result
    result.variables = pinned_variables(a, b)
    windows = windows_for(a, b, until=until)
    profiles = panel_profiles()
    settle = grafana_eval.SCRAPE_INTERVAL_S + 1.0 if settle_s is None else settle_s
    wait = max(end for _, _, end in windows) - PAD_S + settle - time.time()
    if wait > 0:
        time.sleep(wait)
    for label, start, end in windows:
        end = min(end, time.time())
        slug = "a-and-b" if label == "A and B" else label.lower()
        window = PanelWindow(label, start, end)
        try:
            snap = render.render_panels(
                result.prometheus, start, end, out_dir / PANELS_DIR / slug, overrides=result.variables,
                titles=titles or build.COMPARE_PANELS,
            )  # fmt: skip
        except (grafana_eval.PrometheusError, ValueError) as exc:
            result.error = f"rendering the panels for {label} failed: {exc}"
            break
        window.panels = [
            PanelImage(p.title, f"{PANELS_DIR}/{slug}/{p.file}", any(p.data), profiles.get(p.title))
            for p in snap.panels
        ]
        result.windows.append(window)
    return result
