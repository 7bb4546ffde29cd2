"""Dashboards as code: committed JSON is fresh, panels read only exported metrics, provisioning is consistent."""

from __future__ import annotations

import importlib.metadata
import json
import re
from pathlib import Path

import pytest

# Needs the ops/loadtest extras: the GPU machine installs the runtime only, so this module skips there.
pytest.importorskip("grafana_foundation_sdk")
import yaml  # noqa: E402
from prometheus_client.utils import floatToGoString  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from sparsemla import metric_names as mn  # noqa: E402
from sparsemla.dashboards import build, lint, metrics, promql  # noqa: E402
from sparsemla.dashboards.cli import app  # noqa: E402
from sparsemla.dashboards.panels import iter_panels  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROVISIONING = ROOT / "src" / "sparsemla" / "ops" / "grafana" / "provisioning"


@pytest.fixture(scope="module")
def serving() -> dict:
    return build.load("sparsemla-serving.json")


def test_foundation_sdk_is_the_pinned_build() -> None:
    """A bare install picks an epoch-versioned Grafana-10 build that sorts above 0.0.x; we generate with 0.0.21."""
    from packaging.version import Version

    assert Version(importlib.metadata.version("grafana-foundation-sdk")) == Version("0.0.21")  # metadata says v0.0.21
    assert "grafana-foundation-sdk==0.0.21" in (ROOT / "pyproject.toml").read_text()


def test_committed_json_is_not_stale() -> None:
    assert build.stale() == [], "run `make dashboards` and commit src/sparsemla/dashboards/generated/"


def test_stale_detects_edits_missing_and_unexpected_files(tmp_path: Path) -> None:
    build.write_all(tmp_path)
    assert build.stale(tmp_path) == []
    path = tmp_path / "sparsemla-serving.json"
    doc = json.loads(path.read_text())
    doc["panels"][1]["title"] += " (edited in the UI)"
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")
    (tmp_path / "hand-made.json").write_text("{}\n")
    assert build.stale(tmp_path) == ["sparsemla-serving.json", "hand-made.json"]
    path.unlink()
    assert "sparsemla-serving.json" in build.stale(tmp_path)


def test_generation_is_deterministic() -> None:
    assert build.render(build.serving_dashboard) == build.render(build.serving_dashboard)


def test_cli_check_passes_on_the_committed_json() -> None:
    result = CliRunner().invoke(app, ["dashboards", "--check"])
    assert result.exit_code == 0, result.output
    assert "up to date" in result.output


def _expanded_targets(dashboard: dict) -> list[tuple[str, str, str]]:
    values = lint.lint_values(dashboard)
    return [
        (ref.title, t["refId"], promql.expand(t["expr"], values)) for ref in iter_panels(dashboard) for t in ref.targets
    ]


def test_every_panel_queries_only_metrics_someone_exports(serving: dict) -> None:
    unknown = [
        (title, ref, name)
        for title, ref, expr in _expanded_targets(serving)
        for name in promql.metric_names(expr)
        if name not in metrics.KNOWN_SERIES
    ]
    assert unknown == []


def test_the_known_lists_are_not_vacuous(serving: dict) -> None:
    """The dashboards read series from every source, and a misspelled or renamed sglang series is not 'known'."""
    used = {name for _, _, expr in _expanded_targets(serving) for name in promql.metric_names(expr)}
    sources = {metrics.source_of(name) for name in used}
    assert sources >= {"sglang 0.5.23", "sparsemla plugin", "kernel-share exporter", "Locust client", "dcgm-exporter"}
    assert metrics.source_of("sglang:time_per_output_token_seconds_bucket") is None  # the pre-0.5 name, gone
    assert metrics.source_of("sglang:gen_throughput") == "sglang 0.5.23"
    assert metrics.source_of("sglang:generation_tokens") is None  # counters are exposed with _total


def test_rows_are_the_ones_the_issue_lists(serving: dict) -> None:
    rows = [p["title"] for p in serving["panels"] if p["type"] == "row"]
    assert rows == [
        "KPIs", "Latency", "Throughput", "Engine step", "Kernel share", "Saturation", "Load generator",
        "GPU (DCGM, profile gpu)",
    ]  # fmt: skip
    kinds = {ref.kind for ref in iter_panels(serving)}
    assert kinds == {"stat", "timeseries", "heatmap", "bargauge", "piechart", "table"}


def test_profile_gpu_panels_are_exactly_the_dcgm_ones(serving: dict) -> None:
    values = lint.lint_values(serving)
    for ref in iter_panels(serving):
        names = {n for t in ref.targets for n in promql.metric_names(promql.expand(t["expr"], values))}
        reads_dcgm = bool(names & metrics.DCGM_METRICS)
        assert (ref.profile == "gpu") == reads_dcgm == (ref.row == "GPU (DCGM, profile gpu)"), ref.title
    spec = {p.title for row in build.serving_spec() for p in row.panels if p.profile == "gpu"}
    assert spec == {ref.title for ref in iter_panels(serving) if ref.profile == "gpu"}


def test_slo_choices_are_bucket_boundaries_of_server_and_client(serving: dict) -> None:
    """Attainment = bucket{le=SLO}/count is exact only on a boundary, and the `le` text must match exactly."""
    from sparsemla.ops.sim import metrics as sim_metrics  # sglang 0.5.23's default buckets

    def les(buckets: tuple[float, ...]) -> set[str]:
        return {floatToGoString(b) for b in buckets}

    ttft = les(sim_metrics.TTFT_BUCKETS) & les(mn.TTFT_BUCKETS)
    itl = les(sim_metrics.ITL_BUCKETS) & les(mn.ITL_BUCKETS)
    assert set(build.TTFT_SLO_CHOICES) <= ttft
    assert set(build.TPOT_SLO_CHOICES) <= itl
    by_name = {v["name"]: v for v in serving["templating"]["list"]}
    assert by_name["ttft_slo"]["current"]["value"] == build.TTFT_SLO_DEFAULT in build.TTFT_SLO_CHOICES
    assert by_name["tpot_slo"]["current"]["value"] == build.TPOT_SLO_DEFAULT in build.TPOT_SLO_CHOICES


def test_variables_and_annotations(serving: dict) -> None:
    by_name = {v["name"]: v for v in serving["templating"]["list"]}
    assert by_name["datasource"]["current"]["value"] == build.DATASOURCE_UID
    assert by_name["variant"]["multi"] and by_name["variant"]["includeAll"]
    assert by_name["instance"]["multi"] and by_name["run_id"]["multi"]
    assert {"variant_a", "variant_b", "ttft_slo", "tpot_slo"} <= set(by_name)
    annotations = {a["name"]: a for a in serving["annotations"]["list"]}
    assert annotations["Load-test runs"]["target"]["tags"] == ["loadtest"]
    assert annotations["Flag flips (A/B)"]["target"]["tags"] == ["ab"]
    assert mn.KERNEL_FLAGS_INFO in annotations["Variant changes"]["expr"]


def test_every_server_panel_joins_the_variant_the_same_way(serving: dict) -> None:
    """sglang's series have no `variant`; each sglang selector must sit under the flags-info join."""
    join = re.compile(
        r"\* on \(instance\) group_left \(variant\) max by \(instance, variant\) \(" + mn.KERNEL_FLAGS_INFO
    )
    for ref in iter_panels(serving):
        for t in ref.targets:
            if "sglang:" in t["expr"] and ref.profile is None:
                assert join.search(t["expr"]), (ref.title, t["expr"])


def test_provisioning_matches_dashboards_and_prometheus() -> None:
    ds = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())["datasources"][0]
    assert ds["uid"] == build.DATASOURCE_UID and ds["type"] == "prometheus"
    prom = yaml.safe_load((ROOT / "src" / "sparsemla" / "ops" / "prometheus" / "prometheus.yml").read_text())
    assert ds["jsonData"]["timeInterval"] == prom["global"]["scrape_interval"] == "5s"
    provider = yaml.safe_load((PROVISIONING / "dashboards" / "sparsemla.yaml").read_text())["providers"][0]
    assert provider["allowUiUpdates"] is False and provider["type"] == "file"
    assert provider["options"]["path"].startswith("/var/lib/grafana/dashboards")


def test_compare_panels_exist(serving: dict) -> None:
    titles = {ref.title for ref in iter_panels(serving)}
    assert set(build.COMPARE_PANELS) <= titles
