"""A Python re-implementation of the useful grafana/dashboard-linter rules, plus two of our own.

The Go linter cannot be installed here (its module has a replace directive the Go proxy refuses), so the rules it
documents (grafana/dashboard-linter docs/index.md, lint/rule_*.go) are re-implemented over the dashboard JSON, with
PromQL parsed by promql-parser after Grafana's variable expansion:

=================================== ===============================================================================
template-datasource-rule            a ``datasource`` variable of type prometheus, defaulting to the pinned uid
template-on-time-change-reload-rule query variables refresh when the time range changes
template-instance-rule              an ``instance`` variable exists
panel-datasource-rule               every panel and target uses ``${datasource}``
panel-title-description-rule        every panel has a title and a description
panel-units-rule                    every panel sets a valid Grafana unit
panel-no-targets-rule               every panel has at least one target
panel-id-rule                       panel ids are unique (rows included)
target-promql-rule                  every target is valid PromQL once variables are expanded
target-rate-interval-rule           rate/irate/increase use ``$__rate_interval`` (instant "in range" increase: $__range)
target-counter-agg-rule             counters and histogram series are only read through a range function
target-instance-rule                server-side series (sglang, plugin) are filtered by ``$instance``
target-metric-known-rule            (ours) every series is exported by sglang, the plugin, exporter, Locust or DCGM
target-variable-rule                (ours) every ``$variable`` used is defined
uneditable-dashboard                the dashboard is read-only (provisioned from code)
=================================== ===============================================================================
"""

from __future__ import annotations

from dataclasses import dataclass

from sparsemla.dashboards import metrics, promql
from sparsemla.dashboards.panels import PanelRef, all_panel_json, iter_panels, variables

# Grafana unit ids the dashboards may use (a subset of Grafana's unit registry), plus the custom-unit prefixes.
KNOWN_UNITS = frozenset(
    {"s", "ms", "µs", "ns", "percent", "percentunit", "reqps", "short", "none", "watt", "joule", "bytes", "decbytes",
     "Bps", "ops", "hertz", "celsius", "mbytes"}
)  # fmt: skip
CUSTOM_UNIT_PREFIXES = ("suffix:", "prefix:", "si:", "count:")
RANGE_FUNCTIONS = frozenset({"rate", "irate", "increase", "changes", "resets", "delta", "idelta", "deriv"})
# Markers substituted for the interval macros so the rate-interval rule can recognise them after parsing.
_RATE_SENTINEL_S, _RANGE_SENTINEL_S = 4321, 3456
SERVER_SOURCES = (f"sglang {metrics.sglang_metrics.SGLANG_VERSION}", "sparsemla plugin")


@dataclass(frozen=True)
class Finding:
    """One rule violation: which rule, where (panel title or "dashboard"), and what is wrong."""

    rule: str
    where: str
    message: str

    def __str__(self) -> str:
        return f"[{self.rule}] {self.where}: {self.message}"


def lint_values(dashboard: dict) -> dict[str, str]:
    """Variable values used for linting: each variable expands to ``__<name>__``, macros to sentinel durations."""
    values = {v["name"]: f"__{v['name']}__" for v in variables(dashboard)}
    values.update(promql.Interval(step_s=15, range_s=3600).macros())
    values["__rate_interval"] = f"{_RATE_SENTINEL_S}s"
    values["__range"] = f"{_RANGE_SENTINEL_S}s"
    return values


def lint(dashboard: dict) -> list[Finding]:
    """Every rule violation in ``dashboard`` (empty when clean)."""
    found = _dashboard_rules(dashboard)
    values = lint_values(dashboard)
    for ref in iter_panels(dashboard):
        found += _panel_rules(ref)
        for target in ref.targets:
            found += _target_rules(ref, target, values)
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if annotation.get("expr"):  # Prometheus annotation queries are PromQL too
            ref = PanelRef({"title": f"annotation {annotation.get('name')}"}, "")
            target = {"expr": annotation["expr"], "refId": "-", "datasource": annotation.get("datasource")}
            found += _target_rules(ref, target, values)
    return found


def _dashboard_rules(dashboard: dict) -> list[Finding]:
    out = []
    by_name = {v["name"]: v for v in variables(dashboard)}
    ds = by_name.get("datasource")
    if ds is None or ds.get("type") != "datasource" or ds.get("query") != "prometheus":
        out.append(Finding("template-datasource-rule", "dashboard", "no `datasource` variable of type prometheus"))
    elif (ds.get("current") or {}).get("value") != "prometheus":
        out.append(
            Finding("template-datasource-rule", "dashboard", "datasource variable does not default to uid prometheus")
        )
    if "instance" not in by_name:
        out.append(Finding("template-instance-rule", "dashboard", "no `instance` variable"))
    for var in by_name.values():
        if var.get("type") == "query" and var.get("refresh") != 2:
            out.append(
                Finding(
                    "template-on-time-change-reload-rule", f"${var['name']}", "refresh must be 2 (on time range change)"
                )
            )
    if dashboard.get("editable", True):
        out.append(Finding("uneditable-dashboard", "dashboard", "dashboard must be read-only (editable: false)"))
    seen: dict[int, str] = {}
    for panel in all_panel_json(dashboard):
        pid, title = panel.get("id"), panel.get("title", "?")
        if not isinstance(pid, int) or pid <= 0:
            out.append(Finding("panel-id-rule", title, f"missing or invalid id {pid!r}"))
        elif pid in seen:
            out.append(Finding("panel-id-rule", title, f"id {pid} also used by {seen[pid]!r}"))
        else:
            seen[pid] = title
    return out


def _panel_rules(ref: PanelRef) -> list[Finding]:
    out = []
    where = ref.title or f"panel id {ref.panel.get('id')}"
    if not ref.title.strip():
        out.append(Finding("panel-title-description-rule", where, "no title"))
    if not ref.panel.get("description", "").strip():
        out.append(Finding("panel-title-description-rule", where, "no description"))
    unit = ref.unit
    if not unit:
        out.append(Finding("panel-units-rule", where, "no unit set"))
    elif unit not in KNOWN_UNITS and not unit.startswith(CUSTOM_UNIT_PREFIXES):
        out.append(Finding("panel-units-rule", where, f"unknown unit {unit!r}"))
    if not ref.targets:
        out.append(Finding("panel-no-targets-rule", where, "no targets"))
    if (ref.panel.get("datasource") or {}).get("uid") not in ("${datasource}", "$datasource"):
        out.append(Finding("panel-datasource-rule", where, "panel datasource is not ${datasource}"))
    return out


def _target_rules(ref: PanelRef, target: dict, values: dict[str, str]) -> list[Finding]:
    where = f"{ref.title} / {target.get('refId', '?')}"
    out = []
    if (target.get("datasource") or {}).get("uid") not in ("${datasource}", "$datasource"):
        out.append(Finding("panel-datasource-rule", where, "target datasource is not ${datasource}"))
    expr = target.get("expr", "")
    try:
        expanded = promql.expand(expr, values)
    except KeyError as exc:
        return [*out, Finding("target-variable-rule", where, str(exc.args[0]))]
    try:
        uses = promql.selectors(expanded)
    except ValueError as exc:
        return [*out, Finding("target-promql-rule", where, str(exc))]
    instant = bool(target.get("instant"))
    for use in uses:
        fn = use.inside[-1] if use.inside else None
        if use.range_s is not None and fn in promql.RATE_FUNCTIONS:
            in_range = fn == "increase" and instant and use.range_s == _RANGE_SENTINEL_S
            if use.range_s != _RATE_SENTINEL_S and not in_range:
                out.append(
                    Finding("target-rate-interval-rule", where, f"{fn}({use.metric}) does not use $__rate_interval")
                )
        counter = (
            use.metric.endswith(("_total", "_bucket", "_count", "_sum")) or use.metric == metrics.DCGM_TOTAL_ENERGY
        )
        if counter and (use.range_s is None or fn not in RANGE_FUNCTIONS):
            out.append(Finding("target-counter-agg-rule", where, f"counter {use.metric} read without rate/increase"))
        source = metrics.source_of(use.metric)
        if source is None:
            out.append(Finding("target-metric-known-rule", where, f"{use.metric} is exported by nobody we know"))
        elif source in SERVER_SOURCES and use.matcher("instance") != ("=~", "__instance__"):
            out.append(Finding("target-instance-rule", where, f'{use.metric} lacks instance=~"$instance"'))
    return out


def lint_files(paths: list) -> list[Finding]:  # noqa: ANN001 - Path-likes
    """Lint dashboard JSON files; findings name the file."""
    import json
    from pathlib import Path

    out = []
    for path in paths:
        for f in lint(json.loads(Path(path).read_text())):
            out.append(Finding(f.rule, f"{Path(path).name}: {f.where}", f.message))
    return out
