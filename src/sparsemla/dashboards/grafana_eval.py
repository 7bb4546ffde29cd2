"""Evaluate a dashboard the way Grafana would, against a Prometheus HTTP API, without Grafana.

* :class:`PrometheusAPI` — the three endpoints Grafana's Prometheus data source uses (``query_range``, ``query``,
  ``label/<name>/values``).
* :func:`resolve_variables` — template variables as Grafana sets them on load: query variables from
  ``label_values(...)`` sorted like the variable says, multi-value "All" expanded to the variable's ``allValue``,
  custom variables at their current value; ``overrides`` pin any of them.
* :func:`panel_series` — every target of a panel expanded and executed over a time range, with Grafana's legend.

The PNG renderer and the end-to-end test both go through here, so what is tested is what is drawn.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone

import httpx

from sparsemla.dashboards import promql
from sparsemla.dashboards.panels import PanelRef, variables

SCRAPE_INTERVAL_S = (
    5.0  # Prometheus scrape_interval = Grafana datasource timeInterval (src/sparsemla/ops/grafana/provisioning)
)
MAX_POINTS = 300  # Grafana's maxDataPoints is about the panel width in pixels; 300 keeps PNGs readable


class PrometheusError(RuntimeError):
    """Prometheus answered with an error (bad query, unreachable, timeout)."""


@dataclass
class PrometheusAPI:
    """A minimal client of Prometheus' HTTP API (v1)."""

    url: str
    timeout_s: float = 30.0
    _client: httpx.Client = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        self._client = httpx.Client(timeout=self.timeout_s)

    def close(self) -> None:
        self._client.close()

    def _post(self, path: str, params: dict[str, str]) -> object:
        # POST form: long PromQL (variant joins) stays out of the URL, as Grafana's httpMethod POST does.
        try:
            resp = self._client.post(f"{self.url}{path}", data=params)
        except httpx.HTTPError as exc:
            raise PrometheusError(f"{self.url}{path}: {exc}") from None
        try:
            body = resp.json()
        except ValueError:
            raise PrometheusError(f"{self.url}{path}: HTTP {resp.status_code}, not JSON") from None
        if body.get("status") != "success":
            raise PrometheusError(f"{path} failed: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        data = self._post("/api/v1/query_range", params)
        return list(data["result"])  # type: ignore[index]

    def query(self, expr: str, at: float) -> list[dict]:
        data = self._post("/api/v1/query", {"query": expr, "time": f"{at:.3f}"})
        result = data["result"]  # type: ignore[index]
        if data["resultType"] == "scalar":  # type: ignore[index]
            return [{"metric": {}, "value": result}]
        return list(result)

    def label_values(self, label: str, match: str | None, start: float, end: float) -> list[str]:
        params = [("start", f"{start:.3f}"), ("end", f"{end:.3f}")] + ([("match[]", match)] if match else [])
        try:
            resp = self._client.get(f"{self.url}/api/v1/label/{label}/values", params=params)
            body = resp.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise PrometheusError(f"label values of {label}: {exc}") from None
        if body.get("status") != "success":
            raise PrometheusError(f"label values of {label}: {body.get('error')}")
        return list(body["data"])


# -- time ranges -------------------------------------------------------------------------------------------------

_REL = re.compile(r"^now(?:-(\d+)([smhdw]))?$")
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}


def parse_time(text: str, now: float | None = None) -> float:
    """Unix seconds of a Grafana-style time: ``now``, ``now-15m``, unix seconds, or ISO 8601 (UTC if no zone).

    Raises ValueError naming the accepted forms."""
    now = time.time() if now is None else now
    text = text.strip()
    rel = _REL.match(text)
    if rel:
        return now - (int(rel.group(1)) * _UNIT_S[rel.group(2)] if rel.group(1) else 0)
    try:
        return float(text)
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"cannot read time {text!r}: use now, now-<N><s|m|h|d|w>, unix seconds or ISO 8601 (2026-01-31T12:00:00)"
        ) from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=timezone.utc)
    return parsed.timestamp()


def step_for(start: float, end: float, points: int = MAX_POINTS) -> float:
    """Grafana's ``$__interval``: range / max data points, rounded up to whole seconds, at least the scrape interval."""
    return max(SCRAPE_INTERVAL_S, math.ceil((end - start) / points))


# -- variables -----------------------------------------------------------------------------------------------------

_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(?P<match>.+?)\s*,\s*)?(?P<label>\w+)\s*\)\s*$")


@dataclass(frozen=True)
class Resolved:
    """Variable values: ``selected`` lists the chosen values per variable; ``text`` is what ``$var`` expands to."""

    selected: dict[str, list[str]]
    text: dict[str, str]


def resolve_variables(
    dashboard: dict,
    api: PrometheusAPI,
    start: float,
    end: float,
    overrides: Mapping[str, str | list[str]] | None = None,
) -> Resolved:
    """Every template variable's value as Grafana would choose it on load (see the module docstring).

    ``overrides`` pin variables by name (a list for multi-value ones). Variables are resolved in order, so a query
    variable may reference an earlier one, as in Grafana."""
    overrides = dict(overrides or {})
    selected: dict[str, list[str]] = {}
    text: dict[str, str] = {}
    for var in variables(dashboard):
        name, kind = var["name"], var.get("type")
        if kind == "datasource":
            uid = (var.get("current") or {}).get("value") or "prometheus"
            selected[name], text[name] = [uid], uid
            continue
        if name in overrides:
            chosen = overrides[name]
            values = [chosen] if isinstance(chosen, str) else list(chosen)
            selected[name] = values
            text[name] = promql.multi_value(values) if var.get("multi") or len(values) > 1 else values[0]
            continue
        if kind == "custom":
            value = (var.get("current") or {}).get("value") or var.get("query", "").split(",")[0]
            selected[name], text[name] = [value], value
            continue
        if kind != "query":
            raise ValueError(f"variable ${name} has unsupported type {kind!r}")
        options = _query_options(var, api, start, end, text)
        if var.get("multi") and var.get("includeAll") and (var.get("current") or {}).get("value") in ("$__all", None):
            selected[name] = options
            text[name] = var.get("allValue") or (promql.multi_value(options) if options else "")
        else:
            selected[name] = options[:1]
            text[name] = (
                promql.regex_escape(options[0]) if options and var.get("multi") else (options[0] if options else "")
            )
    return Resolved(selected, text)


def _query_options(var: dict, api: PrometheusAPI, start: float, end: float, known: dict[str, str]) -> list[str]:
    query = var.get("query")
    query = query.get("query", "") if isinstance(query, dict) else (query or "")
    parsed = _LABEL_VALUES.match(promql.expand(query, known))
    if not parsed:
        raise ValueError(f"variable ${var['name']}: only label_values(...) queries are supported, got {query!r}")
    values = api.label_values(parsed.group("label"), parsed.group("match"), start, end)
    sort = var.get("sort", 0)
    if sort in (1, 5, 7):
        values = sorted(values, key=str.lower if sort == 5 else None)
    elif sort in (2, 6, 8):
        values = sorted(values, key=str.lower if sort == 6 else None, reverse=True)
    return values


# -- panels ---------------------------------------------------------------------------------------------------------


@dataclass
class Series:
    """One result series of one target: legend, labels, and (unix seconds, value) points (one point if instant)."""

    ref: str
    legend: str
    labels: dict[str, str]
    points: list[tuple[float, float]]


@dataclass
class TargetResult:
    ref: str
    expr: str  # as sent to Prometheus
    instant: bool
    series: list[Series]


def legend(fmt: str, labels: Mapping[str, str]) -> str:
    """Grafana's legend: ``{{label}}`` substituted; without a format, the series' label set."""
    if fmt and fmt != "__auto":
        return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda mm: labels.get(mm.group(1), ""), fmt).strip()
    name = labels.get("__name__", "")
    rest = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()) if k != "__name__")
    return f"{name}{{{rest}}}" if rest else (name or "value")


def panel_series(
    ref: PanelRef, api: PrometheusAPI, values: Mapping[str, str], start: float, end: float
) -> list[TargetResult]:
    """Run every visible target of a panel over [start, end] (instant targets at ``end``)."""
    step = step_for(start, end)
    macros = promql.Interval(step_s=step, range_s=end - start, scrape_s=SCRAPE_INTERVAL_S).macros()
    out = []
    for target in ref.targets:
        expr = promql.expand(target["expr"], {**values, **macros})
        instant = bool(target.get("instant"))
        series = []
        if instant:
            for item in api.query(expr, end):
                ts, val = item["value"]
                series.append(Series(target.get("refId", ""), legend(target.get("legendFormat", ""), item["metric"]),
                                     item["metric"], [(float(ts), float(val))]))  # fmt: skip
        else:
            for item in api.query_range(expr, start, end, step):
                pts = [(float(ts), float(val)) for ts, val in item["values"]]
                series.append(Series(target.get("refId", ""), legend(target.get("legendFormat", ""), item["metric"]),
                                     item["metric"], pts))  # fmt: skip
        out.append(TargetResult(target.get("refId", ""), expr, instant, series))
    return out


def has_data(result: TargetResult) -> bool:
    """True when a target returned at least one finite sample."""
    return any(math.isfinite(v) for s in result.series for _, v in s.points)


def expand_repeats(ref: PanelRef, resolved: Resolved) -> list[tuple[PanelRef, dict[str, str]]]:
    """A panel with ``repeat: var`` becomes one panel per selected value (title suffixed), as Grafana draws it."""
    var = ref.panel.get("repeat")
    if not var:
        return [(ref, {})]
    out = []
    for value in resolved.selected.get(var) or []:
        panel = {**ref.panel, "title": f"{ref.title} — {value}"}
        out.append((PanelRef(panel, ref.row), {var: promql.regex_escape(value)}))
    return out
