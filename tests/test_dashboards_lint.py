"""The dashboard lint: the committed dashboards are clean, and every rule fires on the mistake it exists for."""

from __future__ import annotations

import copy
import random
import re
from collections.abc import Callable

import pytest

# Needs the ops/loadtest extras: the GPU machine installs the runtime only, so this module skips there.
pytest.importorskip("grafana_foundation_sdk")
from sparsemla.dashboards import build, lint, promql  # noqa: E402
from sparsemla.dashboards.panels import iter_panels  # noqa: E402


@pytest.fixture(scope="module")
def serving() -> dict:
    return build.load("sparsemla-serving.json")


def test_committed_dashboards_lint_clean(serving: dict) -> None:
    assert [str(f) for f in lint.lint(serving)] == []


def _first(dash: dict, kind: str = "timeseries") -> dict:
    return next(ref.panel for ref in iter_panels(dash) if ref.kind == kind)


def _set_expr(expr: str) -> Callable[[dict], None]:
    def mutate(dash: dict) -> None:
        _first(dash)["targets"][0]["expr"] = expr

    return mutate


def _dup_id(dash: dict) -> None:
    panels = [ref.panel for ref in iter_panels(dash)]
    panels[1]["id"] = panels[0]["id"]


def _var(dash: dict, name: str) -> dict:
    return next(v for v in dash["templating"]["list"] if v["name"] == name)


MUTATIONS: dict[str, tuple[Callable[[dict], None], str]] = {
    "no description": (lambda d: _first(d).pop("description"), "panel-title-description-rule"),
    "blank title": (lambda d: _first(d).__setitem__("title", " "), "panel-title-description-rule"),
    "no unit": (lambda d: _first(d)["fieldConfig"]["defaults"].pop("unit"), "panel-units-rule"),
    "unknown unit": (lambda d: _first(d)["fieldConfig"]["defaults"].__setitem__("unit", "tokens"), "panel-units-rule"),
    "no targets": (lambda d: _first(d).__setitem__("targets", []), "panel-no-targets-rule"),
    "duplicate id": (_dup_id, "panel-id-rule"),
    "hard-coded panel datasource": (
        lambda d: _first(d).__setitem__("datasource", {"type": "prometheus", "uid": "ddyfngn31dg5cf"}),
        "panel-datasource-rule",
    ),
    "hard-coded target datasource": (
        lambda d: _first(d)["targets"][0].__setitem__("datasource", {"uid": "ddyfngn31dg5cf"}),
        "panel-datasource-rule",
    ),
    "fixed rate window": (
        _set_expr('sum(rate(sglang:generation_tokens_total{instance=~"$instance"}[5m]))'),
        "target-rate-interval-rule",
    ),
    "counter without rate": (
        _set_expr('sum(sglang:generation_tokens_total{instance=~"$instance"})'),
        "target-counter-agg-rule",
    ),
    "bucket without rate": (
        _set_expr(
            'histogram_quantile(0.9, sum by (le) (sglang:e2e_request_latency_seconds_bucket{instance=~"$instance"}))'
        ),
        "target-counter-agg-rule",
    ),
    "no instance filter": (
        _set_expr("sum(rate(sglang:generation_tokens_total[$__rate_interval]))"),
        "target-instance-rule",
    ),
    "invalid PromQL": (
        _set_expr('sum(rate(sglang:generation_tokens_total{instance=~"$instance"}[$__rate_interval])'),
        "target-promql-rule",
    ),  # fmt: skip
    "undefined variable": (
        _set_expr('sglang:num_running_reqs{instance=~"$instance", model_name=~"$model"}'),
        "target-variable-rule",
    ),
    "metric nobody exports": (
        _set_expr('sum(rate(sglang:time_per_output_token_seconds_count{instance=~"$instance"}[$__rate_interval]))'),
        "target-metric-known-rule",
    ),
    "editable": (lambda d: d.__setitem__("editable", True), "uneditable-dashboard"),
    "no datasource variable": (
        lambda d: d["templating"].__setitem__(
            "list", [v for v in d["templating"]["list"] if v["name"] != "datasource"]
        ),
        "template-datasource-rule",
    ),
    "datasource not pinned": (
        lambda d: _var(d, "datasource")["current"].__setitem__("value", "some-other-uid"),
        "template-datasource-rule",
    ),
    "variable never refreshes": (
        lambda d: _var(d, "variant").__setitem__("refresh", 1),
        "template-on-time-change-reload-rule",
    ),  # fmt: skip
    "no instance variable": (
        lambda d: d["templating"].__setitem__("list", [v for v in d["templating"]["list"] if v["name"] != "instance"]),
        "template-instance-rule",
    ),
}


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_rule_fires(serving: dict, case: str) -> None:
    mutate, rule = MUTATIONS[case]
    dash = copy.deepcopy(serving)
    mutate(dash)
    rules = {f.rule for f in lint.lint(dash)}
    assert rule in rules, f"{case}: expected {rule}, got {sorted(rules)}"


def test_increase_over_range_is_allowed_only_for_instant_targets(serving: dict) -> None:
    dash = copy.deepcopy(serving)
    panel = next(ref.panel for ref in iter_panels(dash) if ref.title == "Snapshots in range")
    assert lint.lint(dash) == []
    panel["targets"][0]["instant"] = False
    assert {f.rule for f in lint.lint(dash)} == {"target-rate-interval-rule"}


# -- promql helpers ---------------------------------------------------------------------------------------------------


def test_expand_all_variable_syntaxes() -> None:
    text = 'x{a=~"$a", b="${b}", c="[[c]]", d="${d:regex}"}[$__rate_interval]'
    out = promql.expand(text, {"a": "1", "b": "2", "c": "3", "d": "4", "__rate_interval": "20s"})
    assert out == 'x{a=~"1", b="2", c="3", d="4"}[20s]'
    assert promql.variable_names(text) == {"a", "b", "c", "d", "__rate_interval"}
    with pytest.raises(KeyError, match=r"\$a"):
        promql.expand("$a", {})


def test_multi_value_regex_matches_exactly_the_selected_values() -> None:
    """The variable text goes into a PromQL string (`x{v=~"$var"}`): it must parse, and the regex Prometheus reads out
    of the string must match exactly the selected values (variants like `mma_decode+triton_indexer`, run ids with -)."""
    rng = random.Random(7)
    alphabet = "abc.+*()|_-0123$^?[]{}\\'\""
    for _ in range(200):
        pool = {"".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(8)}
        chosen = sorted(rng.sample(sorted(pool), rng.randint(1, len(pool))))
        selector = promql.parse(f'x{{v=~"{promql.multi_value(chosen)}"}}')
        regex = selector.matchers.matchers[0].value  # the string literal as Prometheus decodes it
        pattern = re.compile(f"^(?:{regex})$")  # Prometheus anchors =~ matchers
        assert {v for v in pool if pattern.match(v)} == set(chosen)
    assert promql.multi_value(["mma_decode+triton_indexer"]) == "mma_decode\\\\+triton_indexer"


def test_selectors_and_rate_interval() -> None:
    uses = promql.selectors(
        'histogram_quantile(0.9, sum by (le) (rate(a_bucket{instance=~"x"}[1m]))) / on() group_left max(b) '
        "+ avg_over_time((rate(c_total[30s]) > 0)[10m:15s])"
    )
    assert [(u.metric, u.inside, u.range_s) for u in uses] == [
        ("a_bucket", ("histogram_quantile", "rate"), 60.0),
        ("b", (), None),
        ("c_total", ("avg_over_time", "rate"), 30.0),
    ]
    assert uses[0].matcher("instance") == ("=~", "x")
    assert promql.Interval(step_s=15, range_s=600, scrape_s=5).rate_interval_s == 20  # max(15+5, 4*5)
    assert promql.Interval(step_s=1, range_s=60, scrape_s=5).rate_interval_s == 20
    assert promql.Interval(step_s=60, range_s=3600, scrape_s=5).macros()["__rate_interval"] == "65s"
    with pytest.raises(ValueError, match="invalid PromQL"):
        promql.parse("sum(")
